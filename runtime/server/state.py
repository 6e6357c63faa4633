"""What the routes share: the engine once booted, the keys, the drain flag and the in-flight count."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfc.runtime.server.auth import ApiKeys

if TYPE_CHECKING:  # the engine's modules import torch; the state is made before the boot
    from tfc.runtime.engine.engine import Engine
    from tfc.runtime.engine.metrics import EngineMetrics


@dataclass
class ServerState:
    """The server's one mutable object; the engine and chat format arrive when the boot finishes."""

    model_name: str
    keys: ApiKeys
    engine: Engine | None = None
    chat: Any = None
    tokenizer: Any = None
    metrics: EngineMetrics | None = None
    status: str = "booting"  # booting | ready | draining | failed
    failure: str | None = None
    inflight: int = 0
    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    boot_s: float | None = None
    boot_phases: dict[str, float] = field(default_factory=dict)
    keepalive_s: float = 15.0  # between pre-token SSE keepalives (the serve options say; 0: none)
    after_count: Callable[[], None] | None = (
        None  # a test hook between counting a request and reading the flag
    )
    graphs: Any = None

    @property
    def ready(self) -> bool:
        """Whether generation requests are admitted."""
        return self.status == "ready"
