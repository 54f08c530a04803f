"""`mbuild bench TARGET`: a concurrency sweep of a served model through AIPerf, read into one typed result
(bench.json), its frontier, SLO point, cost and energy, and the sizing `plan`/`deploy` take from it."""
