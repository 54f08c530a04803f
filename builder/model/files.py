"""Which files of a repository a build needs: configs, tokenizer, chat templates, the model card, one weights
format. The one list both the Hub pull (its allow patterns) and a local folder's digest take, so every file the
export reads is fetched, and a change to any of them is a new model version (a new engine, a new tag)."""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatch

from builder.errors import UnsupportedModel

# Folders of other runtimes' exports and framework formats we never read.
_SKIP_DIRS = ("onnx/", "openvino/", "coreml/", "tf/", "flax/", "original/", "gguf/", ".")
_SMALL = ("*.json", "*.txt", "*.model", "*.tiktoken", "tokenizer*")
# Where transformers (>= 4.43, and 5 always) saves a tokenizer's chat template, and its named others; the export
# reads them through AutoTokenizer (chat_template.json, the processors' legacy file, is among *.json).
_TEMPLATES = ("chat_template.jinja", "additional_chat_templates/*.jinja")
_SAFETENSORS = "*.safetensors"
_TORCH_BIN = ("pytorch_model*.bin", "*/pytorch_model*.bin")


def select_files(repo_files: Iterable[str]) -> list[str]:
    """Pick configs, tokenizer files, chat templates and the weights, preferring safetensors over .bin."""
    files = [f for f in repo_files if not f.startswith(_SKIP_DIRS)]
    small = [f for f in files if any(fnmatch(f.rsplit("/", 1)[-1], p) for p in _SMALL)]
    templates = [f for f in files if any(fnmatch(f, p) for p in _TEMPLATES)]
    weights = [f for f in files if fnmatch(f, _SAFETENSORS)]
    if not weights:
        weights = [f for f in files if any(fnmatch(f, p) for p in _TORCH_BIN)]
    if not weights:
        raise UnsupportedModel(
            "the repository holds no safetensors or PyTorch weights",
            hint="mbuild builds from safetensors (or pytorch_model.bin) checkpoints",
        )
    if "config.json" not in files:
        raise UnsupportedModel("the repository has no config.json at its top level")
    card = ["README.md"] if "README.md" in files else []  # its tags say what an embedder was trained for
    return sorted(set(small) | set(templates) | set(weights) | set(card))
