"""build_scale's report: a table per model shape and the plot, made from build_scale.json alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.lib.plots import save_scale_plot

GIB = 2**30
REFERENCE = "llama.cpp q8_0"  # the converter run mbuild's export stage is compared with
ORDER = ("mbuild fp32", "mbuild int8", "mbuild int4", "llama.cpp q8_0", "llama.cpp bf16", "llama.cpp f32")
COLUMNS = ("arm", "peak RSS GiB (stage)", "of it anonymous GiB", "export-stage peak GiB", "wall s",
           "output GiB (engine)", "source fp32 weights GiB", "predicted build memory GiB",
           f"export-stage peak / {REFERENCE} peak")


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.2f}"


def _prediction(value: Any) -> str:
    """The plan's prediction in GiB: a number is GB (1e9 bytes), as the plan's other memory fields; a mapping
    shows its first *_gb entry; anything else its JSON."""
    if value is None:
        return ""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value * 1e9 / GIB:.2f}"
    if isinstance(value, dict):
        for key, item in value.items():
            if key.endswith("gb") and isinstance(item, int | float):
                return f"{_prediction(item)} ({key})"
    return json.dumps(value, sort_keys=True)


def _ran(run: dict[str, Any]) -> bool:
    """Built, or built and then refused by its gate (every stage that takes memory ran)."""
    return not run["rc"] or bool(run.get("gate_failed"))


def reference_peak(shape: dict[str, Any]) -> tuple[str, int] | None:
    """llama.cpp's q8_0 conversion peak, else any converter run's that succeeded."""
    runs = {arm: r for arm, r in shape["arms"].items() if arm.startswith("llama.cpp") and _ran(r)}
    arm = REFERENCE if REFERENCE in runs else next(iter(runs), None)
    return (arm, runs[arm]["peak_rss"]) if arm else None


def _row(arm: str, run: dict[str, Any], shape: dict[str, Any], reference: tuple[str, int] | None) -> str:
    name = (arm if not run["rc"] else f"{arm} (gate failed, exit {run['rc']})" if run.get("gate_failed")
            else f"{arm} **failed** (exit {run['rc']})")
    peak = _gib(run["peak_rss"]) + (f" ({run['peak_stage']})" if run.get("peak_stage") else "")
    output = _gib(run["output_bytes"]) + (f" ({_gib(run['model_bytes'])})" if "model_bytes" in run else "")
    export = run.get("export_peak_rss")
    ratio = f"{export / reference[1]:.2f}x" if export and reference and arm.startswith("mbuild") else ""
    cells = (name, peak, _gib(run["peak_anon"]), _gib(export), f"{run['wall_s']:.1f}", output,
             _gib(shape["fp32_weight_bytes"]), _prediction(run.get("predicted_build_memory")), ratio)
    return "| " + " | ".join(cells) + " |"


def _arms(shape: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The shape's runs, mbuild's first, in ORDER (the JSON keeps them sorted by name)."""
    rank = {arm: index for index, arm in enumerate(ORDER)}
    return sorted(shape["arms"].items(), key=lambda item: (rank.get(item[0], len(ORDER)), item[0]))


def _allowed(box: dict[str, Any]) -> str:
    allowed = box.get("cores_allowed", box["cores"])
    return "all used" if allowed == box["cores"] else f"the run pinned to {allowed}"


def _shape_section(shape: dict[str, Any]) -> list[str]:
    reference = reference_peak(shape)
    box = shape["machine"]
    files = shape["checkpoint_files"]
    lines = [f"## {shape['title']}", "",
             f"{shape['params'] / 1e6:,.1f}M parameters; checkpoint {_gib(shape['checkpoint_bytes'])} GiB of bf16 "
             f"safetensors in {len(files)} file{'s' if len(files) > 1 else ''}; fp32 weights "
             f"{_gib(shape['fp32_weight_bytes'])} GiB. Machine: {box['cores']} cores ({_allowed(box)}), "
             f"{box['ram_gib']} GiB RAM ({box['cpu']}); measured {box['date']}.", "",
             "| " + " | ".join(COLUMNS) + " |", "| --- |" + " ---: |" * (len(COLUMNS) - 1),
             *(_row(arm, run, shape, reference) for arm, run in _arms(shape)), ""]
    if reference is None:
        lines += ["No llama.cpp conversion succeeded: no ratio.", ""]
    lines += _served(shape)
    for arm, run in _arms(shape):
        if run["rc"]:
            tail = run.get("tail", [])[-4 if run.get("gate_failed") else -12:]
            lines += [f"{arm} exited {run['rc']}; its last lines:", "", "```", *tail, "```", ""]
    return lines


def _served(shape: dict[str, Any]) -> list[str]:
    """The engines served after their build: RSS at ready and at peak against the plan's memory.start_gb."""
    lines = []
    for arm, run in _arms(shape):
        served = run.get("serve")
        if not served:
            continue
        if "error" in served:
            lines += [f"{arm} served: **failed**: {served['error']}", ""]
            continue
        start = (run.get("plan_memory") or {}).get("start_gb")
        versus = (f"; `mbuild plan` predicted {start * 1e9 / GIB:.2f} GiB at ready (memory.start_gb): "
                  "measured "
                  f"at ready / predicted {served['rss_at_ready'] / (start * 1e9):.2f}, peak / predicted "
                  f"{served['peak_rss'] / (start * 1e9):.2f}") if start else ""
        lines += [f"{arm} served (`mbuild serve --allow-failed-gate`): ready in {served['ready_s']:.0f} s with "
                  f"{_gib(served['rss_at_ready'])} GiB RSS (process tree); one streamed answer "
                  f"({served['chat_chunks']} chunks in {served['chat_s']:.0f} s) peaked at "
                  f"{_gib(served['peak_rss'])} GiB{versus}.", ""]
    return lines


def render(data: dict[str, Any], doc: str) -> str:
    lines = ["# Build memory against model size", "", doc.strip(), "",
             "![peak RSS against parameters](build_scale.png)", "",
             "Columns: peak RSS of the whole build's process tree, with the stage it came in, and the highest part "
             "of it that was not file-backed; the export stage's peak; output on disk (du) with, for mbuild, its "
             "engine folder OUT/model in parentheses; the checkpoint's weights at fp32 (what an fp32 export "
             "holds); the build memory `mbuild plan MODEL --gpu cpu --precision P --json` predicts (its "
             "\"build_memory\", else memory.build_gb; GB shown as GiB); and mbuild's export-stage peak over "
             f"{REFERENCE}'s conversion peak on the same files. A build refused by its gate (random weights "
             "often miss the int8 / int4 tolerances) ran every stage that takes memory but the context: its "
             "numbers stand.", ""]
    for shape in data["shapes"].values():
        lines += _shape_section(shape)
    lines += ["Reproduce: `.venv/bin/python -m bench build_scale [--shapes 100m,1b,8b] [--precisions fp32,int8,int4] "
              "[--gguf q8_0,bf16,f32]` (writes docs/benchmarks/build_scale.json, .md and .png; shapes not named "
              "keep their previous results); `--report-only` rewrites the .md and .png from the .json.", ""]
    return "\n".join(lines)


def plot(data: dict[str, Any], path: Path) -> Path:
    """Peak RSS against parameters, a line per arm over the shapes it built, and the fp32 weights for scale."""
    lines: dict[str, list[tuple[float, float]]] = {}
    for shape in data["shapes"].values():
        for arm, run in _arms(shape):
            if _ran(run):
                lines.setdefault(arm, []).append((shape["params"], run["peak_rss"] / GIB))
        lines.setdefault("fp32 weights", []).append((shape["params"], shape["fp32_weight_bytes"] / GIB))
    return save_scale_plot(lines, "Peak memory of a CPU build against model size", path)
