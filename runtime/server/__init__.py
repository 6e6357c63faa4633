"""HTTP only: the OpenAI-compatible routes, SSE and keepalives, drain, API keys, health and metrics."""
