"""Versions of the tools a build depends on, read from installed metadata (nothing imported)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from builder import __version__

BUILD_TOOLS = ("torch", "transformers", "sentence-transformers", "onnx", "onnxruntime", "tensorrt",
               "tokenizers", "huggingface-hub", "bentoml")

# What the image installs: the runtime's own small set, pinned to the versions validated here.
# uvloop and httptools: uvicorn picks them up by itself and serves several times the requests per core.
RUNTIME_PACKAGES = ("bentoml", "fastapi", "uvloop", "httptools", "onnxruntime", "tokenizers", "numpy", "llguidance",
                    "openai-harmony")
# The same module ships under other distribution names; the CPU image always takes the plain one.
_ALIASES = {"onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino")}


def installed_version(dist: str) -> str | None:
    for name in _ALIASES.get(dist, (dist,)):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def tool_versions() -> dict[str, str]:
    found = {name: installed_version(name) for name in BUILD_TOOLS}
    return {"mbuild": __version__, **{k: v for k, v in found.items() if v}}


# GPU images swap onnxruntime for its CUDA build and add cuda-python, which the TensorRT session uses;
# TensorRT itself comes with the NVIDIA base image. Pinned here, since the build host need not have them.
GPU_PACKAGES = {"onnxruntime": "onnxruntime-gpu==1.31.1", "cuda-python": "cuda-python==12.9.0"}


# Optional parts of the image (`mbuild package --with NAME`), pinned as pyproject's extra of the same name (a test
# holds them equal): what pip resolves, then what it installs again without dependencies. dynamo: the image as an
# NVIDIA Dynamo worker (`python3 -m runtimes.dynamo`) and Dynamo's frontend (`python3 -m dynamo.frontend`), about
# 250 MB. ai-dynamo goes in without its dependencies: on Python 3.11-3.13 it requires aisimulate, whose PyPI release
# is a placeholder that downloads from elsewhere, used only by Dynamo's planner; it is installed with the runtime
# package it shares its `dynamo` folder with, so pip merges the two.
EXTRAS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "dynamo": (("ai-dynamo-runtime==1.6.1", "msgspec>=0.19", "pyzmq>=26"),
               ("ai-dynamo-runtime==1.6.1", "ai-dynamo==1.6.1")),
}


def extra_requirements(extras: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(resolved, installed without dependencies) requirement lines for the named extras."""
    resolved = [line for name in extras for line in EXTRAS[name][0]]
    return resolved, [line for name in extras for line in EXTRAS[name][1]]


def runtime_requirements(device: str = "cpu") -> list[str]:
    """Pinned requirement lines for the image, e.g. 'onnxruntime==1.32.0'."""
    lines = []
    for name in RUNTIME_PACKAGES:
        if device == "gpu" and name in GPU_PACKAGES:
            lines.append(GPU_PACKAGES[name])
            continue
        pinned = installed_version(name)
        lines.append(f"{name}=={pinned}" if pinned else name)
    if device == "gpu":
        lines.append(GPU_PACKAGES["cuda-python"])
    return lines
