"""`python -m bench SCENARIO [--repeats N]`: run benchmarks and write docs/benchmarks/.

`all` runs the published comparison (embeddings, llm_served, builds) in one go; `serving` (what the
serving layer costs), `llm` (generation engines in-process) and `llm_kernels` (decode-step time per
precision and quantizer), `llm_context` (decode-step time against the cached context) and `llm_peer`
(mbuild against llama.cpp's llama-server, which it builds into ~/.cache/mbuild-bench when missing) run
on their own.
"""

from __future__ import annotations

import argparse
import importlib
import time

# Imported on demand: a scenario's peer (onnxruntime-genai, infinity-emb, ...) is needed only when it runs.
SCENARIOS = {"embeddings": "bench.embeddings", "llm_served": "bench.llm_served", "builds": "bench.build_times",
             "serving": "bench.serving", "llm": "bench.llm", "llm_kernels": "bench.llm_kernels",
             "llm_context": "bench.llm_context", "llm_peer": "bench.llm_peer"}
ALL = ("embeddings", "llm_served", "builds")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    started = time.perf_counter()
    for name in ALL if args.scenario == "all" else (args.scenario,):
        importlib.import_module(SCENARIOS[name]).main(repeats=args.repeats)
    print(f"bench {args.scenario}: {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
