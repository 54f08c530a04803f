"""`python -m bench SCENARIO [--repeats N] [scenario options]`: run benchmarks and write docs/benchmarks/.

`all` runs the published comparison (embeddings, llm_served, builds) in one go; `serving` (what the
serving layer costs), `llm` (generation engines in-process) and `llm_kernels` (decode-step time per
precision and quantizer), `llm_context` (decode-step time against the cached context), `llm_peer`
(mbuild against llama.cpp's llama-server, which it builds into ~/.cache/mbuild-bench when missing) and
`build_scale` (a build's peak memory, time and output size for ~100M, Llama-3.2-1B- and Llama-3.1-8B-shaped
models, beside llama.cpp's converter; options --shapes 100m,1b,8b --precisions fp32,int8,int4 --gguf
q8_0,bf16,f32 --report-only) and `structured` (tokens/s and TPOT with and without a JSON schema, mbuild and
llama.cpp) run on their own.
"""

from __future__ import annotations

import argparse
import importlib
import time

# Imported on demand: a scenario's peer (onnxruntime-genai, infinity-emb, ...) is needed only when it runs.
SCENARIOS = {"embeddings": "bench.embeddings", "llm_served": "bench.llm_served", "builds": "bench.build_times",
             "serving": "bench.serving", "llm": "bench.llm", "llm_kernels": "bench.llm_kernels",
             "llm_context": "bench.llm_context", "llm_peer": "bench.llm_peer", "build_scale": "bench.build_scale",
             "structured": "bench.structured"}
ALL = ("embeddings", "llm_served", "builds")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument("--repeats", type=int, default=3)
    args, rest = parser.parse_known_args()
    started = time.perf_counter()
    for name in ALL if args.scenario == "all" else (args.scenario,):
        module = importlib.import_module(SCENARIOS[name])
        if rest and not hasattr(module, "parse_options"):  # a scenario with options of its own parses them
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        options = module.parse_options(rest) if hasattr(module, "parse_options") else {}
        module.main(repeats=args.repeats, **options)
    print(f"bench {args.scenario}: {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
