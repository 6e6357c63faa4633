"""What a command asks of the runtime (its flags and the operator's settings), as one frozen value.

The command builds it once, before anything boots, and passes it down: to the boot (graphs, staging), the
graph cache (its settings), and a TP world (timeouts, heartbeat), whose ranks compare it field by field at
start (runtime/parallel/agreement.py). Nothing below the command reads the environment for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tfc.runtime.graphs.graph_cache import GraphSettings

from tfc import settings


@dataclass(frozen=True)
class RuntimeOptions:
    """The runtime's options for one command, alike on every rank."""

    graphs: bool = True  # --no-graphs or TFC_GRAPHS=0: every step eager
    max_graphs: int = settings.default("TFC_GRAPHS_MAX")
    tp_timeout_s: float = settings.default("TFC_TP_TIMEOUT_S")
    tp_hang_s: float = settings.default("TFC_TP_HANG_S")
    prefault: bool = settings.default("TFC_PREFAULT")

    @classmethod
    def from_settings(cls, *, graphs: bool = True, env: Mapping[str, str] | None = None) -> RuntimeOptions:
        """The command's flags (`graphs=False`: --no-graphs) with the operator's settings read from `env`."""
        return cls(
            graphs=graphs and settings.get("TFC_GRAPHS", env),
            max_graphs=settings.get("TFC_GRAPHS_MAX", env),
            tp_timeout_s=settings.get("TFC_TP_TIMEOUT_S", env),
            tp_hang_s=settings.get("TFC_TP_HANG_S", env),
            prefault=settings.get("TFC_PREFAULT", env),
        )

    def graph_settings(self, device: str) -> GraphSettings:
        """The graph cache's settings on `device` (graphs are a CUDA thing: off on the CPU)."""
        on = self.graphs and not str(device).startswith("cpu")
        return GraphSettings(max_graphs=self.max_graphs if on else 0)
