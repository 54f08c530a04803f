#!/usr/bin/env bash
# Set up and run mbuild's tests on a fresh machine: a venv with the build extras, a Docker engine,
# podman, buildah, skopeo, umoci, runc, a local registry and a local Python base image (no outside
# registry needed). Extra arguments go to pytest.
#
# Every run starts from fresh state: a new HOME, new containers-storage (podman and buildah, one
# storage.conf for every call, probes included), a new Docker data root, new registry storage and new
# mbuild caches, all under one folder made for this run and removed after it. Only two things are
# reused between runs, on purpose: the base image `mbuild base` made from the Debian mirror
# (MBUILD_CI_CACHE) and pip's download cache. So a setup step that is missing fails here instead of passing on leftovers.
set -euo pipefail
cd "$(dirname "$0")/.."

STATE_PARENT="${MBUILD_TEST_STATE_PARENT:-/var/tmp}"
# dockerd can leave its namespace and overlay mounts behind in a run's folder; they would keep it busy.
unmount_state() { grep -o " $1/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true; }
# A run that was killed (SIGKILL, a lost machine) never cleaned up after itself; its folder holds gigabytes of
# images and engines. Remove the folders whose run is gone.
for old in "$STATE_PARENT"/mbuild-test-state.*; do
  if [ -f "$old/owner.pid" ] && ! kill -0 "$(cat "$old/owner.pid")" 2>/dev/null; then
    echo "removing $old, left by a run that is gone"
    unmount_state "$old"
    rm -rf "$old"
  fi
done
# A full disk would fail hundreds of tests at once with "No space left on device"; say so before starting.
# A run peaks at about 12 GB here besides the venv (images in vfs storage, Docker's data, engines, the registry).
NEED_GB="${MBUILD_TEST_MIN_FREE_GB:-12}"
for dir in . "$STATE_PARENT"; do
  FREE_GB="$(df -Pk "$dir" | awk 'NR == 2 {print int($4 / 1048576)}')"
  if [ "$FREE_GB" -lt "$NEED_GB" ]; then
    echo "tests/run.sh: $FREE_GB GB free on the disk of $(cd "$dir" && pwd); a test run needs about $NEED_GB GB." >&2
    echo "Free some space, or set MBUILD_TEST_STATE_PARENT to a folder on a larger disk." >&2
    exit 1
  fi
done

PY="${PYTHON:-python3}"
# The CPU build of torch; set MBUILD_TORCH_SPEC (and PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)
# where plain PyPI would hand out a CUDA build.
TORCH_SPEC="${MBUILD_TORCH_SPEC:-torch==2.13.0}"
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

[ -x .venv/bin/python ] || "$PY" -m venv .venv
"${PIP[@]}" --upgrade pip
"${PIP[@]}" "$TORCH_SPEC"
"${PIP[@]}" -e ".[export,dev,dynamo,bench]"
# Dynamo's frontend and backend SDK; --no-deps past its placeholder dependency (pyproject.toml's dynamo extra)
"${PIP[@]}" --no-deps "ai-dynamo==1.6.1"
# TensorRT's type stubs, so mypy checks the TensorRT module against the real API; --no-deps because the
# stubs' own dependency is NVIDIA's runtime library, which only installs where a GPU and its index are.
"${PIP[@]}" --no-deps "tensorrt-stubs==10.13.0.35.1"

# Container tests need the real tools. Install and start them where we can (root); elsewhere those
# tests say why they skip.
TOOLS=(dockerd:docker.io mmdebstrap:mmdebstrap skopeo:skopeo umoci:umoci runc:runc
       docker-registry:docker-registry buildah:buildah podman:podman)
MISSING=()
for pair in "${TOOLS[@]}"; do command -v "${pair%%:*}" >/dev/null || MISSING+=("${pair##*:}"); done
# The Helm chart test renders with Go's text/template and sprig, what Helm is made of (no helm binary
# installs here: it is on none of PyPI, npm or Debian 12).
HELM_RENDER=(golang-go golang-github-masterminds-sprig-dev golang-github-ghodss-yaml-dev)
[ -d /usr/share/gocode/src/github.com/Masterminds/sprig ] && [ -d /usr/share/gocode/src/github.com/ghodss/yaml ] \
  && command -v go >/dev/null || MISSING+=("${HELM_RENDER[@]}")
# The ServiceMonitor test validates with the Prometheus operator's schema, compiled for node (npm).
command -v node >/dev/null && command -v npm >/dev/null || MISSING+=(nodejs npm)
if [ "$(id -u)" = 0 ] && [ ${#MISSING[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${MISSING[@]}" >/dev/null
fi
if [ "$(id -u)" = 0 ]; then export MBUILD_REQUIRE_DEPLOY_TOOLS=1; fi

# What may be reused, resolved against the real HOME before it is replaced.
export MBUILD_CI_CACHE="${MBUILD_CI_CACHE:-$HOME/.cache/mbuild-ci}"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$HOME/.cache/pip}"
STATE="$(mktemp -d "$STATE_PARENT/mbuild-test-state.XXXXXX")"
chmod 755 "$STATE"
echo $$ >"$STATE/owner.pid"
STARTED=()  # pid files of the services this run started
cleanup() {
  local code=$?
  for pidfile in "${STARTED[@]}"; do
    if [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null; then
      timeout 30 tail --pid="$(cat "$pidfile")" -f /dev/null || true
    fi
  done
  unmount_state "$STATE"
  if [ "${MBUILD_KEEP_TEST_STATE:-0}" = 1 ]; then
    rm -f "$STATE/owner.pid"  # kept on purpose: the next run does not sweep it
    echo "test state kept in $STATE"
  else
    rm -rf "$STATE"
  fi
  exit "$code"
}
trap cleanup EXIT

export HOME="$STATE/home"
export MBUILD_CACHE="$STATE/mbuild-cache"
mkdir -p "$HOME" "$MBUILD_CACHE"
echo "fresh state for this run in $STATE:"
echo "  HOME=$HOME  MBUILD_CACHE=$MBUILD_CACHE  pytest --basetemp=$STATE/pytest"
echo "  reused: base image cache $MBUILD_CI_CACHE, pip cache $PIP_CACHE_DIR"

# ruff and mypy (a minute on 2 cores) run while the Docker engine, the registry and the base image come up;
# pytest starts only once they have passed.
LINT_LOG="$STATE/lint.log"
(.venv/bin/ruff check builder runtimes tests bench && .venv/bin/mypy builder runtimes tests bench) >"$LINT_LOG" 2>&1 &
LINT=$!

# podman and buildah: one storage.conf (driver, graph root, run root) and one containers.conf for every
# call, so the first probe cannot set up the storage database with another driver than later builds use.
CS="$STATE/containers"
mkdir -p "$CS/graph" "$CS/run" "$CS/tmp"
export MBUILD_CONTAINERS_STORAGE_DRIVER="${MBUILD_CONTAINERS_STORAGE_DRIVER:-vfs}"  # works in any VM
cat >"$CS/storage.conf" <<CONF
[storage]
driver = "$MBUILD_CONTAINERS_STORAGE_DRIVER"
graphroot = "$CS/graph"
runroot = "$CS/run"
CONF
cat >"$CS/containers.conf" <<CONF
[engine]
tmp_dir = "$CS/tmp"
events_logger = "file"
events_logfile_path = "$CS/events.log"
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
export CONTAINERS_STORAGE_CONF="$CS/storage.conf" CONTAINERS_CONF="$CS/containers.conf"
echo "  containers-storage: $CONTAINERS_STORAGE_CONF (driver $MBUILD_CONTAINERS_STORAGE_DRIVER, graph root $CS/graph)"

if [ "$(id -u)" = 0 ]; then
  # Our own engine and registry, on fresh roots, even where others already run.
  export MBUILD_CI_DOCKER="$STATE/docker" MBUILD_CI_DOCKER_DATA="$STATE/docker-data"
  export DOCKER_HOST="unix://$MBUILD_CI_DOCKER/docker.sock"
  if command -v dockerd >/dev/null; then
    bash .ci/start-dockerd.sh
    STARTED+=("$MBUILD_CI_DOCKER/dockerd.pid")
  fi
  if command -v docker-registry >/dev/null; then
    export MBUILD_CI_REGISTRY="$STATE/registry"
    MBUILD_TEST_REGISTRY="127.0.0.1:$(.venv/bin/python -c 'from tests.support.net import free_port; print(free_port())')"
    export MBUILD_TEST_REGISTRY
    bash .ci/start-registry.sh
    STARTED+=("$MBUILD_CI_REGISTRY/registry.pid")
  fi
  echo "  docker data root $MBUILD_CI_DOCKER_DATA, registry storage ${MBUILD_CI_REGISTRY:-none} at ${MBUILD_TEST_REGISTRY:-none}"
fi
if docker info >/dev/null 2>&1; then
  export MBUILD_TEST_BASE_OCI_DIR="$STATE/base-oci"
  bash .ci/local-base-image.sh "${MBUILD_TEST_BASE_IMAGE:-mbuild-local/python:3.11-bookworm}"
  export MBUILD_TEST_BASE_OCI="oci:$MBUILD_TEST_BASE_OCI_DIR:bookworm"
  MBUILD_TEST_BASE_MBUILD="$(MBUILD_CACHE="$MBUILD_CI_CACHE/mbuild" .venv/bin/mbuild base 2>/dev/null)"  # cached: instant
  export MBUILD_TEST_BASE_MBUILD
  export MBUILD_REQUIRE_CONTAINERS=1
fi

if ! wait "$LINT"; then cat "$LINT_LOG"; echo "ruff or mypy failed (above)"; exit 1; fi
cat "$LINT_LOG"
# Two workers (pytest-xdist): the integration tier in order on one, the unit tests spread beside it
# (tests/conftest.py groups them); MBUILD_TEST_WORKERS=0 runs everything in this one process.
WORKERS="${MBUILD_TEST_WORKERS:-2}"
PARALLEL=()
[ "$WORKERS" -gt 0 ] && PARALLEL=(-n "$WORKERS" --dist loadgroup)
.venv/bin/python -m pytest "${PARALLEL[@]}" --basetemp="$STATE/pytest" "$@"
