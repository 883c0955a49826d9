"""`ask` elicits with a schema that nests an object, which MCP forbids; it reports the answer it got.

In 2025-11-25 that is an `elicitation/create` with id "nested-1" (the server waits for the response with that
id); in 2026-07-28 an `input_required` result."""

import json

import stub

SCHEMA = {
    "type": "object",
    "properties": {
        "address": {"type": "object", "properties": {"street": {"type": "string"}}},
        "name": {"type": "string"},
    },
}


def ask(request):
    params = {"mode": "form", "message": "Where?", "requestedSchema": SCHEMA}
    if stub.modern(request):
        stub.result(request, {
            "resultType": "input_required",
            "inputRequests": {"where": {"method": "elicitation/create", "params": params}},
            "requestState": "nested",
        })
        return
    stub.send({"jsonrpc": "2.0", "id": "nested-1", "method": "elicitation/create", "params": params})
    response = stub.response_to("nested-1")
    stub.log(f"elicitation answered: {json.dumps(response)}")
    stub.text_result(request, json.dumps(response))


stub.serve("nested", {"ask": ask})
