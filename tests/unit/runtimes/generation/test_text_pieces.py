"""Detokenization deltas and chat templates, against the tokenizer's and transformers' own results."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer

from runtimes.generation.chat_template import ChatTemplate, ChatTemplateError
from runtimes.generation.detokenize import Detokenizer

TEXTS = ["Hello, world! How are you?", "déjà vu — naïve café 😀 東京", "def add(a, b):\n    return a + b\n", ""]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_add_up_to_the_decoded_text(tiny_llama: Path, text: str) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    detok = Detokenizer(tokenizer)
    pieces = [detok.push(token) for token in ids] + [detok.flush()]
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)
    assert all("\ufffd" not in piece for piece in pieces)  # never half a character


def test_the_first_new_token_keeps_its_leading_space_with_a_sentencepiece_decoder() -> None:
    """A Metaspace (SentencePiece) decoder drops the space opening a sequence: decoded alone, the first
    generated token "▁Paris" would stream as "Paris", glued to the prompt."""
    pieces = ["<unk>", "▁The", "▁capital", "▁is", "▁Paris", "▁and", "▁nice", "."]
    tokenizer = Tokenizer(models.Unigram([(p, -1.0) for p in pieces], unk_id=0))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    prompt = tokenizer.encode("The capital is", add_special_tokens=False).ids
    made = tokenizer.encode(" Paris and nice.", add_special_tokens=False).ids
    detok = Detokenizer(tokenizer, prompt)
    streamed = "".join([detok.push(token) for token in made] + [detok.flush()])
    assert tokenizer.decode(made[:1]) == "Paris"  # the decoder's own behaviour, which the context undoes
    assert streamed == " Paris and nice."
    assert tokenizer.decode(prompt) + streamed == tokenizer.decode(prompt + made)


def test_chat_template_renders_as_transformers(tiny_llama: Path) -> None:
    hf = AutoTokenizer.from_pretrained(tiny_llama)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "  Tell me more  "}]
    ours = ChatTemplate(hf.chat_template, {"bos_token": hf.bos_token, "eos_token": hf.eos_token})
    for generation_prompt in (True, False):
        assert ours.render(messages, generation_prompt) == hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt)


def test_template_errors_are_chat_template_errors() -> None:
    strict = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}",
                          {})
    with pytest.raises(ChatTemplateError, match="user first"):
        strict.render([{"role": "assistant", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}", {})
