"""mbuild's benchmarks: every scenario runs its arms interleaved in one process and reports ratios.

`python -m bench llm` (or `all`) writes JSON and a markdown table to docs/benchmarks/; `--help` lists the
scenarios (bench/scenarios/), which share bench/lib/ and serve the naive apps in bench/peers/.
"""
