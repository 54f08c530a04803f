"""A few Prometheus metrics rendered in the text exposition format, with no global registry.

Kept in-process on purpose: the service runs one worker per container, and this avoids the
multiprocess-directory dance prometheus_client needs under a process manager.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import defaultdict

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

Labels = tuple[tuple[str, str], ...]
# The same series under vLLM's names (with its model_name label), which existing Grafana dashboards and
# autoscalers (KEDA, the Prometheus adapter) read: mbuild name, its labels to match (None: every series, its labels
# kept) -> vLLM name.
VLLM_NAMES: tuple[tuple[str, Labels | None, str], ...] = (
    ("queue_depth", (), "vllm:num_requests_waiting"),
    ("running_sequences", (), "vllm:num_requests_running"),
    ("kv_cache_usage_ratio", (), "vllm:gpu_cache_usage_perc"),  # a fraction, as vLLM's despite the name
    ("kv_cache_usage_ratio", (), "vllm:kv_cache_usage_perc"),  # its newer name
    ("tokens_total", (("kind", "prompt"),), "vllm:prompt_tokens_total"),
    ("tokens_total", (("kind", "completion"),), "vllm:generation_tokens_total"),
    ("time_to_first_token_seconds", (), "vllm:time_to_first_token_seconds"),
    ("time_per_output_token_seconds", (), "vllm:time_per_output_token_seconds"),
    ("preemptions_total", (), "vllm:num_preemptions_total"),
    ("spec_decode_drafts_total", (), "vllm:spec_decode_num_drafts_total"),
    ("spec_decode_draft_tokens_total", (), "vllm:spec_decode_num_draft_tokens_total"),
    ("spec_decode_accepted_tokens_total", (), "vllm:spec_decode_num_accepted_tokens_total"),
    ("spec_decode_accepted_per_position_total", None, "vllm:spec_decode_num_accepted_tokens_per_pos_total"),
)


def _fmt_labels(labels: Labels, extra: str = "") -> str:
    parts = [f'{k}="{v}"' for k, v in labels]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1


class Metrics:
    def __init__(self, prefix: str = "mbuild") -> None:
        self.prefix = prefix
        self.model_name = ""  # set when the model is loaded: vLLM's series carry it
        self._lock = threading.Lock()
        self._counters: dict[str, dict[Labels, float]] = defaultdict(dict)
        self._gauges: dict[str, dict[Labels, float]] = defaultdict(dict)
        self._hists: dict[str, dict[Labels, Histogram]] = defaultdict(dict)
        self._help: dict[str, str] = {}
        self._buckets: dict[str, tuple[float, ...]] = {}

    def describe(self, name: str, text: str, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self._help[name] = text
        self._buckets[name] = buckets

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._counters[name][key] = self._counters[name].get(key, 0.0) + value

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._gauges[name][tuple(sorted(labels.items()))] = value

    def observe(self, name: str, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            hist = self._hists[name].setdefault(key, Histogram(self._buckets.get(name, LATENCY_BUCKETS)))
            hist.observe(value)

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            for kind, series in (("counter", self._counters), ("gauge", self._gauges)):
                for name, values in sorted(series.items()):
                    full = f"{self.prefix}_{name}"
                    lines += [f"# HELP {full} {self._help.get(name, name)}", f"# TYPE {full} {kind}"]
                    lines += [f"{full}{_fmt_labels(k)} {v:g}" for k, v in sorted(values.items())]
            for name, hists in sorted(self._hists.items()):
                full = f"{self.prefix}_{name}"
                lines += [f"# HELP {full} {self._help.get(name, name)}", f"# TYPE {full} histogram"]
                for key, hist in sorted(hists.items()):
                    lines += _histogram_lines(full, key, hist)
            lines += self._vllm_lines()
        return "\n".join(lines) + "\n"

    def _vllm_lines(self) -> list[str]:
        """VLLM_NAMES' series, present once mbuild's are; counters keep the _total that vLLM's names carry."""
        lines: list[str] = []
        label = (("model_name", self.model_name),)
        for name, match, vllm in VLLM_NAMES:
            for kind, series in (("counter", self._counters), ("gauge", self._gauges)):
                values = series.get(name, {})
                keys = sorted(values) if match is None else [match] if match in values else []
                if keys:
                    family = vllm.removesuffix("_total") if kind == "counter" else vllm
                    lines += [f"# HELP {family} mbuild_{name} under vLLM's name", f"# TYPE {family} {kind}"]
                    lines += [f"{vllm}{_fmt_labels(label + key)} {values[key]:g}" for key in keys]
            if match is not None and match in self._hists.get(name, {}):
                lines += [f"# HELP {vllm} mbuild_{name} under vLLM's name", f"# TYPE {vllm} histogram",
                          *_histogram_lines(vllm, label, self._hists[name][match])]
        return lines


def _histogram_lines(full: str, key: Labels, hist: Histogram) -> list[str]:
    lines, running = [], 0
    for bound, count in zip(hist.buckets, hist.counts, strict=False):
        running += count
        le = f'le="{bound:g}"'
        lines.append(f"{full}_bucket{_fmt_labels(key, le)} {running}")
    inf = 'le="+Inf"'
    lines.append(f"{full}_bucket{_fmt_labels(key, inf)} {hist.n}")
    lines.append(f"{full}_sum{_fmt_labels(key)} {hist.total:g}")
    lines.append(f"{full}_count{_fmt_labels(key)} {hist.n}")
    return lines
