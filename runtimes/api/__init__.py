"""HTTP only: one admission path, one error model, routes per API (OpenAI, KServe V2, health)."""
