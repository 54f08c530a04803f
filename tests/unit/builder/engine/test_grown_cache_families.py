"""The grown-cache graph (decoder_torch.py, the one TensorRT builds) against transformers' generate, on every
family of the test matrix, run through ONNX Runtime on the CPU by the runtime's own DecoderEngine: greedy ids
equal token for token, for two rows at different lengths decoding together, one prompt prefilled in chunks
and crossing the sliding windows (8 tokens) before and while it decodes. The MoE families' experts are dense in
the graph, so a routing the trace baked in would show as different tokens here.
Beyond the matrix: Phi-3 and Mixtral with a sliding_window, which transformers then applies to every layer
(their configs have no layer_types), checked here and in the gate's reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from builder.engine.compile_ort import optimize
from builder.engine.export_decoder import export_decoder_tensorrt
from builder.engine.reference import reference_logits
from runtimes.bundle import Batching
from runtimes.engines.decoder import DecoderEngine
from tests.support.family_configs import WINDOW, decoded, family_configs, generated
from tests.support.tiny_models import save_random_decoder

pytestmark = pytest.mark.slow
PROMPTS = [[1, 17, 99, 3, 250, 42, 7], [1, 200, 201, 202, 9, 9, 9, 9, 9, 30, 31, 32, 33, 34]]
NEW = 12
CHUNK = 5
SLIDING_EVERYWHERE = ("phi3", "mixtral")


def _config(case: str) -> Any:
    family, _, variant = case.partition("-")
    config = family_configs()[family]
    if variant == "sliding":
        config.sliding_window = WINDOW
    return config


CASES = sorted(family_configs()) + [f"{family}-sliding" for family in SLIDING_EVERYWHERE]


def _served(engine: DecoderEngine) -> list[list[int]]:
    """Row 0 prefilled whole, row 1 in chunks on top of its own cache, then both decoding in one batch."""
    first = int(engine.run(0, np.array([PROMPTS[0]])).argmax())
    chunks = [PROMPTS[1][i:i + CHUNK] for i in range(0, len(PROMPTS[1]), CHUNK)]
    tokens = [first, int([engine.run(1, np.array([chunk])) for chunk in chunks][-1].argmax())]
    return decoded(engine, tokens, NEW)


@pytest.mark.parametrize("case", CASES)
def test_grown_cache_greedy_ids_equal_transformers(case: str, tmp_path: Path) -> None:
    assert len(PROMPTS[1]) > WINDOW + CHUNK and len(PROMPTS[0]) + NEW > WINDOW
    folder = save_random_decoder(_config(case), tmp_path / "model")
    exported = export_decoder_tensorrt(folder, tmp_path / "export")
    optimize(tmp_path / "export" / "model.onnx", tmp_path / "engine" / "model.onnx")
    engine = DecoderEngine(tmp_path / "engine", exported.engine_config("onnxruntime", "model.onnx", "fp32",
                                                                       Batching(4, 0)), threads=1)
    assert not engine.in_place
    engine.warm_up()  # as the server starts: what the warm-up wrote must go unread
    assert _served(engine) == generated(folder, PROMPTS, NEW)


@pytest.mark.parametrize("family", SLIDING_EVERYWHERE)
def test_the_reference_slides_every_layer_where_transformers_does(family: str, tmp_path: Path) -> None:
    folder = save_random_decoder(_config(f"{family}-sliding"), tmp_path / "model")
    sequence = PROMPTS[1] + PROMPTS[0]
    ours = reference_logits(folder, [sequence], [1])[0]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        whole = model(torch.tensor([sequence])).logits[0, :-1].numpy()
    assert float(np.abs(ours - whole).max()) < 1e-4
