"""Counts the gateway's instructions per operation under callgrind, with a keep-alive REST client.

    python3 scripts/instructions.py [--config FILE] [--server NAME] [--count N] echo|confirm|confirm-two|mcp-echo|answer

`echo` is one `POST /calls?wait=30` on the demo's echo tool; `confirm` is an elicitation round trip
(`POST /calls?wait=30` -> answer -> `GET /calls/{id}?wait=30`), `confirm-two` the same in two exchanges
(`POST /calls?wait=30` -> `POST /requests/{id}/answer?wait=30`); `mcp-echo` is the echo tool called through the
front door, one stateless 2026-07-28 `tools/call` to `/mcp`; `answer` is one answer to a pending Request, the
drain's operation, one at a time (the Requests are raised by one `flood` call before counting starts). Needs
valgrind and a release build (`cargo build --release`). Only the gateway process is counted, after a warm-up;
the profile is left in target/callgrind.<op>.out for callgrind_annotate.
"""

import argparse
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time


WARM_UP = 50


def client(port):
    connection = http.client.HTTPConnection("127.0.0.1", port)

    def request(method, path, body=None, headers=None):
        payload = json.dumps(body) if body is not None else None
        headers = {"content-type": "application/json", **(headers or {})}
        connection.request(method, path, body=payload, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())

    return request


SERVER = "demo"


def echo(request):
    status, call = request("POST", "/calls?wait=30", {"server": SERVER, "tool": "echo", "arguments": {"text": "x"}})
    assert status == 201 and call["status"] == "completed", call


def confirm(request):
    body = {"server": SERVER, "tool": "confirm_action", "arguments": {"action": "x"}}
    status, call = request("POST", "/calls?wait=30", body)
    assert status == 201 and call["status"] == "input_required", call
    status, view = request("POST", f"/requests/{call['requests'][0]}/answer", {"ok": True, "data": {"confirm": True}})
    assert status == 200, view
    status, done = request("GET", f"/calls/{call['id']}?wait=30")
    assert done["status"] == "completed", done


def confirm_in_two(request):
    body = {"server": SERVER, "tool": "confirm_action", "arguments": {"action": "x"}}
    status, call = request("POST", "/calls?wait=30", body)
    assert status == 201 and call["status"] == "input_required", call
    answer = {"ok": True, "data": {"confirm": True}}
    status, view = request("POST", f"/requests/{call['requests'][0]}/answer?wait=30", answer)
    assert status == 200 and view["resumedCall"]["status"] == "completed", view


MCP_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "instructions", "version": "1"},
}


def mcp_echo(request):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "demo__echo", "arguments": {"text": "x"}, "_meta": MCP_META}}
    headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28",
               "mcp-method": "tools/call", "mcp-name": "demo__echo"}
    status, reply = request("POST", "/mcp", body, headers)
    assert status == 200 and reply["result"]["content"][0]["text"] == "x", reply


def answerer(request, count):
    status, call = request("POST", "/calls?wait=30", {"server": SERVER, "tool": "flood", "arguments": {"count": count}})
    assert status == 201 and call["status"] == "input_required" and len(call["requests"]) == count, call
    pending = iter(call["requests"])

    def answer(request):
        status, view = request("POST", f"/requests/{next(pending)}/answer", {"ok": True, "data": {"confirm": True}})
        assert status == 200, view

    return answer


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main():
    global SERVER
    parser = argparse.ArgumentParser()
    parser.add_argument("op", choices=["echo", "confirm", "confirm-two", "mcp-echo", "answer"])
    parser.add_argument("--config")
    parser.add_argument("--server", default=SERVER, help="the server the REST operations call")
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--binary", default="target/release/toolnexus-gateway")
    args = parser.parse_args()
    SERVER = args.server
    operation = {"echo": echo, "confirm": confirm, "confirm-two": confirm_in_two, "mcp-echo": mcp_echo}.get(args.op)
    port = free_port()
    raw = f"target/callgrind.{args.op}.%p"
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={raw}", args.binary,
               "--listen", f"127.0.0.1:{port}"] + (["--config", args.config] if args.config else [])
    # Without a config the gateway keeps its state in a SQLite file under $XDG_STATE_HOME: a fresh one per run, so
    # that the counts do not grow with what earlier runs left there.
    state = tempfile.TemporaryDirectory()
    environment = dict(os.environ, XDG_STATE_HOME=state.name)
    gateway = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment)
    try:
        request = None
        for _ in range(200):
            try:
                request = client(port)
                if request("GET", "/readyz?wait=1")[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        if operation is None:
            operation = answerer(request, WARM_UP + args.count)
        for _ in range(WARM_UP):
            operation(request)
        subprocess.run(["callgrind_control", "-z", str(gateway.pid)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(args.count):
            operation(request)
        subprocess.run(["callgrind_control", "-d", str(gateway.pid)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        gateway.send_signal(signal.SIGINT)
        gateway.wait()
        state.cleanup()
    dump = raw.replace("%p", str(gateway.pid)) + ".1"
    profile = f"target/callgrind.{args.op}.out"
    os.replace(dump, profile)
    for leftover in (raw.replace("%p", str(gateway.pid)),):
        if os.path.exists(leftover):
            os.remove(leftover)
    annotated = subprocess.run(["callgrind_annotate", profile], capture_output=True, text=True).stdout
    total = int(re.search(r"([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", annotated).group(1).replace(",", ""))
    print(f"{args.op}: {total // args.count} instructions per operation ({args.count} measured, profile in {profile})")


if __name__ == "__main__":
    sys.exit(main())
