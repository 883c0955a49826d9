"""A bare MCP server over stdio for the gateway's tests: newline-delimited JSON-RPC, the handshake of both
protocol eras, and whatever tools a test server passes to `serve`. Everything it does is logged to stderr."""

import json
import sys

NAME = "stub"
MODERN = "2026-07-28"


def log(text):
    sys.stderr.write(f"[{NAME}] {text}\n")
    sys.stderr.flush()


def write(text):
    sys.stdout.write(text)
    sys.stdout.flush()


def send(message):
    write(json.dumps(message) + "\n")


def result(request, value):
    send({"jsonrpc": "2.0", "id": request["id"], "result": value})


def text_result(request, text):
    result(request, {"content": [{"type": "text", "text": text}], "isError": False})


def modern(request):
    meta = (request.get("params") or {}).get("_meta") or {}
    return meta.get("io.modelcontextprotocol/protocolVersion") == MODERN


def incoming():
    """Every message the gateway sends, until its end of stdin."""
    for line in sys.stdin:
        if line.strip():
            yield json.loads(line)


def response_to(request_id):
    """Reads until the response to our request `request_id` arrives; `None` if stdin ends first."""
    for message in incoming():
        if message.get("id") == request_id and "method" not in message:
            return message
        log(f"while waiting for {request_id!r}: {json.dumps(message)}")
    return None


def serve(name, tools, methods=None, capabilities=None):
    """Answers the handshake and `tools/list`, and hands each `tools/call` to `tools[name](request)` and each
    request of another method in `methods` to `methods[method](request)`; `capabilities` are declared besides
    `tools`."""
    global NAME
    NAME = name
    methods = methods or {}
    declared = {"tools": {}, **(capabilities or {})}
    for message in incoming():
        method = message.get("method")
        if method == "initialize":
            result(message, {
                "protocolVersion": "2025-11-25",
                "capabilities": declared,
                "serverInfo": {"name": name, "version": "0"},
            })
        elif method == "server/discover":
            result(message, {
                "resultType": "complete",
                "supportedVersions": ["2025-11-25", MODERN],
                "capabilities": declared,
                "ttlMs": 0,
                "cacheScope": "private",
                "_meta": {"io.modelcontextprotocol/serverInfo": {"name": name, "version": "0"}},
            })
        elif method == "tools/list":
            listed = [{"name": tool, "inputSchema": {"type": "object"}} for tool in tools]
            result(message, {"tools": listed})
        elif method == "tools/call":
            tools[message["params"]["name"]](message)
        elif method in methods:
            methods[method](message)
        elif method == "ping":
            result(message, {})
        elif "id" in message and method is not None:
            send({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "no such method"}})
        else:
            log(f"got {json.dumps(message)}")
    log("stdin closed")
