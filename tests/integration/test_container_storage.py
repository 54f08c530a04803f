"""podman's containers-storage set up with one graph driver and asked for another: a clear error, exit 11.

Real podman, on a storage of the test's own (its storage.conf names the graph root and run root), so the
host's storage is never touched.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import tool
from tests.support.procs import mbuild

pytestmark = pytest.mark.integration


def test_a_storage_set_up_for_another_driver_names_the_fix_and_exits_11(tiny_encoder: Path, tmp_path: Path) -> None:
    tool("podman", "info")
    conf = tmp_path / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "vfs"\ngraphroot = "{tmp_path}/graph"\nrunroot = "{tmp_path}/run"\n')
    env = {"CONTAINERS_STORAGE_CONF": str(conf)}
    first = subprocess.run(["podman", "info"], env={**os.environ, **env}, capture_output=True,
                           text=True, check=False)
    assert first.returncode == 0, first.stderr  # the storage's database now records vfs
    out = tmp_path / "out"
    result = mbuild("package", str(tiny_encoder), "--backend", "podman", "--output", str(out),
                    env={**env, "MBUILD_CONTAINERS_STORAGE_DRIVER": "overlay"})
    assert result.returncode == 11, result.stderr
    assert "containers-storage was set up with the graph driver 'vfs'" in result.stderr
    assert "asks for 'overlay'" in result.stderr
    assert "MBUILD_CONTAINERS_STORAGE_DRIVER=vfs" in result.stderr and "CONTAINERS_STORAGE_CONF" in result.stderr
    assert "DOCKER_HOST" not in result.stderr and "Traceback" not in result.stderr
    assert not (out / "model").exists()  # refused before any export
