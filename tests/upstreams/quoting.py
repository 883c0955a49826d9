"""`open` fails with an error that quotes its `path` argument as it was given, as many servers' errors do: a
value the caller chose comes back in a message the gateway logs."""

import stub


def open_file(request):
    path = request["params"]["arguments"]["path"]
    stub.send({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32602, "message": f"cannot open {path}"}})


stub.serve("quoting", {"open": open_file})
