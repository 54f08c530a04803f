"""A model whose own files are broken is refused with what is wrong in which file, its own exit code
(UnsupportedModel), never "internal error" (70) or the export's traceback: an end token outside the vocabulary,
a tokenizer that cannot encode or drops the gate's plain text, no tokenizer at all. Each exports a tiny model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import LlamaConfig, PreTrainedTokenizerFast

from builder.cli import INTERNAL_ERROR, cli
from builder.errors import UnsupportedModel
from tests.support.tiny_models import save_random_decoder

pytestmark = pytest.mark.slow


def package(model: Path, out: Path) -> Result:
    result = CliRunner().invoke(cli, ["package", str(model), "--backend", "none", "--precision", "fp32",
                                      "-o", str(out)])
    assert result.exit_code != INTERNAL_ERROR and "Traceback" not in result.output, result.output
    assert "bug in mbuild" not in result.output, result.output
    return result


def test_an_end_token_outside_the_vocabulary_is_named(tiny_llama: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_llama, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "bos_token_id": 100_000, "eos_token_id": 100_001}))
    result = package(model, tmp_path / "out")
    assert result.exit_code == UnsupportedModel.exit_code, result.output
    assert (f"config.json names eos_token_id 100001, outside the model's vocabulary of {config['vocab_size']} tokens"
            in result.output and "hint: fix eos_token_id in config.json" in result.output), result.output


def _llama_with(tokenizer: Tokenizer, folder: Path, **special: str) -> Path:
    """A random two-layer Llama whose tokenizer is `tokenizer` (its special tokens named by `special`)."""
    save_random_decoder(LlamaConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=128,
                                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                    max_position_embeddings=512, bos_token_id=1, eos_token_id=2), folder)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                            **special).save_pretrained(folder)
    return folder


def _trained(text: str, unknown: str | None) -> Tokenizer:
    """A BPE tokenizer of `text`'s characters alone, with `unknown` as its model's unknown token (None: none)."""
    tokenizer = Tokenizer(models.BPE(unk_token=unknown))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator([text] * 10, trainers.BpeTrainer(vocab_size=50, special_tokens=["<s>", "</s>"]))
    return tokenizer


@pytest.mark.parametrize(("case", "says"), [
    ("the unknown token is the pad token, an added one", "cannot encode the text 'The quick brown fox': Unk token"),
    ("no unknown token: what it lacks is dropped", "turns the text 'The quick brown fox' into no tokens at all"),
])
def test_a_tokenizer_that_cannot_encode_plain_text_is_refused(tmp_path: Path, case: str, says: str) -> None:
    if case.startswith("the unknown token"):
        tokenizer = _trained("abc def", unknown="<pad>")
        tokenizer.add_special_tokens(["<pad>"])  # in the tokenizer, but not among its BPE model's tokens
    else:
        tokenizer = _trained("zzz", unknown=None)
    model = _llama_with(tokenizer, tmp_path / "model", pad_token="<pad>", unk_token="<pad>")
    result = package(model, tmp_path / "out")
    assert result.exit_code == UnsupportedModel.exit_code and says in result.output, result.output
    assert "hint: check the model's tokenizer.json" in result.output


def test_a_model_without_its_tokenizer_says_what_is_missing(tiny_llama: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_llama, model)
    (model / "tokenizer.json").unlink()
    result = package(model, tmp_path / "out")
    assert result.exit_code == UnsupportedModel.exit_code, result.output
    assert "the model's tokenizer cannot be loaded: it has no tokenizer.json" in result.output, result.output
    assert "hint: mbuild serves with the model's fast tokenizer: the folder needs its tokenizer.json" in result.output
