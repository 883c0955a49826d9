#!/usr/bin/env bash
# The fault-schedule runner (README, "Reliability"): builds the test binary tests/chaos with the project's own
# toolchain and runs one schedule of operations and faults against the real gateway binary.
#
#   scripts/chaos.sh --topology sqlite --seed 7 --duration 600 [--history PATH]
#
# The same seed gives the same schedule. The last line printed is the verdict with the seed; the exit status is
# 0 when every rule held, 1 on a violation (the rule, the operations involved and the kept history are printed
# before it) and 2 on bad arguments. It needs prlimit (util-linux) for the disk-full fault, and the replicas
# topology libfaketime (Debian's faketime) for its clock fault.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v prlimit >/dev/null || { echo "scripts/chaos.sh: prlimit (util-linux) is missing: apt-get install util-linux" >&2; exit 2; }

binary=$(cargo test --locked --no-run --test chaos --message-format=json |
    grep '"kind":\["test"\]' | grep '"name":"chaos"' |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[[ -n "$binary" && -x "$binary" ]] || { echo "scripts/chaos.sh: cargo built no chaos test binary" >&2; exit 1; }
exec "$binary" "$@"
