"""docs/models.md, written from the family registry (builder/model/families/), the model-type sweep's table
(profiles/model_sweep.json, which tests/integration/test_model_sweep.py measures) and the catalog, never by hand:
`python -m builder.model.models_doc > docs/models.md`; tests/unit/builder/model/test_models_doc.py keeps the two
equal."""

from __future__ import annotations

import sys

from builder.model.catalog import load_catalog
from builder.model.families import FAMILIES, WRAPPERS
from builder.model.measured import record
from builder.model.quantization import DESCRIBED

KINDS = {"dense": "dense", "moe": "mixture of experts"}


def models_markdown() -> str:
    catalog = load_catalog()
    generating = {alias: entry.facts() for alias, entry in catalog.items()
                  if entry.facts().task == "text-generation"}
    aliases = {name: [a for a, facts in generating.items() if facts.family == name] for name in FAMILIES}
    lines = [
        "# Supported models",
        "",
        "<!-- Generated from builder/model/families/ and profiles/catalog.yaml by",
        "     `python -m builder.model.models_doc > docs/models.md`; do not edit by hand. -->",
        "",
        "mbuild builds sentence-embedding models (BERT-family encoders, and decoder bodies of the families below with",
        "last-token or mean pooling and instruction prompts, as Qwen3-Embedding), cross-encoder rerankers (an encoder",
        "with a one-label sequence-classification head: BERT, XLM-R, ModernBERT, DeBERTa-v2 bodies) and decoder-only",
        "language models. A language model of the families below takes the fast lane, a graph mbuild writes by hand;",
        "any other type transformers can run as a causal LM takes the generic path, traced from transformers' own",
        "modeling code ([the sweep below](#every-causal-lm-type-transformers-knows) says which build; `--model-impl",
        "generic` takes it for a fast-lane family too, benchmarked in [llm_generic](benchmarks/llm_generic.md)).",
        "Models whose layers keep a recurrent state, encoder-decoders and types transformers has no causal LM for are",
        "refused",
        "when planned, from config.json alone and before any weights are downloaded (exit 7), with the reason;",
        "so are classifiers of several labels",
        "and decoder bodies under a classification head, by what they are. Rerankers on a decoder body are built",
        "where mbuild holds their model card's prompt recipe: Qwen3-Reranker (a Qwen3 causal LM whose card is tagged",
        "`pipeline_tag: text-ranking`), scored by its \"yes\" and \"no\" logits as its card scores it.",
        "",
        "| model_type | family | kind | catalog aliases |",
        "| --- | --- | --- | --- |",
        *[f"| `{f.model_type}` | {f.label} | {KINDS[f.kind]} | {', '.join(aliases[f.model_type]) or '-'} |"
          for f in FAMILIES.values()],
        "",
        "Multimodal checkpoints around a family's text model: the catalog sizes their text model, and they are",
        "built once the export reads it out of the checkpoint (the vision tower is downloaded, never built); until",
        "then, and for any other multimodal model, they are refused by name when planned:",
        "",
        "| model_type | text model | built |",
        "| --- | --- | --- |",
        *[f"| `{name}` | `{w.text_family}` | {'yes' if w.built else 'not yet: refused when planned'} |"
          for name, w in WRAPPERS.items()],
        "",
        *sweep_lines(),
        *quantized_lines(),
        "## The catalog",
        "",
        "Aliases plan offline, from the config.json fields profiles/catalog.yaml records for each",
        "([usage.md](usage.md#checking-a-plan-by-hand) checks a plan from them by hand). Parameters count every",
        "expert; active ones are those a token is routed through. The download is the checkpoint as stored.",
        "",
        "| alias | repository | family | parameters | context | download |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for alias, entry in catalog.items():
        facts = entry.facts()
        family = f"`{facts.family}`" if facts.family else "reranker" if facts.task == "rerank" else "encoder"
        family += {"embedding": " embedder", "rerank": " reranker"}.get(facts.task, "") if facts.family else ""
        family += f" in `{facts.wrapper}`" if facts.wrapper else ""
        gated = " (gated)" if entry.gated else ""
        download = f"{facts.download_gb:.1f} GB" if facts.download_gb >= 1 else f"{facts.download_gb * 1000:.0f} MB"
        size = facts.describe_params("")
        lines.append(f"| {alias} | {entry.repo}{gated} | {family} | {size} | {facts.context} | {download} |")
    return "\n".join(lines) + "\n"


OUTCOMES = ("passed", "refused", "failed", "bug", "not made tiny")


def quantized_lines() -> list[str]:
    """The pre-quantized formats read (builder/model/quantization.py)."""
    return [
        "## Pre-quantized checkpoints",
        "",
        "A checkpoint published quantized is read by config.json's `quantization_config`, a band of rows at a time",
        "(never a whole bf16 copy): the export, the gate's reference and the plan see the same weights. The gate's",
        "reference is transformers running the dequantized source (no unquantized original exists), and the",
        "plan counts the download as stored. The weights are then built at the profile's precision: fp32 keeps the",
        "decoded values; int4 keeps an integer format's own codes, zero points and scales where its groups are the",
        "profile's blocks (GPTQ, AWQ, compressed-tensors' pack-quantized, in groups of 128; an act-order GPTQ's",
        "columns sorted by group and the input gathered alike), so the engine computes with the checkpoint's",
        "values; otherwise int8 and int4 round the decoded values again",
        "with mbuild's own quantizers. engine.json says which (`source_format`, `requantized`). Any other method",
        "(bitsandbytes, HQQ, EXL2, GGUF, ...) is refused when planned, before the weights are downloaded (exit 7),",
        "naming what is read. Built and served against bf16 and llama.cpp: [prequantized](benchmarks/prequantized.md)",
        "(`python -m bench prequantized`).",
        "",
        "| quant_method | what is read | built |",
        "| --- | --- | --- |",
        *[f"| `{method}` | {read} | {built} |" for method, read, built in DESCRIBED],
        "",
    ]


def sweep_lines() -> list[str]:
    """The sweep's table: every causal-LM model_type of the transformers it ran with, and what a tiny one did."""
    data = record()
    rows = data["rows"]
    counts = {o: sum(r["outcome"] == o for r in rows) for o in OUTCOMES}
    made = len(rows) - counts["not made tiny"]
    return [
        "## Every causal-LM type transformers knows",
        "",
        f"transformers {data['transformers']} maps {len(rows)} model types to a causal LM. The sweep",
        "(tests/integration/test_model_sweep.py) makes each tiny by one set of rules (tests/support/tiny_configs.py),",
        "then plans, exports (fp32) and gates it as `mbuild package` does: the gate holds the engine's greedy decode",
        "to transformers' own on 4 prompts x 32 tokens, past every sliding window and chunk (16 tokens). Of the",
        f"{made} types transformers can make tiny, {counts['passed']} pass, {counts['refused']} are refused with",
        f"the reason, {counts['failed']} fail the gate and {counts['bug']} end in an mbuild bug;",
        f"for {counts['not made tiny']} types the rules give no tiny model transformers itself makes and runs. "
        "A refusal",
        "comes from config.json, before any download; the few that only the export finds (marked *export*) are",
        "refused when planned too, before any download, with this transformers: planning reads this table",
        "(builder/model/measured.py).",
        "",
        "| model_type | outcome | path | detail |",
        "| --- | --- | --- | --- |",
        *[f"| `{r['model_type']}` | {r['outcome']}{' *export*' if r['stage'] == 'export' else ''} | "
          f"{r['path'] or '-'} | {_cell(r['detail'])} |" for r in rows],
        "",
    ]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


if __name__ == "__main__":
    sys.stdout.write(models_markdown())
