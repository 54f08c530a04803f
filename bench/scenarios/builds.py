"""B1 builds: a cold `mbuild package`, an unchanged rebuild and a config-only change; image size.

Each round packages all-minilm-l6-v2 (fp32, CPU) with the weights already in the Hugging Face cache
(no network), mbuild's package cache warm (pip wheels, as on any build host after its first image) and
an empty engine cache:
  cold        into a new build dir: download check, export, compile, validate, context, image
  unchanged   the same command again
  config      `--mode throughput` into the same dir: batching limits only, so a new plan and image
              around the cached engine
Images are written by the `oci` backend (no daemon) on the local base image that tests/run.sh makes
(BENCH_BASE_IMAGE overrides it); with no base at hand the builds stop at the context (--backend none).

Image size: mbuild's image against what `bentoml build` + `bentoml containerize` of a naive
sentence-transformers service would hold. containerize cannot run here (its base comes from Docker
Hub, and PyPI's torch for Linux is the CUDA build), so that side is a lower bound made with the same
layer writer: the same base, plus one layer holding `pip install --target` of what its bentofile
would list (CPU torch, sentence-transformers, bentoml) and the model's files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.lib.harness import OUT, Series, machine, skipped, work_folder, write
from bench.lib.mbuild import MBUILD, minilm_home, minilm_path
from builder.image.spec import Copy
from builder.oci.layers import build_layer

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "cold build, unchanged and config-only rebuilds; image size"

DEFAULT_BASE = Path.home() / ".cache" / "mbuild-ci" / "base-oci-v2"
BENTO_PACKAGES = ["torch==2.13.0", "sentence-transformers", "bentoml"]


def base_image() -> str | None:
    if os.environ.get("BENCH_BASE_IMAGE"):
        return os.environ["BENCH_BASE_IMAGE"]
    return f"oci:{DEFAULT_BASE}:bookworm" if (DEFAULT_BASE / "index.json").is_file() else None


def package(out: Path, env: dict[str, str], base: str | None, *extra: str) -> float:
    """Seconds for one `mbuild package` run, as a user types it."""
    image = ["--backend", "oci", "--base-image", base] if base else ["--backend", "none"]
    started = time.perf_counter()
    subprocess.run([*MBUILD, "package", "all-minilm-l6-v2", "--gpu", "cpu", "--precision", "fp32", *image,
                    "--output", str(out), "--quiet", *extra], check=True, capture_output=True,
                   env={**os.environ, **env})
    return time.perf_counter() - started


def image_layers(build: Path) -> list[dict[str, Any]]:
    shown = subprocess.run([*MBUILD, "inspect", str(build), "--json"], check=True, capture_output=True, text=True)
    layers: list[dict[str, Any]] = json.loads(shown.stdout)["layers"]
    return layers


def bento_lower_bound(work: Path, model: Path, base_bytes: int) -> dict[str, Any]:
    """Compressed bytes of base + one layer of the naive service's packages and model (cached in work)."""
    record = work / "bento-estimate.json"
    if record.is_file():
        cached: dict[str, Any] = json.loads(record.read_text())
        return cached
    context = work / "bento-context"
    shutil.rmtree(context, ignore_errors=True)
    print("  installing what a BentoML image of the naive service would hold (once)")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--target", str(context / "site"), *BENTO_PACKAGES], check=True, capture_output=True)
    shutil.copytree(model, context / "model")
    layer = build_layer(context, Copy(("site", "model"), "/home/bentoml/"), work / "bento-layer.tar.gz", 0)
    estimate = {"packages": BENTO_PACKAGES, "base_bytes": base_bytes, "layer_bytes": layer.size,
                "total_bytes": base_bytes + layer.size}
    record.write_text(json.dumps(estimate, indent=2) + "\n")
    layer.path.unlink()
    shutil.rmtree(context)
    return estimate


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """Quick: the same builds, one round (`repeats` 1); MiniLM is its only model."""
    work = work or work_folder("builds")
    base = base_image()
    env = minilm_home(work)
    print(f"build benchmark: {repeats} rounds in {work}; images: {base or 'none (no local base image)'}")
    times = {"cold": Series(), "unchanged": Series(), "config": Series()}
    for round_ in range(repeats):
        build, engines = work / "build", work / f"engines-{round_}"
        shutil.rmtree(build, ignore_errors=True)
        shutil.rmtree(engines, ignore_errors=True)
        round_env = {**env, "MBUILD_ENGINE_CACHE": str(engines)}
        times["cold"].values.append(package(build, round_env, base))
        times["unchanged"].values.append(package(build, round_env, base))
        times["config"].values.append(package(build, round_env, base, "--mode", "throughput"))
        done = ", ".join(f"{name} {series.values[-1]:.1f}s" for name, series in times.items())
        print(f"  round {round_ + 1}/{repeats}: {done}")
    data: dict[str, Any] = {"scenario": "B1 builds", "machine": machine(), "repeats": repeats,
                            "base_image": base, "seconds": {k: s.values for k, s in times.items()},
                            "median_seconds": {k: s.median for k, s in times.items()}}
    data["unchanged_over_cold"] = times["unchanged"].median / times["cold"].median
    data["config_over_cold"] = times["config"].median / times["cold"].median
    if base:
        layers = image_layers(build)
        data["mbuild_layers"] = layers
        data["mbuild_image_bytes"] = sum(layer["bytes"] for layer in layers)
        base_bytes = sum(layer["bytes"] for layer in layers if layer["created_by"] == "base image layer")
        if quick and not (work / "bento-estimate.json").is_file():
            skipped("the BentoML-style image estimate", "it pip-installs torch and sentence-transformers once; "
                    "`python -m bench builds` (no --quick) makes it")
        else:
            data["bento_lower_bound"] = bento_lower_bound(work, minilm_path(), base_bytes)
    path = write("builds", data, render(data), out, measures=MEASURES)
    print(path.read_text())
    return path


def render(data: dict[str, Any]) -> str:
    seconds, median = data["seconds"], data["median_seconds"]

    def row(name: str, label: str) -> str:
        ratio = "-" if name == "cold" else f"{median[name] / median['cold']:.1%}"
        return (f"| {label} | {median[name]:.1f} | {min(seconds[name]):.1f}-{max(seconds[name]):.1f} | {ratio} |")

    verdict = ("met" if data["unchanged_over_cold"] <= 0.10
               else f"missed by {data['unchanged_over_cold'] - 0.10:.1%} of the cold build")
    lines = ["# Builds: cold, unchanged, config-only; image size", "", __doc__.strip(), "",
             f"Machine: {data['machine']['cores']} cores ({data['machine']['cpu']}); {data['repeats']} rounds, median "
             "and min-max.", "",
             "| build | seconds (median) | min-max | of the cold build |", "| --- | ---: | ---: | ---: |",
             row("cold", "cold `mbuild package`"), row("unchanged", "unchanged rebuild"),
             row("config", "config-only change (`--mode throughput`)"), "",
             f"Target: unchanged rebuild <= 10% of the cold build: **{data['unchanged_over_cold']:.1%}**, {verdict}.",
             ""]
    if "mbuild_layers" in data:
        lines += ["## Image size (compressed layers, as a registry stores them)", "",
                  "| layer | MB |", "| --- | ---: |",
                  *(f"| {layer['created_by']} | {layer['bytes'] / 1e6:.1f} |" for layer in data["mbuild_layers"]),
                  f"| **mbuild image** | **{data['mbuild_image_bytes'] / 1e6:.1f}** |"]
    if "bento_lower_bound" in data:
        bento = data["bento_lower_bound"]
        lines += [f"| BentoML-style image, lower bound: same base + {', '.join(bento['packages'])} + model | "
                  f"**{bento['total_bytes'] / 1e6:.1f}** |", "",
                  f"mbuild's image is {data['mbuild_image_bytes'] / bento['total_bytes']:.2f}x the lower bound of the "
                  "BentoML-style one: it ships ONNX Runtime and the tokenizer, never torch or transformers.", ""]
    if "mbuild_layers" not in data:
        lines += ["No local base image was found, so no image was built and no sizes are reported.", ""]
    lines += ["Reproduce: `python -m bench builds` (after `tests/run.sh`, which makes the local base image; writes "
              "docs/benchmarks/builds.json and builds.md).", ""]
    return "\n".join(lines)
