"""Export a sentence-embedding model (BERT family) to ONNX with its pooling and normalization inside.

The graph takes token ids (+ mask, + token types when the model uses them) with dynamic batch and
sequence axes and returns one pooled vector per sequence, so the runtime needs no torch.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer

from builder.engine.exported import ExportResult
from builder.engine.quiet import quiet_ml
from builder.errors import UnsupportedModel
from runtimes.bundle.engine import EncoderOptions

OUTPUT_NAME = "sentence_embedding"  # not "embedding": that name clashes inside ONNX Runtime
_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "lasttoken",  # decoder embedders (Qwen3-Embedding, gte-Qwen2, e5-mistral)
}


MAX_PROMPTS, MAX_PROMPT_CHARS = 16, 4096  # a model's instruction prefixes (config_sentence_transformers.json)


@dataclass(frozen=True)
class EncoderSpec:
    """What sentence-transformers' modules.json and config ask for, read without sentence-transformers."""

    pooling: str
    normalize: bool
    max_seq_length: int
    prompts: dict[str, str]  # name -> the prefix sentence-transformers puts before a text of that kind
    default_prompt: str | None
    matryoshka: tuple[int, ...] | None  # widths it was trained to be cut to (() any); None: not trained for it


def _read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def read_encoder_spec(model_dir: Path, model_config: Any) -> EncoderSpec:
    pooling, normalize = "mean", False  # sentence-transformers' default for a plain transformer
    modules_file = model_dir / "modules.json"
    if modules_file.is_file():
        for module in json.loads(modules_file.read_text()):
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            if kind == "Pooling":
                pooling = _pooling_mode(model_dir / module.get("path", "") / "config.json")
            elif kind == "Normalize":
                normalize = True
            elif kind != "Transformer":
                raise UnsupportedModel(f"the sentence-transformers module {kind!r} is not supported yet",
                                       hint="supported: Transformer, Pooling (cls/mean/max), Normalize")
    positions = int(getattr(model_config, "max_position_embeddings", 512) or 512)
    max_len = positions
    st_config = model_dir / "sentence_bert_config.json"
    if st_config.is_file():
        max_len = int(_read(st_config).get("max_seq_length") or positions)
    prompts, default = read_prompts(model_dir)
    return EncoderSpec(pooling=pooling, normalize=normalize, max_seq_length=min(max_len, positions),
                       prompts=prompts, default_prompt=default, matryoshka=matryoshka(model_dir, model_config))


def matryoshka(model_dir: Path, model_config: Any) -> tuple[int, ...] | None:
    """Whether the model was trained so that its embeddings may be cut short (Matryoshka representation learning),
    by vLLM's signals in config.json (matryoshka_dimensions: the widths; is_matryoshka: any) or a "matryoshka"
    tag on its model card (sentence-transformers' trainer tags loss:MatryoshkaLoss)."""
    widths = getattr(model_config, "matryoshka_dimensions", None)
    if isinstance(widths, list) and widths and all(type(w) is int and w > 0 for w in widths):
        return tuple(sorted(set(widths)))
    if getattr(model_config, "is_matryoshka", False) is True:
        return ()
    card = model_dir / "README.md"
    head = card.read_text(errors="replace")[:20_000] if card.is_file() else ""
    front = head.split("\n---", 1)[0] if head.startswith("---") else ""  # the card's YAML front matter
    return () if re.search(r"^\s*-\s*\S*matryoshka", front, re.IGNORECASE | re.MULTILINE) else None


def read_prompts(model_dir: Path) -> tuple[dict[str, str], str | None]:
    """The model's named prompts and the one used when none is named (Qwen3-Embedding's "query" instruction)."""
    path = model_dir / "config_sentence_transformers.json"
    data = _read(path) if path.is_file() else {}
    prompts, default = data.get("prompts") or {}, data.get("default_prompt_name")
    if not (isinstance(prompts, dict) and len(prompts) <= MAX_PROMPTS
            and all(isinstance(k, str) and 0 < len(k) <= 64 and isinstance(v, str) and len(v) <= MAX_PROMPT_CHARS
                    for k, v in prompts.items())):
        raise UnsupportedModel(f"{path}'s prompts are not at most {MAX_PROMPTS} names of text (each prompt at most "
                               f"{MAX_PROMPT_CHARS} characters)")
    if default is not None and default not in prompts:
        raise UnsupportedModel(f"{path} names default_prompt_name {default!r}, which is not one of its prompts")
    return dict(prompts), default


def _pooling_mode(path: Path) -> str:
    config = _read(path) if path.is_file() else {"pooling_mode_mean_tokens": True}
    modes = [name for key, name in _POOLING_KEYS.items() if config.get(key)]
    other = [k for k, v in config.items() if k.startswith("pooling_mode") and v and k not in _POOLING_KEYS]
    if len(modes) != 1 or other:
        raise UnsupportedModel(f"pooling {modes + other} in {path} is not supported",
                               hint="one of cls, mean, max, mean_sqrt_len or lasttoken pooling is")
    if config.get("include_prompt") is False and modes[0] not in ("cls", "lasttoken"):
        raise UnsupportedModel(f"{path} pools its tokens without the prompt's (include_prompt false), which mbuild "
                               "does not build yet", hint="pooling that includes the prompt, cls or lasttoken is")
    return modes[0]


class _PooledEncoder(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, spec: EncoderSpec) -> None:
        super().__init__()
        self.model, self.pooling, self.normalize = model, spec.pooling, spec.normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        elif self.pooling == "lasttoken":
            # The runtime pads on the right, so a sequence's last token sits at its length - 1; under causal
            # attention its state never saw the padding after it.
            last = attention_mask.sum(dim=1) - 1
            pooled = hidden[torch.arange(hidden.shape[0]), last]
        elif self.pooling == "max":
            pooled = (hidden + (mask - 1.0) * 1e9).max(dim=1).values
        else:
            summed, count = (hidden * mask).sum(dim=1), mask.sum(dim=1).clamp(min=1e-9)
            pooled = summed / (count.sqrt() if self.pooling == "mean_sqrt_len" else count)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled


def fast_tokenizer(model_dir: Path) -> Any:
    """The model's transformers tokenizer; refused unless it is the fast (Rust) one the runtime loads."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError, TypeError) as exc:  # what transformers raises for missing or unreadable files
        said = " ".join(str(exc).split())[:400] or type(exc).__name__
        lacks = "" if (model_dir / "tokenizer.json").is_file() else "it has no tokenizer.json, and "
        raise UnsupportedModel(f"the model's tokenizer cannot be loaded: {lacks}transformers says: {said}",
                               hint="mbuild serves with the model's fast tokenizer: the folder needs its "
                                    "tokenizer.json (and tokenizer_config.json) as transformers saves them") from exc
    if not getattr(tokenizer, "is_fast", False):
        raise UnsupportedModel("the model has no fast (Rust) tokenizer, which the runtime needs")
    return tokenizer


def export_graph(module: torch.nn.Module, body: torch.nn.Module, tokenizer: Any, out_dir: Path, output: str,
                 output_axes: dict[int, str]) -> tuple[str, ...]:
    """model.onnx in out_dir from `module`, which takes input_ids, attention_mask and, where `body`'s forward
    takes them, the tokenizer gives them and the model has more than one type, token_type_ids (as transformers
    feeds the model: XLM-R's forward takes token types its tokenizer never gives), with dynamic batch and
    sequence axes; returns the graph's input names."""
    takes_types = ("token_type_ids" in inspect.signature(body.forward).parameters
                   and "token_type_ids" in getattr(tokenizer, "model_input_names", ())
                   and int(getattr(body.config, "type_vocab_size", 2) or 0) > 1)
    inputs = ["input_ids", "attention_mask"] + (["token_type_ids"] if takes_types else [])
    example = tuple(torch.ones(2, 8, dtype=torch.long) for _ in inputs)
    out_dir.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            module, example, str(out_dir / "model.onnx"),
            input_names=inputs, output_names=[output], opset_version=17, dynamo=False,
            dynamic_axes={**{n: {0: "batch", 1: "sequence"} for n in inputs}, output: output_axes},
        )
    # The exporter drops an input the graph never reads (DeBERTa-v2 without token types reads none).
    kept = {i.name for i in onnx.load(str(out_dir / "model.onnx"), load_external_data=False).graph.input}
    return tuple(name for name in inputs if name in kept)


@quiet_ml()  # a contextmanager is also a decorator: the whole export runs with the libraries quiet
def export_encoder(model_dir: Path, out_dir: Path) -> ExportResult:
    """Write model.onnx and tokenizer.json to out_dir; return the engine.json fields they imply."""
    config = AutoConfig.from_pretrained(model_dir)
    spec = read_encoder_spec(model_dir, config)
    try:
        # Eager attention exports to plain MatMul/Softmax, which ONNX Runtime fuses into Attention.
        model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    except (ValueError, OSError) as exc:
        raise UnsupportedModel(f"transformers cannot load this model as an encoder: {exc}") from exc
    tokenizer = fast_tokenizer(model_dir)
    inputs = export_graph(_PooledEncoder(model, spec), model, tokenizer, out_dir, OUTPUT_NAME, {0: "batch"})
    tokenizer.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    return ExportResult(
        task="embedding",
        inputs=inputs,
        output=OUTPUT_NAME,
        max_seq_length=spec.max_seq_length,
        geometry=None,
        pad_token_id=int(tokenizer.pad_token_id or 0),
        options=EncoderOptions(embedding_dim=int(config.hidden_size), pooling=spec.pooling, normalize=spec.normalize,
                               prompts=spec.prompts, default_prompt=spec.default_prompt,
                               matryoshka=spec.matryoshka is not None, matryoshka_dims=spec.matryoshka or ()),
        attention_heads=int(config.num_attention_heads),
    )
