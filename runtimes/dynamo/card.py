"""The model folder Dynamo's frontend reads a worker's model from (its "model deployment card"): the bundle's
tokenizer, and the template, special tokens, context and stop ids engine.json holds, written in the Hugging Face
files the frontend looks for. The frontend tokenizes and renders chat from it; the worker takes token ids.

Every replica of a model must register the same card, path included (the frontend keeps the first and rejects a
worker whose card differs), so its folder is named by its content, under the temporary folder, and written once:
replicas that start together each write their own copy and rename it into place, and the first one stays.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from runtimes.bundle import EngineConfig


def write_card(model_dir: Path, config: EngineConfig, parent: Path) -> Path:
    """The card's folder under `parent`, named by the card's content."""
    options = config.decoder
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
    texts = {name: json.dumps(content, indent=2) + "\n" for name, content in files.items()}
    tokenizer = (model_dir / config.tokenizer_file).read_bytes()
    digest = hashlib.sha256(tokenizer + json.dumps(texts, sort_keys=True).encode()).hexdigest()[:16]
    folder = parent / f"mbuild-dynamo-card-{digest}"
    if folder.is_dir():
        return folder
    draft = Path(tempfile.mkdtemp(prefix=f"{folder.name}.", dir=parent))
    (draft / "tokenizer.json").write_bytes(tokenizer)
    for name, text in texts.items():
        (draft / name).write_text(text)
    try:
        draft.rename(folder)
    except OSError:  # another replica's copy got there first: the same content
        shutil.rmtree(draft, ignore_errors=True)
    return folder
