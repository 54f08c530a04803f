"""The naive apps the baseline arms serve, started by module path (`uvicorn bench.peers.naive_embed_app:app`)."""
