"""`mbuild doctor`: what this host has, and what mbuild can build here."""

from __future__ import annotations

import json
import platform
import shutil
from pathlib import Path
from typing import Any

import click
from huggingface_hub import get_token

from builder import __version__
from builder.image import BACKENDS
from builder.image.debian_base import bootstrap_tool
from builder.model.catalog import lookup_alias
from builder.model.hubcache import hub_cache_dir, offline_requested
from builder.oci.base import registry_base_status
from builder.planning.profiles import DEFAULT_BASE_IMAGE, load_profiles
from builder.planning.selection import evaluate
from builder.planning.target import CPU_FLAGS_OF_INTEREST, detected_target, host_cpu_target
from builder.versions import installed_version


def _free_gb(path: Path) -> float | None:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return round(shutil.disk_usage(candidate).free / 1e9, 1)
    return None


def gather() -> dict[str, Any]:
    target = detected_target()
    cpu = host_cpu_target()
    refusals = {name: factory("oci", False).unavailable() for name, factory in BACKENDS.items()}
    backends = {name: refusal.message if refusal else "available" for name, refusal in refusals.items()}
    export_tools = {name: installed_version(name) for name in ("torch", "transformers", "sentence-transformers",
                                                               "onnx")}
    cache = hub_cache_dir()
    models = sorted(p.name.removeprefix("models--").replace("--", "/", 1) for p in cache.glob("models--*"))
    embedding = lookup_alias("all-minilm-l6-v2")
    assert embedding is not None
    runnable_cpu = [p.name for p in load_profiles() if p.device == "cpu" and "embedding" in p.tasks
                    and evaluate(p, cpu, embedding.facts()).status == "runnable"]
    can_export = all(export_tools.values())
    base_ok, base_why = registry_base_status(DEFAULT_BASE_IMAGE, offline_requested())
    maker = bootstrap_tool()
    return {
        "mbuild": __version__,
        "platform": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "gpus": [{"name": g.device_name or g.model, "model": g.model, "compute_capability": g.compute_capability,
                  "memory_gb": g.memory_gb} for g in target.gpus],
        "cpu": {"cores": cpu.cpu_count, "flags": sorted(f for f in cpu.cpu_flags if f in CPU_FLAGS_OF_INTEREST)},
        "ram_gb": cpu.ram_gb,
        "disk_free_gb": {"current directory": _free_gb(Path.cwd()), "hugging face cache": _free_gb(cache)},
        "backends": backends,
        "hf_token": "set" if get_token() else "not set",
        "hf_cache": {"path": str(cache), "models": models},
        "offline": offline_requested(),
        "export_tools": {k: v or "missing" for k, v in export_tools.items()},
        "tensorrt": installed_version("tensorrt") or "missing",
        "can_build": {
            "cpu embedding models": ("yes, profiles " + ", ".join(runnable_cpu[:3])) if can_export and runnable_cpu
            else "no: " + ("install the export extra" if not can_export else "no CPU profile fits this CPU"),
            "GPU (TensorRT) engines": "no: TensorRT is not installed" if not installed_version("tensorrt")
            else ("yes" if target.gpus else "no: no NVIDIA GPU visible"),
            "images": _images(backends, base_ok, base_why, maker),
        },
        "base_image": {"default": DEFAULT_BASE_IMAGE, "usable": base_ok, "why": base_why,
                       "mbuild base": maker or "no: install mmdebstrap (or debootstrap and run as root)"},
    }


def _images(backends: dict[str, str], base_ok: bool, base_why: str, maker: str | None) -> str:
    """The truth about images: a backend, and a base it can get."""
    backend = next((name for name, state in backends.items() if state == "available"), None)
    if backend is None:
        return "no image backend; `--backend none` writes the build context"
    if base_ok:
        return f"yes, with {backend} from {DEFAULT_BASE_IMAGE}"
    if maker:
        return (f"yes, with {backend}, once `mbuild base` makes a base with {maker} ({DEFAULT_BASE_IMAGE}: "
                f"{base_why}); or --backend none")
    return (f"no: {DEFAULT_BASE_IMAGE} is {base_why}, and `mbuild base` cannot run here; --backend none writes "
            "the context")


def render(info: dict[str, Any]) -> str:
    gpus = ", ".join(f"{g['name']} ({g['model']}, sm_{g['compute_capability'].replace('.', '')}, "
                     f"{g['memory_gb']:g} GB)" for g in info["gpus"]) or "none (no NVIDIA driver or NVML on this host)"
    rows = [
        ("mbuild", f"{info['mbuild']} on {info['platform']}"),
        ("GPUs", gpus),
        ("CPU", f"{info['cpu']['cores']} cores; {' '.join(info['cpu']['flags']) or 'no AVX2'}"),
        ("RAM", f"{info['ram_gb']:g} GB"),
        ("disk free", ", ".join(f"{v:g} GB in the {k}" for k, v in info["disk_free_gb"].items() if v is not None)),
        ("backends", "; ".join(f"{k}: {v}" for k, v in info["backends"].items())),
        ("HF_TOKEN", info["hf_token"]),
        ("HF cache", f"{info['hf_cache']['path']} ({len(info['hf_cache']['models'])} models)"),
        ("offline", "yes (HF_HUB_OFFLINE)" if info["offline"] else "no"),
        ("export", ", ".join(f"{k} {v}" for k, v in info["export_tools"].items())),
        ("TensorRT", info["tensorrt"]),
        ("base image", f"{info['base_image']['default']}: {info['base_image']['why']}; "
                       f"mbuild base: {info['base_image']['mbuild base']}"),
    ]
    rows += [(f"can build {k}", v) for k, v in info["can_build"].items()]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows) + "\n"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def doctor(as_json: bool) -> None:
    """Report GPUs, CPU, RAM, disk, container backends, Hugging Face setup, and what can be built here."""
    info = gather()
    click.echo(json.dumps(info, indent=2) if as_json else render(info), nl=as_json)
