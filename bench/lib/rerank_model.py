"""The rerank benchmark's cross-encoder and its requests, made offline and deterministically.

No trained cross-encoder can be downloaded here, so the model is the real all-MiniLM-L6-v2 body (6 layers, hidden
384: cross-encoder/ms-marco-MiniLM-L6-v2's exact shape, so every arm does that model's work) under a one-label
classification head drawn from a seeded normal: its scores are compared between servers, not its ranking quality.
The head is scaled on the benchmark's own request so its logits spread over a few units around 0: then the
sigmoid scores are not all saturated, and comparing scores and the passages' order means something.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lib.mbuild import minilm_path

SEED = 20261201
PASSAGES = 32  # per request: 1 query x 32 passages
PASSAGE_TOKENS = (128, 256)  # each passage's own tokens (no special tokens), drawn uniformly in this range
LOGIT_STD = 1.5  # the head's logits over the request: a std of 1.5 spans about 5 units
QUERY = "how does a load balancer decide when a server replica can take traffic"
_WORD_LIST = """a about after all also an and any are as at back be because before between both but by can cache
container could data day decide deploy each even every few first for from good great health high how if image in
into is it its just latency like load long make many memory model more most much must network new no node not now
of on one only or other our out over people port process queue rate replica request restart right same server
service should since so some start such take than that the their them then there these they this those through
time to traffic two under up use very wait was way well were what when which while who will with work would year
you balancer cluster check probe timeout window answer batch token passage query score rank order core thread"""
WORDS = _WORD_LIST.split()  # some are two tokens under MiniLM's vocabulary: workload() leaves those out


@dataclass(frozen=True)
class Workload:
    """One request's texts and their token counts under the model's tokenizer."""

    query: str
    passages: list[str]
    passage_tokens: list[int]
    pair_tokens: list[int]  # [CLS] query [SEP] passage [SEP]: what a server runs per pair, untruncated

    def body(self) -> dict[str, Any]:
        """The Cohere-shaped body both servers take at /rerank and /v1/rerank."""
        return {"query": self.query, "documents": self.passages}


def _sentence(rng: random.Random, vocabulary: list[str]) -> str:
    words = [rng.choice(vocabulary) for _ in range(rng.randint(8, 18))]
    return " ".join([words[0].capitalize(), *words[1:]]) + "."


def workload(tokenizer_dir: Path, passages: int = PASSAGES) -> Workload:
    """`passages` seeded English-like passages, each grown sentence by sentence and then cut word by word to a
    token count drawn in PASSAGE_TOKENS, so every one truly holds 128-256 tokens under this tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))

    def tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    vocabulary = [word for word in WORDS if tokens(word) == 1]  # a popped word is then 1 token, 2 with its period
    rng = random.Random(SEED)
    texts, counts = [], []
    for _ in range(passages):
        target = rng.randint(PASSAGE_TOKENS[0] + 1, PASSAGE_TOKENS[1])  # popping may land one under it
        words: list[str] = []
        while tokens(" ".join(words)) < target:
            words += _sentence(rng, vocabulary).split()
        while tokens(" ".join(words)) > target:
            words.pop()
        texts.append(" ".join(words))
        counts.append(tokens(texts[-1]))
    if not all(PASSAGE_TOKENS[0] <= n <= PASSAGE_TOKENS[1] for n in counts):
        raise AssertionError(f"passage token counts {counts} leave {PASSAGE_TOKENS}")
    pairs = [len(tokenizer(QUERY, text)["input_ids"]) for text in texts]
    return Workload(QUERY, texts, counts, pairs)


def make_cross_encoder(folder: Path) -> Path:
    """The cross-encoder in `folder` (config, safetensors, MiniLM's tokenizer files), made once; the head's std and
    its logits over the request are kept beside it (head_record) for the report, outside the folder the servers
    read."""
    if head_record(folder).is_file():
        return folder
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.manual_seed(SEED)  # the head from_pretrained draws is redrawn below; seeded anyway, so nothing is left random
    model = BertForSequenceClassification.from_pretrained(str(minilm_path()), num_labels=1).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()))
    texts = workload(minilm_path())
    inputs = tokenizer([texts.query] * len(texts.passages), texts.passages, padding=True, return_tensors="pt")
    with torch.no_grad():
        pooled = model.bert(**inputs).pooler_output.double()  # what the classifier reads
        weight = torch.randn(pooled.shape[1], generator=torch.Generator().manual_seed(SEED), dtype=torch.float64)
        raw = pooled @ weight
        # Scale so the request's logits have LOGIT_STD, and centre them on 0: a std picked by hand would leave
        # them nearly equal (pooled outputs of similar passages are close) or all far on one side of the sigmoid
        scale = LOGIT_STD / float(raw.std())
        model.classifier.weight.copy_((weight * scale).unsqueeze(0).float())
        model.classifier.bias.fill_(-float(raw.mean()) * scale)
        logits = model(**inputs).logits.squeeze(-1)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    head = {"seed": SEED, "weight_std": scale, "bias": -float(raw.mean()) * scale,
            "request_logits": {"min": float(logits.min()), "max": float(logits.max()), "std": float(logits.std())}}
    head_record(folder).write_text(json.dumps(head, indent=2) + "\n")  # last: it marks a whole folder
    return folder


def head_record(folder: Path) -> Path:
    return folder.with_name(f"{folder.name}-head.json")


def head_facts(folder: Path) -> dict[str, Any]:
    return dict(json.loads(head_record(folder).read_text()))
