"""`wait` never returns; it logs every message it gets afterwards, so a test can see the gateway cancel it."""

import json
import os

import stub


def wait(request):
    stub.log(f"call {request['id']} waiting")
    for message in stub.incoming():
        stub.log(f"got {json.dumps(message)}")
    stub.log("stdin closed")
    raise SystemExit(0)


stub.serve(f"slow {os.getpid()}", {"wait": wait})
