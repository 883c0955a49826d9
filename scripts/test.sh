#!/usr/bin/env bash
# The project's test entry point: every Rust suite (unit tests and the black-box API tests that drive the
# real binary over HTTP).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --locked "$@"
