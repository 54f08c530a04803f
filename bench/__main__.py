"""`python -m bench SCENARIO [--repeats N] [--quick] [scenario options]`: run benchmarks, write docs/benchmarks/.

Each scenario is the module of its name in bench/scenarios/. `all` runs the published comparison (embeddings,
llm_served, builds) in one go; the others run on their own. `--quick` runs a scenario (with `all`: every scenario)
at its smallest size, one round, writing its report to a scratch folder instead of docs/benchmarks/: a check that
it still runs, not a result. A peer that takes long to build (llama.cpp's server, sentence-transformers' ONNX
venv) is left out of a quick run with a line saying so when it is missing; mbuild's arms always run. Every page a run
writes starts with a header naming its machine, date, commit and the command to reproduce it; `index` rewrites
docs/benchmarks/README.md's table of pages from those headers (`index --check`: exit 1 if it is stale).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.lib import index
from bench.lib.harness import OUT, QUICK_OUT
from bench.lib.mbuild import this_checkout_first
from bench.lib.page_header import start_run

SCENARIOS_DIR = Path(__file__).parent / "scenarios"
PUBLISHED = ("embeddings", "llm_served", "builds")  # what `all` runs without --quick (the README's comparison)


def scenarios() -> dict[str, str]:
    """Every scenario module's name and the first line of its docstring, read without importing it (a scenario
    imports its peers, which need not be installed to list it)."""
    found = {}
    for path in sorted(SCENARIOS_DIR.glob("*.py")):
        if path.stem != "__init__":
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            found[path.stem] = doc.strip().splitlines()[0] if doc.strip() else ""
    return found


def _epilog(listed: dict[str, str]) -> str:
    width = max(map(len, listed))
    return "scenarios:\n" + "\n".join(f"  {name:<{width}}  {line}" for name, line in listed.items())


def _options(parser: argparse.ArgumentParser, module: ModuleType, rest: list[str]) -> dict[str, Any]:
    """A scenario with options of its own parses them; for any other, leftover arguments are an error."""
    if hasattr(module, "parse_options"):
        options: dict[str, Any] = module.parse_options(rest)
        return options
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return {}


def main() -> None:
    listed = scenarios()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__, epilog=_epilog(listed),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=[*listed, "all", "index"], metavar="SCENARIO",
                        help="a scenario below, all, or index (the README's table of pages)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true",
                        help=f"smallest size, one round, reports to {QUICK_OUT} (every scenario with `all`)")
    args, rest = parser.parse_known_args()
    if args.scenario == "index":
        raise SystemExit(index.main(rest))
    this_checkout_first()
    every = list(listed) if args.quick else list(PUBLISHED)
    started = time.perf_counter()
    failed = []
    for name in every if args.scenario == "all" else [args.scenario]:
        began = time.perf_counter()
        print(f"bench {name}{' (quick)' if args.quick else ''}", flush=True)
        start_run(name, sys.argv[1:], args.scenario)
        if not args.quick:
            module = importlib.import_module(f"bench.scenarios.{name}")
            module.main(repeats=args.repeats, **_options(parser, module, rest))
            continue
        try:  # a quick run goes on past a failed scenario, so one run shows every one that broke
            module = importlib.import_module(f"bench.scenarios.{name}")
            module.main(repeats=1, quick=True, out=QUICK_OUT, **_options(parser, module, rest))
        except Exception as error:
            if args.scenario != "all":
                raise
            failed.append(name)
            traceback.print_exc()
            print(f"bench {name} FAILED: {type(error).__name__}: {error}", flush=True)
        print(f"bench {name}: {time.perf_counter() - began:.0f}s", flush=True)
    print(f"bench {args.scenario}: {time.perf_counter() - started:.0f}s"
          + (f"; reports in {QUICK_OUT}, not {OUT}" if args.quick else "")
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
