"""`flood` sends `count` elicitations at once, then waits for every answer and reports how many it got."""

import stub


def flood(request):
    count = request["params"]["arguments"]["count"]
    for index in range(count):
        stub.send({"jsonrpc": "2.0", "id": f"flood-{index}", "method": "elicitation/create", "params": {
            "message": f"Flood {index}", "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
        }})
    stub.log(f"sent {count} elicitations")
    answered = 0
    for message in stub.incoming():
        if str(message.get("id", "")).startswith("flood-"):
            answered += 1
            if answered == count:
                break
    stub.log(f"all {answered} elicitations answered")
    stub.text_result(request, str(answered))


stub.serve("flood", {"flood": flood})
