"""Issue 61's targets for the peer comparisons (llm_peer against llama.cpp, llm_vllm against vLLM): at the top
concurrency, mbuild's total tokens/s over the better of the peer arms each mbuild arm is held against, and mbuild's
TTFT p50 beside the best (lowest) of every peer arm's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.lib.harness import Series


@dataclass(frozen=True)
class Target:
    mine: str  # mbuild's arm, "mbuild int8"
    peers: tuple[str, ...]  # the peer arms it is held against: the better (more tokens/s) of those that ran
    wanted: float  # the least mbuild / peer tokens/s wanted

    def against(self) -> str:
        return self.peers[0] if len(self.peers) == 1 else f"the better of {' and '.join(self.peers)}"


def ratio(target: Target, tok_s: dict[str, float]) -> tuple[float, str] | None:
    """(mbuild / the better peer's tokens/s, that peer's arm), None where mbuild's arm or every peer's did not run."""
    found = {peer: tok_s[peer] for peer in target.peers if peer in tok_s}
    if target.mine not in tok_s or not found:
        return None
    best = max(found, key=found.__getitem__)
    return tok_s[target.mine] / found[best], best


def verdict(found: float | None, wanted: float) -> str:
    if found is None:
        return "not measured"
    return f"{found:.2f}x" + (" (met)" if found >= wanted else " (**behind**)")


def target_lines(targets: tuple[Target, ...], concurrency: int, tok_s: dict[str, float], ttft_ms: dict[str, float],
                 record: dict[str, Any]) -> list[str]:
    """The targets' line and the TTFT line at `concurrency`, from each arm's median total tokens/s and TTFT p50 there
    (the arms that ran); each target's wanted and measured ratio kept in `record` by "mbuild ARM / PEER", the TTFTs
    by "ttft_p50_ms"."""
    parts = []
    for target in targets:
        found = ratio(target, tok_s)
        measured, best = found if found else (None, None)
        record[f"{target.mine} / {target.against()}"] = {"wanted": target.wanted, "measured": measured, "peer": best}
        shown = f" ({best})" if best and len(target.peers) > 1 else ""
        parts.append(f"{target.mine} / {target.against()}{shown}: {verdict(measured, target.wanted)} against >= "
                     f"{target.wanted:.1f}x")
    lines = [f"Targets at c={concurrency}: " + "; ".join(parts) + "."]
    peers = {arm: ms for arm, ms in ttft_ms.items() if not arm.startswith("mbuild")}
    mine = [f"{t.mine} {ttft_ms[t.mine]:.0f} ms" for t in targets if t.mine in ttft_ms]
    if peers and mine:
        best = min(peers, key=peers.__getitem__)
        record["ttft_p50_ms"] = {**{t.mine: ttft_ms[t.mine] for t in targets if t.mine in ttft_ms},
                                 "best peer": best, "best peer ms": peers[best]}
        lines.append(f"TTFT p50 at c={concurrency}: {', '.join(mine)} against the best peer's {peers[best]:.0f} ms "
                     f"({best}).")
    return [" ".join(lines), ""]


def medians(series: dict[str, dict[str, Series] | None], metric: str) -> dict[str, float]:
    """{arm: median of `metric`} of arm_series' results by arm (None: the arm did not run)."""
    return {arm: found[metric].median for arm, found in series.items() if found}
