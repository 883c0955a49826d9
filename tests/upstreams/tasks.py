"""Tasks that misbehave (the MCP Tasks extension): each tool makes a task whose `tasks/get` answers follow a
script, the last answer repeated. `tasks/update` and `tasks/cancel` are acknowledged, unless the script says
the task is forgotten."""

import json

import stub

ELICIT = {"method": "elicitation/create", "params": {
    "mode": "form", "message": "Go on?",
    "requestedSchema": {"type": "object", "properties": {"go": {"type": "boolean"}}, "required": ["go"]},
}}
DONE = {"content": [{"type": "text", "text": "done"}], "isError": False}

# What `tasks/get` says of a tool's task, one step per look.
SCRIPTS = {
    # Works for ever: only the call's timeout ends it.
    "never": [{"status": "working", "statusMessage": "still at it"}],
    # Asking about it fails.
    "flaky": ["error"],
    # Completed, then working again: the first end counts.
    "backwards": [{"status": "working"}, {"status": "completed", "result": DONE}, {"status": "working"}],
    # Asks, and after the answer still lists the question once (a server slow to update), then completes.
    "repeats": [{"status": "input_required", "inputRequests": {"go": ELICIT}},
                {"status": "input_required", "inputRequests": {"go": ELICIT}},
                {"status": "completed", "result": DONE}],
    # Cancelled, then back: a cancelled task ends the call.
    "reappears": [{"status": "cancelled"}, {"status": "working"}],
    # Fails with an error of its own.
    "fails": [{"status": "failed", "error": {"code": -32000, "message": "the disk is full"}}],
    # Asks, then forgets the task before the answer arrives.
    "forgets": [{"status": "input_required", "inputRequests": {"go": ELICIT}}],
    # Asks to be polled every 30 s, and says at once that it completed (`notifications/tasks`).
    "notifies": [{"status": "completed", "result": DONE}],
    # Says a great deal of its progress.
    "chatty": [{"status": "completed", "statusMessage": "x" * 10000, "result": DONE}],
    # Asks for something the gateway does not provide.
    "unknown": [{"status": "input_required", "inputRequests": {"x": {"method": "things/make", "params": {}}}}],
    # Asks for the client's roots, then completes with the answers it was sent.
    "roots": [{"status": "input_required", "inputRequests": {"r": {"method": "roots/list"}}}, "echo"],
}

# Each task's script and how far it has got.
tasks = {}


def task(task_id, status, poll=100):
    return {"taskId": task_id, "status": status, "createdAt": "2026-01-01T00:00:00Z",
            "lastUpdatedAt": "2026-01-01T00:00:00Z", "ttlMs": None, "pollIntervalMs": poll}


def start(request):
    name = request["params"]["name"]
    task_id = "t" * 2000 if name == "long_id" else f"{name}-{request['id']}"
    tasks[task_id] = {"script": SCRIPTS.get(name, [{"status": "working"}]), "at": 0}
    if name == "notifies":
        stub.result(request, {"resultType": "task", **task(task_id, "working", poll=30000)})
        return stub.send({"jsonrpc": "2.0", "method": "notifications/tasks",
                          "params": {**task(task_id, "completed", poll=30000), "result": DONE}})
    stub.result(request, {"resultType": "task", **task(task_id, "working")})


def get(request):
    task_id = request["params"]["taskId"]
    entry = tasks.get(task_id)
    if entry is None:
        return stub.send({"jsonrpc": "2.0", "id": request["id"],
                          "error": {"code": -32602, "message": f"unknown task: {task_id}"}})
    step = entry["script"][min(entry["at"], len(entry["script"]) - 1)]
    entry["at"] += 1
    if step == "error":
        return stub.send({"jsonrpc": "2.0", "id": request["id"],
                          "error": {"code": -32603, "message": "the task store is unavailable"}})
    if step == "echo":
        answers = json.dumps(entry.get("responses"))
        step = {"status": "completed", "result": {"content": [{"type": "text", "text": answers}], "isError": False}}
    stub.result(request, {"resultType": "complete", **task(task_id, step["status"]),
                          **{key: value for key, value in step.items() if key != "status"}})


def update(request):
    task_id = request["params"]["taskId"]
    stub.log(f"tasks/update {json.dumps(request['params'])}")
    if task_id.startswith("forgets-") or task_id not in tasks:
        tasks.pop(task_id, None)
        return stub.send({"jsonrpc": "2.0", "id": request["id"],
                          "error": {"code": -32602, "message": f"unknown task: {task_id}"}})
    tasks[task_id]["responses"] = request["params"].get("inputResponses")
    stub.result(request, {"resultType": "complete"})


def cancel(request):
    stub.log(f"tasks/cancel {request['params']['taskId']}")
    stub.result(request, {"resultType": "complete"})


stub.serve("tasks", {name: start for name in [*SCRIPTS, "long_id"]},
           {"tasks/get": get, "tasks/update": update, "tasks/cancel": cancel},
           {"extensions": {"io.modelcontextprotocol/tasks": {}}})
