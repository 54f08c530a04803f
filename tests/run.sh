#!/usr/bin/env bash
# Set up and run mbuild's tests on a fresh machine: a venv with the build extras, a Docker engine
# and a local Python base image (no registry needed). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
# The CPU build of torch; set MBUILD_TORCH_SPEC (and PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)
# where plain PyPI would hand out a CUDA build.
TORCH_SPEC="${MBUILD_TORCH_SPEC:-torch==2.13.0}"

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check "$TORCH_SPEC"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[export,dev]"

# Container tests need a Docker engine and a base image. Install and start them where we can (root);
# elsewhere those tests say why they skip.
if [ "$(id -u)" = 0 ] && { ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; }; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
fi
if ! docker info >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v dockerd >/dev/null; then
  export DOCKER_HOST="unix://${MBUILD_CI_DOCKER:-/tmp/mbuild-ci-docker}/docker.sock"
  bash .ci/start-dockerd.sh
fi
if docker info >/dev/null 2>&1; then
  bash .ci/local-base-image.sh "${MBUILD_TEST_BASE_IMAGE:-mbuild-local/python:3.11-bookworm}"
  export MBUILD_REQUIRE_DOCKER=1
fi

.venv/bin/ruff check builder runtimes tests
.venv/bin/mypy builder runtimes tests
exec .venv/bin/python -m pytest "$@"
