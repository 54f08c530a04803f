from pathlib import Path

import pytest

from builder.errors import InputError
from builder.model.sources import parse_model_ref


def test_alias_resolves_to_catalog_repo() -> None:
    spec = parse_model_ref("all-minilm-l6-v2")
    assert (spec.repo, spec.revision, spec.alias) == ("sentence-transformers/all-MiniLM-L6-v2", "main",
                                                      "all-minilm-l6-v2")


def test_alias_is_case_insensitive() -> None:
    assert parse_model_ref("Llama-3.1-8B").repo == "meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize(("text", "repo", "revision"), [
    ("BAAI/bge-small-en-v1.5", "BAAI/bge-small-en-v1.5", "main"),
    ("org/name@v1.0", "org/name", "v1.0"),
    ("hf://org/name@" + "a" * 40, "org/name", "a" * 40),
    ("hf://org/name", "org/name", "main"),
])
def test_repo_references(text: str, repo: str, revision: str) -> None:
    spec = parse_model_ref(text)
    assert (spec.repo, spec.revision, spec.local_path) == (repo, revision, None)


def test_local_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    spec = parse_model_ref(str(tmp_path))
    assert spec.local_path == tmp_path.resolve()
    assert spec.repo == f"local/{tmp_path.name}"


def test_local_folder_without_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"no config\.json"):
        parse_model_ref(str(tmp_path))


def test_missing_local_path() -> None:
    with pytest.raises(InputError, match="no such model directory"):
        parse_model_ref("./does/not/exist")


def test_unknown_alias_suggests_close_names() -> None:
    with pytest.raises(InputError) as info:
        parse_model_ref("llama-3.1-8")
    assert "unknown model alias" in info.value.message
    assert info.value.hint is not None and "llama-3.1-8b" in info.value.hint


@pytest.mark.parametrize("text", ["org/na me", "org/name@", "/", "a/b/c", "hf://bad", "", "org/x@../../etc",
                                  "org/x@-rf"])
def test_malformed_references(text: str) -> None:
    with pytest.raises(InputError):
        parse_model_ref(text)
