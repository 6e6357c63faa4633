"""HTTP only: the OpenAI (chat, completions, Responses) and Anthropic Messages routes, SSE and keepalives, drain,
API keys, health and metrics, over an engine it is handed (runtime/serve.py boots it)."""
