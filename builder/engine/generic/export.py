"""The generic path's export: plan the model, trace it, write the engine (this package's docstring)."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import onnx

from builder.engine.checkpoint import Checkpoint
from builder.engine.generic.fusions import fused_norms
from builder.engine.generic.grown import probe, trace_grown
from builder.engine.generic.rewrite import Traced, rewrite
from builder.engine.generic.skeleton import OwnAttention, keyed, load_rest, plan_model, streamed_modules
from builder.engine.generic.states import has_states
from builder.engine.generic.trace import ATTENTION, AttentionCall, trace
from builder.engine.weight_writer import LinearFormat
from builder.errors import UnsupportedModel
from builder.model.generic import computes_attention_itself
from builder.model.geometry import HeadGeometry

log = logging.getLogger("mbuild")


def _geometry(calls: list[AttentionCall]) -> HeadGeometry:
    """The cache's dimensions, each layer's as its attention asked (the runtime sizes each layer's buffers)."""
    odd = next((c for c in calls if c.value_dim != c.head_dim), None)  # (trace.py pads narrower values)
    if odd is not None:
        raise UnsupportedModel(f"its values are {odd.value_dim} wide per head but its keys {odd.head_dim}, "
                               "which mbuild's cache does not hold")
    return HeadGeometry.of_layers(calls[0].heads, [(c.kv_heads, c.head_dim) for c in calls])


def write_generic(model_dir: Path, config: Any, out_dir: Path, form: LinearFormat | None = None) -> HeadGeometry:
    """model.onnx + model.onnx.data in out_dir, as decoder_graph.write_decoder writes them; the cache's
    dimensions. A model whose code computes attention itself (planning's rule), or whose attention the in-place
    trace finds the runtime's op cannot compute, gets the grown-cache graph (grown.py)."""
    text = config.get_text_config()  # a multimodal wrapper's language model; the config itself otherwise
    layers = int(getattr(text, "num_hidden_layers", 0) or 0)
    if layers <= 0:
        raise UnsupportedModel("its config names no num_hidden_layers")
    # a model whose cache keeps recurrent state runs over transformers' own cache: the grown form (states.py)
    if not computes_attention_itself(str(config.model_type)) and not has_states(config):
        try:
            return _write(model_dir, config, out_dir, form, layers)
        except OwnAttention as exc:
            log.info("generic export: %s; tracing its own attention over a grown cache instead", exc.message)
    return _write(model_dir, config, out_dir, form, None)


def _write(model_dir: Path, config: Any, out_dir: Path, form: LinearFormat | None, layers: int | None) -> HeadGeometry:
    """The in-place graph of `layers` layers, or with None the grown-cache one."""
    model = plan_model(config, ATTENTION if layers else "eager", experts=ATTENTION)
    with ExitStack() as stack:
        checkpoint = Checkpoint(model_dir, stack)
        streams = streamed_modules(model, checkpoint, form)
        load_rest(model, checkpoint, keyed(model), streams.stored)
    if layers:
        traced, calls, experts = trace(model, layers)
        dims = _geometry(calls)
    else:
        dims, kept, value_dim = probe(model)
        (traced, experts), calls = trace_grown(model, dims, kept, value_dim), []
    del model
    _check(traced)
    out_dir.mkdir(parents=True, exist_ok=True)
    rewrite(fused_norms(traced), model_dir, out_dir, streams, Traced(calls, experts, dims,
                                                                     int(config.get_text_config().vocab_size)),
            form or LinearFormat())
    return dims


def _check(traced: onnx.ModelProto) -> None:
    """ONNX's checker and shape inference over the traced graph (placeholders in, the big weights out): a model
    whose code traced into nodes ONNX does not allow (a linear on a 3-D weight) is refused here, not when the gate
    loads it. The written graph is the fast lane's writer's nodes and ONNX Runtime's contrib ops, which ONNX's
    checker does not know."""
    try:
        onnx.checker.check_model(traced, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        line = next((x for x in str(exc).splitlines() if x.strip()), type(exc).__name__)
        raise UnsupportedModel(f"its traced graph is not valid ONNX ({line[:200]})",
                               hint="see docs/models.md for the model types mbuild builds") from exc
