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
