"""Serving a build on this host beyond one process: replicas behind NVIDIA Dynamo (replicas.py); waiting for a
server that was just started to be ready (ready.py)."""

# `--router` of `mbuild serve --replicas`: here, so the CLI lists them without importing replicas.py (httpx, Dynamo)
ROUTERS = ("kv", "round-robin")
