"""`python -m bench SCENARIO [--repeats N]`: run benchmarks and write docs/benchmarks/.

`all` runs the published comparison (embeddings, llm_served, builds) in one go; `serving` (what the
serving layer costs) and `llm` (generation engines in-process) run on their own.
"""

from __future__ import annotations

import argparse
import time

from bench import build_times, embeddings, llm, llm_served, serving

SCENARIOS = {"embeddings": embeddings.main, "llm_served": llm_served.main, "builds": build_times.main,
             "serving": serving.main, "llm": llm.main}
ALL = ("embeddings", "llm_served", "builds")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    started = time.perf_counter()
    for name in ALL if args.scenario == "all" else (args.scenario,):
        SCENARIOS[name](repeats=args.repeats)
    print(f"bench {args.scenario}: {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
