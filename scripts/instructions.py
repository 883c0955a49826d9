"""Counts the gateway's instructions per operation under callgrind, with a keep-alive REST client.

    python3 scripts/instructions.py [--config FILE] [--count N] echo|confirm

`echo` is one `POST /calls?wait=30` on the demo's echo tool; `confirm` is an elicitation round trip
(`POST /calls?wait=30` -> answer -> `GET /calls/{id}?wait=30`). Needs valgrind and a release build
(`cargo build --release`). Only the gateway process is counted, after a warm-up; the profile is left in
target/callgrind.<op>.out for callgrind_annotate.
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


def client(port):
    connection = http.client.HTTPConnection("127.0.0.1", port)

    def request(method, path, body=None):
        payload = json.dumps(body) if body is not None else None
        connection.request(method, path, body=payload, headers={"content-type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())

    return request


def echo(request):
    status, call = request("POST", "/calls?wait=30", {"server": "demo", "tool": "echo", "arguments": {"text": "x"}})
    assert status == 201 and call["status"] == "completed", call


def confirm(request):
    body = {"server": "demo", "tool": "confirm_action", "arguments": {"action": "x"}}
    status, call = request("POST", "/calls?wait=30", body)
    assert status == 201 and call["status"] == "input_required", call
    status, view = request("POST", f"/requests/{call['requests'][0]}/answer", {"ok": True, "data": {"confirm": True}})
    assert status == 200, view
    status, done = request("GET", f"/calls/{call['id']}?wait=30")
    assert done["status"] == "completed", done


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("op", choices=["echo", "confirm"])
    parser.add_argument("--config")
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--binary", default="target/release/toolnexus-gateway")
    args = parser.parse_args()
    operation = {"echo": echo, "confirm": confirm}[args.op]
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
        for _ in range(50):
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
