#!/usr/bin/env bash
# Installs what tests/api/notify.rs checks the gateway's notifications with, each pinned, from the package
# registries, and does nothing for what is installed already:
# - a mail server that keeps what it receives: aiosmtpd (PyPI) in a virtualenv, ~/.cache/toolnexus-gateway/aiosmtpd
#   ($AIOSMTPD_VENV);
# - Slack's published Block Kit types (@slack/types) and the TypeScript compiler that checks messages against
#   them: npm ci in tests/notify;
# - the published Adaptive Card JSON schema, as the Adaptive Cards designer (npm) ships it:
#   ~/.cache/toolnexus-gateway/adaptive-card-<version>.json ($ADAPTIVE_CARD_SCHEMA).
# Needs python3 with the venv module (installed here with apt-get when missing and running as root), node and npm.
set -euo pipefail
cd "$(dirname "$0")/.."

AIOSMTPD=1.4.6
DESIGNER=2.4.4
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/toolnexus-gateway"
VENV="${AIOSMTPD_VENV:-$CACHE/aiosmtpd}"
SCHEMA="${ADAPTIVE_CARD_SCHEMA:-$CACHE/adaptive-card-$DESIGNER.json}"

fail() {
    echo "scripts/notify-checkers.sh: $*" >&2
    exit 1
}

if ! "$VENV/bin/python" -c 'import importlib.metadata, sys; sys.exit(importlib.metadata.version("aiosmtpd") != sys.argv[1])' \
    "$AIOSMTPD" 2>/dev/null; then
    command -v python3 >/dev/null || fail "the notification tests need python3 (e.g. apt-get install python3 python3-venv)"
    echo "scripts/notify-checkers.sh: installing aiosmtpd $AIOSMTPD into $VENV" >&2
    if ! python3 -c 'import ensurepip, venv' 2>/dev/null && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv
    fi
    [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV" || fail "cannot create a virtualenv in $VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "aiosmtpd==$AIOSMTPD" ||
        fail "cannot install aiosmtpd $AIOSMTPD from PyPI into $VENV"
fi

if [[ ! -d tests/notify/node_modules/@slack/types ]]; then
    (cd tests/notify && npm ci --no-audit --no-fund) || fail "cannot install Slack's types: run 'npm ci' in tests/notify"
fi

if [[ ! -s "$SCHEMA" ]]; then
    echo "scripts/notify-checkers.sh: fetching the Adaptive Card schema (adaptivecards-designer $DESIGNER)" >&2
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    (cd "$work" && npm pack --silent "adaptivecards-designer@$DESIGNER" >/dev/null && tar xzf adaptivecards-designer-*.tgz) ||
        fail "cannot fetch adaptivecards-designer $DESIGNER from npm"
    mkdir -p "$(dirname "$SCHEMA")"
    # The designer ships the schema as `export const adaptiveCardSchema = {…};`: the object is the JSON.
    node -e '
        const fs = require("fs");
        const text = fs.readFileSync(process.argv[1], "utf8");
        const json = text.slice(text.indexOf("{"), text.lastIndexOf("}") + 1);
        JSON.parse(json);
        fs.writeFileSync(process.argv[2], json);
    ' "$work/package/src/adaptive-card-schema.ts" "$SCHEMA" || fail "the designer's schema is not the JSON expected"
fi
