"""Prefill and decode apart on Dynamo: a prefill and a decode worker against two whole workers, long prompts arriving.

Model: the ~100M random Llama of the LLM benchmarks on its word-level tokenizer (bench/lib/llm_models.py), the
default build (`mbuild package --gpu cpu`). Load: the mixed-step benchmark's (bench/lib/mixed_load.py): 4 streams
of a 64-token prompt decode 1024 tokens each; once all are running, 2 prompts of 1920 tokens arrive 1 s apart, each
asking for one token. Arms, each alone on the host, two workers on one core each behind Dynamo's frontend and KV
router (the client shares the two cores with them):
  aggregated      `mbuild serve BUILD --replicas 2`: each worker prefills and decodes what it is sent
  disaggregated   `mbuild serve BUILD --replicas 2 --prefill-workers 1`: one worker prefills every prompt and hands
                  its KV to the other (runtimes/dynamo/kv_transfer.py), which decodes every stream
A stream's gaps between tokens are its TPOT as a user sees it: "during" while the long prompts are in, "quiet" before.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.lib.harness import OUT, machine, work_folder, write
from bench.lib.llm_models import make_llama_words, measured_shape
from bench.lib.mbuild import build_mbuild, source_hash
from bench.lib.mixed_load import Load, Round, measure, summary
from bench.lib.servers import dynamo_frontend, served_name

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "prefill and decode apart on Dynamo, against two whole workers"

ARMS = {"aggregated": (), "disaggregated": ("--prefill-workers", "1")}
QUICK_LOAD = Load(streams=2, new_tokens=1536, long_prompts=1, long_tokens=256, spacing=0.05)  # the tiny model is quick


def report(found: dict[str, dict[str, float]], load: Load, rounds: int, command: str, quick: bool
           ) -> tuple[dict[str, Any], str]:
    rows = ["| arm | gap p50 during ms | gap p99 during ms | quiet gap p50 ms | long prompt TTFT p50 ms | "
            "stream tokens/s in the window |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for arm, s in found.items():
        rows.append(f"| {arm} | {s['gap_p50_ms']:.1f} | {s['gap_p99_ms']:.1f} | {s['quiet_p50_ms']:.1f} | "
                    f"{s['long_ttft_p50_ms']:.0f} | {s['stream_tokens_in_window_per_s']:.1f} |")
    apart, whole = found["disaggregated"], found["aggregated"]
    ratios = {key: apart[key] / whole[key] for key in ("gap_p50_ms", "gap_p99_ms", "quiet_p50_ms",
                                                       "long_ttft_p50_ms", "stream_tokens_in_window_per_s")}
    m = machine()
    verdict = (f"Disaggregated / aggregated: stream gap while the prompts are in p50 {ratios['gap_p50_ms']:.2f}x, "
               f"p99 {ratios['gap_p99_ms']:.2f}x; quiet gap {ratios['quiet_p50_ms']:.2f}x; the long prompts' TTFT "
               f"{ratios['long_ttft_p50_ms']:.2f}x; stream tokens/s in the window "
               f"{ratios['stream_tokens_in_window_per_s']:.2f}x.")
    markdown = "\n".join([
        "# Prefill and decode apart on Dynamo, against two whole workers" + (" (quick smoke run)" if quick else ""),
        "", (__doc__ or "").strip(), "", f"Machine: {m['cores']} cores ({m['cpu']}), {m['date']}; {rounds} round(s) "
        f"per arm after a warm-up round; {load.streams} streams x {load.new_tokens} tokens, {load.long_prompts} "
        f"prompts of {load.long_tokens} tokens {load.spacing:g} s apart.", "", verdict, "", *rows, "",
        f"Reproduce: `{command}`.", ""])
    data = {"scenario": "disagg", "machine": m, "command": command, "rounds": rounds, "quick": quick,
            "results": found, "ratios": ratios}
    return data, markdown


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """`python -m bench disagg`. Quick: the tiny Llama and a small load, one round, into a scratch folder."""
    work = work or work_folder("disagg", quick)
    work.mkdir(parents=True, exist_ok=True)
    key, shape = measured_shape(quick)
    model = make_llama_words(work / f"llama-{key}-words", shape)
    build = build_mbuild(model, work / f"mbuild-{model.name}-{source_hash()}", precision=None).parent
    load, rounds = (QUICK_LOAD, 1) if quick else (Load(), repeats)
    found: dict[str, dict[str, float]] = {}
    for arm, extra in ARMS.items():
        with ExitStack() as stack:
            url = f"{dynamo_frontend(stack, build, '--replicas', '2', *extra)}/v1/completions"
            model_name = served_name(int(url.split(":")[2].split("/")[0]))
            measure(url, model_name, load, seed=99)  # warm-up
            kept: list[Round] = [measure(url, model_name, load, seed=n) for n in range(rounds)]
            found[arm] = summary(kept)
            print(f"  {arm}: gap p99 during {found[arm]['gap_p99_ms']:.0f} ms, long TTFT "
                  f"{found[arm]['long_ttft_p50_ms']:.0f} ms", flush=True)
    command = f"python -m bench disagg {'--quick' if quick else f'--repeats {repeats}'}"
    data, markdown = report(found, load, rounds, command, quick)
    path = write("disagg", data, markdown, out, measures=MEASURES)
    print(markdown)
    return path
