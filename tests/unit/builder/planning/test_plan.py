"""The plan digest versions a build: same inputs, same digest; any input changed, a new one."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from builder.build.context import image_labels
from builder.errors import InputError
from builder.model.catalog import lookup_alias
from builder.model.ref import ModelRef
from builder.plan_record import PLAN_FORMAT, PlanRecord
from builder.planning import plan as plan_module
from builder.planning.memory import memory_need
from builder.planning.plan import DEPLOY_LABEL, BuildPlan, make_plan
from builder.planning.profiles import load_profiles
from builder.planning.target import Target

REF = ModelRef("org/model", "main", "a" * 40, ("config.json", "model.safetensors"), alias=None)
TARGET = Target(kind="cpu", cpu_flags=frozenset({"avx2", "fma"}), ram_gb=16, cpu_count=2)
FACTS = lookup_alias("all-minilm-l6-v2").facts()  # type: ignore[union-attr]


def _plan(target: Target = TARGET, **overrides: object) -> BuildPlan:
    args: dict[str, object] = {"image_name": None, "version": None, "base_image": None}
    args.update(overrides)
    profile = load_profiles()[0]
    return make_plan(REF, FACTS, target, profile, memory_need(FACTS, profile), ("why",),
                     **args)  # type: ignore[arg-type]


def test_same_inputs_same_digest_and_tag() -> None:
    first, second = _plan(), _plan()
    assert first.digest() == second.digest()
    assert first.tag == second.tag == f"mbuild/model:sha-{first.digest()[:12]}"


def test_the_host_does_not_change_the_digest_only_the_profile_does() -> None:
    other_host = replace(TARGET, cpu_flags=frozenset({"avx2", "fma", "avx512f"}), ram_gb=64, cpu_count=32)
    assert _plan(other_host).digest() == _plan().digest()


def test_an_unpinned_plan_is_versioned_by_its_revision() -> None:
    unpinned = _plan()
    assert replace(unpinned, model=replace(REF, sha=None)).digest() != unpinned.digest()
    a = replace(unpinned, model=replace(REF, sha=None, revision="main"))
    b = replace(unpinned, model=replace(REF, sha=None, revision="v2"))
    assert a.digest() != b.digest()


@pytest.mark.parametrize("change", [
    lambda p: replace(p, model=replace(REF, sha="b" * 40)),
    lambda p: replace(p, base_image="registry.local/python:3.11"),
    lambda p: replace(p, profile=p.profile.model_copy(update={"precision": "int8"})),
    lambda p: replace(p, runtime_requirements=(*p.runtime_requirements, "extra==1")),
    lambda p: replace(p, image_name="other/name"),
])
def test_any_input_changes_the_digest(change: object) -> None:
    base = _plan()
    assert change(base).digest() != base.digest()  # type: ignore[operator]


def test_a_template_change_changes_the_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _plan().digest()
    templates = tmp_path / "templates"
    shutil.copytree(plan_module.resource_dir("templates"), templates)
    (templates / "Dockerfile.j2").write_text((templates / "Dockerfile.j2").read_text() + "\n# changed\n")
    monkeypatch.setattr(plan_module, "resource_dir", lambda name: templates)
    assert _plan().digest() != before


def test_explicit_version_is_the_tag() -> None:
    assert _plan(version="1.2.0", image_name="acme/minilm").tag == "acme/minilm:1.2.0"


@pytest.mark.parametrize("name", ["Upper/Case", "a b", "x;rm", "-lead"])
def test_bad_image_names(name: str) -> None:
    with pytest.raises(InputError):
        _plan(image_name=name)


@pytest.mark.parametrize("version", ["bad tag", "-x", "a" * 129, "v1\n"])
def test_bad_versions(version: str) -> None:
    with pytest.raises(InputError):
        _plan(version=version)


def test_a_disk_too_small_for_the_engine_is_refused_with_both_numbers(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk cannot be made here: the free space is what shutil reports, faked at that one edge."""
    from builder.build import host_fit

    plan = _plan()
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(host_fit.shutil, "disk_usage", lambda _: usage._replace(free=1000))
    with pytest.raises(InputError, match=r"takes about [\d.]+ GB; .* has 0\.0 GB free") as refused:
        host_fit.check_disk(plan, tmp_path)
    assert "MBUILD_BUILD_CHECK=0" in (refused.value.hint or "")
    monkeypatch.setenv("MBUILD_BUILD_CHECK", "0")
    host_fit.check_disk(plan, tmp_path)  # the override builds anyway


def test_plan_json_and_the_deploy_label_read_back_as_the_plan_s_record() -> None:
    """plan.json (to_dict) and the image's label (record) hold the reader's fields at the same paths."""
    plan = _plan()
    saved = json.loads(json.dumps(plan.to_dict()))
    assert saved["format"] == PLAN_FORMAT and PlanRecord.from_dict(saved) == plan.record()
    label = image_labels(plan, None, "2024-01-01T00:00:00Z")[DEPLOY_LABEL]
    assert PlanRecord.parse(label) == plan.record()
    assert plan.record().max_batch == plan.profile.limits.max_batch == plan.batching.max_batch
