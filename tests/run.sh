#!/usr/bin/env bash
# Set up and run mbuild's tests on a fresh machine: a venv with the build extras, a Docker engine,
# podman, buildah, skopeo, umoci, runc, a local registry on 127.0.0.1:5000 and a local Python base
# image (no outside registry needed). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
# The CPU build of torch; set MBUILD_TORCH_SPEC (and PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)
# where plain PyPI would hand out a CUDA build.
TORCH_SPEC="${MBUILD_TORCH_SPEC:-torch==2.13.0}"
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

[ -x .venv/bin/python ] || "$PY" -m venv .venv
"${PIP[@]}" --upgrade pip
"${PIP[@]}" "$TORCH_SPEC"
"${PIP[@]}" -e ".[export,dev]"
# TensorRT's type stubs, so mypy checks the TensorRT module against the real API; --no-deps because the
# stubs' own dependency is NVIDIA's runtime library, which only installs where a GPU and its index are.
"${PIP[@]}" --no-deps "tensorrt-stubs==10.13.0.35.1"

# Container tests need the real tools. Install and start them where we can (root); elsewhere those
# tests say why they skip.
TOOLS=(dockerd:docker.io debootstrap:debootstrap skopeo:skopeo umoci:umoci runc:runc
       docker-registry:docker-registry buildah:buildah podman:podman)
MISSING=()
for pair in "${TOOLS[@]}"; do command -v "${pair%%:*}" >/dev/null || MISSING+=("${pair##*:}"); done
if [ "$(id -u)" = 0 ] && [ ${#MISSING[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${MISSING[@]}" >/dev/null
fi
if [ "$(id -u)" = 0 ]; then
  if ! docker info >/dev/null 2>&1 && command -v dockerd >/dev/null; then
    export DOCKER_HOST="unix://${MBUILD_CI_DOCKER:-/tmp/mbuild-ci-docker}/docker.sock"
    bash .ci/start-dockerd.sh
  fi
  export MBUILD_TEST_REGISTRY="${MBUILD_TEST_REGISTRY:-127.0.0.1:5000}"
  command -v docker-registry >/dev/null && bash .ci/start-registry.sh
  export MBUILD_CONTAINERS_STORAGE_DRIVER="${MBUILD_CONTAINERS_STORAGE_DRIVER:-vfs}"  # works in any VM
fi
if docker info >/dev/null 2>&1; then
  bash .ci/local-base-image.sh "${MBUILD_TEST_BASE_IMAGE:-mbuild-local/python:3.11-bookworm}"
  export MBUILD_TEST_BASE_OCI="oci:${MBUILD_CI_CACHE:-$HOME/.cache/mbuild-ci}/base-oci-v2:bookworm"
  export MBUILD_REQUIRE_CONTAINERS=1
fi

.venv/bin/ruff check builder runtimes tests bench
.venv/bin/mypy builder runtimes tests bench
exec .venv/bin/python -m pytest "$@"
