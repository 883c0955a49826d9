#!/usr/bin/env bash
# The container image built and run for real, with podman (`scripts/check-container.sh --engine podman`):
#   1. stand-ins for the two base images, tagged with the Dockerfile's own FROM names (nothing is pulled):
#      the Debian runtime from a `debootstrap --variant=minbase` root file system, and the Rust build image
#      from it plus gcc, libc6-dev, the machine's CA bundle and a copy of the machine's Rust toolchain of the
#      version the Dockerfile pins;
#   2. `podman build` of the unchanged Dockerfile into localhost/toolnexus-gateway:check;
#   3. the image run as a sidecar would (the admin token from the environment, the store on a named volume,
#      port 8080 published on loopback) and checked: /healthz, /readyz, the HEALTHCHECK as the engine runs it,
#      the README's walkthrough with the demo server, a request without a token refused, uid 10001 under tini,
#      the demo server's process reaped when it exits, SIGTERM (`podman stop`), then a second container,
#      read-only but for the volume, holding the first one's pending 2026-07-28 Request and completing it;
#   4. the image's size and each container's time to ready, printed.
# One line per check, then `container: N/M checks hold`; the exit status is 1 when any falls short.
#
# Run it as root: it installs podman, runc, debootstrap, curl and jq from Debian's packages when they are
# missing, and needs the machine's Rust toolchain of the pinned version (rustup's, or rustc on PATH). Podman
# reads a containers.conf of the script's own (runc, no default ulimits, cgroupfs, file events), never the
# machine's. It leaves the two stand-ins behind (to make the next run quick: remove them with `podman rmi`)
# and nothing else: its containers, volume and image are removed on the way out, whatever happens.
# CHECK_CONTAINER_CACHE=DIR keeps the build's cache mounts (the cargo registry and target directory) in DIR
# between runs; without it every run builds from cold, as CI would.
# shellcheck disable=SC2317 # the checks are functions called by name
set -euo pipefail
cd "$(dirname "$0")/.."

image="localhost/toolnexus-gateway:check"
prefix="toolnexus-check-$$"
volume="$prefix-state"
first="$prefix-1"
second="$prefix-2"
mirror="http://deb.debian.org/debian"
# Seconds `podman stop` gives the gateway before SIGKILL (Docker's and podman's default).
grace=10
# The checks, in the order they run.
checks=(bases build healthz readyz healthcheck token walkthrough user tini volume reaped stop read-only restart clean)

fail() {
    echo "scripts/check-container.sh --engine podman: $*" >&2
    exit 2
}

[[ "$(id -u)" == 0 ]] ||
    fail "run it as root: it installs podman, runc and debootstrap with apt-get and runs rootful containers"

scratch="$(mktemp -d)"
export CONTAINERS_CONF="$scratch/containers.conf"
cat >"$CONTAINERS_CONF" <<'EOF'
# crun refuses to start containers under hybrid cgroups (v1 and v2 mounted together), and podman's default
# ulimits stop every container where raising RLIMIT_NOFILE is not permitted: so runc, and no default ulimits.
# Without systemd: cgroupfs, and events in a file.
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
TMPDIR="$(realpath -m "${CHECK_CONTAINER_CACHE:-$scratch/tmp}")"
export TMPDIR
mkdir -p "$TMPDIR"

# What is removed on the way out: the run's containers, volume and image, then the scratch directory.
cleanup() {
    if command -v podman >/dev/null; then
        podman rm --force --ignore --time 0 "$first" "$second" >/dev/null 2>&1 || true
        podman volume rm --force "$volume" >/dev/null 2>&1 || true
        podman rmi --force "$image" >/dev/null 2>&1 || true
    fi
    rm -rf "$scratch"
}
trap cleanup EXIT

# --- What the run needs, each missing piece named -------------------------------------------------------

# The FROM names, and what they pin: the Rust version and the Debian suite.
mapfile -t bases < <(sed -nE 's/^FROM[[:space:]]+([^[:space:]]+).*/\1/p' Dockerfile)
[[ ${#bases[@]} == 2 ]] || fail "expected two FROM lines in the Dockerfile, found ${#bases[@]}"
rust_base="${bases[0]}"
debian_base="${bases[1]}"
[[ "$rust_base" =~ ^rust:([0-9]+\.[0-9]+\.[0-9]+)-slim-([a-z]+)$ ]] ||
    fail "the build stage's base is not rust:<version>-slim-<suite>: $rust_base"
rust_version="${BASH_REMATCH[1]}"
suite="${BASH_REMATCH[2]}"
[[ "$debian_base" =~ ^debian:$suite-[0-9]{8}-slim$ ]] ||
    fail "the runtime stage's base is not debian:$suite-<date>-slim: $debian_base"

[[ -x /usr/lib/apt/apt-helper ]] ||
    fail "no apt here: it runs on Debian $suite, installing podman, runc and debootstrap with apt-get"
/usr/lib/apt/apt-helper download-file "$mirror/dists/$suite/Release" "$scratch/Release" >"$scratch/probe" 2>&1 ||
    fail "no network to the Debian packages: $(sed -n 's/^E: Failed to fetch //p' "$scratch/probe" | head -1)"

missing=()
for package in podman runc debootstrap curl jq; do
    [[ "$(dpkg-query -W -f '${Status}' "$package" 2>/dev/null)" == "install ok installed" ]] || missing+=("$package")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "installing ${missing[*]} from Debian's packages"
    apt-get update -qq >"$scratch/apt" 2>&1 || fail "apt-get update failed: $(tail -3 "$scratch/apt")"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$scratch/apt" 2>&1 ||
        fail "apt-get install ${missing[*]} failed: $(tail -3 "$scratch/apt")"
fi

# The machine's Rust toolchain of the pinned version: rustup's toolchain of that name, else rustc on PATH.
sysroot=""
for rustc in "rustc +$rust_version" rustc; do
    if [[ "$($rustc --version 2>/dev/null)" == "rustc $rust_version "* ]]; then
        sysroot="$($rustc --print sysroot)"
        break
    fi
done
[[ -n "$sysroot" ]] ||
    fail "no Rust $rust_version on this machine (the Dockerfile's $rust_base): rustup toolchain install $rust_version"

# --- Reporting ------------------------------------------------------------------------------------------

passed=0
reported=()
detail=""

# Runs check $1 (the function check_$1 with its arguments), which sets `detail`; prints one line for it.
check() {
    local name=$1
    shift
    detail=""
    reported+=("$name")
    if "check_${name//-/_}" "$@"; then
        passed=$((passed + 1))
        printf 'ok    %-12s %s\n' "$name" "$detail"
    else
        printf 'FAIL  %-12s %s\n' "$name" "$detail"
        return 1
    fi
}

# Prints the checks that did not run and the summary, and exits: 0 only when every check held.
finish() {
    local name ran seen
    for name in "${checks[@]}"; do
        seen=""
        for ran in "${reported[@]}"; do [[ "$ran" == "$name" ]] && seen=1; done
        [[ -n "$seen" ]] || printf 'FAIL  %-12s not run: %s\n' "$name" "$1"
    done
    echo "wall time: $SECONDS s"
    echo "container: $passed/${#checks[@]} checks hold"
    [[ "$passed" == "${#checks[@]}" ]] && exit 0
    exit 1
}

# Milliseconds since the Unix epoch.
now_ms() {
    echo $(($(date +%s%N) / 1000000))
}

# --- The gateway's API and processes --------------------------------------------------------------------

TOOLNEXUS_ADMIN_TOKEN="check-container-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
export TOOLNEXUS_ADMIN_TOKEN
port=""
ready_ms=""

# Sends method $1 to path $2 of the running container (body $3 as JSON, if any) with bearer token $4 (by
# default the admin token; none when empty); the response body goes to $scratch/body, the status to stdout.
api() {
    local args=(-sS --max-time 40 -o "$scratch/body" -w '%{http_code}' -X "$1") token="${4-$TOOLNEXUS_ADMIN_TOKEN}"
    [[ -z "$token" ]] || args+=(-H "Authorization: Bearer $token")
    [[ -z "${3:-}" ]] || args+=(-H 'content-type: application/json' --data "$3")
    : >"$scratch/body"
    curl "${args[@]}" "http://127.0.0.1:$port$2" 2>/dev/null || true
}

# Reads the last response body with jq (its filter and options as arguments), raw.
body() {
    jq -r "$@" "$scratch/body"
}

# Starts container $1 from the image as a sidecar runs it, with extra podman flags after; sets `port` (the
# host's loopback port published for 8080) and `ready_ms` (from `podman run` to /readyz answering 200).
start() {
    local name=$1 started deadline
    shift
    started="$(now_ms)"
    # Without systemd, podman says on stderr that it cannot time the HEALTHCHECK; `podman healthcheck run` runs it.
    podman run -d --name "$name" -e TOOLNEXUS_ADMIN_TOKEN -v "$volume:/var/lib/toolnexus-gateway" \
        -p 127.0.0.1::8080 "$@" "$image" >/dev/null 2>"$scratch/run.log" || {
        cat "$scratch/run.log" >&2
        return 1
    }
    port="$(podman port "$name" 8080/tcp)"
    port="${port##*:}"
    deadline=$((started + 60000))
    until curl -sf --max-time 30 -o /dev/null "http://127.0.0.1:$port/readyz?wait=20"; do
        [[ "$(podman inspect -f '{{.State.Running}}' "$name")" == true && "$(now_ms)" -lt "$deadline" ]] || {
            podman logs "$name" 2>&1 | tail -20 >&2
            return 1
        }
        sleep 0.1
    done
    ready_ms=$(($(now_ms) - started))
}

# Lists container $1's processes, one per line sorted by pid: pid, parent pid, state, uids (real, effective,
# saved, file system), gids, command line. What `podman exec` starts (this listing among it) is left out.
processes() {
    podman exec "$1" sh -c 'for d in /proc/[0-9]*; do
        echo "@@ ${d#/proc/}"
        cat "$d/status"
        printf "Cmd:\t"
        tr "\0" " " <"$d/cmdline"
        echo
    done 2>/dev/null' | awk -F '\t' '
        /^@@ / { pid = substr($0, 4) }
        $1 == "State:" { state = substr($2, 1, 1) }
        $1 == "PPid:" { parent[pid] = $2 }
        $1 == "Uid:" { uid = $2 "," $3 "," $4 "," $5 }
        $1 == "Gid:" { gid = $2 "," $3 "," $4 "," $5 }
        $1 == "Cmd:" { sub(/ $/, "", $2); line[pid] = pid " " parent[pid] " " state " " uid " " gid " " $2 }
        END {
            for (p in line) {
                q = p
                while (q != 1 && q in parent && parent[q] != 0) q = parent[q]
                if (q == 1) print line[p]
            }
        }' | sort -n
}

# --- The checks -----------------------------------------------------------------------------------------

# The stand-in base images, made when missing.
check_bases() {
    local started made=()
    started="$(now_ms)"
    if ! podman image exists "docker.io/library/$debian_base"; then
        standin_debian || return 1
        made+=("$debian_base")
    fi
    if ! podman image exists "docker.io/library/$rust_base"; then
        standin_rust || return 1
        made+=("$rust_base")
    fi
    if [[ ${#made[@]} -gt 0 ]]; then
        detail="made ${made[*]} in $((($(now_ms) - started) / 1000)) s"
    else
        detail="$debian_base and $rust_base were there (stand-ins from an earlier run)"
    fi
}

# The Debian runtime base: a minbase root file system, slimmed as Debian's official slim images are.
standin_debian() {
    local root="$scratch/rootfs"
    debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$scratch/debootstrap.log" 2>&1 || {
        detail="debootstrap failed: $(tail -3 "$scratch/debootstrap.log" | tr '\n' ' ')"
        return 1
    }
    rm -f "$root/etc/apt/sources.list"
    cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror}-security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    # What Debian's official images (debuerreotype) set: no docs, man pages or translations, no apt caches.
    cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    echo 'Acquire::GzipIndexes "true";' >"$root/etc/apt/apt.conf.d/docker-gzip-indexes"
    echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
    echo 'Apt::AutoRemove::SuggestsImportant "false";' >"$root/etc/apt/apt.conf.d/docker-autoremove-suggests"
    cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/man/*
EOF
    find "$root/usr/share/doc" -mindepth 1 -not -type d -not -name copyright -delete
    find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
    rm -rf "$root"/usr/share/{groff,info,linda,lintian,man}/* "$root"/var/cache/apt/*.bin \
        "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log "$root"/var/log/apt/*
    # A whole archive first: an import fed by a tar that fails midway would tag half a file system.
    tar -C "$root" -cf "$scratch/rootfs.tar" . && rm -rf "$root"
    podman import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' \
        --change "LABEL org.opencontainers.image.description=\"stand-in for $debian_base made by scripts/check-container.sh\"" \
        "$scratch/rootfs.tar" "docker.io/library/$debian_base" >"$scratch/import.log" 2>&1 || {
        detail="podman import failed: $(tail -3 "$scratch/import.log" | tr '\n' ' ')"
        return 1
    }
    rm -f "$scratch/rootfs.tar"
}

# The Rust build base: the Debian one with gcc, libc6-dev, the machine's CA bundle (the build reaches the crate
# registry through the machine's certificate authorities) and the machine's toolchain, without its docs.
standin_rust() {
    local context="$scratch/rust"
    mkdir -p "$context/toolchain"
    cp -a "$sysroot/bin" "$sysroot/lib" "$context/toolchain/"
    cp /etc/ssl/certs/ca-certificates.crt "$context/"
    cat >"$context/Containerfile" <<EOF
FROM docker.io/library/$debian_base
RUN apt-get update \\
    && apt-get install -y --no-install-recommends ca-certificates gcc libc6-dev \\
    && rm -rf /var/lib/apt/lists/*
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY toolchain /usr/local
ENV CARGO_HOME=/usr/local/cargo RUST_VERSION=$rust_version \\
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LABEL org.opencontainers.image.description="stand-in for $rust_base made by scripts/check-container.sh"
EOF
    podman build --network host --pull=never --layers=false --format docker \
        -t "docker.io/library/$rust_base" "$context" >"$scratch/rust.log" 2>&1 || {
        detail="building the Rust stand-in failed: $(tail -3 "$scratch/rust.log" | tr '\n' ' ')"
        return 1
    }
    rm -rf "$context"
}

# The unchanged Dockerfile builds; the HEALTHCHECK survives (--format docker).
check_build() {
    local started
    started="$(now_ms)"
    podman build --network host --pull=never --layers=false --format docker -t "$image" . >"$scratch/build.log" 2>&1 || {
        detail="podman build failed: $(tail -5 "$scratch/build.log" | tr '\n' ' ')"
        return 1
    }
    detail="$image in $((($(now_ms) - started) / 1000)) s"
}

check_healthz() {
    local status
    status="$(api GET /healthz "" "")"
    [[ "$status" == 200 && "$(body .status)" == ok ]] || {
        detail="GET /healthz answered $status: $(cat "$scratch/body")"
        return 1
    }
    detail="GET /healthz (no token) 200 {\"status\":\"ok\"} on 127.0.0.1:$port"
}

check_readyz() {
    local status
    status="$(api GET '/readyz?wait=20' "" "")"
    [[ "$status" == 200 && "$(body .status)" == ready ]] || {
        detail="GET /readyz answered $status: $(cat "$scratch/body")"
        return 1
    }
    status="$(api GET /servers/demo)"
    [[ "$status" == 200 && "$(body .status)" == ready ]] || {
        detail="GET /servers/demo answered $status: $(cat "$scratch/body")"
        return 1
    }
    status="$(api GET "/sessions/$(body .session)")"
    [[ "$status" == 200 ]] || {
        detail="GET /sessions/… answered $status: $(cat "$scratch/body")"
        return 1
    }
    detail="GET /readyz 200 (no token), $ready_ms ms after podman run; the demo server ready, $(body .protocolVersion)"
}

# The engine runs the image's HEALTHCHECK and reports the container healthy.
check_healthcheck() {
    local test status
    test="$(podman inspect -f '{{json .Config.Healthcheck.Test}}' "$first")"
    [[ "$test" == *healthcheck* ]] || {
        detail="the container has no HEALTHCHECK from the image: $test"
        return 1
    }
    podman healthcheck run "$first" >"$scratch/health" 2>&1 || {
        detail="podman healthcheck run: $(cat "$scratch/health")"
        return 1
    }
    status="$(podman inspect -f '{{.State.Health.Status}}' "$first")"
    [[ "$status" == healthy ]] || {
        detail="the engine reports the container $status"
        return 1
    }
    detail="podman healthcheck run ran $test: $status"
}

# The API refuses a request without a token, or with a wrong one (401, problem+json); the admin token is let in.
check_token() {
    local status token
    for token in "" wrong; do
        status="$(api GET /requests "" "$token")"
        [[ "$status" == 401 && "$(body .status)" == 401 ]] || {
            detail="GET /requests with token '$token' answered $status: $(cat "$scratch/body")"
            return 1
        }
    done
    status="$(api GET /requests)"
    [[ "$status" == 200 ]] || {
        detail="GET /requests with the admin token answered $status: $(cat "$scratch/body")"
        return 1
    }
    detail="GET /requests: 401 without a token and with a wrong one, 200 with TOOLNEXUS_ADMIN_TOKEN"
}

# README's walkthrough: confirm_action waits on a Request, which is listed, answered, and the call completes.
check_walkthrough() {
    local status call request
    status="$(api POST '/calls?wait=10' '{"server": "demo", "tool": "confirm_action", "arguments": {"action": "deploy"}}')"
    [[ "$status" == 20[01] && "$(body .status)" == input_required ]] || {
        detail="POST /calls answered $status: $(cat "$scratch/body")"
        return 1
    }
    call="$(body .id)"
    request="$(body '.requests[0]')"
    api GET /requests >/dev/null
    # shellcheck disable=SC2016 # a jq variable
    [[ "$(body --arg id "$request" '.[] | select(.id == $id) | .prompt')" == "Confirm: deploy?" ]] || {
        detail="GET /requests does not list $request: $(cat "$scratch/body")"
        return 1
    }
    status="$(api POST "/requests/$request/answer?wait=10" '{"ok": true, "data": {"confirm": true}}')"
    [[ "$status" == 200 && "$(body .resumedCall.status)" == completed &&
        "$(body -c .resumedCall.result.structuredContent)" == '{"results":[{"action":"accept","content":{"confirm":true,"note":""}}]}' ]] || {
        detail="answering $request answered $status: $(cat "$scratch/body")"
        return 1
    }
    detail="POST /calls confirm_action: input_required, $request listed, answered: $call completed"
}

# The image's user, and every process of the container running as it.
check_user() {
    local configured list others
    configured="$(podman image inspect -f '{{.Config.User}}' "$image")"
    [[ "$configured" == 10001:10001 ]] || {
        detail="the image's USER is $configured"
        return 1
    }
    list="$(processes "$first")"
    others="$(awk '$4 != "10001,10001,10001,10001" || $5 != "10001,10001,10001,10001"' <<<"$list")"
    [[ -n "$list" && -z "$others" ]] || {
        detail="processes not running as uid and gid 10001: $(tr '\n' ';' <<<"${others:-none listed}")"
        return 1
    }
    detail="USER $configured; its $(wc -l <<<"$list") processes run as uid 10001, gid 10001 (real, effective, saved)"
}

# tini is process 1, the gateway its child, the demo server the gateway's, and nothing else runs.
check_tini() {
    local list gateway demo
    list="$(processes "$first")"
    gateway="$(awk '$2 == 1 && $6 == "/usr/local/bin/toolnexus-gateway" { print $1 }' <<<"$list")"
    demo="$(awk -v g="$gateway" '$2 == g && $6 " " $7 == "/usr/local/bin/toolnexus-gateway demo-server" { print $1 }' <<<"$list")"
    [[ "$(awk '$1 == 1 { print $6 " " $7 " " $8 }' <<<"$list")" == "/usr/bin/tini -- /usr/local/bin/toolnexus-gateway" &&
        -n "$gateway" && -n "$demo" && "$(wc -l <<<"$list")" == 3 ]] || {
        detail="expected tini → gateway → demo-server, found: $(tr '\n' ';' <<<"$list")"
        return 1
    }
    detail="pid 1 /usr/bin/tini → pid $gateway toolnexus-gateway → pid $demo demo-server, nothing else"
}

# The store is on the named volume, which belongs to the gateway's user.
check_volume() {
    local mounted mountpoint owner
    mounted="$(podman inspect -f '{{range .Mounts}}{{.Name}}:{{.Destination}} {{end}}' "$first")"
    [[ " $mounted " == *" $volume:/var/lib/toolnexus-gateway "* ]] || {
        detail="the volume is not mounted at /var/lib/toolnexus-gateway: $mounted"
        return 1
    }
    mountpoint="$(podman volume inspect -f '{{.Mountpoint}}' "$volume")"
    owner="$(stat -c '%u:%g %a' "$mountpoint") $(stat -c '%u:%g' "$mountpoint/gateway.sqlite3" 2>&1)"
    [[ "$owner" == "10001:10001 750 10001:10001" ]] || {
        detail="the volume's directory and gateway.sqlite3 (owner, mode): $owner"
        return 1
    }
    detail="volume $volume at /var/lib/toolnexus-gateway (10001:10001, 0750) holds gateway.sqlite3"
}

# The demo server exits in the middle of a call (its `crash` tool): the gateway reaps it and starts it again,
# and no zombie is left in the container.
check_reaped() {
    local list demo status call deadline zombies again
    list="$(processes "$first")"
    demo="$(awk '/ demo-server$/ { print $1 }' <<<"$list")"
    status="$(api POST '/calls?wait=10' '{"server": "demo", "tool": "crash", "arguments": {}}')"
    [[ "$status" == 20[01] ]] || {
        detail="POST /calls crash answered $status: $(cat "$scratch/body")"
        return 1
    }
    call="$(body .id)"
    deadline=$(($(now_ms) + 30000))
    until [[ "$(api GET /servers/demo)" == 200 && "$(body .restarts)" -ge 1 && "$(body .status)" == ready ]]; do
        [[ "$(now_ms)" -lt "$deadline" ]] || {
            detail="the demo server was not started again within 30 s: $(cat "$scratch/body")"
            return 1
        }
        sleep 0.1
    done
    list="$(processes "$first")"
    zombies="$(awk '$3 == "Z"' <<<"$list")"
    again="$(awk '/ demo-server$/ { print $1 }' <<<"$list")"
    [[ -z "$zombies" && -n "$again" && "$again" != "$demo" ]] || {
        detail="after the demo server (pid $demo) exited: $(tr '\n' ';' <<<"$list")"
        return 1
    }
    podman logs "$first" 2>&1 | grep -q 'demo-server: crash: exiting' || {
        detail="the demo server's exit is not in the logs"
        return 1
    }
    status="$(api DELETE "/calls/$call")"
    [[ "$status" == 2* ]] || {
        detail="DELETE /calls/$call answered $status: $(cat "$scratch/body")"
        return 1
    }
    detail="demo-server (pid $demo) exited mid-call; reaped, started again (pid $again); no zombie among $(wc -l <<<"$list") processes"
}

pending_call=""
pending_request=""
pending_session=""

# Leaves a 2026-07-28 call waiting on its Request, for the next container to find.
leave_pending() {
    local status
    status="$(api POST '/calls?wait=10' '{"server": "demo", "tool": "confirm_action", "arguments": {"action": "survive"}}')"
    if [[ "$status" == 20[01] && "$(body .status)" == input_required ]]; then
        pending_call="$(body .id)"
        pending_request="$(body '.requests[0]')"
        pending_session="$(body .session)"
    else
        pending_call="POST /calls answered $status: $(cat "$scratch/body")"
    fi
}

# `podman stop` (SIGTERM) ends the gateway within the grace period: it closes its sessions, reaps the demo
# server, logs `stopped` and exits 0 (tini passes the status on), and no process of the container outlives it.
check_stop() {
    local pids pid started elapsed code left=()
    mapfile -t pids < <(podman top "$first" hpid | tail -n +2)
    started="$(now_ms)"
    podman stop --time "$grace" "$first" >/dev/null 2>"$scratch/stop.log" || {
        detail="podman stop: $(cat "$scratch/stop.log")"
        return 1
    }
    elapsed=$(($(now_ms) - started))
    code="$(podman inspect -f '{{.State.ExitCode}}' "$first")"
    for pid in "${pids[@]}"; do
        [[ -e "/proc/$pid" ]] && left+=("$pid")
    done
    [[ "$code" == 0 && "$elapsed" -lt $((grace * 1000)) && ${#left[@]} == 0 ]] || {
        detail="exit status $code after $elapsed ms; processes left (host pids): ${left[*]:-none}"
        return 1
    }
    podman logs "$first" 2>&1 | tail -1 | grep -q 'INFO toolnexus_gateway: stopped$' || {
        detail="the gateway's last log line is not 'stopped': $(podman logs "$first" 2>&1 | tail -1)"
        return 1
    }
    detail="exit status 0 after $elapsed ms (grace $grace s), the gateway's last log line 'stopped'; none of its ${#pids[@]} processes left"
}

# The second container runs with a read-only root file system: only the volume takes writes.
check_read_only() {
    local path refused=()
    [[ "$(podman inspect -f '{{.HostConfig.ReadonlyRootfs}}' "$second")" == true ]] || {
        detail="the container is not read-only"
        return 1
    }
    for path in / /etc /tmp /var/tmp /var/lib /usr/local/bin; do
        if podman exec --user 0 "$second" touch "$path/.written" 2>"$scratch/touch"; then
            detail="root can write to $path"
            return 1
        fi
        grep -q 'Read-only file system' "$scratch/touch" || {
            detail="writing to $path: $(cat "$scratch/touch")"
            return 1
        }
        refused+=("$path")
    done
    podman exec "$second" sh -c 'touch /var/lib/toolnexus-gateway/.written && rm /var/lib/toolnexus-gateway/.written' \
        2>"$scratch/touch" || {
        detail="the gateway's user cannot write to the volume: $(cat "$scratch/touch")"
        return 1
    }
    detail="--read-only: ${refused[*]} refused (even to root), the volume writable"
}

# The second container, on the first one's volume, still holds its pending 2026-07-28 Request; answered, the
# call completes.
check_restart() {
    local status
    [[ -n "$pending_request" ]] || {
        detail="no pending Request was left: $pending_call"
        return 1
    }
    status="$(api GET "/sessions/$pending_session")"
    [[ "$status" == 200 && "$(body .protocolVersion)" == 2026-07-28 ]] || {
        detail="GET /sessions/$pending_session (the call's session, to be 2026-07-28) answered $status: $(cat "$scratch/body")"
        return 1
    }
    status="$(api GET "/requests/$pending_request")"
    [[ "$status" == 200 && "$(body .status)" == pending ]] || {
        detail="GET /requests/$pending_request answered $status: $(cat "$scratch/body")"
        return 1
    }
    status="$(api POST "/requests/$pending_request/answer?wait=10" '{"ok": true, "data": {"confirm": true}}')"
    [[ "$status" == 200 && "$(body .resumedCall.id)" == "$pending_call" && "$(body .resumedCall.status)" == completed &&
        "$(body -c .resumedCall.result.structuredContent)" == '{"results":[{"action":"accept","content":{"confirm":true,"note":""}}]}' ]] || {
        detail="answering $pending_request answered $status: $(cat "$scratch/body")"
        return 1
    }
    detail="2026-07-28 $pending_request still pending after the stop; answered: $pending_call completed"
}

# The run's containers, volume and image are gone; only the stand-in bases stay.
check_clean() {
    local code left
    podman stop --time "$grace" "$second" >/dev/null 2>&1 || true
    code="$(podman inspect -f '{{.State.ExitCode}}' "$second" 2>/dev/null || echo none)"
    podman rm --force --ignore "$first" "$second" >/dev/null 2>&1 || true
    podman volume rm --force "$volume" >/dev/null 2>&1 || true
    podman rmi --force "$image" >/dev/null 2>&1 || true
    left="$(
        podman ps -a --format '{{.Names}}' | grep "^$prefix" || true
        podman volume ls --format '{{.Name}}' | grep "^$prefix" || true
        comm -13 <(echo "$images_before") <(podman images -a -q --no-trunc | sort -u)
    )"
    [[ -z "$left" && "$code" == 0 ]] || {
        detail="the second container exited $code; left behind: $(tr '\n' ' ' <<<"$left")"
        return 1
    }
    detail="the second container stopped with 0; containers, volume and image removed; the stand-ins stay"
}

# --- The run --------------------------------------------------------------------------------------------

# Runs a check that the ones after it need; without it, the rest are reported as not run.
require() {
    check "$1" || finish "$2"
}

# Runs a check; the run goes on whatever its outcome.
check_on() {
    check "$1" || true
}

echo "podman $(podman version -f '{{.Client.Version}}'), $(runc --version | head -1), $suite, Rust $rust_version from $sysroot"
require bases "the base images are missing"
# A stale image from an interrupted run must not pass for this build.
podman rmi --force "$image" >/dev/null 2>&1 || true
images_before="$(podman images -a -q --no-trunc | sort -u)"
require build "the image did not build"
echo "image: $image, $(podman image inspect -f '{{.Size}}' "$image" | awk '{ printf "%.1f MB", $1 / 1e6 }')"

podman volume create "$volume" >/dev/null
start "$first" || true
echo "ready: $first (new volume) in ${ready_ms:-(never)} ms"
require healthz "the container does not answer"
check_on readyz
check_on healthcheck
check_on token
check_on walkthrough
check_on user
check_on tini
check_on volume
check_on reaped
leave_pending
check_on stop
# Whatever its stop did, the first container lets go of the store before the second opens it.
podman rm --force --ignore --time 0 "$first" >/dev/null 2>&1 || true

ready_ms=""
start "$second" --read-only --read-only-tmpfs=false || true
echo "ready: $second (same volume, read-only) in ${ready_ms:-(never)} ms"
check_on read-only
check_on restart
check_on clean
finish "an earlier check fell short"
