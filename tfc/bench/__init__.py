"""`tfc bench`: a streaming load generator for any OpenAI-compatible server (stdlib plus httpx2)."""

from tfc.errors import TfcError


class BenchError(TfcError):
    """A bench that cannot start: an unreachable or non-OpenAI URL, a bad sweep, a dataset that does not parse."""
