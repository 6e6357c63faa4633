"""Boot phase timing: wall time and bytes per phase (`tfc load --json` prints them)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Phase:
    """One timed phase: its wall seconds and the bytes it moved (0 when it moves none)."""

    name: str
    seconds: float = 0.0
    bytes: int = 0
    note: str = ""

    @property
    def gbps(self) -> float:
        """Bytes per second in GB/s (1e9), 0 for phases that move no bytes."""
        return self.bytes / self.seconds / 1e9 if self.bytes and self.seconds > 0 else 0.0


@dataclass
class Phases:
    """Phases in the order they ran."""

    phases: list[Phase] = field(default_factory=list)
    t0: float = field(default_factory=time.perf_counter)

    @contextmanager
    def time(self, name: str, nbytes: int = 0, note: str = "") -> Iterator[Phase]:
        """Time the body as phase `name`; the body may set `.bytes` and `.note` on what it yields."""
        phase = Phase(name, 0.0, nbytes, note)
        start = time.perf_counter()
        try:
            yield phase
        finally:
            phase.seconds = time.perf_counter() - start
            self.phases.append(phase)

    def add(self, name: str, seconds: float, nbytes: int = 0, note: str = "") -> Phase:
        """Record a phase measured elsewhere (e.g. the read part of an overlapped upload)."""
        phase = Phase(name, seconds, nbytes, note)
        self.phases.append(phase)
        return phase

    def to_dict(self, **extra: object) -> dict:
        """`{"wall_ms", "<phase>": {"ms", "bytes", "gbps", "note"}, ...}` plus `extra` fields."""
        out: dict = {"wall_ms": round((time.perf_counter() - self.t0) * 1e3, 3), **extra}
        for p in self.phases:
            out[p.name] = {"ms": round(p.seconds * 1e3, 3), "bytes": p.bytes, "gbps": round(p.gbps, 3)}
            if p.note:
                out[p.name]["note"] = p.note
        return out
