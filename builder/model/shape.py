"""What a model is, from its config.json: ModelFacts, and the one derivation of them that a downloaded config.json
and the catalog's recorded fields (profiles/catalog.yaml) both go through, so a plan can be checked by hand
from the model card's config.

Parameters are counted from the weight matrices: attention (q, k, v, o), the MLP (gate, up, down; in a
mixture-of-experts layer every expert's, and the router), the token table and an untied LM head. Norms, biases,
q/k norms and gpt-oss's attention sinks are under 0.1% of any size built here and left out; fused projections
(Phi-3's qkv and gate_up, gpt-oss's gate_up) hold the same weights as separate ones. Every family's MLP is gated
(three matrices); encoders' have two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from builder.errors import UnsupportedModel
from builder.model.families import FAMILIES, WRAPPERS, Family, wrapped_family
from builder.model.generic import language_family, wrapped_text
from builder.model.geometry import (
    EXPERT_COUNTS,
    SHARED_COUNTS,
    SHARED_WIDTHS,
    HeadGeometry,
    expert_layers,
    head_geometry,
    model_context,
)
from builder.model.quantization import MXFP4, SourceFormat, source_format
from runtimes.bundle.engine import Task  # the one list of tasks: engine.json's, which the image reads

DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}
HUB_DTYPE = "bfloat16"  # a checkpoint whose config.json names no dtype: the Hub's usual one


def billions(value: float) -> str:
    return f"{value:.3g}B" if value >= 0.9995 else f"{value * 1000:.3g}M"


class ModelFacts(BaseModel):
    """Architecture facts for memory planning: from the catalog, or derived from config.json."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: Task
    params: float = Field(gt=0, description="parameters, in billions: every expert's")
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    # each layer's cache (kv_heads, head_dim) where the layers' differ (config.json's per_layer_config); kv_heads and
    # head_dim are then most layers'
    layer_caches: tuple[tuple[int, int], ...] = ()
    values_are_keys: bool = False  # one cache held as keys and values (multi-head latent attention's latent)
    context: int = Field(gt=0, description="longest sequence served by default")
    vocab: int = Field(gt=0)
    tied: bool = False  # the LM head shares the token table (tie_word_embeddings)
    source: str = "catalog"
    family: str = ""  # the decoder family's model_type (builder/model/families/); "" for encoders
    wrapper: str = ""  # the multimodal model_type whose text model this is (families.WRAPPERS); "" for most
    active_params: float | None = Field(None, gt=0, description="billions a token runs through (None: all)")
    experts: int = Field(0, ge=0)  # routed experts in each mixture-of-experts layer; 0: dense
    experts_per_token: int = Field(0, ge=0)
    expert_intermediate: int = Field(0, ge=0)  # one expert's MLP width
    moe_layers: tuple[int, ...] = ()  # the layers whose MLP is the experts
    sliding_window: int = Field(0, ge=0)  # tokens a sliding layer attends to; 0: none
    sliding_layers: int = Field(0, ge=0)  # how many layers attend to the window only
    checkpoint_gb: float | None = Field(None, gt=0, description="the checkpoint's weights on disk (None: bf16)")

    @property
    def kv_kinds(self) -> int:
        """The caches a layer holds: keys and values, or one that is both."""
        return 1 if self.values_are_keys else 2

    @property
    def kv_values(self) -> int:
        """The cache's values a token takes in one kind (its keys, or its values) over every layer."""
        if self.layer_caches:
            return sum(heads * dim for heads, dim in self.layer_caches)
        return self.layers * self.kv_heads * self.head_dim

    @property
    def active(self) -> float:
        """Billions of parameters a token runs through: all of a dense model's, the routed experts' of an MoE."""
        return self.active_params or self.params

    @property
    def table(self) -> int:
        """Parameters of the token table (and of an untied LM head, each)."""
        return self.vocab * self.hidden

    @property
    def decode_params(self) -> float:
        """Billions of parameters a decode step reads: the active ones, but of an untied token table only the
        row it looks up (a tied one is read whole, as the LM head)."""
        return self.active - (0 if self.tied else self.table / 1e9)

    @property
    def download_gb(self) -> float:
        return self.checkpoint_gb if self.checkpoint_gb is not None else self.params * DTYPE_BYTES[HUB_DTYPE]

    def describe_params(self, noun: str = "parameters") -> str:
        """'30.5B parameters (3.35B active)' for a mixture of experts, '8.03B parameters' otherwise."""
        active = f" ({billions(self.active)} active)" if self.active_params else ""
        return " ".join(filter(None, (billions(self.params), noun))) + active


@dataclass(frozen=True)
class MoeLayout:
    experts: int = 0
    per_token: int = 0
    intermediate: int = 0
    layers: tuple[int, ...] = ()
    shared: int = 0  # the shared experts' MLP width, all of them together, in each such layer


def _int(config: Mapping[str, Any], *names: str, default: int = 0) -> int:
    """The first of names that config.json sets (a null is unset), as an int."""
    for name in names:
        if config.get(name) is not None:
            return _number(config[name], name)
    return default


def _number(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise UnsupportedModel(f"config.json's {name} is {value!r}, not a number") from exc


def text_config(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], Family | None]:
    """The language model's config, and its family when a multimodal wrapper names one (refused otherwise)."""
    inner = config.get("text_config")
    if not isinstance(inner, Mapping):
        return config, None
    kind = str(config.get("model_type") or "")
    generic = None if kind in WRAPPERS else wrapped_text(kind, inner)
    if generic is not None:
        return generic
    wrapped, wrapper = wrapped_family(str(config.get("model_type") or ""), inner.get("model_type"))
    return {**wrapper.text_defaults, **inner, "model_type": wrapped.model_type}, wrapped


def _wrapper(config: Mapping[str, Any]) -> str:
    return str(config.get("model_type") or "") if isinstance(config.get("text_config"), Mapping) else ""


def moe_layout(text: Mapping[str, Any]) -> MoeLayout:
    """Experts from config.json: Mixtral and gpt-oss name them num_local_experts, Qwen3-MoE num_experts."""
    experts = _int(text, *EXPERT_COUNTS)
    if not experts:
        raise UnsupportedModel("config.json of a mixture-of-experts model names no num_local_experts or num_experts")
    width = _int(text, "moe_intermediate_size", "intermediate_size")
    shared = _int(text, *SHARED_COUNTS) * width or _int(text, *SHARED_WIDTHS)
    return MoeLayout(experts, _int(text, "num_experts_per_tok", "experts_per_token", default=1), width,
                     expert_layers(text), shared)


def attention_params(text: Mapping[str, Any], hidden: int, geometry: HeadGeometry) -> int:
    """One layer's attention projections: q, k, v and o; multi-head latent attention's (DeepSeek-V2/V3) as its
    modeling code holds them: q through a low-rank q_lora_rank (or whole), keys and values from a kv_lora_rank
    latent and one shared rotary key, expanded per head by kv_b_proj."""
    latent = _int(text, "kv_lora_rank")
    if not latent:
        return hidden * geometry.head_dim * (2 * geometry.heads + 2 * geometry.kv_heads)
    heads, rope, nope = geometry.heads, _int(text, "qk_rope_head_dim"), _int(text, "qk_nope_head_dim")
    value, q_rank = _int(text, "v_head_dim", default=nope), _int(text, "q_lora_rank")
    query = q_rank * (hidden + heads * (nope + rope)) if q_rank else hidden * heads * (nope + rope)
    return query + hidden * (latent + rope) + latent * heads * (nope + value) + heads * value * hidden


def sliding(text: Mapping[str, Any], fam: Family | None, layers: int, context: int) -> tuple[int, int]:
    """(window, how many layers slide it): layer_types where config.json lists them, else the family's period."""
    window = _int(text, "sliding_window")
    if not window or window >= context or text.get("use_sliding_window") is False:
        return 0, 0
    kinds = text.get("layer_types")
    if kinds:
        return window, sum(kind == "sliding_attention" for kind in kinds)
    period = _int(text, "sliding_window_pattern", "_sliding_window_pattern",
                  default=fam.sliding_period if fam else 0)
    return window, sum(1 for i in range(layers) if not period or (i + 1) % period)


def _vision_params(config: Mapping[str, Any]) -> int:
    """A wrapper's vision tower (a ViT: patches, positions, layers), downloaded though not built."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return 0
    hidden, inter, layers = (_int(vision, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers"))
    patch, image = _int(vision, "patch_size") or 1, _int(vision, "image_size")
    return layers * (4 * hidden * hidden + 2 * hidden * inter) + (3 * patch * patch + (image // patch) ** 2) * hidden


def _checkpoint_gb(config: Mapping[str, Any], fmt: SourceFormat | None, total: int, expert_params: int,
                   table: int) -> float:
    """What the checkpoint's weights take: its dtype's bytes each; a pre-quantized checkpoint's quantized ones as
    its format stores them (quantization.py): gpt-oss's MXFP4 experts, the linear layers of the others (the token
    tables stay in the checkpoint's dtype)."""
    dtype = str(config.get("torch_dtype") or config.get("dtype") or HUB_DTYPE)
    per = DTYPE_BYTES.get(dtype, DTYPE_BYTES[HUB_DTYPE])
    packed = 0 if fmt is None else expert_params if fmt.method == MXFP4 else total - table
    stored = fmt.bytes_per_weight() if fmt else 0.0
    return ((total - packed + _vision_params(config)) * per + packed * stored) / 1e9


def facts_from_config(config: Mapping[str, Any], task: Task, source: str = "config.json") -> ModelFacts:
    """The planning facts of a transformers config.json; a language model's family must be one mbuild builds, its
    quantization (if any) one mbuild reads."""
    fmt = source_format(config)
    if task == "text-generation" or config.get("model_type") in FAMILIES:  # a decoder body embeds too (Qwen3-Embedding)
        text, fam = text_config(config)
        if fam is None:  # the fast lane's family, the generic export's, or the refusal that says why neither
            text, fam = language_family(text)
    else:  # an encoder inside a wrapper (a text_config) is sized by it; its own export decides what it reads
        inner = config.get("text_config")
        text, fam = (inner if isinstance(inner, Mapping) else config), None
    try:
        hidden = int(text["hidden_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UnsupportedModel(f"config.json lacks {exc} needed to plan memory") from exc
    geometry = head_geometry(text)
    layers = geometry.layers
    inter = _int(text, "intermediate_size", default=4 * hidden)
    vocab = _int(text, "vocab_size", default=32000)
    context = model_context(text)
    # Only a language model serves an LM head; an embedder or reranker holds the token table alone.
    tied = task != "text-generation" or bool(text.get("tie_word_embeddings", fam.ties_head if fam else False))
    moe = moe_layout(text) if fam is not None and fam.kind == "moe" else MoeLayout()
    attention = sum(attention_params(text, hidden, geometry.layer(i)) for i in range(layers))  # layers may differ
    gated = 3 if fam is not None else 2  # every decoder family's MLP is gated; encoders' are not
    expert = gated * hidden * moe.intermediate
    dense_layers = layers - len(moe.layers)
    expert_params = len(moe.layers) * moe.experts * expert
    table = vocab * hidden * (1 if tied else 2)
    shared = (attention + dense_layers * gated * hidden * inter
              + len(moe.layers) * hidden * (moe.experts + gated * moe.shared))  # the router, the shared experts
    total = shared + expert_params + table
    active = shared + len(moe.layers) * moe.per_token * expert + table
    window, sliding_layers = sliding(text, fam, layers, context)
    try:
        return ModelFacts(
            task=task, params=total / 1e9, layers=geometry.layers, hidden=hidden, heads=geometry.heads,
            kv_heads=geometry.kv_heads, head_dim=geometry.head_dim, layer_caches=geometry.layer_shapes,
            values_are_keys=geometry.values_are_keys, context=context, vocab=vocab, tied=tied,
            source=source, family=fam.model_type if fam else "",
            wrapper=_wrapper(config) if task == "text-generation" else "",
            active_params=active / 1e9 if moe.experts else None, experts=moe.experts,
            experts_per_token=moe.per_token, expert_intermediate=moe.intermediate, moe_layers=moe.layers,
            sliding_window=window, sliding_layers=sliding_layers,
            checkpoint_gb=_checkpoint_gb(config, fmt, total, expert_params, table))
    except ValidationError as exc:  # zero or negative sizes
        fields = ", ".join(sorted({str(error["loc"][0]) for error in exc.errors()}))
        raise UnsupportedModel(f"config.json's sizes give no model mbuild can plan ({fields}: not positive)") from exc
