"""The language model the LLM benchmark runs: a random ~100M-parameter Llama, made on the spot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 32000


def make_llama_100m(folder: Path) -> Path:
    """12 layers, hidden 640, GQA 10/5 heads, vocab 32000: 95.5M parameters, random weights.

    A word-level tokenizer over 32000 made-up words keeps every id decodable with a realistic vocab; the
    special tokens get names no word contains, so "w1000" is one token, not "w1" + "000".
    """
    if (folder / "model.safetensors").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    special = {"<unk>": 0, "<s>": 1, "</s>": 2}
    tok = Tokenizer(models.WordLevel(vocab={**special, **{f"w{i}": i for i in range(3, VOCAB)}}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<unk>",
                            unk_token="<unk>",
                            model_max_length=2048).save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=640, intermediate_size=1728, num_hidden_layers=12,
                         num_attention_heads=10, num_key_value_heads=5, max_position_embeddings=2048,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    GenerationConfig(bos_token_id=1, eos_token_id=2, do_sample=False).save_pretrained(folder)
    return folder


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
