"""Writes awkward lines to stderr: `shout` writes its `text`, then a line with terminal escapes and bytes
that are not UTF-8, then one far longer than any log line, then a short one, and returns."""

import sys

import stub


def shout(request):
    text = request["params"]["arguments"]["text"]
    err = sys.stderr.buffer
    err.write(f"[noisy] {text}\n".encode())
    err.write(b"[noisy] escapes \x1b[31mred\x1b[0m\r and \xff\xfe bytes\n")
    err.write(b"[noisy] long " + b"x" * 100_000 + b"\n")
    err.write(f"[noisy] after the long line of {text}\n".encode())
    err.flush()
    stub.text_result(request, "shouted")


stub.serve("noisy", {"shout": shout})
