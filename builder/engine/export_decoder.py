"""Export a decoder-only language model (builder/model/families/): the graph, its tokenizer and engine.json fields.

Two graphs, one per backend: ONNX Runtime gets decoder_graph.py's, written from the checkpoint's tensors
with the KV cache updated in place and the weights already in the profile's precision (it is the engine);
TensorRT gets decoder_torch.py's grown-cache graph. Both are checked by the same gate against transformers.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from builder.engine.decoder_graph import write_decoder
from builder.engine.decoder_torch import write_grown_cache_graph
from builder.engine.export_encoder import fast_tokenizer
from builder.engine.exported import ExportResult
from builder.engine.generic.export import write_generic
from builder.engine.native_kernels import build_library
from builder.engine.quiet import quiet_ml
from builder.engine.rope import served_context
from builder.engine.weight_writer import LinearFormat
from builder.errors import ToolMissing, UnsupportedModel
from builder.model.families import family, takes_fast_lane
from builder.model.geometry import expert_layers
from builder.model.quantization import source_format
from builder.planning.engine_options import ort_options
from builder.planning.profiles import Profile
from runtimes.bundle.engine import DecoderOptions, LayerCache
from runtimes.kernels import LIBRARY_FILE

log = logging.getLogger("mbuild")


def _chat_template(model_dir: Path, tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one
        template = template.get("default")
    if not template and (model_dir / "chat_template.jinja").is_file():
        template = (model_dir / "chat_template.jinja").read_text()
    return str(template) if template else None


def _eos_ids(model_dir: Path, config: Any, tokenizer: Any) -> list[int]:
    """Every end token the model's files name; one outside the vocabulary is a broken file, refused by name."""
    found: list[int] = []
    path = model_dir / "generation_config.json"
    sources = [("generation_config.json", json.loads(path.read_text()).get("eos_token_id"))] if path.is_file() else []
    text = config.get_text_config()  # a multimodal wrapper's language model names its own end tokens
    sources += [("config.json", getattr(config, "eos_token_id", None) or getattr(text, "eos_token_id", None)),
                ("the tokenizer", tokenizer.eos_token_id)]
    rows = int(text.vocab_size)
    for where, value in sources:
        for token in value if isinstance(value, list) else [value]:
            if isinstance(token, int) and not 0 <= token < rows:
                raise UnsupportedModel(f"{where} names eos_token_id {token}, outside the model's vocabulary of "
                                       f"{rows} tokens (config.json's vocab_size)",
                                       hint=f"fix eos_token_id in {where} to the id of the model's end token")
            if isinstance(token, int) and token not in found:
                found.append(token)
    return found


def _export(model_dir: Path, out_dir: Path, grown_cache: bool, form: LinearFormat | None = None,
            impl: str = "auto") -> ExportResult:
    config = AutoConfig.from_pretrained(model_dir)
    tokenizer = fast_tokenizer(model_dir)
    if grown_cache:
        family(config.model_type)  # TensorRT's graph is the fast lane's families' only: the others are refused
        past, dims = write_grown_cache_graph(model_dir, config, out_dir)
        inputs: tuple[str, ...] = ("input_ids", "attention_mask", "position_ids", "logits_at", *past)
    else:
        writer = write_decoder if takes_fast_lane(config.model_type, impl) else write_generic
        dims = writer(model_dir, config, out_dir, form)
        past = [f"past_{kind}.{i}" for i in range(dims.layers) for kind in ("key", "value")]
        inputs = ("input_ids", "seqlens_k", "total_sequence_length", "logits_at", *past)
    tokenizer.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    special = {"bos_token": tokenizer.bos_token or "", "eos_token": tokenizer.eos_token or ""}
    fmt = source_format(config.to_dict())
    # whether the engine's weights hold the source's own values: fp32 (decoded exactly), or its codes as blocks
    if form is None:
        kept = not grown_cache
    else:
        # experts are packed by decoder_moe.py from their decoded rows: rounded again
        kept = form.kind == "fp32" or (fmt is not None and form.kind == "nbits" and not form.tiles
                                       and fmt.kept_in_blocks(form.bits, form.block_size)
                                       and not expert_layers(config.get_text_config()))
    return ExportResult(
        task="text-generation",
        source_format=fmt.label if fmt else "",
        requantized=fmt is not None and not kept,
        inputs=inputs,
        output="logits",
        max_seq_length=served_context(config.get_text_config()),
        geometry=dims,
        pad_token_id=int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0),
        options=DecoderOptions(vocab_size=int(config.get_text_config().vocab_size), layers=dims.layers,
                               kv_heads=dims.kv_heads, head_dim=dims.head_dim,
                               layer_caches=tuple(LayerCache(i, *shape) for i, shape in enumerate(dims.shapes)
                                                  if shape != (dims.kv_heads, dims.head_dim)),
                               eos_token_ids=tuple(_eos_ids(model_dir, config, tokenizer)),
                               special_tokens=special, chat_template=_chat_template(model_dir, tokenizer)),
    )


@quiet_ml()  # a contextmanager is also a decorator: the whole export runs with the libraries quiet
def export_decoder(model_dir: Path, out_dir: Path, profile: Profile | None = None) -> ExportResult:
    """For ONNX Runtime: the in-place KV cache graph (decoder_graph.py), its linear layers in the profile's
    precision (fp32 without one)."""
    if profile is None:
        return _export(model_dir, out_dir, grown_cache=False)
    options = ort_options(profile.engine_options)
    form = LinearFormat.for_profile(profile.precision, options)
    if form.tiles:
        form = _with_kernels(form, out_dir)
    return _export(model_dir, out_dir, grown_cache=False, form=form, impl=options.model_impl)


def _with_kernels(form: LinearFormat, out_dir: Path) -> LinearFormat:
    """mbuild's kernel library beside the graph, built (once per machine) before any weight is written; where it
    cannot be built, ONNX Runtime's MatMulNBits on the same 8-bit blocks, saying why."""
    try:
        library = build_library()
    except (ToolMissing, OSError) as exc:  # OSError: the cache folder cannot be written
        log.warning("mbuild's int8 kernel is unavailable, so this engine runs ONNX Runtime's MatMulNBits on the same "
                    "8-bit blocks (one stream as fast, verify rows and batches slower): %s", exc)
        return replace(form, tiles=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(library, out_dir / LIBRARY_FILE)
    return form


@quiet_ml()
def export_decoder_tensorrt(model_dir: Path, out_dir: Path) -> ExportResult:
    """For TensorRT, which cannot run ONNX Runtime's contrib ops: the grown-cache graph (decoder_torch.py)."""
    return _export(model_dir, out_dir, grown_cache=True)
