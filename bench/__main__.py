"""`python -m bench SCENARIO [--repeats N]`: run benchmarks and write docs/benchmarks/."""

from __future__ import annotations

import argparse

from bench import llm, serving

SCENARIOS = {"llm": llm.main, "serving": serving.main}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for name, run in SCENARIOS.items():
        if args.scenario in {name, "all"}:
            run(repeats=args.repeats)


if __name__ == "__main__":
    main()
