"""A draft model, end to end: `mbuild package TARGET --draft DRAFT` builds both engines through the real pipeline
(export, int8, each gated), the bundle names the draft, and the server drafts with it by default.

The target is the tiny Llama trained on a short text (tests/support/tiny_models.py); the draft is the same shape
with the same tokenizer, trained less, from another seed, on the same text with two phrases changed, so it agrees
with the target often and is wrong where the answers pass those phrases (chosen, not left to training's rounding:
how often two such models agree otherwise varies with the CPU that trains them). With
the draft on, every greedy answer must equal speculation off token for token, alone and several at once, with a
prefix-cache hit; its drafts must have been both accepted and refused. A draft that does not speak the target's
tokens, or is no language model, is refused with a clear error before anything is built for it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.build.pipeline import package
from builder.build.plan_package import PackageOptions
from builder.cli import cli
from builder.errors import InputError
from builder.progress import Reporter
from runtimes.bundle import BundleError, load_engine_config, load_metadata
from runtimes.bundle.metadata import DRAFT_DIR, METADATA_FILE
from runtimes.generation import draft as draft_module
from runtimes.generation.loader import GenerationRuntime
from runtimes.metrics import Metrics
from runtimes.settings import Settings
from tests.support.tiny_models import TRAINING_TEXT, make_tiny_llama
from tests.unit.runtimes.generation.test_speculative_served import same_greedy_answers


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    changed = TRAINING_TEXT.replace("lazy dog", "lazy cat").replace("Hello, world", "Hello, there")
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-draft"), train_steps=40, seed=1, text=changed)


@pytest.fixture(scope="module")
def drafted_build(tiny_llama: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("drafted-build")
    package(PackageOptions(model=str(tiny_llama), output=out, backend="none", draft=str(tiny_draft)),
            Reporter(quiet=True))
    return out


def test_the_bundle_carries_the_gated_draft_and_the_plan_its_memory(drafted_build: Path, tiny_draft: Path) -> None:
    model = drafted_build / "model"
    metadata = json.loads((model / METADATA_FILE).read_text())
    assert metadata["draft"]["repo"] == f"local/{tiny_draft.name}"
    report = json.loads((model / DRAFT_DIR / "report.json").read_text())
    assert report["passed"] is True
    assert json.loads((model / DRAFT_DIR / "engine.json").read_text())["precision"] == "int8"
    plan = json.loads((drafted_build / "plan.json").read_text())
    alone = plan["draft"]["memory"]
    # The draft's int8 cache is a few MB, 0.0 at the plan's two decimals: its token count says it was planned.
    assert alone["kv_tokens"] > 0 and plan["memory"]["kv_cache_gb"] > alone["kv_cache_gb"]
    assert plan["draft"]["repo"] == metadata["draft"]["repo"]


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_answers_are_the_same_with_the_draft_on(drafted_build: Path, batch: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # At this size a step is ONNX Runtime's call overhead (~65 us measured for either model), so the draft costs
    # what the target does and the server rightly never uses it; priced as a draft a tenth of its target's cost,
    # which is what this test needs to run drafts through the real graphs.
    monkeypatch.setattr(draft_module, "draft_cost", lambda draft, target: 0.1)
    drafted, accepted = same_greedy_answers(drafted_build / "model", batch)  # auto: the bundle's draft
    print(f"batch {batch}: {accepted} of {drafted} draft-model drafts accepted")
    assert 0 < accepted < drafted


def test_a_server_told_to_draft_without_a_draft_model_fails_with_what_to_do(tiny_llm_build: Path) -> None:
    model = tiny_llm_build / "model"
    with pytest.raises(BundleError, match=r"carries no draft model.*--draft"):
        GenerationRuntime.load(model, load_engine_config(model), Settings(model_dir=model, speculative="draft"),
                               Metrics(), load_metadata(model))


def test_a_draft_with_another_tokenizer_or_task_is_refused(tiny_llama: Path, tiny_draft: Path,
                                                           tiny_encoder: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-tokens"
    shutil.copytree(tiny_draft, other)
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[100:102]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # two tokens' ids swapped: same size, other ids
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(InputError, match="tokenizer is not the target's") as refused:
        package(PackageOptions(model=str(tiny_llama), output=tmp_path / "a", backend="none", draft=str(other)),
                Reporter(quiet=True))
    assert refused.value.exit_code == 2 and not (tmp_path / "a" / "model" / DRAFT_DIR / "model.onnx").exists()
    with pytest.raises(InputError, match="a draft model is a language model"):
        package(PackageOptions(model=str(tiny_llama), output=tmp_path / "b", backend="none",
                               draft=str(tiny_encoder)), Reporter(quiet=True))


def test_the_plan_names_the_draft_and_holds_its_memory(tiny_llama: Path, tiny_draft: Path) -> None:
    def plan(*more: str) -> str:
        result = CliRunner().invoke(cli, ["plan", str(tiny_llama), "--gpu", "cpu", *more])
        assert result.exit_code == 0, result.output
        return result.output

    alone, both = json.loads(plan("--json")), json.loads(plan("--json", "--draft", str(tiny_draft)))
    draft, before = both["draft"]["memory"], alone["memory"]
    held = draft["weights_gb"] + draft["kv_cache_gb"]  # served beside the target; headroom and processes once
    added = {"weights_gb": draft["weights_gb"], "kv_cache_gb": draft["kv_cache_gb"], "per_device_gb": held,
             "start_gb": draft["weights_gb"]}  # a CPU server commits neither's KV pages before they are filled
    for key, more in added.items():
        assert both["memory"][key] == pytest.approx(before[key] + more, abs=0.011)  # each rounded to 0.01
    assert both["digest"] != alone["digest"] and "draft" not in alone
    text = plan("--draft", str(tiny_draft))
    assert f"draft      local/{tiny_draft.name}" in text and "with the draft model: its weights" in text


@pytest.mark.slow
def test_a_draft_with_the_targets_tokenizer_and_fewer_rows_drafts_for_it(tmp_path_factory: pytest.TempPathFactory,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen2.5-0.5B drafting for 7B: one tokenizer, embeddings padded to 151,936 and 152,064 rows. Here the
    target's 640 rows and the draft's 512 pad the same ~400 tokens; the build takes them and the server drafts."""
    changed = TRAINING_TEXT.replace("lazy dog", "lazy cat").replace("Hello, world", "Hello, there")
    target = make_tiny_llama(tmp_path_factory.mktemp("padded-target"), rows=640)
    draft = make_tiny_llama(tmp_path_factory.mktemp("padded-draft"), train_steps=40, seed=1, text=changed, rows=512)
    out = tmp_path_factory.mktemp("padded-build")
    package(PackageOptions(model=str(target), output=out, backend="none", draft=str(draft)), Reporter(quiet=True))
    model = out / "model"
    rows = [load_engine_config(m).decoder.vocab_size for m in (model, model / DRAFT_DIR)]
    assert rows == [640, 512]
    monkeypatch.setattr(draft_module, "draft_cost", lambda draft, target: 0.1)  # as in the test above
    drafted, accepted = same_greedy_answers(model, 1)
    assert 0 < accepted <= drafted


@pytest.mark.parametrize(("draft", "says"), [
    ("", "--draft is empty"),
    ("no-tokenizer", "has no tokenizer.json, so mbuild cannot check that it speaks the target's tokens"),
])
def test_an_empty_draft_or_one_without_its_tokenizer_is_a_users_error(tiny_llama: Path, tmp_path: Path, draft: str,
                                                                      says: str) -> None:
    if draft:
        shutil.copytree(tiny_llama, tmp_path / draft)
        (tmp_path / draft / "tokenizer.json").unlink()
        draft = str(tmp_path / draft)
    result = CliRunner().invoke(cli, ["package", str(tiny_llama), "--backend", "none", "--plan-only",
                                      "-o", str(tmp_path / "out"), "--draft", draft])
    assert result.exit_code == 2 and says in result.output and "hint:" in result.output, result.output


def test_a_draft_for_a_model_that_decodes_nothing_says_drafts_are_for_language_models(
        tiny_cross_encoder: Path, tiny_llama: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["package", str(tiny_cross_encoder), "--backend", "none", "--plan-only",
                                      "-o", str(tmp_path / "out"), "--draft", str(tiny_llama)])
    assert result.exit_code == 2 and "draft models are for language models" in result.output, result.output
    assert "the target is a rerank model" in result.output and "tokenizer" not in result.output
