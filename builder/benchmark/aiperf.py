"""One sweep point through AIPerf (NVIDIA's load generator, documented for NIM), and its report read back.

Why AIPerf and not GuideLLM (both measured here, docs/benchmarks/cost.md): aiperf 0.13 installs from PyPI in a
minute without torch (1.2 GB), runs offline with the build's own tokenizer, and speaks every route mbuild
serves (chat, completions, embeddings, rankings); guidellm 0.8.1 pulls a CUDA build of torch (6 GB) onto a CPU
host. mbuild does not generate load itself: AIPerf's numbers are the ones a user can reproduce with its CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.benchmark.result import Point, Spread
from builder.benchmark.workloads import Workload
from builder.errors import BenchFailed, ToolMissing
from runtimes.settings import child_env

VERSION = "0.13.0"
REPORT = "profile_export_aiperf.json"
OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
INSTALL_HINT = f"pip install 'mbuild[bench]' (aiperf=={VERSION}), or put aiperf {VERSION} on PATH"


def executable() -> str:
    """aiperf beside this Python (the bench extra), else on PATH."""
    beside = Path(sys.executable).with_name("aiperf")
    found = str(beside) if beside.is_file() else shutil.which("aiperf")
    if found is None:
        raise ToolMissing("`mbuild bench` drives AIPerf, which is not installed here", hint=INSTALL_HINT)
    return found


@dataclass(frozen=True)
class Call:
    url: str
    model: str
    endpoint: str  # chat | embeddings
    tokenizer: str  # a folder holding tokenizer.json, or "builtin"
    workload: Workload
    api_key: str | None = None
    cores: tuple[int, ...] = ()  # AIPerf's own, apart from the server's (empty: wherever the OS puts it)

    @property
    def env(self) -> dict[str, str]:
        """AIPerf's environment. Under HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) AIPerf 0.13 looks every tokenizer
        up in the Hub's cache by repo id, a local folder too, and fails each point; a folder needs no Hub, so for
        one the two are left out (what AIPerf then loads is the folder alone, no download)."""
        env = child_env()
        if Path(self.tokenizer).is_dir():
            for name in OFFLINE:
                env.pop(name, None)
        return env

    @property
    def generates(self) -> bool:
        return self.endpoint in ("chat", "completions")

    def command(self, concurrency: int, requests: int, folder: Path) -> list[str]:
        args = [executable(), "profile", "--model", self.model, "--url", self.url, "--endpoint-type", self.endpoint,
                "--tokenizer", self.tokenizer, "--concurrency", str(concurrency), "--request-count", str(requests),
                "--warmup-request-count", str(concurrency), "--artifact-dir", str(folder), "--ui", "none",
                "--random-seed", "0", "--no-gpu-telemetry", *self.workload.arguments(self.generates)]
        if self.generates:
            args += ["--streaming", "--use-server-token-count"]
        return args


def run_point(call: Call, concurrency: int, requests: int, folder: Path, timeout_s: float) -> Point:
    """AIPerf at one concurrency; its log and artifacts stay in folder, whatever happens."""
    folder.mkdir(parents=True, exist_ok=True)
    command = call.command(concurrency, requests, folder)
    if call.api_key:
        command += ["--api-key", call.api_key]
    log = folder / "aiperf.log"
    with log.open("w") as out:
        out.write("$ " + " ".join(a if a != call.api_key else "***" for a in command) + "\n")
        out.flush()
        try:
            pin = (lambda: os.sched_setaffinity(0, call.cores)) if call.cores else None
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=False,
                                  preexec_fn=pin, env=call.env).returncode
        except subprocess.TimeoutExpired as exc:
            raise BenchFailed(f"AIPerf ran past {timeout_s:.0f} s at concurrency {concurrency} and was stopped",
                              hint=f"its log: {log}; fewer --requests, or a larger --point-timeout") from exc
    report = folder / REPORT
    if code != 0 or not report.is_file():
        tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-8:])
        raise BenchFailed(f"AIPerf failed at concurrency {concurrency} (exit {code}):\n{tail}", hint=f"its log: {log}")
    return read_point(report, concurrency, call.generates)


def _metric(raw: dict[str, Any], name: str) -> dict[str, Any] | None:
    found = raw.get(name)
    return found if isinstance(found, dict) and isinstance(found.get("avg"), (int, float)) else None


def _avg(raw: dict[str, Any], name: str) -> float:
    found = _metric(raw, name)
    return float(found["avg"]) if found else 0.0


def _spread(raw: dict[str, Any], name: str) -> Spread | None:
    found = _metric(raw, name)
    if found is None or not found.get("count"):
        return None
    return Spread(mean=float(found["avg"]), p50=float(found["p50"]), p90=float(found["p90"]),
                  p99=float(found["p99"]))


def read_point(report: Path, concurrency: int, generates: bool) -> Point:
    """AIPerf's summary (profile_export_aiperf.json) as one Point, its values unchanged."""
    try:
        raw = json.loads(report.read_text())
    except (OSError, ValueError) as exc:
        raise BenchFailed(f"AIPerf's report {report} cannot be read ({exc})") from exc
    latency = _spread(raw, "request_latency")
    if not isinstance(raw, dict) or latency is None:
        raise BenchFailed(f"AIPerf's report {report} holds no completed request",
                          hint=f"see {report.parent / 'aiperf.log'}; the errors AIPerf counted are in the report")
    errors = sum(int(e.get("count", 0)) for e in raw.get("error_summary") or [] if isinstance(e, dict))
    requests = int(_avg(raw, "request_count"))
    if generates:
        # per user, InferenceMAX's interactivity (1000 / TPOT); where AIPerf cannot compute it (every response
        # came in one chunk: a model faster than the stream's writes), a request's tokens over its latency
        tokens = _avg(raw, "output_token_throughput")
        per_user = _avg(raw, "output_token_throughput_per_user") or _avg(raw, "e2e_output_token_throughput")
    else:  # an embedder's work is its input; per user: a request's tokens over its latency
        tokens = _avg(raw, "input_token_throughput")
        per_user = _avg(raw, "input_sequence_length") / (latency.mean / 1000) if latency.mean else 0.0
    return Point(concurrency=concurrency, requests=requests, errors=errors,
                 duration_s=_avg(raw, "benchmark_duration"), request_rate=_avg(raw, "request_throughput"),
                 tokens_per_s=tokens, per_user_tokens_per_s=per_user, latency=latency,
                 ttft=_spread(raw, "time_to_first_token") if generates else None,
                 tpot=_spread(raw, "inter_token_latency") if generates else None,
                 itl=_spread(raw, "inter_chunk_latency") if generates else None)
