"""What an export hands the compile stage: typed, so a field's name is checked where it is read."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class ExportShape:
    """What compile settings need from the graph; known from the model's facts before exporting (plan-only)."""

    inputs: tuple[str, ...]
    max_seq_length: int
    options: dict[str, Any]  # the task's own: pooling for encoders, layers, kv_heads, head_dim for decoders


@dataclass(frozen=True)
class ExportResult(ExportShape):
    """model.onnx and tokenizer.json were written; these are the engine.json fields they imply."""

    task: str
    output: str
    dimensions: int
    pad_token_id: int

    def capped(self, context: int | None) -> ExportResult:
        """The served context is what the profile reserved KV cache for, not the model's longest."""
        return replace(self, max_seq_length=min(self.max_seq_length, context)) if context else self

    def engine_fields(self, engine: str, model_file: str, options: dict[str, Any]) -> dict[str, Any]:
        """engine.json's fields: these, the engine, and the export's options joined with the compile's."""
        return {**asdict(self), "inputs": list(self.inputs), "engine": engine, "model_file": model_file,
                "options": {**self.options, **options}}
