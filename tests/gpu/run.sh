#!/usr/bin/env bash
# The real GPU test, for a host with an NVIDIA GPU, its driver, TensorRT 10 and network access to the
# package index: installs mbuild with the TensorRT extra into .venv-gpu and runs tests/gpu.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m venv .venv-gpu
PIP=(.venv-gpu/bin/python -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" "${MBUILD_TORCH_SPEC:-torch}"
"${PIP[@]}" -e ".[export,tensorrt,dev]"
exec .venv-gpu/bin/python -m pytest -m gpu tests/gpu -v -rs "$@"
