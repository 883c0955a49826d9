"""`big` returns a text of `bytes` bytes; `big_ask` elicits with a message of that size, then reports the answer."""

import json

import stub


def big(request):
    stub.text_result(request, "x" * request["params"]["arguments"]["bytes"])


def big_ask(request):
    message = "y" * request["params"]["arguments"]["bytes"]
    stub.send({"jsonrpc": "2.0", "id": "big-1", "method": "elicitation/create", "params": {
        "message": message, "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
    }})
    stub.text_result(request, json.dumps(stub.response_to("big-1")))


stub.serve("huge", {"big": big, "big_ask": big_ask})
