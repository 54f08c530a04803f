"""The generic export's second graph form, the grown cache (past in, present out), for models whose own code
computes attention (alibi, masks of their own, attention run twice a layer), not through transformers' attention
interface, where trace.py puts the runtime's in-place attention.

The model runs whole, as transformers runs it, over a transformers DynamicCache built inside the traced forward
from the past inputs: every such model still hands its layers' new keys and values to the cache
(`cache.update(keys, values, layer_idx)`) and attends over what comes back, so its attention, masks and biases
compute on past + new as they do in generate(). The cache's grown keys and values are the present outputs. The
linear layers and the token table are trace.py's placeholders, streamed and quantized by rewrite.py as in the
other form; the attention is the model's own (eager) nodes.

Inputs and outputs are the grown-cache graph's that the runtime drives by copying (runtimes/engines/decoder.py):
input_ids [B,S], attention_mask [B,P+S], position_ids [B,S], logits_at [N], past.{i}.key/value [B,KV,P,D];
logits [N,vocab], present.{i}.key/value [B,KV,P+S,D]. The graph says its pasts are right-aligned (its
PAST_LAYOUT metadata): a model that places keys by their index in the cache (local windows counted from cache
positions, alibi from an arange) sees each row's past end where its new tokens start, as in a left-padded
generate() batch; with left-aligned pasts and holes after the shorter rows' GPT-Neo's windows went wrong.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import onnx
import torch
from torch.export import Dim
from transformers import DynamicCache

from builder.engine.generic import axes, ops, states
from builder.engine.generic.trace import _STEP, ExpertsCall, _placeholders, _refusal, readable_weights
from builder.errors import UnsupportedModel
from builder.model.geometry import HeadGeometry, model_context
from runtimes.engines.decoder import PAST_LAYOUT, RIGHT_ALIGNED
from runtimes.engines.states import PRESENT_STATE, state_name
from runtimes.kernels import DOMAIN as KERNELS_DOMAIN


def _cache_argument(model: Any) -> str:
    """The forward's name for the cache: transformers 5 renames past_key_values to cache, model by model."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class _Grown(torch.nn.Module):
    def __init__(self, model: Any, layers: int, kept: states.Layout | None, value_dim: int) -> None:
        super().__init__()
        self.model, self.layers, self.kept, self.value_dim = model, layers, kept, value_dim
        self.cache_argument = _cache_argument(model)
        # a model without position_ids derives positions itself (from the mask or the cache's length)
        self.positions = "position_ids" in inspect.signature(model.forward).parameters

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                logits_at: torch.Tensor, past: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        _STEP.logits_at, _STEP.calls, _STEP.experts = logits_at, [], []  # per run: the exporter may run it again
        readable_weights()
        # values narrower than keys (multi-head latent attention's) are held padded to the keys' width
        past = tuple(t[..., :self.value_dim] if i % 2 and i < 2 * self.layers else t for i, t in enumerate(past))
        if self.kept is None:
            cache = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(self.layers)])
        else:  # past: the keyed layers' keys and values, then the states
            cache = states.cache(self.model.config)
            states.fill(cache, self.kept, past[:2 * self.layers], past[2 * self.layers:])
        extra = {"position_ids": position_ids} if self.positions else {}
        # states alone: no past to mask, and the new token is no padding (Mamba's layers would broadcast a longer
        # mask over the token)
        mask = None if self.kept is not None and not self.kept.keyed else attention_mask
        logits = self.model(input_ids=input_ids, attention_mask=mask, use_cache=True,
                            **{self.cache_argument: cache}, **extra).logits
        held = _entries(cache) if self.kept is None else states.presents(cache, self.kept)
        width = held[0].shape[-1] if self.layers else 0
        held = [torch.nn.functional.pad(t, (0, width - self.value_dim)) if i % 2 and i < 2 * self.layers else t
                for i, t in enumerate(held)]
        return (logits.reshape(-1, logits.shape[-1]), *held)


def _entries(cache: Any) -> list[torch.Tensor]:
    """Each layer's keys and values, in the graph's order."""
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def probe(model: Any) -> tuple[HeadGeometry, states.Layout | None, int]:
    """The cache's dimensions, from one eager run of two tokens over an empty cache (the placeholders compute
    zeros): how many layers the model caches and each one's keys' and values' shapes; for a model whose cache
    keeps recurrent state (states.py), which layers hold keys and its states; and the values' width, which may be
    narrower than the keys' (they are held padded to it)."""
    stateful = states.has_states(model.config)
    cache = states.cache(model.config) if stateful else DynamicCache()
    _STEP.logits_at = None  # the head's rows are all kept: none are picked yet
    _STEP.names = {id(module.__dict__): name for name, module in model.named_modules()}  # experts' placeholders
    with torch.no_grad(), _placeholders(model):
        try:
            readable_weights()
            model(input_ids=torch.ones(1, 2, dtype=torch.long), attention_mask=torch.ones(1, 2, dtype=torch.long),
                  use_cache=True, **{_cache_argument(model): cache})
        except Exception as exc:
            raise _refusal(exc) from exc
        _steps(model, cache)
    kept = states.layout(cache) if stateful else None
    layers: list[Any] = [cache.layers[i] for i in kept.keyed] if kept else \
        [layer for layer in cache.layers if getattr(layer, "is_initialized", False)]
    if kept is None and (not layers or len(layers) != len(cache.layers)):
        raise UnsupportedModel("its modeling code keeps no KV cache in transformers' Cache (every layer's keys "
                               "and values), which mbuild's engines serve a sequence from")
    shapes = {(tuple(layer.keys.shape[1::2]), tuple(layer.values.shape[1::2])) for layer in layers}
    if len(shapes) > 1:
        raise UnsupportedModel("its layers' caches differ in shape (key/value heads or head size per layer)")
    (kv_heads, head_dim), values = shapes.pop() if shapes else ((1, 1), (1, 1))  # a model of states alone
    if values[0] != kv_heads or values[1] > head_dim:
        raise UnsupportedModel(f"its values are {values} (heads, width) but its keys {(kv_heads, head_dim)}, "
                               "which mbuild's cache does not hold")
    heads = int(getattr(model.config.get_text_config(), "num_attention_heads", 0) or kv_heads)
    return HeadGeometry(layers=len(layers), heads=heads, kv_heads=kv_heads, head_dim=head_dim), kept, values[1]


def _length(cache: Any) -> int:
    """How many positions the cache's first keyed layer holds; -1 where no layer holds keys (states alone)."""
    layer = next((x for x in cache.layers if getattr(x, "keys", None) is not None and x.keys.dim() == 4), None)
    return -1 if layer is None else int(layer.keys.shape[-2])


def _steps(model: Any, cache: Any) -> None:
    """One more token over the probe's cache, as the engine steps a sequence (new tokens in, the mask as long as
    past and new): a model whose code takes the whole sequence each step and drops what its cache holds (XLM's,
    CPM-Ant's) computes nothing for it, or fails, which the traced graph would do too, only later."""
    held = _length(cache)
    try:
        logits = model(input_ids=torch.ones(1, 1, dtype=torch.long), attention_mask=torch.ones(1, max(held, 2) + 1,
                       dtype=torch.long), use_cache=True, **{_cache_argument(model): cache}).logits
        stepped = (held < 0 or _length(cache) - held == 1) and logits.shape[1] == 1
    except Exception:  # the step itself fails: the same verdict, said the same way
        stepped = False
    if not stepped:
        raise UnsupportedModel("its modeling code does not run new tokens over its cache (it takes the whole "
                               "sequence each step), which is how mbuild's engines step a sequence",
                               hint="see docs/models.md for the model types mbuild builds")


def trace_grown(model: Any, dims: HeadGeometry, kept: states.Layout | None = None, value_dim: int = 0
                ) -> tuple[onnx.ModelProto, list[ExpertsCall]]:
    """The traced graph (placeholders in for the linear layers, the token table and experts; the model's own
    attention) and its experts blocks."""
    past = [f"past.{i}.{kind}" for i in range(dims.layers) for kind in ("key", "value")]
    present = [name.replace("past", "present") for name in past]
    held = kept.states if kept else ()
    # sizes that coincide with nothing else, so the exporter ties no two axes by accident. A model with states
    # takes one new token a run: its code's scans loop over the new tokens in Python, which a trace unrolls to the
    # example's count (the engine steps a longer work one token at a time: runtimes/engines/decoder.py)
    batch, new, before = 2, 1 if held else 3, 5
    example = (torch.ones(batch, new, dtype=torch.long), torch.ones(batch, before + new, dtype=torch.long),
               torch.arange(before, before + new).repeat(batch, 1), torch.tensor([new - 1, batch * new - 1]),
               (*(torch.zeros(batch, dims.kv_heads, before, dims.head_dim) for _ in past),
                *(torch.zeros(batch, *state.shape) for state in held)))
    # new tokens and past each within half the context, so the keys (their sum) are within it as the engine keeps
    # them: a guard on the sum (MPT's alibi table sliced by max(0, size - keys): axes.guarded_extremes) then holds
    # for every length traced, where bounds on each alone would be narrowed by it (and refused: axes.refusal)
    half = model_context(model.config.get_text_config()) // 2
    dynamic = Dim.DYNAMIC
    rows = {0: dynamic} if held else {0: dynamic, 1: Dim.DYNAMIC(min=1, max=half)}
    shapes = (rows, {0: dynamic, 1: Dim.DYNAMIC(min=1, max=2 * half)}, rows,
              {0: dynamic}, (*({0: dynamic, 2: Dim.DYNAMIC(min=0, max=half)} for _ in past),
                             *({0: dynamic} for _ in held)))
    _STEP.names = {id(module.__dict__): name for name, module in model.named_modules()}
    try:
        with torch.no_grad(), _placeholders(model), axes.guarded_extremes():
            grown = _Grown(model, dims.layers, kept, value_dim or dims.head_dim)
            program = torch.onnx.export(grown, example, dynamo=True, dynamic_shapes=shapes,
                                        input_names=["input_ids", "attention_mask", "position_ids", "logits_at",
                                                     *past, *(state_name(j) for j in range(len(held)))],
                                        output_names=["logits", *present,
                                                      *(f"{PRESENT_STATE}{j}" for j in range(len(held)))],
                                        custom_translation_table=ops.TRANSLATIONS, optimize=True, verbose=False)
    except Exception as exc:  # the exporter wraps what went wrong; the innermost error is the reason
        raise _refusal(exc) from exc
    if program is None:
        raise AssertionError("torch.onnx.export returned no program")
    why = axes.refusal(program.exported_program, half, one_token=bool(held))
    if why:
        raise UnsupportedModel(why, hint="see docs/models.md for the model types mbuild builds")
    proto = program.model_proto
    onnx.helper.set_model_props(proto, {PAST_LAYOUT: RIGHT_ALIGNED})
    return proto, list(_STEP.experts)


def save_grown(nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto], traced: onnx.ModelProto,
               out_dir: Path) -> None:
    """model.onnx with the traced graph's inputs and outputs (the module docstring) and its metadata."""
    graph = onnx.helper.make_graph(nodes, "decoder", list(traced.graph.input), list(traced.graph.output),
                                   initializers)
    opsets = [o for o in traced.opset_import if o.domain not in (ops.DOMAIN, "com.microsoft")]
    opsets.append(onnx.helper.make_opsetid("com.microsoft", 1))
    if any(node.domain == KERNELS_DOMAIN for node in nodes):  # the int8 linears of mbuild's kernel library
        opsets.append(onnx.helper.make_opsetid(KERNELS_DOMAIN, 1))
    model = onnx.helper.make_model(graph, opset_imports=opsets, producer_name="mbuild")
    model.ir_version = 9
    onnx.helper.set_model_props(model, {p.key: p.value for p in traced.metadata_props})
    onnx.save(model, str(out_dir / "model.onnx"))
