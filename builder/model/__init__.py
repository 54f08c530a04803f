"""A user's reference -> pinned files and facts: sources, catalog, hub pull, cache import."""
