"""The engine's Prometheus metrics, vLLM's names under a `tfc:` prefix, one `model_name` label, own registry."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class EngineMetrics:
    """Counters, gauges and histograms of one served model (a registry of its own, so servers never share)."""

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        self.model = model
        reg, lab = self.registry, ["model_name"]

        def counter(name: str, doc: str, labels: list[str] | None = None) -> Any:
            m = Counter(f"tfc:{name}", doc, lab + (labels or []), registry=reg)
            return m if labels else m.labels(model)

        def gauge(name: str, doc: str, labels: list[str] | None = None) -> Any:
            m = Gauge(f"tfc:{name}", doc, lab + (labels or []), registry=reg)
            return m if labels else m.labels(model)

        def histogram(name: str, doc: str, buckets: tuple) -> Any:
            return Histogram(f"tfc:{name}", doc, lab, buckets=buckets, registry=reg).labels(model)

        self.requests = counter("requests", "HTTP generation requests received")
        self.errors = counter(
            "request_errors", "generation requests that ended in an error (4xx/5xx or in-stream)"
        )
        self.rejected = counter("requests_rejected", "requests refused for capacity or drain before any byte")
        self.aborted = counter("requests_aborted", "requests cancelled by the client (disconnect)")
        self._success = counter("request_success", "finished requests by finish reason", ["finished_reason"])
        self.prompt_tokens = counter("prompt_tokens", "prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "tokens generated")
        self.cached_tokens = counter(
            "cached_tokens", "prompt tokens of finished requests restored from the prefix cache"
        )
        self.prefix_queries = counter("prefix_cache_queries", "prompt tokens looked up in the prefix cache")
        self.prefix_hits = counter("prefix_cache_hits", "prompt tokens restored from the prefix cache")
        self.prefix_tier_hits = counter(
            "prefix_cache_tier_hits", "requests resumed from the prefix cache, by the tier that held the state",
            ["tier"],
        )  # fmt: skip
        self.prefix_evictions = counter(
            "prefix_cache_evictions",
            "entries pushed out of a prefix-cache tier (to the next or gone)",
            ["tier"],
        )
        self.prefix_damaged = counter(
            "prefix_cache_damaged", "disk entries refused because their digest or form did not check"
        )
        self.prefix_bytes = gauge("prefix_cache_bytes", "bytes held by each prefix-cache tier", ["tier"])
        self.prefix_entries = gauge(
            "prefix_cache_entries", "entries held by each prefix-cache tier", ["tier"]
        )
        self.drafts = counter("spec_decode_num_drafts", "draft-verify rounds")
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "tokens drafted")
        self.accepted_tokens = counter(
            "spec_decode_num_accepted_tokens", "drafted tokens the main model agreed with (and emitted)"
        )
        self.running = gauge("num_requests_running", "requests holding a slot")
        self.waiting = gauge("num_requests_waiting", "requests queued for a slot")
        self.kv_usage = gauge("kv_cache_usage_perc", "fraction of sequence slots in use")
        self.ttft = histogram("time_to_first_token_seconds", "arrival to first generated token", LATENCY)
        self.itl = histogram(
            "inter_token_latency_seconds", "time between consecutive tokens of a sequence", LATENCY
        )
        self.e2e = histogram("e2e_request_latency_seconds", "arrival to last token", LATENCY)
        self.queue_time = histogram("request_queue_time_seconds", "arrival to slot", LATENCY)
        self.iteration_tokens = histogram("iteration_tokens_total", "tokens per engine step", TOKENS)
        self.graph_replays = gauge("graph_replays", "CUDA-graph replays of the worker's cache")
        self.graph_captures = gauge("graph_captures", "CUDA-graph captures of the worker's cache")
        self._boot = Gauge(
            "tfc:boot_phase_seconds", "seconds of each boot phase", [*lab, "phase"], registry=reg
        )

    def finish(self, reason: str | None, usage: Any) -> None:
        """Count a finished sequence."""
        if reason == "error":
            self.errors.inc()
            return
        self._success.labels(self.model, reason or "unknown").inc()
        self.prompt_tokens.inc(usage.prompt_tokens)
        self.cached_tokens.inc(usage.cached_tokens)
        self.e2e.observe(usage.e2e_s)

    def boot_phases(self, phases: dict[str, float]) -> None:
        """Record boot phase times (seconds by phase name)."""
        for name, seconds in phases.items():
            self._boot.labels(self.model, name).set(seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
