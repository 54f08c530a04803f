"""The online path: huggingface_hub resolves the commit and downloads only the needed files, chat templates
included; a local folder's version (its digest) covers the same files."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from builder.build.pipeline import package
from builder.build.plan_package import PackageOptions, plan_package
from builder.model.hubcache import repo_folder
from builder.progress import Reporter
from tests.support.fakehub import FakeHub, FakeRepo
from tests.unit.runtimes.api.test_generation_service import CHAT, serving


def test_package_downloads_pinned_files_then_builds_offline(fake_hub: FakeHub, tiny_encoder: Path,
                                                            tmp_path: Path) -> None:
    repo_dir = tmp_path / "repo"
    shutil.copytree(tiny_encoder, repo_dir)
    (repo_dir / "pytorch_model.bin").write_bytes(b"legacy weights that must not be fetched")
    (repo_dir / "onnx").mkdir()
    (repo_dir / "onnx" / "model.onnx").write_bytes(b"someone else's export")
    fake_hub.repos["org/tiny"] = FakeRepo(repo_dir, sha="1" * 40)

    result = package(PackageOptions(model="org/tiny", output=tmp_path / "online", backend="none"),
                     Reporter(quiet=True))
    assert result.plan.model.sha == "1" * 40
    assert result.report is not None and result.report.passed
    fetched = {p.relative_to(repo_folder("org/tiny") / "snapshots" / ("1" * 40)).as_posix()
               for p in (repo_folder("org/tiny") / "snapshots" / ("1" * 40)).rglob("*") if p.is_file()}
    assert "model.safetensors" in fetched and "1_Pooling/config.json" in fetched
    assert "pytorch_model.bin" not in fetched and "onnx/model.onnx" not in fetched
    assert not any("/resolve/main/" in r for r in fake_hub.requests if "model.safetensors" in r)  # pinned to sha

    fake_hub.server.shutdown()  # the Hub goes away; the cache is enough now
    offline = plan_package(PackageOptions(model="org/tiny", offline=True, backend="none"), Reporter(quiet=True))
    assert offline.digest() == result.plan.digest()
    lock = json.loads((result.build_dir / "mbuild.lock").read_text())
    assert {f["path"] for f in lock["model"]["files"]} == set(result.plan.model.files)


TOOL_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def _served_prompt_tokens(model: Path) -> int:
    """What the served chat says its prompt took (400 where the build carries no chat template)."""
    with serving(model) as client:
        response = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1})
    assert response.status_code == 200, response.text
    return int(response.json()["usage"]["prompt_tokens"])


def _templated_tokens(folder: Path) -> int:
    """transformers' own rendering of the chat with the folder's template, in tokens."""
    ids = AutoTokenizer.from_pretrained(folder).apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    return len(ids["input_ids"] if isinstance(ids, Mapping) else ids)


@pytest.mark.slow
def test_a_chat_template_saved_in_its_own_file_is_fetched_and_served(fake_hub: FakeHub, tiny_llama: Path,
                                                                     tmp_path: Path) -> None:
    repo_dir = tmp_path / "repo"
    shutil.copytree(tiny_llama, repo_dir)
    # As transformers 5 saves a tokenizer: the template in chat_template.jinja, none in tokenizer_config.json;
    # named others under additional_chat_templates/.
    assert "chat_template" not in json.loads((repo_dir / "tokenizer_config.json").read_text())
    (repo_dir / "additional_chat_templates").mkdir()
    (repo_dir / "additional_chat_templates" / "tool_use.jinja").write_text(TOOL_TEMPLATE)
    fake_hub.repos["org/chat"] = FakeRepo(repo_dir, sha="2" * 40)

    result = package(PackageOptions(model="org/chat", output=tmp_path / "out", backend="none"), Reporter(quiet=True))
    snapshot = repo_folder("org/chat") / "snapshots" / ("2" * 40)
    assert (snapshot / "chat_template.jinja").is_file()
    assert (snapshot / "additional_chat_templates" / "tool_use.jinja").is_file()
    assert _served_prompt_tokens(result.build_dir / "model") == _templated_tokens(tiny_llama)


@pytest.mark.slow
def test_an_edited_chat_template_is_a_new_build_that_serves_it(tiny_llama: Path, tmp_path: Path) -> None:
    folder = tmp_path / "llama"
    shutil.copytree(tiny_llama, folder)
    first = package(PackageOptions(model=str(folder), output=tmp_path / "first", backend="none"),
                    Reporter(quiet=True))
    template = folder / "chat_template.jinja"
    template.write_text("{{ 'You talk about containers, and only about them.' }}" + template.read_text())
    second = package(PackageOptions(model=str(folder), output=tmp_path / "second", backend="none"),
                     Reporter(quiet=True))
    assert second.plan.tag != first.plan.tag and second.plan.model.sha != first.plan.model.sha
    assert _served_prompt_tokens(second.build_dir / "model") == _templated_tokens(folder) > _templated_tokens(
        tiny_llama)
