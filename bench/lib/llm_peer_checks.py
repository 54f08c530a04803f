"""Prompts of exact token counts, greedy agreement and shared-prefix TTFT for the llama.cpp comparison.

Each check talks to one mbuild server and one llama-server of the same weights; the client is bench/lib/llm_client.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
from pathlib import Path
from typing import Any

import httpx
from tokenizers import Tokenizer

from bench.lib.llm_client import stream_one
from runtimes.generation.sampling import MAX_LOGIT_BIAS

PROMPT_TOKENS = 64  # every throughput prompt, BOS included

# common English words; those the Llama SPM vocabulary holds as one token make prompts of exact lengths
_WORDS = """the of and to in is was for that with as on by at from his her they this which are were have had
one all their there been has when who will more out would up other into time only new some could these two may
then first any like now over such our man me even most made after also did many before must through back years
where much your way well down should because each just those people how too little state good very make world
still own see men work long get here between both life being under never day same another know while last might
us great old year off come since against go came right used take three states himself few house use during
without again place around however home small found thought went say part once general high upon school every
does got united left number course war until always away something fact though water less public put think
almost hand enough far took head yet government system better set told nothing night end why called find going
look asked later knew point next city business give group toward young days let room president side social
given present several order national second possible rather per face among form important often things early
white case become large big need four within felt along children saw best church ever least power development
light thing family interest want members others mind country area done turned although open"""
WORDS = _WORDS.split()


class Texts:
    """Texts that the model's own tokenizer (tokenizer.json in the model folder) encodes to exact lengths."""

    def __init__(self, model: Path) -> None:
        self.tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
        self.words = [w for w in WORDS if len(self.tokenizer.encode(w, add_special_tokens=False).ids) == 1
                      and len(self.tokenizer.encode(f"the {w}", add_special_tokens=False).ids) == 2]
        # the tokens the tokenizer adds to a text: Llama's BOS, none for Qwen
        self.added = len(self.tokenizer.encode("the").ids) - 1
        config = model / "config.json"  # the embedding's rows: Qwen's pad the tokenizer's ids
        self.rows = (int(json.loads(config.read_text())["vocab_size"]) if config.is_file()
                     else self.tokenizer.get_vocab_size())

    def silent(self, limit: int = MAX_LOGIT_BIAS) -> dict[str, float]:
        """logit_bias banning the tokens that stream no text on their own: special tokens, rows the tokenizer has
        no token for, byte pieces (a random model strings lone UTF-8 bytes together, which llama.cpp holds back
        until they form a character, maybe never: SentencePiece's <0xNN> pieces, byte-level BPE tokens that end
        inside a character) and the bare "\u2581" (mbuild drops a completion's opening space). Sent to both
        servers, so every token streams text and TTFT means the same on both. At most `limit` (OpenAI's limit on
        logit_bias entries, which mbuild enforces): where more stream no text, the special tokens first, then the
        missing rows, then the rest in id order; those left out, both servers hold back alike (each holds a text
        that ends inside a character)."""
        pattern = re.compile(r"<0x[0-9A-F]{2}>|<unk>|<s>|</s>|\u2581")
        special = {token.content for token in self.tokenizer.get_added_tokens_decoder().values() if token.special}
        pieces = [self.tokenizer.id_to_token(i) for i in range(self.rows)]
        texts = self.tokenizer.decode_batch([[i] for i in range(self.rows)], skip_special_tokens=False)
        banned = [i for i, (piece, text) in enumerate(zip(pieces, texts, strict=True))
                  if piece is None or pattern.fullmatch(piece) or piece in special or not text
                  or ("\ufffd" in text and "\ufffd" not in piece)]  # a piece that is U+FFFD streams it
        banned.sort(key=lambda i: (pieces[i] not in special, pieces[i] is not None))
        return {str(i): -100.0 for i in banned[:limit]}

    def count(self, text: str) -> int:
        """Prompt tokens as the servers see them: a BOS the tokenizer adds included."""
        return len(self.tokenizer.encode(text).ids)

    def text(self, tokens: int, seed: int, bos: bool = True) -> str:
        """`tokens` tokens (counting the BOS the servers add when `bos` and the tokenizer has one) of one-token
        words drawn with `seed`."""
        rng = random.Random(seed)
        words = tokens - (self.added if bos else 0)
        text = " ".join(rng.choice(self.words) for _ in range(words))
        if self.count(text) != words + self.added:
            raise RuntimeError(f"a text of {tokens} tokens came out at {self.count(text)}")
        return text

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text).ids)

    def continuation(self, prompt: list[int], generated: list[int]) -> str:
        """The text `generated` adds after `prompt`, as an incremental detokenizer streams it."""
        before = self.tokenizer.decode(prompt, skip_special_tokens=True)
        return self.tokenizer.decode(prompt + generated, skip_special_tokens=True)[len(before):]


def _unspaced(ours: str, theirs: str) -> str:
    """llama.cpp's text as mbuild spells it: mbuild drops the space that opens a completion's first token."""
    return theirs[1:] if theirs.startswith(" ") and not ours.startswith(" ") else theirs


def _agreeing(texts: Texts, prompt: list[int], tokens: list[int], ours: str) -> int:
    """How many of llama.cpp's tokens, decoded, are a prefix of mbuild's text."""
    return max((k for k in range(len(tokens) + 1)
                if ours.startswith(_unspaced(ours, texts.continuation(prompt, tokens[:k])))), default=0)


def greedy(mbuild: str, llama: str, model: str, texts: Texts, prompts: list[list[int]],
           new_tokens: int) -> dict[str, Any]:
    """Greedy continuations of token-id prompts from both servers: mbuild's text against llama.cpp's tokens
    (from /completion with return_tokens). mbuild returns text only, so a prompt counts as equal when llama.cpp's
    tokens, decoded by the model's tokenizer, give mbuild's text (up to the leading space, counted apart)."""
    rows = []
    with httpx.Client(timeout=600) as client:
        for prompt in prompts:
            ours = client.post(f"{mbuild}/v1/completions", json={
                "model": model, "prompt": prompt, "max_tokens": new_tokens, "min_tokens": new_tokens,
                "ignore_eos": True, "temperature": 0.0}).raise_for_status().json()["choices"][0]["text"]
            theirs = client.post(f"{llama}/completion", json={
                "prompt": prompt, "n_predict": new_tokens, "ignore_eos": True, "temperature": 0.0,
                "return_tokens": True, "cache_prompt": False}).raise_for_status().json()
            decoded = texts.continuation(prompt, theirs["tokens"])
            rows.append({"mbuild_text": ours, "llama_text": theirs["content"], "llama_tokens": theirs["tokens"],
                         "equal": ours == _unspaced(ours, decoded),
                         "leading_space_dropped": ours != decoded and ours == _unspaced(ours, decoded),
                         "agreeing_tokens": _agreeing(texts, prompt, theirs["tokens"], ours)})
    return {"prompts": len(rows), "equal": sum(r["equal"] for r in rows), "new_tokens": new_tokens,
            "leading_space_dropped": sum(r["leading_space_dropped"] for r in rows), "rows": rows}


async def _ttft(url: str, body: dict[str, Any]) -> tuple[float, int]:
    async with httpx.AsyncClient(timeout=900) as client:
        timing = await stream_one(client, url, body, len)
    return timing.ttft * 1000, timing.prompt_tokens


def prefix_ttft(url: str, body: dict[str, Any], texts: Texts, prefix_tokens: int, samples: int,
                seed: int) -> dict[str, Any]:
    """TTFT of prefix + a short new tail: with the prefix uncached (one never sent before) and cached (the
    same prefix sent once just before with another tail), alternating, `samples` of each."""
    def ask(prefix: str, tail: int) -> tuple[float, int]:
        prompt = f"{prefix} {texts.text(16, seed + 7919 * tail, bos=False)}"
        return asyncio.run(_ttft(url, {**body, "prompt": prompt}))

    cached, uncached, prompt_tokens = [], [], 0
    for sample in range(samples):
        fresh = texts.text(prefix_tokens, seed + 2 * sample)
        uncached.append(ask(fresh, 0)[0])
        shared = texts.text(prefix_tokens, seed + 2 * sample + 1)
        ask(shared, 1)  # puts the prefix in the cache
        ttft, prompt_tokens = ask(shared, 2)
        cached.append(ttft)
    ratio = statistics.median(cached) / statistics.median(uncached)
    return {"uncached_ms": uncached, "cached_ms": cached, "ratio": ratio, "prompt_tokens": prompt_tokens}
