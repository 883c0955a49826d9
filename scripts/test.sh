#!/usr/bin/env bash
# The project's test entry point: every Rust suite (unit and property tests, the black-box API tests that
# drive the real binary over HTTP, and the fault-schedule runner's short schedules, tests/chaos), then
# schemathesis against the running gateway's /openapi.json (scripts/schemathesis.sh), then the browser tests
# of the inbox at /ui (tests/browser, headless Chromium), then the container check: the unchanged Dockerfile
# built with podman and the image run as a sidecar (scripts/check-container.sh --engine podman; as root, which
# it needs; TOOLNEXUS_SKIP_CONTAINER=1 leaves it out).
#
# schemathesis, and the Standard Webhooks library the webhook tests verify deliveries with, are installed from
# PyPI into virtualenvs under ~/.cache when missing (needs python3-venv); so is the mail server the notification
# tests send to (aiosmtpd), with Slack's Block Kit types and the Adaptive Card schema they check messages
# against (scripts/notify-checkers.sh, from npm).
# The OpenID tests (tests/api/oidc.rs) sign in at panva's oidc-provider, tests/oidc's npm package; the peer
# tests (tests/api/peers.rs) run the TypeScript reference server-everything, tests/peers'; and the browser
# tests drive the inbox with tests/browser's: all need Node.js 20.19+ with npm, and are installed here with
# `npm ci` when missing. The browser tests also need Debian's chromium (installed here with apt-get
# when missing and running as root).
set -euo pipefail
cd "$(dirname "$0")/.."

# The PostgreSQL tests (and the fault-schedule runner's replicas topology) start throwaway servers from
# Debian's postgresql-15 (src/test_postgres.rs), installed here with apt-get when missing and running
# as root, without the package's own default cluster. The runner's disk-full fault uses prlimit (util-linux);
# its clock fault, Debian's libfaketime (installed here as postgresql-15 is).
if [[ ! -x /usr/lib/postgresql/15/bin/postgres && -z "${TOOLNEXUS_TEST_POSTGRES:-}" && "$(id -u)" == 0 ]] &&
    command -v apt-get >/dev/null; then
    echo "scripts/test.sh: installing Debian's postgresql-15 for the PostgreSQL tests" >&2
    mkdir -p /etc/postgresql-common/createcluster.d
    echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.d/toolnexus-no-main.conf
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql-15
fi
if ! compgen -G "/usr/lib/*/faketime/libfaketimeMT.so.1" >/dev/null && [[ "$(id -u)" == 0 ]] &&
    command -v apt-get >/dev/null; then
    echo "scripts/test.sh: installing Debian's faketime for the fault-schedule runner's clock fault" >&2
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q faketime
fi

# tests/api/webhooks.rs has the Standard Webhooks library (standardwebhooks) check the gateway's deliveries.
scripts/webhook-verifier.sh

fail() {
    echo "scripts/test.sh: $*" >&2
    exit 1
}

command -v node >/dev/null && command -v npm >/dev/null ||
    fail "the OpenID and browser tests need Node.js 20.19 or newer and npm; install them (e.g. apt-get install nodejs npm)"
node -e 'const [major, minor] = process.versions.node.split(".").map(Number); process.exit(major > 20 || (major == 20 && minor >= 19) ? 0 : 1)' ||
    fail "the OpenID and browser tests need Node.js 20.19 or newer, not $(node --version)"
if [[ ! -d tests/oidc/node_modules/oidc-provider ]]; then
    (cd tests/oidc && npm ci --no-audit --no-fund) ||
        fail "cannot install the OpenID provider the tests sign in at: run 'npm ci' in tests/oidc"
fi
if [[ ! -d tests/peers/node_modules/@modelcontextprotocol/server-everything ]]; then
    (cd tests/peers && npm ci --no-audit --no-fund) ||
        fail "cannot install the third-party MCP servers the tests run: run 'npm ci' in tests/peers"
fi

scripts/notify-checkers.sh
cargo test --locked "$@"
scripts/schemathesis.sh

export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [[ ! -x "$CHROMIUM" && "$CHROMIUM" == /usr/bin/chromium && "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    echo "scripts/test.sh: installing Debian's chromium for the browser tests" >&2
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
fi
[[ -x "$CHROMIUM" ]] ||
    fail "the browser tests need Chromium at $CHROMIUM: run 'apt-get install chromium' as root (or set CHROMIUM)"

if [[ ! -d tests/browser/node_modules/playwright-core ]]; then
    (cd tests/browser && npm ci --no-audit --no-fund) ||
        fail "cannot install the browser tests' packages: run 'npm ci' in tests/browser"
fi

# The binary `cargo test` built: a plain `cargo build` would compile the dependencies again without the
# dev-dependencies' features, doubling the size of target/.
cargo test --locked --no-run
(cd tests/browser && node --test --test-concurrency=1 inbox.test.js)

if [[ -n "${TOOLNEXUS_SKIP_CONTAINER:-}" ]]; then
    echo "scripts/test.sh: the container check is left out (TOOLNEXUS_SKIP_CONTAINER is set)" >&2
elif [[ "$(id -u)" != 0 ]]; then
    echo "scripts/test.sh: the container check needs root (podman as root): not run" >&2
else
    scripts/check-container.sh --engine podman
fi
