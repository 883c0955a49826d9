#!/usr/bin/env bash
# Runs schemathesis against the real gateway binary: every check, on every operation of /openapi.json, with a
# bearer token so authentication is exercised too. The endless SSE stream /events is read for a short while
# (tests/schemathesis/schemathesis.toml), and each event it sent is checked against the document's schema for
# its type.
#
# Installs schemathesis (pinned) from PyPI into a virtualenv under ~/.cache when it is missing; needs
# python3 with the venv module (installed here with apt-get when missing and running as root). Extra arguments go to `schemathesis run` (e.g. --max-examples 50).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=4.32.5
VENV="${SCHEMATHESIS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/toolnexus-gateway/schemathesis-$VERSION}"
BINARY="${CARGO_TARGET_DIR:-target}/debug/toolnexus-gateway"

fail() {
    echo "scripts/schemathesis.sh: $*" >&2
    exit 1
}

if [[ ! -x "$VENV/bin/schemathesis" ]]; then
    command -v python3 >/dev/null || fail "schemathesis needs python3 (e.g. apt-get install python3 python3-venv)"
    echo "scripts/schemathesis.sh: installing schemathesis $VERSION into $VENV" >&2
    if ! python3 -c 'import ensurepip, venv' 2>/dev/null && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
        echo "scripts/schemathesis.sh: installing Debian's python3-venv" >&2
        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv
    fi
    python3 -m venv "$VENV" || fail "cannot create a virtualenv in $VENV: install python3-venv"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$VERSION" ||
        fail "cannot install schemathesis $VERSION from PyPI into $VENV"
fi

# The binary `cargo test` builds (a no-op after it), not a plain `cargo build`, which would compile the
# dependencies a second time with other features.
cargo test --locked --no-run
work="$(mktemp -d)"
token="$(python3 -c 'import secrets; print(secrets.token_hex(24))')"
# The per-principal caps are raised: the stateful phase opens sessions and starts calls it never closes, and a
# schema-valid request refused with 429 because of that would count as a failure.
cat >"$work/gateway.toml" <<TOML
listen = "127.0.0.1:0"

[limits]
calls_per_principal = 100000
sessions_per_principal = 100000
streams_per_principal = 100000

[store]
url = "sqlite:$work/gateway.sqlite3"

[[servers]]
name = "demo"
builtin = "demo"

[[auth.tokens]]
name = "schemathesis"
role = "admin"
env = "TOOLNEXUS_SCHEMATHESIS_TOKEN"
TOML
TOOLNEXUS_SCHEMATHESIS_TOKEN="$token" "$BINARY" --config "$work/gateway.toml" >"$work/stdout" 2>"$work/stderr" &
gateway=$!
cleanup() {
    kill "$gateway" 2>/dev/null && wait "$gateway" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

for _ in $(seq 100); do
    [[ -s "$work/stdout" ]] && break
    kill -0 "$gateway" 2>/dev/null || { cat "$work/stderr" >&2; fail "the gateway exited before listening"; }
    sleep 0.1
done
address="$(head -n1 "$work/stdout")"
address="${address#listening on http://}"
[[ "$address" =~ ^[0-9.]+:[0-9]+$ ]] || fail "the gateway did not print 'listening on http://ADDR': $address"
python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=40)' \
    "http://$address/readyz?wait=30" || fail "the gateway did not become ready"

# Pending Requests of both kinds, so that the Request routes are exercised beyond 404.
for tool in confirm_action collect_profile authorize; do
    python3 - "http://$address/calls?wait=5" "$token" "$tool" <<'PY' || fail "cannot start the demo tool $tool"
import json, sys, urllib.request
url, token, tool = sys.argv[1:]
body = json.dumps({"server": "demo", "tool": tool, "arguments": {"action": "deploy", "service": "mail"}}).encode()
headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
call = json.load(urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=30))
assert call["status"] == "input_required", call
PY
done

# One worker: with two threads, hypothesis (under schemathesis) now and then parses a lambda's source while
# the other thread does the same, and CPython 3.11 fails it with "AST constructor recursion depth mismatch".
run_schemathesis() {
    PYTHONPATH="tests/schemathesis" SCHEMATHESIS_HOOKS=hooks "$VENV/bin/schemathesis" \
        --config-file tests/schemathesis/schemathesis.toml run \
        "http://$address/openapi.json" \
        --checks all \
        --header "Authorization: Bearer $token" \
        --max-examples 50 \
        --workers 1 \
        --request-timeout 10 \
        --no-color \
        "$@" 2>&1 | tee "$work/schemathesis.out"
}

# A crash inside schemathesis itself (a Python exception in its generators) says nothing about the gateway:
# with no failed check and the gateway still up, run it once more.
status=0
run_schemathesis "$@" || status=$?
if ((status != 0)) && grep -q "Runtime Error" "$work/schemathesis.out" &&
    ! grep -q "FAILURES" "$work/schemathesis.out" && kill -0 "$gateway" 2>/dev/null; then
    echo "scripts/schemathesis.sh: schemathesis itself crashed (no check failed); running it once more" >&2
    status=0
    run_schemathesis "$@" || status=$?
fi
if ((status != 0)); then
    echo "scripts/schemathesis.sh: schemathesis found failures; the gateway's log:" >&2
    tail -n 50 "$work/stderr" >&2
    exit "$status"
fi
