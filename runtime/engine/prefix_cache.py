"""The prefix cache: sequence states kept under a digest of the tokens they have seen, resumed by later prompts.

Keys form a hash chain: the digest of a sequence's first k*page tokens covers the digest before it and the
page's ids, and a state at n = k*page + r tokens (r > 0: a prompt's or a reply's end) is keyed by the digest
of page k's chain value and the r ids after it. A prompt resumes from the longest cached prefix of at most
len(prompt) - 1 tokens, so its last token is always fed again and its logits are the model's, never stored.
Entries live in tiers, each an LRU under a byte budget: the runner's device, then host memory, then a disk
folder; one pushed out of a tier moves to the next (out of the last it is gone), one hit below the device
tier comes back up. A request pins the entry it resumes from until its state is in the slot: a pinned entry
is never evicted. The cache runs on the engine's thread only; `stats` may be read from any.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import numpy as np
from tfc.runtime.engine.prefix_tiers import DamagedEntry, DiskTier, Entry, MemoryTier
from tfc.runtime.worker.runner import ModelRunner, Snapshot, Snapshots, snapshots_of

GIB = 1 << 30


@dataclass(frozen=True)
class PrefixSettings:
    """The tiers' budgets in bytes; `disk` (a folder) adds the disk tier."""

    device_bytes: int = GIB
    host_bytes: int = 0
    disk: Path | None = None
    disk_bytes: int = 16 * GIB


def _digest(kind: bytes, parent: bytes, tokens: Sequence[int]) -> bytes:
    return blake3.blake3(kind + parent + np.asarray(tokens, dtype="<u4").tobytes()).digest()


class PrefixChain:
    """The chain digests of a growing token sequence, one per page boundary, and the key of any prefix."""

    def __init__(self, page: int, tokens: Sequence[int] = ()) -> None:
        self.page = page
        self.tokens: list[int] = []
        self.pages = [blake3.blake3(b"tfc-prefix-root:%d" % page).digest()]  # pages[k]: first k*page tokens
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ids (the chain grows by every page they complete)."""
        self.tokens.extend(int(t) for t in tokens)
        while len(self.pages) * self.page <= len(self.tokens):
            k = len(self.pages)
            self.pages.append(_digest(b"p", self.pages[-1], self.tokens[(k - 1) * self.page : k * self.page]))

    def key(self, n: int) -> bytes:
        """The key of the first n ids (n at most len(self))."""
        k, r = divmod(n, self.page)
        return self.pages[k] if r == 0 else _digest(b"t", self.pages[k], self.tokens[k * self.page : n])


@dataclass
class Lease:
    """One request's look-up: its prompt's chain, how far it may resume, the entry it pinned (None: a miss)."""

    chain: PrefixChain
    limit: int
    entry: Entry | None = None


class PrefixCache:
    """Entries by key over the tiers; look-up, resume into a slot, offer a slot's state; stats for metrics."""

    def __init__(self, page: int, tiers: Sequence[Any], metrics: Any = None) -> None:
        self.page, self.tiers, self.metrics = page, list(tiers), metrics
        self._entries: dict[bytes, Entry] = {}
        self._tails: dict[bytes, Counter[int]] = {}  # page chain value -> lengths r of entries past it
        self.queries = self.hits = 0  # prompt tokens looked up, prompt tokens restored
        self._publish()

    # -- a request resumes ---------------------------------------------------------------------------------

    def lease(self, prompt: Sequence[int]) -> Lease:
        """Look a prompt up and pin its longest cached prefix (at most len(prompt) - 1 tokens)."""
        lease = Lease(PrefixChain(self.page, prompt), len(prompt) - 1)
        lease.entry = self._pin(self._longest(lease.chain, lease.limit))
        self.queries += len(prompt)
        if self.metrics is not None:
            self.metrics.prefix_queries.inc(len(prompt))
        return lease

    def resume(self, lease: Lease, slot: int, runner: Snapshots) -> int:
        """Restore the leased prefix into `slot` and unpin it; the tokens restored (0: nothing usable).

        A damaged entry is dropped and the next longest prefix tried; a hit below the device tier moves up."""
        try:
            while lease.entry is not None:
                entry, snapshot = lease.entry, None
                if entry.tier is not None:
                    try:
                        snapshot = entry.tier.get(entry)
                    except DamagedEntry:
                        self._forget(entry)
                        if self.metrics is not None:
                            self.metrics.prefix_damaged.inc()
                if snapshot is not None:
                    runner.restore(slot, snapshot)
                    self._count_hit(entry.tier.name, entry.tokens)
                    self._move_up(entry, snapshot, slot, runner)
                    return entry.tokens
                self._unpin(entry)
                lease.entry = self._pin(self._longest(lease.chain, lease.limit))
            return 0
        finally:
            self.release(lease)
            self._publish()

    def release(self, lease: Lease) -> None:
        """Unpin a lease's entry (a no-op once resumed)."""
        if lease.entry is not None:
            self._unpin(lease.entry)
            lease.entry = None

    def _longest(self, chain: PrefixChain, limit: int) -> Entry | None:
        for k in range(min(limit, len(chain)) // self.page, -1, -1):
            base = chain.pages[k]
            tails = self._tails.get(base, {})
            for r in sorted((r for r in tails if k * self.page + r <= limit), reverse=True):
                entry = self._entries.get(chain.key(k * self.page + r))
                if entry is not None:
                    return entry
            if k and base in self._entries:
                return self._entries[base]
        return None

    @staticmethod
    def _pin(entry: Entry | None) -> Entry | None:
        if entry is not None:
            entry.pins += 1
        return entry

    @staticmethod
    def _unpin(entry: Entry) -> None:
        entry.pins -= 1

    # -- a running sequence offers its state ---------------------------------------------------------------

    def offer(self, chain: PrefixChain, n: int, slot: int, runner: Snapshots) -> None:
        """Keep `slot`'s state, which has seen the chain's first n ids, unless that prefix is cached already."""
        key = chain.key(n)
        entry = self._entries.get(key)
        if entry is not None:
            entry.tier.touch(entry)
            return
        entry = Entry(key, n, chain.pages[n // self.page])
        if self._place(entry, runner.snapshot(slot), 0):
            self._entries[key] = entry
            if n % self.page:
                self._tails.setdefault(entry.parent, Counter())[n % self.page] += 1
        self._publish()

    def _place(self, entry: Entry, snapshot: Snapshot, level: int) -> bool:
        """Put a snapshot in the first tier from `level` down that can make room for it (False: none can)."""
        for i in range(level, len(self.tiers)):
            victims = self._victims(i, self.tiers[i].size(snapshot))
            if victims is not None:
                self._evict(i, victims)
                if self.tiers[i].put(entry, snapshot):
                    return True
        return False

    def _move_up(self, entry: Entry, fetched: Snapshot, slot: int, runner: Snapshots) -> None:
        """Move a hit from below the device tier to the highest tier that can make room (else just use it)."""
        old = entry.tier
        for i in range(self.tiers.index(old)):
            victims = self._victims(i, self.tiers[i].size(fetched))
            if victims is not None:
                old.take(entry)  # first: the entries it pushes down may need its room
                self._evict(i, victims)
                self.tiers[i].put(entry, runner.snapshot(slot) if i == 0 else fetched)
                return
        old.touch(entry)

    def _victims(self, level: int, size: int) -> list[Entry] | None:
        """The least recently used unpinned entries of a tier whose room `size` more bytes need (None: too few)."""
        tier = self.tiers[level]
        if size > tier.budget:
            return None
        need = tier.used + size - tier.budget
        victims, freed = [], 0
        for entry, held in tier.oldest():
            if freed >= need:
                break
            if not entry.pins:
                victims.append(entry)
                freed += held
        return victims if freed >= need else None

    def _evict(self, level: int, victims: list[Entry]) -> None:
        """Move entries out of a tier into the next that can take them (out of the last: gone)."""
        tier = self.tiers[level]
        for entry in victims:
            snapshot = tier.take(entry)
            if self.metrics is not None:
                self.metrics.prefix_evictions.labels(self.metrics.model, tier.name).inc()
            if snapshot is None or not self._place(entry, snapshot, level + 1):
                self._forget(entry)

    def _forget(self, entry: Entry) -> None:
        """Drop an entry from the index (and from its tier, if it still has one)."""
        if entry.tier is not None:
            entry.tier.take(entry)
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
            r = entry.tokens % self.page
            tails = self._tails.get(entry.parent)
            if r and tails is not None:
                tails[r] -= 1
                if tails[r] <= 0:
                    del tails[r]
                if not tails:
                    del self._tails[entry.parent]

    # -- what it holds -------------------------------------------------------------------------------------

    def _count_hit(self, tier: str, tokens: int) -> None:
        self.hits += tokens
        if self.metrics is not None:
            self.metrics.prefix_hits.inc(tokens)
            self.metrics.prefix_tier_hits.labels(self.metrics.model, tier).inc()

    def _publish(self) -> None:
        if self.metrics is None:
            return
        for tier in self.tiers:
            self.metrics.prefix_bytes.labels(self.metrics.model, tier.name).set(tier.used)
            self.metrics.prefix_entries.labels(self.metrics.model, tier.name).set(len(tier))

    def stats(self) -> dict:
        """Entries, pins, hits and each tier's bytes (a plain dict, safe to read from another thread)."""
        tiers = {t.name: {"entries": len(t), "bytes": t.used, "budget": t.budget} for t in list(self.tiers)}
        entries = list(self._entries.values())
        return {"page": self.page, "entries": len(entries), "pinned": sum(1 for e in entries if e.pins),
                "queries": self.queries, "hits": self.hits, "damaged": sum(t.damaged for t in self.tiers),
                "tiers": tiers}  # fmt: skip

    def close(self) -> None:
        """Drop every entry (a disk tier removes its files); a no-op the second time."""
        for tier in self.tiers:
            tier.close()
        self.tiers = []
        self._entries.clear()
        self._tails.clear()


def open_prefix_cache(
    runner: ModelRunner, settings: PrefixSettings | None, page: int, metrics: Any = None
) -> tuple[PrefixCache | None, str]:
    """(the cache over a runner's snapshots, or None; one line saying which and why)."""
    if settings is None:
        return None, "prefix cache off"
    snapshots = snapshots_of(runner)
    if snapshots is None:
        return None, "prefix cache off: the model runner cannot snapshot a sequence's state"
    tiers: list[Any] = [MemoryTier("device", settings.device_bytes)]
    if settings.host_bytes:
        tiers.append(MemoryTier("host", settings.host_bytes, lambda s: s.to_host()))
    if settings.disk is not None:
        tiers.append(DiskTier(settings.disk, settings.disk_bytes, snapshots.load_snapshot))
    budgets = ", ".join(
        f"{t.name} {t.budget / GIB:g} GiB" + (f" in {t.folder}" if t.name == "disk" else "") for t in tiers
    )
    note = f"prefix cache on: a state every {page} tokens and at each prompt's and reply's end; {budgets}"
    return PrefixCache(page, tiers, metrics), note
