"""Reads everything and never answers: its MCP handshake never finishes."""

import sys

for line in sys.stdin:
    sys.stderr.write(f"[silent] ignoring {line.strip()[:60]}\n")
