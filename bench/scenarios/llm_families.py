"""Decoder families against llama.cpp's `llama-server`: a Qwen3-MoE mixture of experts and a dense Qwen3, same weights.

Arms, per model, in precision pairs: mbuild int8 (its default on a VNNI CPU: `mbuild plan` says which) / llama.cpp
q8_0, mbuild int4 / q4_0; the llama.cpp comparison's servers, flags and client (llm_peer.md):
  mbuild     `mbuild serve` of `mbuild package --backend none --gpu cpu --precision P`, MBUILD_THREADS=1
  llama.cpp  `llama-server --threads 1 --threads-batch 1 --parallel 16 --cont-batching`, a slot's context
             equal to mbuild's, on GGUFs made as a user makes them of a bf16 checkpoint: its own
             convert_hf_to_gguf.py --outtype bf16, then llama-quantize
Models: random bf16 checkpoints, experts one tensor each as the Hub's are, with Qwen's real tokenizer (read offline
from llama.cpp's vocab GGUF; 151936 embedding rows, no BOS):
  moe    Qwen3-30B-A3B's layers (hidden 2048, 32 query heads and 4 KV heads of 128, 128 experts of 768, 8 a token,
         untied LM head), 8 of its 48
  dense  Qwen3-1.7B's shape (28 layers, hidden 2048, MLP 6144, 16 query heads and 8 KV heads of 128, tied
         embeddings): the dense family nearest Llama-3.2-1B's size, so a family's cost is seen beside llm_peer's
Every request streams POST /v1/completions with a 64-token text prompt and decodes exactly 64 tokens; c=1 sends
requests one after another (4 for moe, 2 for dense), c=16 one wave, after a warm-up wave. The two servers of a
pair share one pinned core (one measured at a time), the client has another, the arms alternate; the dense
pair, whose two servers together outgrow a 24 GB host, is served one server at a time, each arm's rounds in turn.
Then the default pair's engines run decode steps alone, mbuild's under ONNX Runtime's profiler, llama.cpp's in
llama-batched-bench.
Builds: the peak RSS of each build's process tree, sampled every 0.1 s (bench/lib/rss.py): `mbuild package` with
an empty engine cache (export, gate and all) beside the converter and the quantizer.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from bench.lib import llamacpp
from bench.lib.harness import OUT, read_rate_gbs, work_folder, write
from bench.lib.llm_families_report import Targets, report
from bench.lib.llm_models import make_qwen, qwen_tokenizer, weight_shapes
from bench.lib.llm_peer_checks import PROMPT_TOKENS, Texts
from bench.lib.llm_peer_pairs import build_arms, measure_pair
from bench.lib.llm_peer_report import Pairs, plot
from bench.lib.llm_peer_shapes import Shape, quick
from bench.lib.mbuild import build_record, context_of, plan
from bench.lib.rss import disk_bytes
from bench.lib.servers import pinned, split_cores
from bench.lib.step_profile import step_profile
from bench.lib.weight_bytes import experts_read, step_bytes

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "Qwen3-MoE and dense Qwen3 served, against llama.cpp"

PAIRS: Pairs = (("int8", "q8_0"), ("int4", "q4_0"))  # (mbuild precision, llama.cpp GGUF type)
QUICK_PAIRS: Pairs = (("fp32", "f32"), *PAIRS)  # quick: greedy agreement of fp32 / f32 too (both built in seconds)
SOURCE = "bf16"  # what llama.cpp's converter writes for llama-quantize: the checkpoint's own dtype
TARGETS: Targets = {"moe": {1: 1.2, 16: 1.5}}  # the default precision's pair: mbuild / llama.cpp q8_0 tokens/s
STEP_TOKENS = 16  # llama-batched-bench's decode steps a row, after the prompt

_QWEN3 = {"hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
          "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 40960}
QWEN3_1_7B = {**_QWEN3, "intermediate_size": 6144, "num_hidden_layers": 28, "tie_word_embeddings": True}
QWEN3_30B_A3B_LAYERS = {**_QWEN3, "num_attention_heads": 32, "num_key_value_heads": 4, "intermediate_size": 6144,
                        "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
                        "num_hidden_layers": 8, "tie_word_embeddings": False}
# quick: the smallest of each family every path takes (widths that 32-wide q4_0/q8_0 blocks and mbuild's blocks divide)
_TINY = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 2048}
TINY_MOE = {**_TINY, "moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
            "tie_word_embeddings": False}
TINY_DENSE = {**_TINY, "tie_word_embeddings": True}


@dataclass(frozen=True)
class Family:
    model_type: str  # transformers' model_type of the checkpoint
    shape: Shape


FAMILIES = {family.shape.key: family for family in (
    Family("qwen3_moe", Shape("moe", "random Qwen3-MoE: 8 of Qwen3-30B-A3B's 48 layers", QWEN3_30B_A3B_LAYERS,
                              concurrency=(1, 16))),
    # int8 reads ~2 GB of weights a decode step on one core: two requests at c=1; mbuild's fp32 KV for 16 x 2048
    # and llama.cpp's mmapped weights do not fit together on a 24 GB host: one server at a time
    Family("qwen3", Shape("dense", "random Qwen3-1.7B-shaped", QWEN3_1_7B, concurrency=(1, 16), sequential=2,
                          apart=True)))}
QUICK = {family.shape.key: family for family in (
    Family("qwen3_moe", quick(Shape("moe", "random tiny Qwen3-MoE (quick)", TINY_MOE))),
    Family("qwen3", quick(Shape("dense", "random tiny Qwen3 (quick)", TINY_DENSE))))}


def _params(model: Path) -> dict[str, int]:
    """All parameters, and those one token runs through (all but the experts it is not routed to)."""
    config = AutoConfig.from_pretrained(model)
    shapes = weight_shapes(config)
    total = sum(size.numel() for size in shapes.values())
    expert = sum(size.numel() for name, size in shapes.items() if ".mlp.experts." in name)
    routed = config.num_experts_per_tok / config.num_experts if expert else 1.0
    return {"total": total, "active": round(total - expert * (1 - routed))}


def _built(build: Path) -> dict[str, Any] | None:
    """What the build took (bench/lib/mbuild.py's record) and the engine it wrote."""
    record = build_record(build)
    return {**record, "output_bytes": disk_bytes(build / "model")} if record else None


def measure_family(family: Family, pairs: Pairs, work: Path, tokenizer: Path, repeats: int,
                   results: dict[str, Any], peer: bool) -> None:
    shape = family.shape
    model = make_qwen(work / f"{family.model_type}-{shape.key}", family.model_type, shape.config, tokenizer)
    results["params"][shape.key], results["checkpoint_bytes"][shape.key] = _params(model), disk_bytes(model)
    profile = plan(model).get("profile") or {}
    results["default"][shape.key] = {"profile": profile.get("name"),
                                     "precision": (profile.get("content") or {}).get("precision")}
    print(f"{shape.title}: building mbuild {', '.join(mine for mine, _ in pairs)} "
          f"(default here: {results['default'][shape.key]['profile']})", flush=True)
    with tempfile.TemporaryDirectory(dir=work) as engines:  # no cached engine: every build exports and gates
        builds = build_arms(model, work, [mine for mine, _ in pairs], shape.key, results,
                            {"MBUILD_ENGINE_CACHE": engines})
    gguf = work / "gguf"
    files = llamacpp.ggufs(model, gguf, tuple(theirs for _, theirs in pairs), SOURCE) if peer else {}
    results["build_memory"][shape.key] = {**{f"mbuild {p}": _built(b) for p, b in builds.items()
                                             if isinstance(b, Path)}, **llamacpp.gguf_steps(model, gguf)}
    top = max(shape.concurrency)
    shares = {c: experts_read(shape.config, c) for c in (1, top)}
    results["experts_read"][shape.key] = {str(c): share for c, share in shares.items()}
    results["step_bytes"][shape.key] = step_bytes(builds, files, shares[1])
    results["step_bytes_top"][shape.key] = step_bytes(builds, files, shares[top])
    context = context_of(builds, model)
    results["context"][shape.key] = context
    texts = Texts(model)
    for mine, theirs in pairs:
        print(f"{shape.title}: mbuild {mine} against llama.cpp {theirs} (context {context} a sequence)", flush=True)
        measure_pair(shape, (mine, theirs), builds[mine], files.get(theirs), context, texts, repeats, results)
    default = next((pair for pair in pairs if pair[0] == results["default"][shape.key]["precision"]), None)
    if default is not None and isinstance(builds[default[0]], Path):
        results["steps"][shape.key] = steps(shape, default, builds[default[0]], files.get(default[1]))


def steps(shape: Shape, pair: tuple[str, str], build: Path | str, gguf: Path | None) -> dict[str, Any]:
    """Decode steps of the default pair's engines alone, no server, at c=1 and the top concurrency, on the servers'
    core: mbuild's by op type (ONNX Runtime's profiler), llama.cpp's whole (llama-batched-bench)."""
    batches = (1, max(shape.concurrency))
    print(f"{shape.title}: decode steps of mbuild {pair[0]}{f' and llama.cpp {pair[1]}' if gguf else ''}", flush=True)
    with pinned({min(split_cores()[1])}):
        found: dict[str, Any] = {"pair": list(pair), "mbuild": {
            str(batch): step_profile(Path(build) / "model", batch, PROMPT_TOKENS) for batch in batches}}
        if gguf is not None:
            measured = llamacpp.batched_steps(gguf, batches, (PROMPT_TOKENS,), STEP_TOKENS)
            found["llama.cpp"] = {str(batch): measured[(batch, PROMPT_TOKENS)] for batch in batches}
    return found


def parse_options(argv: list[str]) -> dict[str, Any]:
    """This scenario's own options, after `python -m bench llm_families`."""
    parser = argparse.ArgumentParser(prog="python -m bench llm_families")
    parser.add_argument("--families", default=",".join(FAMILIES), help="of moe,dense (default: both)")
    chosen = [name for name in parser.parse_args(argv).families.split(",") if name]
    if unknown := set(chosen) - set(FAMILIES):
        parser.error(f"--families: unknown {', '.join(sorted(unknown))}; choose from {', '.join(FAMILIES)}")
    return {"families": chosen}


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None,
         families: list[str] | None = None) -> Path:
    """`python -m bench llm_families [--families moe,dense]`. Quick: a tiny model of each family, smoke-sized runs,
    mbuild alone where llama.cpp is not built."""
    work = work or work_folder("families", quick)
    work.mkdir(parents=True, exist_ok=True)
    chosen = [(QUICK if quick else FAMILIES)[key] for key in families or FAMILIES]
    pairs = QUICK_PAIRS if quick else PAIRS
    print(f"decoder families against llama.cpp: work in {work}, {repeats} rounds{' (quick)' if quick else ''}")
    llamacpp.ensure_source()  # the vocabulary GGUF the models' tokenizer comes from
    peer = llamacpp.peer(quick)
    tokenizer = qwen_tokenizer(llamacpp.CACHE / "tokenizer-qwen2", llamacpp.QWEN2_VOCAB)
    results: dict[str, Any] = {"gguf_source": SOURCE, **{key: {} for key in (
        "runs", "greedy", "prefix", "prefix_pair", "builds", "ungated", "context", "params", "checkpoint_bytes",
        "default", "build_memory", "experts_read", "step_bytes", "step_bytes_top", "steps")}}
    with pinned({min(split_cores()[1])}):  # the servers' core
        results["read_gbs"] = read_rate_gbs()
    for family in chosen:
        measure_family(family, pairs, work, tokenizer, repeats, results, peer)
    shapes = [family.shape for family in chosen]
    named = "" if families in (None, list(FAMILIES)) else f" --families {','.join(families or [])}"
    command = f"python -m bench llm_families {'--quick' if quick else f'--repeats {repeats}'}{named}"
    data, markdown = report(results, shapes, pairs, repeats, quick, __doc__ or "", TARGETS, command)
    path = write("llm_families", data, markdown, out, measures=MEASURES)
    plot(results, shapes, pairs, out / "llm_families.png")
    print(markdown)
    return path

