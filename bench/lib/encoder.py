"""The embedding benchmarks' sentence, mbuild's encoder engine run in-process on it (no HTTP), and where an encoder
engine's time goes (ONNX Runtime's profiler)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtimes.bundle import load_engine_config
from runtimes.engines import encoder_for
from runtimes.engines.encoder import EncoderEngine
from runtimes.tokenize import TextTokenizer

SENTENCE = "mbuild turns a Hugging Face model into a container with a health-checked REST API"
SECONDS = 5.0  # the timing window of one case in a full run
QUICK_SECONDS = 1.0  # and in a quick one (`--quick`): enough to see it answer


class Engine:
    """The runtime's encoder in-process, fed whole batches: what the service could reach with no HTTP."""

    def __init__(self, model_dir: Path, threads: int = 0) -> None:
        config = load_engine_config(model_dir)
        self.engine = encoder_for(model_dir, config, threads)
        self.tokenizer = TextTokenizer(model_dir / "tokenizer.json", config.max_seq_length)
        self.max_batch = config.batching.max_batch  # as runtimes.state reads it

    def sentences_per_second(self, concurrency: int, seconds: float = SECONDS) -> float:
        texts, done = [SENTENCE] * concurrency, 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            seqs = self.tokenizer.encode(texts)
            for start in range(0, len(seqs), self.max_batch):
                self.engine.run(seqs[start : start + self.max_batch])
            done += concurrency
        return done / (time.perf_counter() - started)

    def call_ms(self) -> float:
        return 1000 / self.sentences_per_second(1, 2.0)


def flops_per_sequence(config: dict[str, Any], tokens: int) -> float:
    """Matmul FLOPs of a BERT encoder: Q, K, V, O and the two FFN projections, plus QK^T and AV."""
    hidden, ffn, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    per_layer = 2 * tokens * (4 * hidden * hidden + 2 * hidden * ffn) + 4 * tokens * tokens * hidden
    return float(layers * per_layer)


def op_shares(model_dir: Path, run: Callable[[EncoderEngine], object], threads: int, work: Path) -> dict[str, float]:
    """Each ONNX op type's share of the engine's kernel time while `run` drives it, from ONNX Runtime's profiler:
    the runtime's engine (its batching and splitting) over a session opened as the runtime opens it, profiling on."""
    import onnxruntime as ort

    config = load_engine_config(model_dir)
    engine = EncoderEngine(model_dir, config, threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # saved optimized, as served
    options.enable_profiling, options.profile_file_prefix = True, str(work / "ort-profile")
    session = ort.InferenceSession(str(model_dir / config.model_file), options, providers=["CPUExecutionProvider"])
    engine.session = session
    run(engine)
    events = json.loads(Path(session.end_profiling()).read_text())
    spent: dict[str, float] = {}
    for event in events:
        if event.get("cat") == "Node" and str(event.get("name", "")).endswith("_kernel_time"):
            op = str(event["args"]["op_name"])
            spent[op] = spent.get(op, 0.0) + float(event["dur"])
    total = sum(spent.values()) or 1.0
    return {op: value / total for op, value in sorted(spent.items(), key=lambda kv: -kv[1])}
