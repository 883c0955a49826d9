#!/usr/bin/env bash
# What `limits.call_timeout` costs answers while many 2025-11-25 calls wait on a human: a gateway with one demo
# server holds WAITING calls (their upstream waiting on an elicitation), then 300 of their Requests are answered
# one after another; printed as a table row per gateway build and setting.
#
#   scripts/work-budget.sh [gateway binary ...]
#
# STORE (default: a SQLite file in a temporary directory) names the store, e.g. a PostgreSQL URL of an empty
# database; WAITING (default 5000) how many calls wait. Needs curl and python3.
set -euo pipefail

waiting=${WAITING:-5000}
port=18190
binaries=("$@")
[ ${#binaries[@]} -gt 0 ] || binaries=(target/release/toolnexus-gateway)

echo "| build | limits.call_timeout | calls waiting | 300 answers in turn (s) |"
echo "|---|---|---|---|"
for binary in "${binaries[@]}"; do
    for timeout in none 1h; do
        dir=$(mktemp -d)
        {
            echo "listen = \"127.0.0.1:$port\""
            echo "[store]"
            echo "url = \"${STORE:-sqlite://$dir/gateway.db}\""
            echo "[[servers]]"
            echo 'name = "legacy"'
            echo 'builtin = "demo"'
            echo 'protocol = "2025-11-25"'
            echo "[limits]"
            echo "calls_per_principal = 100000"
            [ "$timeout" = none ] || echo "call_timeout = \"$timeout\""
        } >"$dir/gateway.toml"
        "$binary" --config "$dir/gateway.toml" >"$dir/log" 2>&1 &
        gateway=$!
        curl -sf --retry 50 --retry-connrefused --retry-delay 0 "127.0.0.1:$port/readyz?wait=30" >/dev/null
        seq "$waiting" | xargs -P 16 -I{} curl -sf -o /dev/null -X POST "127.0.0.1:$port/calls?wait=0" \
            -H 'content-type: application/json' \
            -d '{"server": "legacy", "tool": "confirm_action", "arguments": {"action": "a{}"}}'
        pending=$(curl -sf "127.0.0.1:$port/metrics" | awk '/^toolnexus_requests_pending /{print $2}')
        ids=$(curl -sf "127.0.0.1:$port/requests?status=pending&limit=300" |
            python3 -c 'import json, sys; print("\n".join(r["id"] for r in json.load(sys.stdin)))')
        started=$(date +%s.%N)
        for id in $ids; do
            curl -sf -o /dev/null -X POST "127.0.0.1:$port/requests/$id/answer" \
                -H 'content-type: application/json' -d '{"ok": true, "data": {"confirm": true}}'
        done
        ended=$(date +%s.%N)
        echo "| $binary | $timeout | $pending | $(python3 -c "print(f'{$ended - $started:.2f}')") |"
        kill "$gateway"
        wait "$gateway" 2>/dev/null || true
        rm -rf "$dir"
    done
done
