"""The language models the LLM benchmarks run: random decoders made on the spot (a ~100M Llama with a word-level
tokenizer; the llama.cpp and vLLM comparisons' Llamas and Qwen3-MoE with the real Llama SPM tokenizer; bf16
Llama-3.2-1B- and Llama-3.1-8B-shaped ones with Llama 3's BPE tokenizer, sharded as published, for the
build-scale benchmark), and random decoders of other families (Qwen3, Qwen3-MoE) on Qwen's real BPE tokenizer
for the families comparison."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedConfig,
    PreTrainedTokenizerFast,
)

VOCAB = 32000


def make_llama_words(folder: Path, shape: dict[str, Any]) -> Path:
    """A random Llama of `shape` (LLAMA_100M: 95.5M parameters) on a word-level tokenizer of VOCAB made-up words.

    The word-level tokenizer keeps every id decodable with a realistic vocab; the special tokens get names no
    word contains, so "w1000" is one token, not "w1" + "000".
    """
    if (folder / "model.safetensors").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    save_words_tokenizer(folder)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, **shape)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    GenerationConfig(bos_token_id=1, eos_token_id=2, do_sample=False).save_pretrained(folder)
    return folder


def save_words_tokenizer(folder: Path, vocab: int = VOCAB) -> None:
    """A word-level tokenizer in `folder`: <unk>, <s> and </s> (ids 0-2), then made-up words "w3" to "w{vocab - 1}"."""
    special = {"<unk>": 0, "<s>": 1, "</s>": 2}
    tok = Tokenizer(models.WordLevel(vocab={**special, **{f"w{i}": i for i in range(3, vocab)}}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<unk>",
                            unk_token="<unk>",
                            model_max_length=2048).save_pretrained(folder)


def make_words_decoder(folder: Path, model_type: str, shape: dict[str, Any], vocab: int = VOCAB) -> Path:
    """A random decoder of any family (`model_type`: llama, qwen3_moe, ...) of `shape` and `vocab` rows, fp32, on a
    word-level tokenizer of as many made-up words (save_words_tokenizer): a shape of our own choosing, with no
    tokenizer to fetch. Its weights drawn as transformers initializes a Llama (save_random_weights)."""
    config = _config(model_type, vocab_size=vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0, dtype="float32",
                     **shape)
    return _make_decoder(folder, config, partial(save_words_tokenizer, vocab=vocab), torch.float32, SHARD_BYTES)


def workload(count: int) -> list[list[int]]:
    """`count` of 16 prompts of 16-128 token ids of the word-level vocabulary, the same every run."""
    rng = np.random.default_rng(0)
    return [rng.integers(3, VOCAB, size=int(n)).tolist() for n in np.linspace(16, 128, 16)][:count]


def build_genai(model: Path, out: Path, threads: int) -> Path:
    """onnxruntime-genai's own model builder (fp32, CPU), pinned to the benchmark's thread count."""
    if not (out / "genai_config.json").is_file():
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(model), "-o", str(out),
                        "-p", "fp32", "-e", "cpu"], check=True, capture_output=True)
    config_path = out / "genai_config.json"
    config = json.loads(config_path.read_text())
    config["model"]["decoder"]["session_options"]["intra_op_num_threads"] = threads
    config_path.write_text(json.dumps(config, indent=2))
    return out


# Llama shapes on the 32000-token vocabularies (word-level, or the Llama SPM one of the llama.cpp comparison)
LLAMA_100M = {"hidden_size": 640, "intermediate_size": 1728, "num_hidden_layers": 12, "num_attention_heads": 10,
              "num_key_value_heads": 5, "max_position_embeddings": 2048, "tie_word_embeddings": False}
# What quick runs (`python -m bench SCENARIO --quick`) serve: the smallest Llama every path accepts (head_dim 32,
# widths that llama.cpp's 32-wide q4_0/q8_0 blocks and MatMulNBits' 128-wide ones divide), built in seconds
LLAMA_TINY = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 2048, "tie_word_embeddings": False}
# Llama-3.2-1B's shape (rope_theta and tied embeddings included) on the SPM vocabulary, without its
# 128k-context rope scaling: mbuild's profiles cap the context at 2048-4096 anyway
LLAMA_1B = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
            "num_key_value_heads": 8, "max_position_embeddings": 2048, "tie_word_embeddings": True,
            "rope_theta": 500000.0, "rms_norm_eps": 1e-5}
SHARD_BYTES = 1 << 30


def measured_shape(quick: bool) -> tuple[str, dict[str, Any]]:
    """(key, shape): the ~100M Llama a full run measures, or the tiny one a quick run checks the code with."""
    return ("tiny", LLAMA_TINY) if quick else ("100m", LLAMA_100M)
# Llama 3's vocabulary (llama.cpp's models/ggml-vocab-llama-bpe.gguf) and the Llama-3.2-1B and Llama-3.1-8B shapes
# on it, bf16 as published; rope_theta as published, without the 128k-context rope scaling (context capped at 4096)
LLAMA3_VOCAB, LLAMA3_BOS, LLAMA3_EOS = 128256, 128000, 128001
LLAMA3_1B = {**LLAMA_1B, "head_dim": 64, "max_position_embeddings": 4096}
LLAMA3_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 4096, "tie_word_embeddings": False,
             "rope_theta": 500000.0, "rms_norm_eps": 1e-5}


def run_flops(config: dict[str, Any], prompt: int, new: int, requests: int) -> float:
    """The matmul FLOPs of answering `requests` prompts of `prompt` tokens with `new` tokens each: every position but
    the last through each layer's projections (Q, K, V, O and the gated MLP; of a mixture of experts, the router
    and the gated MLPs of the k experts a position is routed to) and attention over the positions up to it (QK and
    AV), and the LM head once per output token (the prompt's last position gives the first). Norms, rotary and
    softmax are left out, so no engine does less."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    experts = config.get("num_experts") or config.get("num_local_experts") or 0
    ffn = config["num_experts_per_tok"] * config["moe_intermediate_size"] if experts else config["intermediate_size"]
    projections = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * ffn + hidden * experts
    positions = prompt + new - 1
    attended = positions * (positions + 1) // 2  # position t attends to t positions, itself included
    per_layer = projections * positions + 2 * heads * head_dim * attended
    return float(requests * (2 * layers * per_layer + 2 * hidden * config["vocab_size"] * new))


def gguf_module(gguf_vocab: Path) -> Any:
    """llama.cpp's gguf package from the tree beside `gguf_vocab` (models/ -> gguf-py/), not installed."""
    gguf_py = str(gguf_vocab.parents[1] / "gguf-py")
    if gguf_py not in sys.path:  # last: gguf-py/ also holds a `tests` package, which must not shadow ours
        sys.path.append(gguf_py)
    import gguf

    # transformers checks the gguf version; the vendored tree has no installed metadata to read it from
    gguf.__version__ = getattr(gguf, "__version__", "0.19.0")
    return gguf


def save_spm_model(folder: Path, gguf_vocab: Path) -> None:
    """tokenizer.model, the SentencePiece file a Llama repository ships, rebuilt from the vocab GGUF's pieces,
    scores and types: llama.cpp's converter reads the scores from it (from tokenizer.json it would write -1000 for
    every piece, and llama.cpp's SPM tokenizer would then split words differently from everyone else)."""
    from sentencepiece import sentencepiece_model_pb2 as spm

    fields = gguf_module(gguf_vocab).GGUFReader(gguf_vocab).fields

    def values(key: str) -> list[Any]:
        field = fields[key]
        return [field.parts[i] for i in field.data]

    proto = spm.ModelProto()  # type: ignore[attr-defined]  # protobuf-generated
    for piece, score, kind in zip(values("tokenizer.ggml.tokens"), values("tokenizer.ggml.scores"),
                                  values("tokenizer.ggml.token_type"), strict=True):
        proto.pieces.add(piece=bytes(piece).decode(), score=float(score[0]), type=int(kind[0]))
    proto.trainer_spec.model_type = spm.TrainerSpec.BPE  # type: ignore[attr-defined]
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.vocab_size = len(proto.pieces)
    proto.trainer_spec.unk_id, proto.trainer_spec.bos_id, proto.trainer_spec.eos_id = 0, 1, 2
    proto.trainer_spec.pad_id = -1
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = True
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    (folder / "tokenizer.model").write_bytes(proto.SerializeToString())


def save_spm_tokenizer(folder: Path, gguf_vocab: Path) -> None:
    """The real Llama SPM tokenizer (32000 tokens, BOS 1 / EOS 2), read offline from llama.cpp's vocab-only GGUF
    by transformers' GGUF loader (tokenizer.json). llama.cpp's converter also needs tokenizer.model, which
    bench.lib.llamacpp writes before it converts (save_spm_model needs sentencepiece, the peer's dependency)."""
    gguf_module(gguf_vocab)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_vocab.parent, gguf_file=gguf_vocab.name)
    tokenizer.model_max_length = 2048
    tokenizer.save_pretrained(folder)


# Llama 3's chat format (header tokens, <|eot_id|> after each turn), without its tool and date preamble.
LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def save_bpe_tokenizer(folder: Path, gguf_vocab: Path) -> None:
    """Llama 3's byte-level BPE tokenizer (128256 ids), read offline from llama.cpp's vocab-only GGUF by
    transformers' GGUF loader, with the two repairs that make it behave as the tokenizer.json Meta ships: the
    `<|endoftext|>` the loader's GPT2Tokenizer adds by default (id 128256, one past the embedding, which
    convert_hf_to_gguf.py rejects) is dropped, and BOS is prepended as Llama 3's post-processor does (the
    GGUF carries no add_bos flag). The converter then recognises it by its pre-tokenizer hash as llama-bpe."""
    spec = _gguf_tokenizer_spec(gguf_vocab)
    spec["added_tokens"] = [token for token in spec["added_tokens"] if token["id"] < LLAMA3_VOCAB]
    tok = Tokenizer.from_str(json.dumps(spec))
    bos, eos = tok.id_to_token(LLAMA3_BOS), tok.id_to_token(LLAMA3_EOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A:0", pair=f"{bos} $A:0 {bos}:1 $B:1",
                                                       special_tokens=[(bos, LLAMA3_BOS)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                            model_max_length=4096).save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(LLAMA3_CHAT_TEMPLATE)  # so the endpoint serves chat too


def _gguf_tokenizer_spec(gguf_vocab: Path) -> dict[str, Any]:
    """The tokenizer.json (as a dict) that transformers' GGUF loader makes of a vocab-only GGUF."""
    gguf_module(gguf_vocab)
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(gguf_vocab.parent, gguf_file=gguf_vocab.name)
    spec: dict[str, Any] = json.loads(loaded.backend_tokenizer.to_str())
    return spec


# Qwen2's vocabulary, which Qwen3 and Qwen3-MoE ship too: 151643 byte-level BPE tokens and the special ones after
# them, in an embedding of 151936 rows; Qwen prepends no BOS, and the base models end with <|endoftext|>
QWEN_VOCAB, QWEN_EOS = 151936, 151643
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def qwen_tokenizer(folder: Path, gguf_vocab: Path) -> Path:
    """Qwen's tokenizer in `folder` (made once: the GGUF loader takes a minute or two), read offline from llama.cpp's
    vocab-only GGUF, less the [PADn] tokens the loader pads the vocabulary with up to the embedding's rows (Qwen's
    tokenizer.json has none; convert_hf_to_gguf.py pads the GGUF itself). The converter recognises it by its
    pre-tokenizer hash as qwen2."""
    if (folder / "tokenizer.json").is_file():
        return folder
    spec = _gguf_tokenizer_spec(gguf_vocab)
    spec["added_tokens"] = [token for token in spec["added_tokens"] if not token["content"].startswith("[PAD")]
    spec["model"]["vocab"] = {piece: i for piece, i in spec["model"]["vocab"].items() if not piece.startswith("[PAD")}
    tok = Tokenizer.from_str(json.dumps(spec))
    eos = tok.id_to_token(QWEN_EOS)
    unfinished = folder.with_name(folder.name + ".part")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=eos,
                            model_max_length=4096).save_pretrained(unfinished)
    (unfinished / "chat_template.jinja").write_text(CHATML_TEMPLATE)
    unfinished.rename(folder)
    return folder


def _config(model_type: str, **values: Any) -> PreTrainedConfig:
    """transformers' config of `model_type` with `values`, naming its ForCausalLM class as a checkpoint's does."""
    config = AutoConfig.for_model(model_type, **values)
    config.architectures = [f"{type(config).__name__.removesuffix('Config')}ForCausalLM"]
    return config


def make_qwen(folder: Path, model_type: str, shape: dict[str, Any], tokenizer: Path,
              dtype: torch.dtype = torch.bfloat16, shard_bytes: int = SHARD_BYTES) -> Path:
    """A random decoder of a Qwen family (`model_type` qwen3 or qwen3_moe) of `shape` with Qwen's tokenizer (from
    qwen_tokenizer), stored in `dtype` (bf16, as the published checkpoints), experts one tensor each as published."""
    config = _config(model_type, vocab_size=QWEN_VOCAB, bos_token_id=QWEN_EOS, eos_token_id=QWEN_EOS,
                     pad_token_id=QWEN_EOS, dtype=str(dtype).removeprefix("torch."), **shape)

    def save_tokenizer(to: Path) -> None:
        for path in tokenizer.iterdir():
            shutil.copyfile(path, to / path.name)

    return _make_decoder(folder, config, save_tokenizer, dtype, shard_bytes)


def _random_tensor(name: str, shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    return torch.normal(0.0, 0.02, tuple(shape), generator=generator)  # transformers' Llama initializer


def _shard(shapes: dict[str, torch.Size], element_bytes: int = 4,
           shard_bytes: int = SHARD_BYTES) -> list[list[str]]:
    """Tensor names grouped into shards of at most `shard_bytes` at `element_bytes` a value, in order."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        if groups[-1] and size + shape.numel() * element_bytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += shape.numel() * element_bytes
    return groups


def _published(name: str, shape: torch.Size) -> dict[str, torch.Size]:
    """A tensor of transformers' modules as the Hub's checkpoints store it: the fused expert weights of a
    mixture of experts (gate_up_proj [E, 2I, H], down_proj [E, H, I]) as one nn.Linear weight per expert and
    projection (experts.{e}.gate_proj.weight [I, H], ...), which is also what save_pretrained writes."""
    prefix, _, kind = name.rpartition(".")
    if not prefix.endswith(".mlp.experts") or kind not in ("gate_up_proj", "down_proj"):
        return {name: shape}
    experts, rows, columns = shape
    if kind == "down_proj":
        return {f"{prefix}.{e}.down_proj.weight": torch.Size((rows, columns)) for e in range(experts)}
    return {f"{prefix}.{e}.{part}.weight": torch.Size((rows // 2, columns))
            for e in range(experts) for part in ("gate_proj", "up_proj")}


def weight_shapes(config: PreTrainedConfig) -> dict[str, torch.Size]:
    """The checkpoint's tensors as published (a tied lm_head left out, as transformers saves it; experts one
    tensor each), planned on the meta device."""
    with torch.device("meta"):
        state = AutoModelForCausalLM.from_config(config).state_dict()
    shapes = {key: size for name, t in state.items() for key, size in _published(name, t.shape).items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes


def save_random_weights(config: PreTrainedConfig, folder: Path, dtype: torch.dtype = torch.float32,
                        shard_bytes: int = SHARD_BYTES) -> None:
    """Random weights as transformers initializes a Llama (drawn in fp32, stored as `dtype`), planned on the
    meta device and written one shard of at most `shard_bytes` at a time, named as the Hub names them: a
    shard's tensors are made for it and freed after it, so the model never sits in memory whole."""
    shapes = weight_shapes(config)
    element_bytes = torch.empty((), dtype=dtype).element_size()
    generator = torch.Generator().manual_seed(0)
    groups = _shard(shapes, element_bytes, shard_bytes)
    files = ["model.safetensors"] if len(groups) == 1 else [
        f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    for names, file in zip(groups, files, strict=True):
        save_file({name: _random_tensor(name, shapes[name], generator).to(dtype) for name in names}, folder / file,
                  metadata={"format": "pt"})
    if len(groups) > 1:
        index = {"metadata": {"total_size": sum(s.numel() * element_bytes for s in shapes.values())},
                 "weight_map": {name: file for names, file in zip(groups, files, strict=True) for name in names}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _make_decoder(folder: Path, config: PreTrainedConfig, save_tokenizer: Callable[[Path], None], dtype: torch.dtype,
                shard_bytes: int) -> Path:
    if (folder / "config.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    save_tokenizer(folder)
    save_random_weights(config, folder, dtype, shard_bytes)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     do_sample=False).save_pretrained(folder)
    config.save_pretrained(folder)  # last: its presence marks a finished folder
    return folder


def make_spm_decoder(folder: Path, model_type: str, shape: dict[str, Any], gguf_vocab: Path,
                     dtype: torch.dtype = torch.float32, shard_bytes: int = SHARD_BYTES) -> Path:
    """A random decoder of `model_type` (llama, qwen3_moe) of `shape` with the real Llama SPM tokenizer (VOCAB
    tokens, BOS 1 / EOS 2), readable by mbuild, vLLM and convert_hf_to_gguf.py."""
    config = _config(model_type, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2,
                     dtype=str(dtype).removeprefix("torch."), **shape)
    return _make_decoder(folder, config, partial(save_spm_tokenizer, gguf_vocab=gguf_vocab), dtype, shard_bytes)


def make_llama_spm(folder: Path, shape: dict[str, Any], gguf_vocab: Path, dtype: torch.dtype = torch.float32,
                   shard_bytes: int = SHARD_BYTES) -> Path:
    """A random Llama of `shape` with the real Llama SPM tokenizer (make_spm_decoder's llama)."""
    return make_spm_decoder(folder, "llama", shape, gguf_vocab, dtype, shard_bytes)


def make_llama_bpe(folder: Path, shape: dict[str, Any], gguf_vocab: Path, dtype: torch.dtype = torch.bfloat16,
                   shard_bytes: int = SHARD_BYTES) -> Path:
    """A random Llama of `shape` with Llama 3's BPE tokenizer (BOS 128000, EOS 128001 as the base models)."""
    config = LlamaConfig(vocab_size=LLAMA3_VOCAB, bos_token_id=LLAMA3_BOS, eos_token_id=LLAMA3_EOS,
                         architectures=["LlamaForCausalLM"], dtype=str(dtype).removeprefix("torch."), **shape)
    return _make_decoder(folder, config, partial(save_bpe_tokenizer, gguf_vocab=gguf_vocab), dtype, shard_bytes)
