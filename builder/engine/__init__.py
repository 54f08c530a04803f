"""Exactly what decides an engine: export, compile, the gates, the engine cache (keyed by this folder)."""
