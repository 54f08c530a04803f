"""A user's mistake is an error with a fix and its own exit code, never "internal error" (70) or a traceback."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from builder.build.build_dir import MARKER
from builder.cli import INTERNAL_ERROR, cli
from builder.errors import BaseImageError, OutputUnusable, PortBusy, UnsafeInput, ValidationFailed
from tests.support.bundles import write_bundle_files
from tests.support.procs import mbuild

PLAN = ["package", "all-minilm-l6-v2", "--backend", "none", "--plan-only", "--output"]


def run(args: list[str]) -> Result:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != INTERNAL_ERROR and "Traceback" not in result.output, result.output
    return result


def test_output_below_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("mine")
    result = run([*PLAN, str(tmp_path / "afile" / "build")])
    assert result.exit_code == OutputUnusable.exit_code
    assert "is a file" in result.output and "hint:" in result.output
    assert (tmp_path / "afile").read_text() == "mine"


def test_output_in_a_read_only_system_folder_is_refused() -> None:
    target = Path("/sys/mbuild-test-output")
    result = run([*PLAN, str(target)])
    assert result.exit_code == OutputUnusable.exit_code, result.output
    assert "cannot write" in result.output and not target.exists()


def test_output_into_a_users_folder_is_refused_and_keeps_its_files(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "notes.txt").write_text("my notes")
    (tmp_path / "thesis.tex").write_text("chapter 1")
    result = run([*PLAN, str(tmp_path)])
    assert result.exit_code == OutputUnusable.exit_code
    assert "not an mbuild build" in result.output and "--force" in result.output
    forced = run([*PLAN, str(tmp_path), "--force"])  # --force still never takes model/, which a build rewrites
    assert forced.exit_code == OutputUnusable.exit_code and "model" in forced.output
    assert (tmp_path / "model" / "notes.txt").read_text() == "my notes"
    assert (tmp_path / "thesis.tex").read_text() == "chapter 1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "thesis.tex"]


def test_force_builds_beside_a_users_files_and_keeps_them(tmp_path: Path) -> None:
    (tmp_path / "thesis.tex").write_text("chapter 1")
    assert run([*PLAN, str(tmp_path), "--force"]).exit_code == 0
    assert (tmp_path / "thesis.tex").read_text() == "chapter 1" and (tmp_path / "plan.json").is_file()
    assert run([*PLAN, str(tmp_path)]).exit_code == 0  # now it is an mbuild build: no --force needed again


def test_missing_docker_archive_base_is_a_base_image_error(tmp_path: Path) -> None:
    result = run(["inspect", f"docker-archive:{tmp_path / 'missing.tar'}"])
    assert result.exit_code == BaseImageError.exit_code and "does not exist" in result.output


def test_hostile_layout_through_the_cli_is_its_own_exit_code(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text(json.dumps({"manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:../../etc/passwd", "size": 1}]}))
    result = run(["inspect", f"oci:{tmp_path}"])
    assert result.exit_code == UnsafeInput.exit_code and "not a sha256 digest" in result.output


def _build_dir(tmp_path: Path, passed: bool | None) -> Path:
    write_bundle_files(tmp_path / "build" / "model", passed)
    (tmp_path / "build" / MARKER).write_text("")
    return tmp_path / "build"


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("passed", [False, None], ids=["failed", "never-validated"])
def test_serve_refuses_a_build_that_failed_its_gate(tmp_path: Path, passed: bool | None) -> None:
    result = run(["serve", str(_build_dir(tmp_path, passed))])
    assert result.exit_code == ValidationFailed.exit_code
    assert "numerical gate" in result.output and "--allow-failed-gate" in result.output


def test_serve_checks_the_port_before_starting(tmp_path: Path, busy_port: int) -> None:
    result = run(["serve", str(_build_dir(tmp_path, True)), "--port", str(busy_port)])
    assert result.exit_code == PortBusy.exit_code
    assert f"127.0.0.1:{busy_port}" in result.output and "serving on" not in result.output


def test_allow_failed_gate_warns_and_still_checks_the_port(tmp_path: Path, busy_port: int) -> None:
    result = run(["serve", str(_build_dir(tmp_path, False)), "--allow-failed-gate", "--port", str(busy_port)])
    assert result.exit_code == PortBusy.exit_code


@pytest.mark.parametrize(("backend", "says", "never"), [("oci", "mbuild load", "run it:  docker run"),
                                                          ("docker", "docker run", "skopeo"),
                                                          ("podman", "podman run", "docker run")])
def test_the_summary_says_how_to_run_the_image_from_where_it_is(tmp_path: Path, backend: str, says: str,
                                                                never: str) -> None:
    from builder.build.pipeline import PackageResult
    from builder.cli.package import _run_hint
    from builder.image.base import ImageResult
    from builder.planning.plan import BuildPlan

    class _Plan:
        tag = "mbuild/x:1"

    image = ImageResult("mbuild/x:1", "sha256:" + "0" * 64, 1, backend)
    plan: BuildPlan = _Plan()  # type: ignore[assignment]  # the hint reads only the tag
    hint = _run_hint(PackageResult(plan, tmp_path, None, image, ""))
    assert says in hint and never not in hint


@pytest.mark.parametrize(("args", "says"), [
    (["--replicas", "2"], "--replicas serves language models"),  # an embedding model: Dynamo routes language models
    (["--replicas", "0"], "0 is not in the range"),
    (["--replicas", "2", "--router", "random"], "'random' is not one of"),
    (["--replicas", "2", "--prefill-workers", "2"], "leaves no worker to decode"),
    (["--prefill-workers", "1"], "leaves no worker to decode"),  # without --replicas
])
def test_serve_replicas_refuses_what_it_cannot_serve(tmp_path: Path, args: list[str], says: str) -> None:
    result = run(["serve", str(_build_dir(tmp_path, True)), *args])
    assert result.exit_code == 2 and says in result.output


def test_a_draft_that_is_not_there_is_a_users_error(tmp_path: Path) -> None:
    result = run([*PLAN, str(tmp_path / "out"), "--draft", str(tmp_path / "no-such-model")])
    assert result.exit_code not in (0, INTERNAL_ERROR) and "no-such-model" in result.output
    assert not (tmp_path / "out" / "model").exists()


@pytest.mark.parametrize(("args", "said"), [
    (["--concurrency", "1,x"], "not a list of whole numbers"),
    (["--concurrency", "0"], "each in 1..4096"),
    (["--concurrency", ",".join(map(str, range(1, 40)))], "1 to 16 values"),
    (["--concurrency", "4,4"], "names a point twice"),
    (["--slo", "ttft=fast"], "cannot read"),
    (["--slo", "ttft=5ms," * 40], "characters long"),
    (["--workload", "chat", "--prompts", "/etc/hostname"], "give one of them"),
    (["--isl", "0"], "outside 1..131072"),
    (["--cores", "4000"], "this process may use"),
    (["--prompts", "/nonexistent/prompts.jsonl"], "--prompts"),
    (["--prompts", "/dev/zero"], "is a device, not a regular file"),  # was read for ever
    (["--isl", "4096"], "takes at most 128"),  # more than the build's context: every request would be a 400
])
def test_bench_options_are_checked_before_any_load(tmp_path: Path, args: list[str], said: str) -> None:
    build = tmp_path / "build"
    write_bundle_files(build / "model", True)  # a build directory whose server is never started: the options fail first
    result = run(["bench", str(build), "-o", str(tmp_path / "out"), *args])
    assert result.exit_code == 2 and said in result.output and "hint:" in result.output, result.output


def test_bench_of_something_that_is_no_target_says_what_it_takes(tmp_path: Path) -> None:
    result = run(["bench", str(tmp_path / "no-such-build"), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and "not a build directory, a URL or an image" in result.output, result.output


def test_bench_never_writes_into_a_users_folder(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("chapter 1")
    result = run(["bench", "http://127.0.0.1:9", "-o", str(mine)])
    assert result.exit_code == OutputUnusable.exit_code and "did not write" in result.output, result.output
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"]


@pytest.mark.parametrize("args", [["--price-per-hour", "nan"], ["--ready-timeout", "nan"],
                                  ["--price-per-hour", "inf"]])
def test_bench_numbers_must_be_finite(tmp_path: Path, args: list[str]) -> None:
    result = run(["bench", "http://127.0.0.1:9", "-o", str(tmp_path / "out"), *args])  # nan was written to bench.json
    assert result.exit_code == 2 and f"Invalid value for '{args[0]}'" in result.output, result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("url", ["http://127.0.0.1:9\nX-Injected: 1", "http://127.0.0.1:9/\x1b[31m", "http://",
                                 "http://exa mple.com"])
def test_bench_of_a_malformed_url_says_so(tmp_path: Path, url: str) -> None:
    result = run(["bench", url, "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and "the target URL" in result.output and "hint:" in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_bench_refuses_a_fifo_for_prompts(tmp_path: Path) -> None:
    fifo = tmp_path / "prompts.jsonl"
    os.mkfifo(fifo)  # opening it waited for a writer for ever
    result = mbuild("bench", "http://127.0.0.1:9", "-o", str(tmp_path / "out"), "--prompts", str(fifo), timeout=60)
    assert result.returncode == 2 and "is a FIFO, not a regular file" in result.stderr, result.stderr
