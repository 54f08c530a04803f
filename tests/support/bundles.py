"""Small, valid contract files for tests that need a bundle's engine.json or report.json without building one,
and edit_json for tests that spoil one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runtimes.bundle import Batching, EncoderOptions, EngineConfig
from runtimes.bundle.codec import write_contract
from runtimes.bundle.report import EncoderReport, GateTolerance, InputCheck


def encoder_config() -> EngineConfig:
    return EngineConfig(engine="onnxruntime", task="embedding", model_file="model.onnx",
                        tokenizer_file="tokenizer.json", inputs=("input_ids", "attention_mask"),
                        output="sentence_embedding", max_seq_length=128, pad_token_id=0, precision="fp32",
                        batching=Batching(32, 2.0), options=EncoderOptions(embedding_dim=32, pooling="mean",
                                                                           normalize=True))


def encoder_report(passed: bool, summary: str = "min cosine 0.41 < 0.99", load_seconds: float = 1.0,
                   min_cosine: float = 0.41) -> EncoderReport:
    return EncoderReport(reference="sentence-transformers", tolerance=GateTolerance(0.99, True, 0.9, None),
                         load_seconds=load_seconds, summary=summary, passed=passed,
                         inputs=(InputCheck("hello", 3, min_cosine),), min_cosine=min_cosine, mean_cosine=min_cosine,
                         max_abs_diff=0.1)


def write_bundle_files(model_dir: Path, passed: bool | None) -> None:
    """engine.json, and report.json unless passed is None (never validated)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    write_contract(model_dir / "engine.json", encoder_config())
    if passed is not None:
        write_contract(model_dir / "report.json", encoder_report(passed))


def edit_json(path: Path, change: dict[str, Any]) -> None:
    """Set each dotted field of a JSON file to its value; ... deletes the field."""
    data = json.loads(path.read_text())
    for dotted, value in change.items():
        *parents, name = dotted.split(".")
        node = data
        for key in parents:
            node = node[key]
        if value is ...:
            del node[name]
        else:
            node[name] = value
    path.write_text(json.dumps(data))
