"""The decoder graphs against transformers' generate, on every family of the test matrix
(tests/support/family_configs.py): greedy ids must be equal token for token, with rows at different lengths
decoding together, a prompt longer than the sliding windows prefilled in chunks on top of its own cache in the
steps of other rows' decodes, and a multi-token verify row taken back past its rejected draft.
"""

from __future__ import annotations

import ctypes
import dataclasses
import mmap
from pathlib import Path

import numpy as np
import pytest

from builder.engine.compile_ort import optimize
from builder.engine.export_decoder import export_decoder, export_decoder_tensorrt
from builder.engine.rope import served_context
from runtimes.bundle import Batching
from runtimes.engines.decoder import DecoderEngine
from runtimes.engines.step import Work
from tests.support.family_configs import WINDOW, family_configs, generated
from tests.support.tiny_models import save_random_decoder

pytestmark = pytest.mark.slow
SHAPES = family_configs()
GROWN_CACHE = ("llama", "mistral", "qwen2")  # with mixed steps; every family: test_grown_cache_families.py
PROMPTS = [[1, 17, 99, 3, 250, 42, 7], [1, 5], [1, 200, 201, 202, 9, 9, 9, 9, 9, 30, 31, 32, 33, 34]]
NEW = 16


def _model(kind: str, folder: Path) -> Path:
    return save_random_decoder(SHAPES[kind], folder)


def _engine(folder: Path, out: Path, grown_cache: bool) -> DecoderEngine:
    exported = (export_decoder_tensorrt if grown_cache else export_decoder)(folder, out / "export")
    optimize(out / "export" / "model.onnx", out / "engine" / "model.onnx")
    return DecoderEngine(out / "engine", exported.engine_config("onnxruntime", "model.onnx", "fp32", Batching(4, 0)),
                         threads=1)


def _step(engine: DecoderEngine, works: list[Work]) -> list[np.ndarray]:
    output = engine.step(works)
    for error in output.errors.values():
        raise error
    return [output.logits[work.slot] for work in works]


def _served(engine: DecoderEngine, expected: list[list[int]]) -> list[list[int]]:
    """Mixed steps, as the scheduler plans them: rows 0 and 1 prefilled in one step (padded to the longer); row 2's
    prompt in chunks of 5, each in the step of a decode token of rows 0 and 1; then row 0 verifies three drafts in
    one multi-token row (its next two tokens and a wrong third), its cache taken back past the wrong one, while rows
    1 and 2 decode; then every row decodes until it has NEW tokens."""
    out: list[list[int]] = [[], [], []]
    for row, logits in enumerate(_step(engine, [Work(0, tuple(PROMPTS[0])), Work(1, tuple(PROMPTS[1]))])):
        out[row].append(int(logits.argmax()))
    chunks = [PROMPTS[2][i:i + 5] for i in range(0, len(PROMPTS[2]), 5)]
    for index, chunk in enumerate(chunks):
        last = index == len(chunks) - 1
        got = _step(engine, [Work(0, (out[0][-1],)), Work(1, (out[1][-1],)), Work(2, tuple(chunk), int(last))])
        for row in range(2 + last):
            out[row].append(int(got[row].argmax()))
    held = int(engine.lengths[0])
    drafts = (*expected[0][len(out[0]):len(out[0]) + 2], (expected[0][len(out[0]) + 2] + 1) % 256)
    got = _step(engine, [Work(0, (out[0][-1], *drafts), 4), Work(1, (out[1][-1],)), Work(2, (out[2][-1],))])
    verified = [int(t) for t in got[0].argmax(-1)]
    assert verified[:2] == list(drafts[:2])  # the two right drafts are accepted: the wrong one is rejected
    out[0] += verified[:3]  # the accepted two and the correction
    engine.truncate(0, held + 3)  # the last token and the two accepted drafts; the wrong draft's position goes
    out[1].append(int(got[1].argmax()))
    out[2].append(int(got[2].argmax()))
    while short := [row for row in range(3) if len(out[row]) < NEW]:
        for row, logits in zip(short, _step(engine, [Work(row, (out[row][-1],)) for row in short]), strict=True):
            out[row].append(int(logits.argmax()))
    return out


CASES = [(kind, False) for kind in sorted(SHAPES)] + [(kind, True) for kind in GROWN_CACHE]


@pytest.mark.parametrize(("kind", "grown_cache"), CASES, ids=[f"{k}-{'grown' if g else 'in-place'}" for k, g in CASES])
def test_greedy_ids_equal_transformers(kind: str, grown_cache: bool, tmp_path: Path) -> None:
    assert len(PROMPTS[2]) + NEW > 2 * WINDOW  # the long prompt and its decode cross every sliding window
    folder = _model(kind, tmp_path / "model")
    engine = _engine(folder, tmp_path, grown_cache)
    assert engine.in_place is not grown_cache
    engine.warm_up()  # as the server starts: what the warm-up wrote stays in slots 0 and 1, and must go unread
    expected = generated(folder, PROMPTS, NEW)
    assert _served(engine, expected) == expected


def _resident_share(buffer: np.ndarray) -> float:
    """The share of a buffer's pages the kernel has committed (mincore(2))."""
    page = mmap.PAGESIZE
    start = buffer.ctypes.data // page * page
    pages = (buffer.ctypes.data + buffer.nbytes - start + page - 1) // page
    flags = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * page), flags) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return sum(flag & 1 for flag in flags) / pages


def test_cache_pages_follow_the_written_positions(tmp_path: Path) -> None:
    """The cache is reserved for every slot's whole context, but a ready engine holds none of its pages; a prompt
    commits the pages of the positions it writes, in its own slot only (with transparent huge pages one token had
    committed 2 MB a head), and forget hands back those past a position: its tokens before it still answer."""
    engine = _engine(_model("llama", tmp_path / "model"), tmp_path, grown_cache=False)
    longer = dataclasses.replace(engine.config, max_seq_length=4096)  # within the rotary table: 96 used
    wide = DecoderEngine(tmp_path / "engine", longer, threads=1, slots=16)
    wide.warm_up()
    region = wide.context * wide.head_dim * wide.kv_dtype.itemsize  # one head of one slot
    assert region >= 4 * mmap.PAGESIZE and wide.cache[0].nbytes >= 1 << 20
    assert max(_resident_share(buffer) for buffer in wide.cache) == 0.0  # the warm-up's pages went back
    prompt = [5, 9, 2, 7] * 24  # 96 positions
    first = wide.run(3, np.array([prompt], np.int64))
    reach = -(-len(prompt) * wide.head_dim * wide.kv_dtype.itemsize // mmap.PAGESIZE) * mmap.PAGESIZE
    for buffer in wide.cache:
        assert _resident_share(buffer[3]) == pytest.approx(reach / region, abs=1 / 64)
        assert _resident_share(buffer[:3]) == _resident_share(buffer[4:]) == 0.0
    assert wide.written[3] == len(prompt)
    wide.forget(3, 32)
    assert wide.written[3] == 32 and all(_resident_share(b[3]) < reach / region for b in wide.cache)
    wide.truncate(3, 32)
    again = wide.run(3, np.array([prompt[32:]], np.int64))  # the kept positions still hold the prompt's start
    assert np.allclose(again, first, atol=1e-5)
    wide.release(3)
    wide.forget(3, 0)
    assert max(_resident_share(buffer) for buffer in wide.cache) == 0.0


def test_longrope_is_served_to_its_original_length() -> None:
    """Past original_max_position_embeddings LongRoPE switches every position to its long factors, which a
    table per position cannot express: the engine's context stops where its short-factor table is exact."""
    config = SHAPES["phi3"]
    assert config.rope_parameters["rope_type"] == "longrope"
    assert served_context(config) == config.rope_parameters["original_max_position_embeddings"]
    assert served_context(SHAPES["llama"]) == SHAPES["llama"].max_position_embeddings
