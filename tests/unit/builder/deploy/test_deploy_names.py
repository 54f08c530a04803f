"""`mbuild deploy` checks every name and number it writes into the objects as the Kubernetes API server would
(RFC 1123 labels and subdomains, RFC 1035 labels for what names a Service, their lengths), so a bad one is a
clear error at once, not YAML that is quoted safely and then refused by `kubectl apply`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import cli
from tests.support.deploy_cases import image_for, plan_file

CASE = "minilm-cpu"


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return plan_file(CASE, tmp_path_factory.mktemp("plan"))


def deploy(plan: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["deploy", str(plan), "--image", image_for(CASE), *args])
    return result.exit_code, result.output


@pytest.mark.parametrize("fmt", ["k8s", "helm", "kserve"])
@pytest.mark.parametrize(("option", "value"), [
    ("--namespace", "a\n  b: c"),
    ("--namespace", "Models"),
    ("--namespace", "team.models"),  # a namespace is a label: no dots
    ("--namespace", "-models"),
    ("--namespace", "m" * 64),
    ("--namespace", ""),
    ("--api-key-secret", "key\nother: 1"),
    ("--api-key-secret", "{{ .Values.secret }}"),
    ("--api-key-secret", "Api_Key"),
    ("--api-key-secret", "k" * 254),
    ("--api-key-secret", "a..b"),
    ("--name", "My_Model"),
    ("--name", "1model"),  # a Service's name starts with a letter
    ("--name", "m" * 64),
    ("--name", "model\n"),
])
def test_a_name_kubernetes_would_refuse_is_a_clear_error(plan: Path, tmp_path: Path, fmt: str, option: str,
                                                         value: str) -> None:
    code, output = deploy(plan, "--format", fmt, option, value, "--output", str(tmp_path / "out"))
    assert code == 2, output
    assert f"error: {option} " in output and "hint:" in output and "Traceback" not in output, output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "words"), [
    (("--replicas", "9", "--max-replicas", "4"), "--replicas 9 is above --max-replicas 4"),
    (("--replicas", "1", "--min-replicas", "2"), "--replicas 1 is below --min-replicas 2"),
])
def test_replicas_outside_the_autoscaler_s_range_are_refused(plan: Path, args: tuple[str, ...], words: str) -> None:
    """The HorizontalPodAutoscaler would at once scale such a Deployment back into its range."""
    code, output = deploy(plan, *args)
    assert code == 2 and words in output, output


def test_a_name_made_from_the_image_that_kubernetes_would_refuse_asks_for_name(plan: Path, tmp_path: Path) -> None:
    data = json.loads(plan.read_text())
    data["tag"] = "registry.example.com/models/7b-chat:1.0"
    other = tmp_path / "plan.json"
    other.write_text(json.dumps(data))
    code, output = deploy(other)
    assert code == 2 and "7b-chat" in output and "--name" in output, output
    code, output = deploy(other, "--name", "chat-7b")
    assert code == 0 and "name: chat-7b" in output, output


def test_names_at_their_limits_are_taken(plan: Path) -> None:
    code, output = deploy(plan, "--name", "m" * 63, "--namespace", "n" * 63, "--api-key-secret",
                          ".".join(["s" * 63] * 3 + ["s" * 61]))
    assert code == 0, output
    assert f"namespace: {'n' * 63}" in output and f"name: {'m' * 63}" in output


@pytest.mark.parametrize("image", [image_for(CASE) + "\n", image_for(CASE) + "\nx: y", "reg{{ x }}.io/a/b:1",
                                   "reg\n.io/a/b:1", " registry.example.com/a/b:1"])
def test_an_image_kubernetes_would_refuse_is_a_clear_error(plan: Path, image: str) -> None:
    result = CliRunner().invoke(cli, ["deploy", str(plan), "--image", image])
    assert result.exit_code == 2 and "not a valid image reference" in result.output, result.output
