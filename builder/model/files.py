"""Which files of a repository a build needs: configs, tokenizer, the model card, one weights format."""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatch

from builder.errors import UnsupportedModel

# Folders of other runtimes' exports and framework formats we never read.
_SKIP_DIRS = ("onnx/", "openvino/", "coreml/", "tf/", "flax/", "original/", "gguf/", ".")
_SMALL = ("*.json", "*.txt", "*.model", "*.tiktoken", "tokenizer*")
_SAFETENSORS = "*.safetensors"
_TORCH_BIN = ("pytorch_model*.bin", "*/pytorch_model*.bin")


def select_files(repo_files: Iterable[str]) -> list[str]:
    """Pick configs, tokenizer files and the weights, preferring safetensors over .bin."""
    files = [f for f in repo_files if not f.startswith(_SKIP_DIRS)]
    small = [f for f in files if any(fnmatch(f.rsplit("/", 1)[-1], p) for p in _SMALL)]
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
    return sorted(set(small) | set(weights) | set(card))
