"""What an export hands the compile stage: typed, so a field's name is checked where it is read."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from builder.model.geometry import HeadGeometry
from runtimes.bundle.codec import decode, encode
from runtimes.bundle.engine import OPTIONS, Batching, EngineConfig, Options, OrtBuild, Task


@dataclass(frozen=True)
class ExportShape:
    """What compile settings need from the graph; known from the model's facts before exporting (plan-only)."""

    inputs: tuple[str, ...]
    max_seq_length: int
    geometry: HeadGeometry | None  # decoders: the KV cache's shape; None for encoders


@dataclass(frozen=True)
class ExportResult(ExportShape):
    """model.onnx and tokenizer.json were written; these are the engine.json fields they imply."""

    task: Task
    output: str
    pad_token_id: int
    options: Options  # engine.json's options: the task's own
    attention_heads: int = 0  # encoders: the heads whose scores bound a batch's memory (0: a decoder's, unbounded)
    source_format: str = ""  # a pre-quantized checkpoint's format as published (quantization.py's label); "" if not
    requantized: bool = False  # its values rounded again into the engine's weights (not fp32, its codes not kept)

    def capped(self, context: int | None) -> ExportResult:
        """The served context is what the profile reserved KV cache for, not the model's longest."""
        return replace(self, max_seq_length=min(self.max_seq_length, context)) if context else self

    def engine_config(self, engine: str, model_file: str, precision: str, batching: Batching,
                      onnxruntime: OrtBuild | None = None) -> EngineConfig:
        """engine.json: these fields, with what the compile stage decided."""
        return EngineConfig(engine=engine, task=self.task, model_file=model_file,  # type: ignore[arg-type]
                            tokenizer_file="tokenizer.json", inputs=self.inputs, output=self.output,
                            max_seq_length=self.max_seq_length, pad_token_id=self.pad_token_id,
                            precision=precision, batching=batching, options=self.options, onnxruntime=onnxruntime,
                            attention_heads=self.attention_heads, source_format=self.source_format,
                            requantized=self.requantized)

    def save(self, path: Path) -> None:
        """For the export's child process to hand back (export_worker)."""
        path.write_text(json.dumps(encode(self)))

    @classmethod
    def load(cls, path: Path) -> ExportResult:
        raw = json.loads(path.read_text())
        return decode(cls, raw, path.name, types_={"options": OPTIONS[raw["task"]]})
