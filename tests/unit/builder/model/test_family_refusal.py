"""Which language models are built and which refused, decided when planning from config.json alone, before any
weights are looked for or downloaded: a type with a fast lane or one the generic export traces is planned (and
the plan says which path, recurrent-state models included); a model whose code keeps its recurrent state outside
transformers' Cache, an encoder-decoder, or a type transformers has no causal LM for is refused with the reason,
exit 7. Configs come from transformers' own config classes,
saved as a Hub repo holds them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import transformers as tf
from click.testing import CliRunner, Result

from builder.cli import INTERNAL_ERROR, cli
from builder.errors import UnsupportedModel
from builder.model.facts import infer_task
from builder.model.families import FAMILIES, WRAPPERS
from builder.model.shape import facts_from_config
from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.family_configs import COMMON, family_configs

TINY = {k: COMMON[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers")}
# model_type: (its config class, the architecture its Hub repos name, what the refusal says it is)
REFUSED: dict[str, tuple[Any, str, str]] = {
    # recurrent state its modeling code keeps outside transformers' Cache (where the generic export finds it)
    "rwkv": (lambda: tf.RwkvConfig(**TINY), "RwkvForCausalLM",
             "no attention layers: a recurrent model, whose modeling code keeps its per-sequence state outside"),
    "recurrent_gemma": (lambda: tf.RecurrentGemmaConfig(**COMMON), "RecurrentGemmaForCausalLM",
                        "a hybrid with recurrent layers"),
    "bart": (lambda: tf.BartConfig(**TINY, is_encoder_decoder=False), "BartForCausalLM", "an encoder-decoder model"),
    # attention within fixed chunks of the sequence (Llama 4's), which no window computes
    "llama4_text": (lambda: tf.Llama4TextConfig(**COMMON, attention_chunk_size=16), "Llama4ForCausalLM",
                    "attention of kinds mbuild's attention does not compute (chunked_attention)"),
    # its own attention and no KV cache: every step recomputes the whole sequence
    "openai-gpt": (lambda: tf.OpenAIGPTConfig(n_embd=64, n_layer=2, n_head=4, vocab_size=512), "OpenAIGPTLMHeadModel",
                   "its modeling code keeps no KV cache"),
    # a masked language model transformers also maps as a causal LM
    "xlm": (lambda: tf.XLMConfig(emb_dim=64, n_layers=2, n_heads=4, vocab_size=512), "XLMWithLMHeadModel",
            "its config says its attention is not causal"),
    # a vision encoder-decoder's text decoder: its config sizes cross-attention to the encoder's states
    "trocr": (lambda: tf.TrOCRConfig(vocab_size=256, d_model=64, decoder_layers=2), "TrOCRForCausalLM",
              "an encoder-decoder model or its decoder"),
}
SUPPORTED_LIST = "supported families: " + ", ".join(sorted(FAMILIES))


def run(args: list[str]) -> Result:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != INTERNAL_ERROR and "Traceback" not in result.output, result.output
    return result


def repo_folder(root: Path, config: Any, architecture: str) -> Path:
    """What a repo holds but its weights: config.json and tokenizer files."""
    folder = root / str(config.model_type)
    config.architectures = [architecture]
    config.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    (folder / "tokenizer_config.json").write_text("{}")
    return folder


@pytest.mark.parametrize("model_type", list(REFUSED))
@pytest.mark.parametrize("command", ["plan", "package"])
def test_a_model_the_exports_cannot_build_is_refused_with_why_before_its_weights(
        tmp_path: Path, model_type: str, command: str) -> None:
    make, architecture, why = REFUSED[model_type]
    folder = repo_folder(tmp_path, make(), architecture)
    out = tmp_path / "out"
    extra = ["--backend", "none", "--output", str(out)] if command == "package" else []
    result = run([command, str(folder), "--gpu", "cpu", *extra])
    assert result.exit_code == UnsupportedModel.exit_code, result.output
    assert f"language models of type {model_type!r} are not supported: {why}" in result.output
    assert "docs/models.md" in result.output and "safetensors" not in result.output
    assert not out.exists()


def test_a_type_transformers_does_not_know_is_refused_naming_the_families(tmp_path: Path) -> None:
    config = family_configs()["llama"]
    folder = repo_folder(tmp_path, config, "LlamaForCausalLM")
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**saved, "model_type": "lama"}))
    result = run(["plan", str(folder), "--gpu", "cpu"])
    assert result.exit_code == UnsupportedModel.exit_code, result.output
    assert "language models of type 'lama' are not supported" in result.output
    assert SUPPORTED_LIST in result.output and "the nearest is 'llama'" in result.output


PLANNED = {"qwen3": lambda: family_configs()["qwen3"], "phi": lambda: tf.PhiConfig(**COMMON),
           "mamba": lambda: tf.MambaConfig(**TINY), "jamba": lambda: tf.JambaConfig(**COMMON),
           "qwen3_next": lambda: tf.Qwen3NextConfig(**COMMON)}


@pytest.mark.parametrize("model_type", list(PLANNED))
def test_a_folder_without_weights_is_refused_for_its_weights_after_its_path_is_chosen(tmp_path: Path,
                                                                                     model_type: str) -> None:
    """The other side: a fast lane's type (qwen3) or a generic one (phi; mamba, jamba and qwen3_next, whose
    recurrent state transformers' Cache holds) passes, and what is missing is said."""
    config = PLANNED[model_type]()
    folder = repo_folder(tmp_path, config, f"{type(config).__name__.removesuffix('Config')}ForCausalLM")
    result = run(["plan", str(folder), "--gpu", "cpu"])
    assert result.exit_code == UnsupportedModel.exit_code
    assert "no safetensors or PyTorch weights" in result.output and "not supported" not in result.output


def test_a_hub_repo_of_a_generic_type_is_planned_from_its_config_json_alone(fake_hub: FakeHub,
                                                                           tmp_path: Path) -> None:
    folder = repo_folder(tmp_path, tf.CohereConfig(**COMMON), "CohereForCausalLM")
    (folder / "model.safetensors").write_bytes(b"\0" * 4096)
    fake_hub.repos["org/cohere"] = FakeRepo(folder, sha="2" * 40)
    result = run(["plan", "org/cohere", "--gpu", "cpu"])
    assert result.exit_code == 0, result.output
    assert "path       generic: traced from transformers' own 'cohere' modeling code" in result.output
    downloads = [r for r in fake_hub.requests if "/resolve/" in r]
    assert downloads and all(r.endswith("/config.json") for r in downloads), downloads


def test_a_multimodal_wrapper_whose_text_model_is_not_built_is_refused_by_name(tmp_path: Path) -> None:
    config = tf.LlavaConfig(text_config=family_configs()["llama"].to_dict(),
                            vision_config={"model_type": "clip_vision_model", "hidden_size": 32,
                                           "intermediate_size": 64, "num_hidden_layers": 1,
                                           "num_attention_heads": 2})
    folder = repo_folder(tmp_path, config, "LlavaForConditionalGeneration")
    result = run(["plan", str(folder), "--gpu", "cpu"])
    assert result.exit_code == UnsupportedModel.exit_code, result.output
    assert "multimodal models of type 'llava' (a 'llama' model with other inputs)" in result.output
    assert f"the text model of {', '.join(sorted(WRAPPERS))}" in result.output


def test_gemma3s_wrapper_is_sized_by_its_text_model_and_planned_on_the_generic_path(tmp_path: Path) -> None:
    """google/gemma-3-4b-it and up: a vision tower around a gemma3_text model. Its text model is what is sized
    (the vision tower only adds to the download); the generic export traces the wrapper's own forward on text, so
    it plans, from config.json or the catalog, on that path (the sweep builds a tiny one against transformers)."""
    text = family_configs()["gemma3_text"]
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "patch_size": 4, "image_size": 16}
    folder = repo_folder(tmp_path, tf.Gemma3Config(text_config=text.to_dict(), vision_config=vision),
                         "Gemma3ForConditionalGeneration")
    saved = json.loads((folder / "config.json").read_text())
    assert infer_task(("config.json",), saved, "org/gemma3") == "text-generation"
    wrapped, alone = facts_from_config(saved, "text-generation"), facts_from_config(text.to_dict(), "text-generation")
    assert (wrapped.family, wrapped.wrapper, alone.wrapper) == ("gemma3_text", "gemma3", "")
    assert wrapped.params == alone.params and wrapped.layers == alone.layers == text.num_hidden_layers
    assert (wrapped.checkpoint_gb or 0) > (alone.checkpoint_gb or 0)  # the vision tower is downloaded too
    from_folder = run(["plan", str(folder), "--gpu", "cpu"])  # planned, then refused for the weights it lacks
    assert "no safetensors or PyTorch weights" in from_folder.output and "multimodal" not in from_folder.output
    from_catalog = run(["plan", "gemma-3-4b", "--gpu", "cpu"])
    assert from_catalog.exit_code == 0, from_catalog.output
    assert "path       generic: traced from transformers' own 'gemma3' modeling code" in from_catalog.output
    one_b = run(["plan", "gemma-3-1b", "--gpu", "cpu"])  # Gemma 3's text-only size: the fast lane
    assert one_b.exit_code == 0, one_b.output
    assert "path       fast lane: mbuild's hand-written graph for 'gemma3_text'" in one_b.output


@pytest.mark.parametrize("broken", [{"num_hidden_layers": "many"}, {"hidden_size": -64}, {"num_local_experts": [4]},
                                    {"mlp_only_layers": ["first"]}, {"vocab_size": 0}])
def test_a_config_json_with_unusable_sizes_is_refused_not_a_crash(tmp_path: Path, broken: dict[str, Any]) -> None:
    config = family_configs()["qwen3_moe"]
    folder = repo_folder(tmp_path, config, "Qwen3MoeForCausalLM")
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**saved, **broken}))
    result = run(["plan", str(folder), "--gpu", "cpu"])
    assert result.exit_code == UnsupportedModel.exit_code and "config" in result.output, result.output


@pytest.mark.parametrize(("config", "architecture", "told"), [
    (lambda: tf.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, num_labels=3),  # type: ignore[call-arg]
     "BertForSequenceClassification", "a classifier (3 labels), which mbuild does not build yet"),
    (lambda: tf.Qwen2Config(**COMMON, num_labels=1),  # type: ignore[call-arg]
     "Qwen2ForSequenceClassification",
     "a reranker on a qwen2 body, which mbuild does not build yet"),
], ids=["bert-classifier", "qwen2-reranker"])
def test_a_sequence_classifier_that_is_no_encoder_reranker_is_refused_by_name(
        tmp_path: Path, config: Any, architecture: str, told: str) -> None:
    """A classification head of several labels (a classifier), or a one-label head on a decoder body, would be
    built wrong as an embedding or language model: each is refused by what it is, before any weights are looked
    for. (A one-label encoder head is a cross-encoder reranker: tests/unit/builder/engine/test_rerank.py builds it.)"""
    folder = repo_folder(tmp_path, config(), architecture)
    result = run(["plan", str(folder), "--gpu", "cpu"])
    assert result.exit_code == UnsupportedModel.exit_code, result.output
    assert f"is a sequence-classification model ({architecture}): {told}" in result.output
    assert "rerankers on encoder bodies" in result.output
