"""Completes its handshake, then exits at once: a server that dies every time it is started."""

import stub

for message in stub.incoming():
    if message.get("method") == "initialize":
        stub.result(message, {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "crash-loop", "version": "0"},
        })
    elif message.get("method") == "notifications/initialized":
        stub.log("initialized, exiting")
        break
