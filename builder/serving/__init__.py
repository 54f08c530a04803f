"""Serving a build on this host beyond one process: replicas behind NVIDIA Dynamo (replicas.py)."""
