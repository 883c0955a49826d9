#!/usr/bin/env bash
# Installs the Standard Webhooks library for Python (standardwebhooks, pinned, from PyPI) into a virtualenv for
# tests/api/webhooks.rs, which has it verify the gateway's deliveries (tests/webhooks/verify.py). Does nothing
# when the virtualenv already has that version.
#
# The virtualenv is $STANDARDWEBHOOKS_VENV, else ~/.cache/toolnexus-gateway/standardwebhooks (under
# $XDG_CACHE_HOME when set): where the test looks for it. Needs python3 with the venv module (installed here
# with apt-get when missing and running as root).
set -euo pipefail

VERSION=1.1.0
VENV="${STANDARDWEBHOOKS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/toolnexus-gateway/standardwebhooks}"

fail() {
    echo "scripts/webhook-verifier.sh: $*" >&2
    exit 1
}

installed() {
    "$VENV/bin/python" -c 'import importlib.metadata, sys; sys.exit(importlib.metadata.version("standardwebhooks") != sys.argv[1])' \
        "$VERSION" 2>/dev/null
}

installed && exit 0
command -v python3 >/dev/null || fail "the webhook tests need python3 (e.g. apt-get install python3 python3-venv)"
echo "scripts/webhook-verifier.sh: installing standardwebhooks $VERSION into $VENV" >&2
if ! python3 -c 'import ensurepip, venv' 2>/dev/null && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    echo "scripts/webhook-verifier.sh: installing Debian's python3-venv" >&2
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv
fi
[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV" || fail "cannot create a virtualenv in $VENV: install python3-venv"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "standardwebhooks==$VERSION" ||
    fail "cannot install standardwebhooks $VERSION from PyPI into $VENV"
installed || fail "standardwebhooks $VERSION is not importable from $VENV/bin/python after installing it"
