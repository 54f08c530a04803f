"""The model folder Dynamo's frontend reads a worker's model from (its "model deployment card"): the bundle's
tokenizer, and the template, special tokens, context and stop ids engine.json holds, written in the Hugging Face
files the frontend looks for. The frontend tokenizes and renders chat from it; the worker takes token ids.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from runtimes.bundle import EngineConfig


def write_card(model_dir: Path, config: EngineConfig, folder: Path) -> Path:
    options = config.decoder
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(model_dir / config.tokenizer_file, folder / "tokenizer.json")
    tokens = dict(options.special_tokens)
    eos = list(options.eos_token_ids)
    template = {"chat_template": options.chat_template} if options.chat_template else {}
    files: dict[str, dict[str, Any]] = {
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast",
                                  "model_max_length": config.max_seq_length, **template,
                                  **{k: v for k, v in tokens.items() if k in ("bos_token", "eos_token", "pad_token")}},
        # the frontend reads the context and the stop ids here and runs no model; its parser requires an
        # architecture and a model_type, which name this server's engine rather than any transformers class
        "config.json": {"architectures": ["MbuildEngine"], "model_type": "mbuild", "vocab_size": options.vocab_size,
                        "max_position_embeddings": config.max_seq_length,
                        "eos_token_id": eos},
        "generation_config.json": {"eos_token_id": eos},
    }
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content, indent=2) + "\n")
    return folder
