"""The online path: huggingface_hub resolves the commit and downloads only the needed files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from builder.build.pipeline import package
from builder.build.plan_package import PackageOptions, plan_package
from builder.model.hubcache import repo_folder
from builder.progress import Reporter
from tests.support.fakehub import FakeHub, FakeRepo


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
