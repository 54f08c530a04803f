"""`mbuild profiles`: sensible, explained choices, golden-tested as tables and as JSON, offline."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from builder.cli import cli
from tests.support.golden import assert_golden
from tests.support.hosts import pin_cpu_host

CASES = [("llama-3.1-8b", "h100"), ("llama-3.1-8b", "l4"), ("llama-3.1-8b", "a10g"), ("llama-3.1-8b", "cpu"),
         ("llama-3.1-70b", "h100"), ("llama-3.1-70b", "h100x8"), ("all-minilm-l6-v2", "cpu")]


@pytest.fixture(autouse=True)
def offline_fixed_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pin_cpu_host(monkeypatch)


def profiles(*args: str) -> str:
    result = CliRunner().invoke(cli, ["profiles", *args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize(("model", "gpu"), CASES)
def test_golden_table_and_json(model: str, gpu: str) -> None:
    assert_golden(f"profiles/{model}--{gpu}.txt", profiles(model, "--gpu", gpu))
    assert_golden(f"profiles/{model}--{gpu}.json", profiles(model, "--gpu", gpu, "--json"))


def statuses(model: str, gpu: str) -> dict[str, str]:
    data = json.loads(profiles(model, "--gpu", gpu, "--json"))
    return {p["name"]: p["status"] for p in data["profiles"]}


@pytest.mark.parametrize(("gpu", "offered"), [("h100", True), ("l4", True), ("a10g", False), ("a100", False)])
def test_fp8_only_from_sm89(gpu: str, offered: bool) -> None:
    runnable_fp8 = [n for n, s in statuses("llama-3.1-8b", gpu).items() if "-fp8-" in n and s == "runnable"]
    assert bool(runnable_fp8) is offered


def test_70b_bf16_is_low_memory_on_one_h100_and_runnable_at_tp4_tp8() -> None:
    one = statuses("llama-3.1-70b", "h100")
    assert one["tensorrt-h100-bf16-tp1-throughput"] == "low_memory"
    eight = statuses("llama-3.1-70b", "h100x8")
    for tp in (4, 8):
        assert eight[f"tensorrt-h100-bf16-tp{tp}-throughput"] == "runnable"
    assert eight["tensorrt-h100-bf16-tp2-throughput"] == "low_memory"


def test_selected_profile_is_marked_and_explained() -> None:
    data = json.loads(profiles("llama-3.1-8b", "--gpu", "h100", "--json"))
    assert data["selected"] == "tensorrt-h100-fp8-tp1-throughput"
    assert [p["name"] for p in data["profiles"] if p["selected"]] == [data["selected"]]
    assert any("fp8" in line for line in data["why"])
    table = profiles("llama-3.1-8b", "--gpu", "h100")
    assert "  * tensorrt-h100-fp8-tp1-throughput" in table


def test_low_memory_rows_say_what_they_need() -> None:
    table = profiles("llama-3.1-8b", "--gpu", "l4")
    low = table.split("Compatible but low memory:")[1].split("Incompatible:")[0]
    assert "tensorrt-l4-bf16-tp1-throughput" in low and "needs >= " in low and "GB per GPU" in low


def test_unknown_gpu_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["profiles", "llama-3.1-8b", "--gpu", "h1000"])
    assert result.exit_code == 2
    assert "unknown GPU 'h1000'" in result.output and "h100" in result.output
