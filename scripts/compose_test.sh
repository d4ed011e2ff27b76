#!/usr/bin/env bash
# make compose-test: the docker-compose federation, for real, on a Docker host that reaches no image
# registry and gives containers host networking only (docs/deployment.md, "Running it for real").
#
#  1. images: a Debian bookworm minbase rootfs (debootstrap) `docker import`ed as
#     fedlora-base:bookworm; fedlora-flwr:1.41.0 (docker/Dockerfile.flwr-local), the stand-in for
#     flwr/superlink, flwr/supernode and flwr/superexec; fedlora-dp:local from ./Dockerfile on top.
#     Wheels are downloaded on the host into a wheelhouse and installed with pip --no-index.
#  2. docker-compose.yml + docker-compose.local.yml (host network): SuperLink, ServerApp SuperExec,
#     3 SuperNodes and their ClientApp SuperExecs; fresh volumes (project fedlora-compose-test).
#  3. run 1: a private federation (dp-fedavg, target epsilon 8) with `flwr run`; it must complete.
#  4. `down` (volumes kept), `up`: run 1's directory and the node ledgers must still be there.
#  5. run 2: supernode-3's container is killed (docker kill) mid-run; the run must complete with
#     the two survivors.
# Timings of each step are printed at the end. Needs root (debootstrap, docker), a running dockerd.
#
# Knobs (environment): COMPOSE_BUILD_DIR (rootfs, wheelhouse, logs; default
# ${XDG_CACHE_HOME:-~/.cache}/fedlora-compose), DOCKER, COMPOSE (docker-compose v1, default
# .venv/compose-v1/bin/docker-compose), FLWR (the flwr CLI), VENV_PYTHON (a Python 3.11 with pip, for
# the wheelhouse), DEBIAN_MIRROR, WHEELS_PORT (8765), LOCAL_SUPERLINK_PORT (8000), REBUILD=1
# (rebuild the images), KEEP_UP=1 (leave the federation running at the end).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
B=${COMPOSE_BUILD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fedlora-compose}
DOCKER=${DOCKER:-docker}
COMPOSE=${COMPOSE:-$ROOT/.venv/compose-v1/bin/docker-compose}
FLWR=${FLWR:-$ROOT/.venv/bin/flwr}
VENV_PYTHON=${VENV_PYTHON:-$ROOT/.venv/bin/python}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WHEELS_PORT=${WHEELS_PORT:-8765}
export LOCAL_SUPERLINK_PORT=${LOCAL_SUPERLINK_PORT:-8000}
export COMPOSE_PROJECT_NAME=fedlora-compose-test
# Creating a container from the 2 GB app image copies it in full under the vfs storage driver:
# minutes on 2 busy cores, past docker-compose's default 60 s API read timeout.
export COMPOSE_HTTP_TIMEOUT=${COMPOSE_HTTP_TIMEOUT:-900}
FLWR_IMG=fedlora-flwr:1.41.0
APP_IMG=fedlora-dp:local
CONN=fedlora-docker
mkdir -p "$B/logs"
LOG=$B/logs

# docker-compose v1 refuses a published port in host network mode ('"host" network_mode is
# incompatible with port_bindings'), and an override cannot remove the base file's `ports:` (v1
# merges the lists; v2's !reset does not exist in v1). So the merged configuration is written out
# once with the `ports:` of host-network services dropped, and every compose call uses it.
MERGED=$B/docker-compose.merged.yml
dc() { "$COMPOSE" -f "$MERGED" "$@"; }
say() { printf '[compose-test %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { say "FAILED: $*"; exit 1; }
TIMES=()
T0=$SECONDS
step_start() { STEP=$1; TS=$SECONDS; say "== $STEP"; }
step_end() { TIMES+=("$(printf '%-44s %5d s' "$STEP" $((SECONDS - TS)))"); }

for tool in "$COMPOSE" "$FLWR" "$VENV_PYTHON"; do
    [ -x "$tool" ] || die "$tool missing (make install compose-install, or set COMPOSE/FLWR/VENV_PYTHON)"
done
"$DOCKER" info >/dev/null 2>&1 || die "no Docker engine answers '$DOCKER info'"

# --- 1. images ----------------------------------------------------------------------------------
step_start "base image (debootstrap + docker import)"
if [ -n "${REBUILD:-}" ] || ! "$DOCKER" image inspect fedlora-base:bookworm >/dev/null 2>&1; then
    if [ ! -x "$B/rootfs/usr/bin/python3" ]; then
        rm -rf "$B/rootfs"
        debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
            bookworm "$B/rootfs" "$DEBIAN_MIRROR" >"$LOG/debootstrap.log" 2>&1 \
            || die "debootstrap (see $LOG/debootstrap.log)"
    fi
    rm -rf "$B/rootfs/var/cache/apt/archives/"*.deb "$B/rootfs/var/lib/apt/lists/"*
    tar -C "$B/rootfs" -c . | "$DOCKER" import - fedlora-base:bookworm >/dev/null
fi
step_end

step_start "wheelhouse (pip wheel on the host)"
if [ ! -f "$B/wheels/.complete" ]; then
    rm -rf "$B/wheels" "$B/stub" && mkdir -p "$B/wheels" "$B/stub"
    # The Dockerfile's stub install: the dependencies of pyproject.toml (flwr without [simulation]).
    cp pyproject.toml constraints.txt requirements-assets.txt README.md "$B/stub/"
    sed -i 's/"flwr\[simulation\]==/"flwr==/' "$B/stub/pyproject.toml"
    for p in server client common autoencoder; do mkdir -p "$B/stub/$p" && touch "$B/stub/$p/__init__.py"; done
    (cd "$B/stub" && "$VENV_PYTHON" -m pip wheel -q -w "$B/wheels" -c constraints.txt . \
        && "$VENV_PYTHON" -m pip wheel -q --no-deps -w "$B/wheels" -r requirements-assets.txt \
        && "$VENV_PYTHON" -m pip download -q --only-binary :all: -d "$B/wheels" hatchling) \
        >"$LOG/wheels.log" 2>&1 || die "pip wheel (see $LOG/wheels.log)"  # hatchling: the build backend
    rm -f "$B/wheels"/fedlora_dp-*.whl
    touch "$B/wheels/.complete"
fi
step_end

# The wheelhouse is served to `docker build --network host` on loopback; pip runs --no-index.
"$VENV_PYTHON" -m http.server --bind 127.0.0.1 --directory "$B/wheels" "$WHEELS_PORT" \
    >"$LOG/wheels-http.log" 2>&1 &
HTTP_PID=$!
cleanup() {
    kill "$HTTP_PID" 2>/dev/null || true
    if [ -z "${KEEP_UP:-}" ]; then dc down >>"$LOG/compose.log" 2>&1 || true; fi
}
trap cleanup EXIT
sleep 1
WHEELS_URL=http://127.0.0.1:$WHEELS_PORT/

step_start "image $FLWR_IMG (Flower stand-in)"
if [ -n "${REBUILD:-}" ] || ! "$DOCKER" image inspect "$FLWR_IMG" >/dev/null 2>&1; then
    "$DOCKER" build --network host -f docker/Dockerfile.flwr-local --build-arg WHEELS_URL="$WHEELS_URL" \
        -t "$FLWR_IMG" docker >"$LOG/build-flwr.log" 2>&1 || die "docker build $FLWR_IMG (see $LOG/build-flwr.log)"
fi
step_end

step_start "image $APP_IMG (./Dockerfile)"
"$DOCKER" build --network host --build-arg SUPEREXEC_IMAGE="$FLWR_IMG" \
    --build-arg PIP_OPTS="--no-index --find-links $WHEELS_URL" -t "$APP_IMG" . \
    >"$LOG/build-app.log" 2>&1 || die "docker build $APP_IMG (see $LOG/build-app.log)"
tail -n 3 "$LOG/build-app.log"
step_end
kill "$HTTP_PID" 2>/dev/null || true

# --- 2. the federation --------------------------------------------------------------------------
"$COMPOSE" -f docker-compose.yml -f docker-compose.local.yml config >"$MERGED.tmp"
"$VENV_PYTHON" - "$MERGED.tmp" "$MERGED" <<'PY'
import sys

import yaml

cfg = yaml.safe_load(open(sys.argv[1]))
for name, service in cfg["services"].items():
    if service.get("network_mode") == "host" and service.pop("ports", None):
        print(f"{name}: ports dropped (host network: the process binds the host's port itself)")
yaml.safe_dump(cfg, open(sys.argv[2], "w"), sort_keys=False)
PY
rm -f "$MERGED.tmp"
export FLWR_HOME="$B/flwr-home"
mkdir -p "$FLWR_HOME"
cat >"$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "$CONN"

[superlink.$CONN]
address = "127.0.0.1:$LOCAL_SUPERLINK_PORT"
insecure = true
EOF
export FLWR_DISABLE_UPDATE_CHECK=1

flwr_json() { # flwr ARGS --format json; the JSON object only
    "$FLWR" "$@" --format json 2>/dev/null | "$VENV_PYTHON" -c \
        'import sys; s = sys.stdin.read(); print(s[s.index("{"): s.rindex("}") + 1])'
}
online_nodes() {
    flwr_json supernode list "$CONN" | "$VENV_PYTHON" -c \
        'import json, sys; print(sum(n.get("status") == "online" for n in json.load(sys.stdin).get("nodes", [])))' \
        2>/dev/null || echo 0
}
wait_nodes() { # wait_nodes N: until N SuperNodes are online (5 min)
    local t=$SECONDS
    until [ "$(online_nodes)" -ge "$1" ]; do
        [ $((SECONDS - t)) -lt 300 ] || { dc ps; dc logs --tail 20; die "$1 SuperNodes not online after 300 s"; }
        sleep 3
    done
    say "$(online_nodes) SuperNodes online"
}
run_status() { # run_status ID: e.g. finished:completed
    flwr_json list "$CONN" --run-id "$1" | "$VENV_PYTHON" -c \
        'import json, sys; r = json.load(sys.stdin)["runs"][0]; print(r["status"], "|", r.get("status-details", ""))'
}
submit() { # submit NAME EXTRA: a private run writing /app/runs/NAME; prints its run id
    local cfg="$B/run-$1.toml"
    cat >"$cfg" <<EOF
preset = "small"
num-clients = 3
rounds = $2
sample-rate = 1.0
local-steps = 5
eval-examples = 100
mechanism = "dp-fedavg"
target-epsilon = 8.0
out-dir = "/app/runs/$1"
EOF
    flwr_json run . "$CONN" --run-config "$cfg" | "$VENV_PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["run-id"])'
}
wait_run() { # wait_run ID LOGFILE [TIMEOUT]: until the run has finished; its status line
    "$FLWR" log "$1" "$CONN" --stream >"$2" 2>&1 &
    local follower=$! t=$SECONDS st
    while :; do
        st=$(run_status "$1" 2>/dev/null || echo "unknown |")
        case "$st" in finished*) break ;; esac
        [ $((SECONDS - t)) -lt "${3:-1500}" ] || { kill $follower 2>/dev/null; die "run $1 not finished after ${3:-1500} s ($st)"; }
        sleep 5
    done
    sleep 2; kill $follower 2>/dev/null || true
    echo "$st"
}
volume_ls() { # volume_ls VOLUME: its files, from a throwaway container
    "$DOCKER" run --rm --network host --entrypoint /bin/sh -v "${COMPOSE_PROJECT_NAME}_$1:/v" "$FLWR_IMG" \
        -c 'cd /v && find . -type f | sort'
}

step_start "compose up (fresh volumes) + 3 nodes online"
dc down -v >"$LOG/compose.log" 2>&1 || true
dc up -d --no-build >>"$LOG/compose.log" 2>&1 || { cat "$LOG/compose.log"; die "compose up"; }
dc ps
wait_nodes 3
step_end

# --- 3. run 1 -----------------------------------------------------------------------------------
step_start "run 1: private federation, 3 nodes, 2 rounds"
RUN1=$(submit run1 2)
say "run 1 id $RUN1"
ST1=$(wait_run "$RUN1" "$LOG/run1.log")
say "run 1: $ST1"
grep -E '^\[run\]|round|epsilon|eps' "$LOG/run1.log" | tail -n 15 || true
case "$ST1" in finished:completed*) ;; *) dc logs --tail 40 superexec-serverapp; die "run 1 $ST1" ;; esac
step_end

say "run directory and node ledgers (server-runs, node-K-state volumes):"
volume_ls server-runs | tee "$LOG/runs-before.txt"
for k in 1 2 3; do volume_ls "node-$k-state" | sed "s|^|node-$k-state: |"; done | tee "$LOG/nodes-before.txt"
grep -q '^./run1/' "$LOG/runs-before.txt" || die "no run1 directory in the server-runs volume"
[ "$(grep -c . "$LOG/nodes-before.txt")" -ge 3 ] || die "node state volumes are (partly) empty"

# --- 4. down / up -------------------------------------------------------------------------------
step_start "down (volumes kept) + up + 3 nodes online"
dc down >>"$LOG/compose.log" 2>&1
dc up -d --no-build >>"$LOG/compose.log" 2>&1 || die "compose up after down"
wait_nodes 3
step_end
volume_ls server-runs >"$LOG/runs-after.txt"
for k in 1 2 3; do volume_ls "node-$k-state" | sed "s|^|node-$k-state: |"; done >"$LOG/nodes-after.txt"
diff "$LOG/runs-before.txt" "$LOG/runs-after.txt" || die "the server-runs volume changed across down/up"
diff "$LOG/nodes-before.txt" "$LOG/nodes-after.txt" || die "a node-K-state volume changed across down/up"
flwr_json list "$CONN" | "$VENV_PYTHON" -c \
    'import json, sys; print("SuperLink state after down/up:", [(r["run-id"], r["status"]) for r in json.load(sys.stdin)["runs"]])'
say "run directory, node ledgers and SuperLink state survived down/up"

# --- 5. run 2, one SuperNode killed -------------------------------------------------------------
step_start "run 2: supernode-3 killed mid-run, 2 rounds"
RUN2=$(submit run2 2)
say "run 2 id $RUN2"
# Kill once the ServerApp logs round 1 (its progress or its result line), so round 2 (or the rest
# of round 1) runs without node 3: the SuperLink answers its messages "Node Unavailable" once its
# heartbeat lapses, a dropout.
"$FLWR" log "$RUN2" "$CONN" --stream >"$LOG/run2-kill.log" 2>&1 &
FOLLOW=$!
t=$SECONDS
until grep -q -E 'round 1[: ]' "$LOG/run2-kill.log"; do
    [ $((SECONDS - t)) -lt 900 ] || die "run 2 showed no round 1 within 900 s"
    sleep 2
done
kill $FOLLOW 2>/dev/null || true
"$DOCKER" kill "${COMPOSE_PROJECT_NAME}_supernode-3_1" >/dev/null
say "killed supernode-3 (docker kill) after round 1: $(grep -m1 -E 'round 1[: ]' "$LOG/run2-kill.log" | cut -c1-150)"
"$DOCKER" ps -a --filter "name=${COMPOSE_PROJECT_NAME}_supernode-3_1" --format '{{.Names}}: {{.Status}}'
ST2=$(wait_run "$RUN2" "$LOG/run2.log")
say "run 2: $ST2"
grep -E 'round|dropout|navailable|eps' "$LOG/run2.log" | tail -n 20 || true
case "$ST2" in finished:completed*) ;; *) die "run 2 $ST2" ;; esac
step_end

say "PASS"
printf '%s\n' "${TIMES[@]}" "$(printf '%-44s %5d s' total $((SECONDS - T0)))"
