"""The prefix cache on its own, over a stand-in runner whose slot state is the ids it has seen: the hash chain,
longest-prefix look-up, LRU tiers (device, host, disk), pins, and damaged disk entries refused."""

from __future__ import annotations

import json

import pytest
from tfc.runtime.engine.prefix_cache import PrefixCache, PrefixChain, PrefixSettings, open_prefix_cache
from tfc.runtime.engine.prefix_tiers import DiskTier, MemoryTier, PrefixCacheError
from tfc.runtime.worker.runner import RunnerCapabilities, snapshots_of

from tfc.errors import TfcError

SIZE = 100  # every stand-in snapshot's bytes


class Snap:
    """A slot's ids, `where` it is held."""

    def __init__(self, ids: tuple[int, ...], where: str = "device") -> None:
        self.ids, self.where, self.nbytes = ids, where, SIZE

    def to_host(self) -> Snap:
        return Snap(self.ids, "host")

    def to_bytes(self) -> bytes:
        return json.dumps(list(self.ids)).encode()


class BadBytes(TfcError):
    pass


class SlotRunner:
    """Slots hold the ids fed; snapshot, restore and load_snapshot as a runner's."""

    capabilities = RunnerCapabilities(snapshot=True)

    def __init__(self) -> None:
        self.slots: dict[int, tuple[int, ...]] = {}
        self.restored: list[tuple[int, ...]] = []

    def feed(self, slot: int, ids) -> None:
        self.slots[slot] = tuple(ids)

    def snapshot(self, slot: int) -> Snap:
        return Snap(self.slots[slot])

    def restore(self, slot: int, snap: Snap) -> None:
        self.slots[slot] = snap.ids
        self.restored.append(snap.ids)

    def load_snapshot(self, data: bytes) -> Snap:
        try:
            return Snap(tuple(json.loads(data)), "disk")
        except ValueError:
            raise BadBytes("not ids") from None


IDS = tuple(range(100, 140))


def _offer(cache: PrefixCache, runner: SlotRunner, ids, n: int) -> None:
    runner.feed(9, ids[:n])
    cache.offer(PrefixChain(cache.page, ids), n, 9, runner)


def _resume(cache: PrefixCache, runner: SlotRunner, prompt) -> int:
    return cache.resume(cache.lease(prompt), 0, runner)


def test_chain_keys_cover_every_id_before_them_and_grow_alike():
    whole = PrefixChain(4, IDS)
    grown = PrefixChain(4)
    for i in range(0, len(IDS), 3):
        grown.extend(IDS[i : i + 3])
    assert grown.pages == whole.pages and len(whole.pages) == 11
    assert [grown.key(n) for n in range(41)] == [whole.key(n) for n in range(41)]
    assert len({whole.key(n) for n in range(41)}) == 41
    other = PrefixChain(4, (999, *IDS[1:]))  # one different first id changes every key after it
    assert all(other.key(n) != whole.key(n) for n in range(1, 41))
    assert PrefixChain(4, IDS[:10]).key(10) == whole.key(10)
    assert PrefixChain(8, IDS).key(8) != whole.key(8)  # another page size is another chain


def test_a_prompt_resumes_from_its_longest_cached_prefix_and_feeds_its_last_id():
    cache, runner = PrefixCache(4, [MemoryTier("device", 100 * SIZE)]), SlotRunner()
    for n in (4, 8, 10, 13):
        _offer(cache, runner, IDS, n)
    _offer(cache, runner, (*IDS[:8], 7, 7, 7), 11)  # same page chain, another tail
    assert _resume(cache, runner, IDS[:20]) == 13 and runner.slots[0] == IDS[:13]
    assert _resume(cache, runner, IDS[:13]) == 10  # never the whole prompt: its last id is fed again
    assert _resume(cache, runner, IDS[:10]) == 8
    assert _resume(cache, runner, (*IDS[:6], 0, 0, 0, 0, 0, 0)) == 4
    assert _resume(cache, runner, (*IDS[:8], 7, 7, 7, 7)) == 11
    assert _resume(cache, runner, (5, *IDS)) == 0
    stats = cache.stats()
    assert stats["hits"] == 13 + 10 + 8 + 4 + 11 and stats["entries"] == 5 and stats["pinned"] == 0


def test_lru_moves_entries_down_the_tiers_and_a_hit_brings_one_back():
    device = MemoryTier("device", 2 * SIZE)
    host = MemoryTier("host", 2 * SIZE, lambda s: s.to_host())
    cache, runner = PrefixCache(4, [device, host]), SlotRunner()
    for n in (4, 8, 12, 16, 20):
        _offer(cache, runner, IDS, n)
    assert (len(device), len(host), cache.stats()["entries"]) == (2, 2, 4)  # 4 fell out of the last tier
    assert device.used == host.used == 2 * SIZE
    assert _resume(cache, runner, IDS[:6]) == 0
    assert _resume(cache, runner, IDS[:9]) == 8 and runner.restored[-1] == IDS[:8]
    assert [e.tokens for e, _ in device.oldest()] == [20, 8]  # 8 came back up, 16 went down
    assert [e.tokens for e, _ in host.oldest()] == [12, 16]
    assert all(s.where == "host" for _, s, _ in host._held.values())
    _offer(cache, runner, IDS, 20)  # offered again: only used, not copied
    assert [e.tokens for e, _ in device.oldest()] == [8, 20]


def test_a_pinned_entry_is_never_evicted_and_is_restored_whole():
    device = MemoryTier("device", 2 * SIZE)
    cache, runner = PrefixCache(4, [device]), SlotRunner()
    _offer(cache, runner, IDS, 8)
    lease = cache.lease(IDS[:12])
    assert lease.entry.tokens == 8 and cache.stats()["pinned"] == 1
    for n in (12, 16, 20, 24):  # a flood while the request waits to resume
        _offer(cache, runner, IDS, n)
    assert 8 in [e.tokens for e, _ in device.oldest()] and device.used <= device.budget
    assert cache.resume(lease, 0, runner) == 8 and runner.slots[0] == IDS[:8]
    assert cache.stats()["pinned"] == 0
    for n in (28, 32):
        _offer(cache, runner, IDS, n)
    assert [e.tokens for e, _ in device.oldest()] == [28, 32]  # unpinned: evicted like any other


def test_a_state_too_big_for_every_tier_is_not_kept():
    cache, runner = PrefixCache(4, [MemoryTier("device", SIZE - 1)]), SlotRunner()
    _offer(cache, runner, IDS, 8)
    assert cache.stats()["entries"] == 0 and _resume(cache, runner, IDS) == 0


def _disk_cache(folder, budget=100 * SIZE):
    runner = SlotRunner()
    disk = DiskTier(folder, budget, runner.load_snapshot)
    return PrefixCache(4, [MemoryTier("device", 0), disk]), runner, disk


def test_the_disk_tier_round_trips_and_refuses_a_damaged_entry(tmp_path):
    cache, runner, disk = _disk_cache(tmp_path)
    for n in (4, 8, 12):
        _offer(cache, runner, IDS, n)
    files = sorted(tmp_path.glob("*.tfcprefix"))
    assert len(files) == len(disk) == 3 and disk.used == sum(f.stat().st_size for f in files)
    assert _resume(cache, runner, IDS[:9]) == 8 and runner.slots[0] == IDS[:8]
    assert len(disk) == 3  # no tier above can take it: it stays where it is
    twelve = tmp_path / f"{PrefixChain(4, IDS).key(12).hex()}.tfcprefix"
    raw = bytearray(twelve.read_bytes())
    raw[-2] ^= 0x01  # one flipped bit in the payload
    twelve.write_bytes(bytes(raw))
    runner.restored.clear()
    assert _resume(cache, runner, IDS[:20]) == 8  # refused: the next longest prefix instead
    assert runner.restored == [IDS[:8]] and not twelve.exists()
    assert cache.stats()["damaged"] == 1 and cache.stats()["entries"] == 2


def test_a_disk_hit_comes_back_to_memory(tmp_path):
    runner = SlotRunner()
    host = MemoryTier("host", SIZE, lambda s: s.to_host())
    disk = DiskTier(tmp_path, 100 * SIZE, runner.load_snapshot)
    cache = PrefixCache(4, [MemoryTier("device", 0), host, disk])
    for n in (4, 8):
        _offer(cache, runner, IDS, n)
    assert [e.tokens for e, _ in disk.oldest()] == [4] and len(host) == 1
    assert _resume(cache, runner, IDS[:5]) == 4 and runner.slots[0] == IDS[:4]
    assert [e.tokens for e, _ in host.oldest()] == [4] and [e.tokens for e, _ in disk.oldest()] == [8]
    assert len(list(tmp_path.glob("*.tfcprefix"))) == 1


@pytest.mark.parametrize("damage", ["truncated", "swapped", "foreign"])
def test_a_disk_entry_that_is_not_its_own_is_refused(tmp_path, damage):
    cache, runner, disk = _disk_cache(tmp_path)
    _offer(cache, runner, IDS, 4)
    _offer(cache, runner, IDS, 8)
    chain = PrefixChain(4, IDS)
    eight, four = (tmp_path / f"{chain.key(n).hex()}.tfcprefix" for n in (8, 4))
    if damage == "truncated":
        eight.write_bytes(eight.read_bytes()[:-3])
    elif damage == "swapped":  # a well-formed file of another entry: the digest covers the key
        eight.write_bytes(four.read_bytes())
    else:
        eight.write_bytes(b"\0" * 64)
    runner.restored.clear()
    assert _resume(cache, runner, IDS[:9]) == 4 and runner.restored == [IDS[:4]]
    assert disk.damaged == 1 and len(disk) == 1


def test_the_disk_folder_is_one_servers_and_emptied_on_close(tmp_path):
    (tmp_path / "old.tfcprefix").write_bytes(b"an earlier run's")
    cache, runner, _ = _disk_cache(tmp_path)
    assert not (tmp_path / "old.tfcprefix").exists()
    with pytest.raises(PrefixCacheError, match="another server"):
        DiskTier(tmp_path, SIZE, runner.load_snapshot)
    _offer(cache, runner, IDS, 8)
    cache.close()
    assert not list(tmp_path.glob("*.tfcprefix")) and cache.stats()["entries"] == 0
    DiskTier(tmp_path, SIZE, runner.load_snapshot).close()  # free again


def test_a_full_disk_keeps_the_oldest_out(tmp_path):
    cache, runner, disk = _disk_cache(tmp_path, budget=2 * (SIZE + 48))
    for n in (4, 8, 12):
        _offer(cache, runner, IDS, n)
    assert [e.tokens for e, _ in disk.oldest()] == [8, 12] and len(list(tmp_path.glob("*.tfcprefix"))) == 2


class NoSnapshots:
    capabilities = RunnerCapabilities()

    def execute(self, plan): ...

    def release(self, slot): ...


def test_a_runner_that_cannot_snapshot_runs_with_the_cache_off_and_says_so():
    cache, note = open_prefix_cache(NoSnapshots(), PrefixSettings(), 8)
    assert cache is None and "cannot snapshot" in note
    runner = SlotRunner()
    runner.capabilities = RunnerCapabilities()  # the methods, not stated: the cache stays off
    assert snapshots_of(runner) is None and snapshots_of(SlotRunner()) is not None
    assert open_prefix_cache(runner, PrefixSettings(), 8)[0] is None
    assert open_prefix_cache(SlotRunner(), None, 8) == (None, "prefix cache off")
    cache, note = open_prefix_cache(SlotRunner(), PrefixSettings(host_bytes=1 << 20), 8)
    assert [t.name for t in cache.tiers] == ["device", "host"] and note.startswith("prefix cache on")


def test_a_worker_says_whether_its_runner_can_snapshot():
    from tfc.runtime.worker.worker import Worker

    worker = Worker.__new__(Worker)  # no boot: only the runner matters here
    worker.runner, worker.kind = NoSnapshots(), "reference"
    assert not worker.capabilities.snapshot and snapshots_of(worker) is None
    assert open_prefix_cache(worker, PrefixSettings(), 8)[0] is None
    worker.runner = SlotRunner()
    assert worker.capabilities.snapshot and snapshots_of(worker) is worker
