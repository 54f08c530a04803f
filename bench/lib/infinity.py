"""infinity-emb as a peer: the server that serves embedders and rerankers (POST /rerank, the Cohere shape), in a
venv of its own outside the repo (BENCH_CACHE, as vLLM's and llama.cpp's), made on first use and reused.

Why its own venv: infinity-emb pins transformers 4.57 (and optimum-onnx pins huggingface-hub < 1), which cannot live
beside this checkout's transformers 5. The CPU torch comes from the local wheel store; never a CUDA torch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.lib.llamacpp import CACHE
from bench.lib.servers import HOST

VERSION = "0.0.78"
TORCH = "2.13.0"  # the CPU build from the local wheel store (../shared/machine-notes.md); never a CUDA torch
VENV = CACHE / f"infinity-emb-{VERSION}"
READY = "/health"
# `torch` brings sentence-transformers (< 4), which its torch engine's CrossEncoder is; `optimum` its ONNX engine
PACKAGES = [f"torch=={TORCH}", f"infinity-emb[server,torch,optimum]=={VERSION}"]


def python() -> Path:
    return VENV / "bin" / "python"


def installed() -> bool:
    """Made, and with these packages: a venv made from another list is made again."""
    return (VENV / "ready").is_file() and (VENV / "ready").read_text() == " ".join(PACKAGES)


def ensure_venv() -> Path:
    """The venv, made once (about a minute of pip, 1.4 GB): infinity-emb with its server, torch and optimum extras,
    the CPU torch."""
    if installed():
        return VENV
    print(f"  installing infinity-emb {VERSION} into {VENV} (once, about a minute)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    pip = [str(python()), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", *PACKAGES], check=True)
    (VENV / "ready").write_text(" ".join(PACKAGES))
    return VENV


def serve(model: str, name: str, port: int, engine: str = "torch", batch_size: int = 32) -> list[str]:
    """`infinity_emb v2` serving `model` (a local folder) on the CPU as `name`, `batch_size` pairs a forward pass (its
    default, 32), quiet. Its other defaults are what a user gets: no response cache (the benchmark repeats one
    request, which a cache would answer without work), no torch.compile, a warm-up before ready. Its default
    BetterTransformer does not apply: it needs optimum < 2, and its optimum extra installs optimum 2.1."""
    return [str(VENV / "bin" / "infinity_emb"), "v2", "--model-id", model, "--served-model-name", name,
            "--engine", engine, "--device", "cpu", "--batch-size", str(batch_size), "--no-vector-disk-cache",
            "--host", HOST, "--port", str(port), "--log-level", "warning"]


def onnx_folder(model: Path, folder: Path) -> Path:
    """`model` with the model.onnx its optimum engine loads, made once offline by optimum's exporter in this venv.

    Its optimum engine takes no folder without an ONNX file (a Hub repo such as cross-encoder/ms-marco-MiniLM-L6-v2
    ships one under onnx/); it is put at the folder's top, see `serve_onnx`."""
    if (folder / "model.onnx").is_file():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(model, folder)
    exported = folder.with_name(f"{folder.name}-export")
    subprocess.run([str(VENV / "bin" / "optimum-cli"), "export", "onnx", "--model", str(model), "--task",
                    "text-classification", str(exported)], check=True, capture_output=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""})
    shutil.move(exported / "model.onnx", folder / "model.onnx")  # last: it marks a whole folder
    shutil.rmtree(exported)
    return folder


def serve_onnx(folder: Path, port: int, batch_size: int = 32) -> tuple[list[str], Path]:
    """Its optimum engine (ONNX Runtime) on `folder`, and the working directory to start it in.

    Why `--model-id .` from inside the folder: infinity 0.0.78 hands optimum the ONNX file's path as it globbed it
    (absolute for an absolute folder), and optimum-onnx 0.1 matches that against bare file names only, so any other
    spelling of a local folder fails to start ("Could not find any ONNX files with target file name")."""
    return serve(".", folder.name, port, "optimum", batch_size), folder


def env(home: Path, threads: int) -> dict[str, str]:
    """`threads` intra-op threads (torch and ONNX Runtime read OMP_NUM_THREADS; it sets none itself), no telemetry
    (it would try the network), the Hub offline, and its caches (its optimized ONNX graph) under `home`."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "INFINITY_ANONYMOUS_USAGE_STATS": "0",
            "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(home), "INFINITY_HOME": str(home),
            "PYTHONPATH": ""}  # not this checkout (bench/lib/mbuild.this_checkout_first): it imports its own
