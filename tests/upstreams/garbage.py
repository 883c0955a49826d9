"""Writes garbage to stdout around its answers; `half` sends an elicitation, then half a message, then exits."""

import stub

GARBAGE = [
    "this is not JSON",
    "{\"unterminated\": ",
    "[1, 2, 3]",
    "{\"jsonrpc\": \"2.0\", \"method\": \"notifications/made_up\", \"params\": 7}",
    "{\"jsonrpc\": \"2.0\", \"id\": 424242, \"result\": {}}",
    "\x00\x01\x02",
]


def echo(request):
    for line in GARBAGE:
        stub.write(line + "\n")
    stub.text_result(request, request["params"]["arguments"]["text"])


def half(request):
    stub.send({"jsonrpc": "2.0", "id": "ask", "method": "elicitation/create", "params": {
        "message": "Half?", "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
    }})
    stub.write("{\"jsonrpc\": \"2.0\", \"id\": " + str(request["id"]) + ", \"result\": {\"content\": [{\"ty")
    stub.log("wrote half a message, exiting")
    raise SystemExit(0)


stub.serve("garbage", {"echo": echo, "half": half})
