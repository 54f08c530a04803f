"""OCI images without a daemon: layouts, deterministic layers, and the distribution API."""
