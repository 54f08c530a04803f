"""Serving a build on this host beyond one process: replicas behind NVIDIA Dynamo (replicas.py); waiting for a
server that was just started to be ready (ready.py)."""
