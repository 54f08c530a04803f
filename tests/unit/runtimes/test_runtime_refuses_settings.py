"""The container's entry point refuses a setting it cannot honour: exit 3 and one line that names it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from builder.image.spec import default_env
from runtimes.exits import Exit
from runtimes.settings import Settings
from tests.support.net import free_port


def _start(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    host = {k: v for k, v in os.environ.items() if not k.startswith(("MBUILD_", "NIM_"))}
    image = {k: v for k, v in default_env() if k.startswith("MBUILD_")}  # what the image sets
    return subprocess.run([sys.executable, "-m", "runtimes"], capture_output=True, text=True, timeout=60,
                          check=False, env={**host, **image, "MBUILD_MODEL_DIR": str(tmp_path / "nowhere"), **env})


@pytest.mark.parametrize(("env", "line"), [
    ({"NIM_SERVER_PORT": "99999"}, "mbuild runtime: NIM_SERVER_PORT (read as MBUILD_PORT)=99999 is outside 1..65535"),
    ({"MBUILD_API_KEY": ""}, "mbuild runtime: MBUILD_API_KEY is set but empty"),
    ({"MBUILD_KV_CACHE_MB": "-1"}, "mbuild runtime: MBUILD_KV_CACHE_MB=-1 is outside 0..16777216"),
    ({"MBUILD_KV_CACHE_MB": "1.5GB"}, "mbuild runtime: MBUILD_KV_CACHE_MB='1.5GB' is not an integer"),
])
def test_a_setting_it_cannot_honour_exits_3_with_one_line(tmp_path: Path, env: dict[str, str], line: str) -> None:
    result = _start(tmp_path, **env)
    assert result.returncode == Exit.BROKEN_BUNDLE
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith(line), result.stderr


def test_nim_server_port_moves_the_image_off_8000() -> None:
    """The image's own MBUILD_PORT must not hide a deployment's NIM_SERVER_PORT."""
    assert Settings.from_env({**dict(default_env()), "NIM_SERVER_PORT": "8123"}).port == 8123


@pytest.fixture
def entry_without_bundle(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The entry point with the bundle checks stubbed and a server that must not start."""
    import runtimes.__main__ as entry

    for name in ("preflight", "choose_profile"):
        monkeypatch.setattr(entry, name, lambda *_: None)
    monkeypatch.setattr(entry, "hardware_problems", lambda _: [])
    monkeypatch.setattr(entry, "Supervisor", lambda *_: pytest.fail("the server must not start"))
    monkeypatch.setenv("MBUILD_API_KEY", "k")
    return entry


def test_the_start_warns_of_an_open_endpoint_and_hands_the_server_its_env(
        tmp_path: Path, entry_without_bundle: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Up to the supervisor, in process: the bundle checks are stubbed, the server is not started."""
    entry = entry_without_bundle
    seen: dict[str, dict[str, str]] = {}

    class Supervisor:
        def __init__(self, command: list[str], env: dict[str, str], *_: object) -> None:
            seen["env"] = env

        def run(self) -> int:
            return 0

    monkeypatch.setattr(entry, "Supervisor", Supervisor)
    for name in ("MBUILD_API_KEY", "MBUILD_ALLOW_UNAUTHENTICATED", "MBUILD_DRAIN_FLAG", "MBUILD_FAILED_FLAG"):
        monkeypatch.delenv(name, raising=False)
    port = str(free_port())
    assert entry.main(["--model-dir", str(tmp_path), "--port", port]) == 0
    assert "mbuild runtime: WARNING, the endpoint is unauthenticated" in capsys.readouterr().err
    env = seen["env"]
    assert (env["MBUILD_MODEL_DIR"], env["MBUILD_PORT"]) == (str(tmp_path.resolve()), port)
    assert env["MBUILD_FAILED_FLAG"].startswith(str(Path(env["MBUILD_DRAIN_FLAG"]).parent))
    monkeypatch.setenv("MBUILD_API_KEY", "k")
    assert entry.main(["--model-dir", str(tmp_path)]) == 0
    assert "unauthenticated" not in capsys.readouterr().err


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_a_port_in_use_exits_3_with_one_line_before_the_server_starts(
        tmp_path: Path, entry_without_bundle: Any, capsys: pytest.CaptureFixture[str], host: str) -> None:
    """Another process listening on the port: a line that says so, not the process manager's bind traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = entry_without_bundle.main(["--model-dir", str(tmp_path), "--host", host, "--port", str(port)])
    assert code == Exit.BROKEN_BUNDLE
    assert capsys.readouterr().err == (f"mbuild runtime: port {port} on {host} is already in use by another process: "
                                       "stop it, or serve on another port (MBUILD_PORT or --port)\n")


def test_a_host_address_this_machine_lacks_exits_3_with_one_line(
        tmp_path: Path, entry_without_bundle: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code = entry_without_bundle.main(["--model-dir", str(tmp_path), "--host", "203.0.113.7", "--port", "8000"])
    assert code == Exit.BROKEN_BUNDLE
    err = capsys.readouterr().err
    assert err.startswith("mbuild runtime: cannot listen on 203.0.113.7:8000 (") and err.count("\n") == 1, err
