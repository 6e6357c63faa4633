"""GraphCache policy with a fake capture backend (CPU), and replay == eager on CUDA (gpu)."""

from __future__ import annotations

import random
import threading

import pytest
from tfc.runtime.graphs.graph_cache import (
    GraphCache,
    GraphSettings,
    GraphSettingsError,
    check_same_settings,
    fingerprint,
)
from tfc.runtime.options import RuntimeOptions

from tfc import settings
from tfc.settings import SettingError


class FakeGraph:
    def __init__(self, step):
        self.step = step
        self.released = False


class FakeBackend:
    """Captures by remembering the step; replay runs it; failures are injected by capture number."""

    def __init__(self, fail_at: set[int] | None = None):
        self.fail_at = fail_at or set()
        self.made = 0
        self.live: list[FakeGraph] = []
        self.replays = 0

    def capture(self, step):
        self.made += 1
        step()  # warm-up, as the real backend does
        if self.made in self.fail_at:
            raise RuntimeError("capture failed")
        graph = FakeGraph(step)
        self.live.append(graph)
        return graph

    def replay(self, graph):
        assert not graph.released
        self.replays += 1
        graph.step()

    def release(self, graph):
        assert not graph.released
        graph.released = True
        self.live.remove(graph)


STATIC_IN = [0]
STATIC_OUT = [0]


class Step:
    """A step reading the static input and writing the static output, as the contract requires."""

    def __init__(self, key: int):
        self.key, self.runs = key, 0

    def __call__(self):
        self.runs += 1
        STATIC_OUT[0] = STATIC_IN[0] * 7919 + self.key


def make(max_graphs=48, min_keep=8, room=None, fail_at=None, **kw):
    backend = FakeBackend(fail_at)
    cache = GraphCache(
        GraphSettings(max_graphs=max_graphs, min_keep=min_keep, **kw),
        backend=backend,
        room=room or (lambda: True),
    )
    return cache, backend


_rng = random.Random(7)


def run(cache, key, buffers=(), static=None):
    static_in, static_out = static or (STATIC_IN, STATIC_OUT)
    static_in[0] = _rng.randrange(1, 1 << 30)
    static_out[0] = None
    graphed = cache.run(key, Step(key) if static is None else StepOn(key, static), buffers)
    assert static_out[0] == static_in[0] * 7919 + key
    return graphed


class StepOn(Step):
    def __init__(self, key, static):
        super().__init__(key)
        self.static = static

    def __call__(self):
        self.runs += 1
        self.static[1][0] = self.static[0][0] * 7919 + self.key


def test_capture_then_replay_counts():
    cache, backend = make()
    keys = random.Random(1).sample(range(1000), 5)
    assert all(run(cache, k) for k in keys)
    assert all(run(cache, k) for k in keys)
    s = cache.stats
    assert (s.captures, s.misses, s.hits, s.eager, s.held) == (5, 5, 5, 0, 5)
    assert backend.replays == 10


def test_lru_evicts_least_recent_and_releases():
    cache, backend = make(max_graphs=3, min_keep=1)
    for k in (11, 22, 33):
        run(cache, k)
    run(cache, 11)  # 22 is now the least recently used
    run(cache, 44)
    assert cache.keys() == [33, 11, 44]
    assert cache.stats.evictions == 1
    assert len(backend.live) == 3
    cache.clear()
    assert backend.live == []


def test_max_zero_is_always_eager():
    cache = GraphCache(GraphSettings(max_graphs=0))  # no backend needed at all
    assert not cache.enabled
    for k in (3, 3, 5):
        assert run(cache, k) is False
    assert cache.stats.eager == 3 and cache.stats.captures == 0


@pytest.mark.parametrize(
    ("env", "graphs", "device", "want"),
    [({}, True, "cuda", 48), ({"TFC_GRAPHS": "0"}, True, "cuda", 0), ({}, False, "cuda:1", 0),
     ({"TFC_GRAPHS_MAX": "5"}, True, "cuda", 5), ({"TFC_GRAPHS": "off", "TFC_GRAPHS_MAX": "5"}, True, "cuda", 0),
     ({"TFC_GRAPHS_MAX": "5"}, True, "cpu", 0)],
)  # fmt: skip
def test_the_cache_settings_come_from_the_commands_options(env, graphs, device, want):
    """The flag and the operator's settings meet in RuntimeOptions; the graph cache only takes its settings."""
    options = RuntimeOptions.from_settings(graphs=graphs, env=env)
    cache = options.graph_settings(device)
    assert cache.max_graphs == want and cache.enabled == (want > 0)
    assert (cache.min_keep, cache.floor) == (GraphSettings().min_keep, GraphSettings().floor)


def test_bad_graph_settings_are_refused_by_name():
    with pytest.raises(
        SettingError, match=r"^TFC_GRAPHS_MAX='many' cannot be used: TFC_GRAPHS_MAX takes a whole"
    ):
        RuntimeOptions.from_settings(env={"TFC_GRAPHS_MAX": "many"})
    with pytest.raises(SettingError, match=r"^TFC_GRAPHS='maybe' cannot be used: TFC_GRAPHS takes on or off"):
        RuntimeOptions.from_settings(env={"TFC_GRAPHS": "maybe"})
    with pytest.raises(GraphSettingsError):
        GraphSettings(floor="drop")
    assert GraphSettings().max_graphs == RuntimeOptions().max_graphs == settings.default("TFC_GRAPHS_MAX")


def test_floor_shed_quarter_then_cap_returns():
    room = [True]
    cache, backend = make(max_graphs=16, min_keep=2, room=lambda: room[0])
    for k in range(12):
        run(cache, k)
    room[0] = False
    assert run(cache, 100) is False
    assert len(cache) == 9 and cache.cap == 9
    assert cache.keys() == list(range(3, 12))
    assert run(cache, 5) is True  # hits still replay below the floor
    run(cache, 101)
    assert len(cache) == 6 and cache.cap == 6
    assert len(backend.live) == 6
    room[0] = True
    run(cache, 102)
    assert cache.cap == 16 and len(cache) == 7
    assert cache.stats.floor_hits == 2


def test_floor_shed_never_below_min_keep():
    room = [True]
    cache, _ = make(max_graphs=8, min_keep=2, room=lambda: room[0])
    for k in range(3):
        run(cache, k)
    room[0] = False
    run(cache, 50)
    assert len(cache) == 2
    run(cache, 51)
    assert len(cache) == 2 and cache.cap == 2


def test_floor_hold_evicts_nothing():
    room = [True]
    cache, backend = make(max_graphs=8, min_keep=2, room=lambda: room[0], floor="hold")
    for k in range(6):
        run(cache, k)
    room[0] = False
    assert run(cache, 60) is False
    assert len(cache) == 6 and cache.cap == 8 and cache.stats.evictions == 0
    assert len(backend.live) == 6


def test_dip_after_prefill_sheds_nothing():
    room = [True]
    cache, _ = make(max_graphs=8, min_keep=0, room=lambda: room[0], dip_rounds=3)
    for k in range(8):
        run(cache, k)
    cache.note_prefill()
    room[0] = False
    run(cache, 70)
    assert len(cache) == 8
    for k in range(3):
        run(cache, k)  # hits move rounds forward
    run(cache, 71)
    assert len(cache) == 6


def test_fingerprint_drops_every_graph_when_a_buffer_moves():
    cache, backend = make()
    bufs = [(0x7F0000001000, 4096), (0x7F0000100000, 1 << 20)]
    for k in range(4):
        run(cache, k, bufs)
    moved = [bufs[0], (0x7F0000200000, 1 << 20)]
    assert fingerprint(moved) != fingerprint(bufs)
    assert run(cache, 2, moved) is True  # recaptured against the new addresses
    s = cache.stats
    assert s.drops == 1 and s.captures == 5 and cache.keys() == [2]
    assert len(backend.live) == 1


def test_fingerprint_of_tensors_uses_address_and_size():
    torch = pytest.importorskip("torch")
    a = torch.randn(64)
    assert fingerprint([a]) == fingerprint([(a.data_ptr(), 256)])
    assert fingerprint([a[:32]]) != fingerprint([a])


def test_failed_capture_runs_eager_and_leaks_nothing():
    cache, backend = make(fail_at={3})
    run(cache, 1)
    run(cache, 2)
    before = cache.keys()
    STATIC_IN[0] = 5
    assert cache.run(9, Step(9)) is False
    assert STATIC_OUT[0] == 5 * 7919 + 9
    assert cache.keys() == before and len(backend.live) == 2
    assert cache.stats.fallbacks == 1
    made = backend.made
    assert run(cache, 9) is False and backend.made == made  # the key is not captured again
    assert run(cache, 4) is True


def test_failed_capture_off_mode_turns_graphs_off():
    cache, backend = make(fail_at={2}, on_fail="off")
    run(cache, 1)
    assert run(cache, 2) is False
    assert not cache.enabled and len(cache) == 0 and backend.live == []
    assert run(cache, 1) is False


class FakeWorld:
    """An AND across threads standing in for ranks (barrier, then the minimum of the verdicts)."""

    def __init__(self, n):
        self.n = n
        self.barrier = threading.Barrier(n)
        self.votes = [1] * n
        self.calls = [0] * n

    def agree_for(self, rank):
        def agree(verdict):
            self.calls[rank] += 1
            self.votes[rank] = verdict
            self.barrier.wait()
            result = min(self.votes)
            self.barrier.wait()
            return result

        return agree


def test_ranks_agree_on_floor_and_failures():
    world = FakeWorld(2)
    keys = [1, 2, 3, 1, 4, 5, 2, 6, 7, 8, 3, 9]
    results: dict[int, tuple] = {}

    def rank_main(rank):
        step_no = [0]
        # rank 1 is below its floor at the 8th step; rank 0's capture of its 6th graph fails
        backend = FakeBackend(fail_at={6} if rank == 0 else set())
        cache = GraphCache(
            GraphSettings(max_graphs=4, min_keep=1),
            backend=backend,
            room=lambda: not (rank == 1 and step_no[0] == 8),
            agree=world.agree_for(rank),
        )
        graphed = []
        static = ([0], [0])  # each rank has its own static buffers
        for k in keys:
            step_no[0] += 1
            graphed.append(run(cache, k, static=static))
        results[rank] = (graphed, cache.keys(), cache.stats, len(backend.live))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    g0, k0, s0, live0 = results[0]
    g1, k1, s1, live1 = results[1]
    assert g0 == g1 and k0 == k1
    assert s0 == s1
    assert s0.fallbacks == 1 and s0.floor_hits == 1 and live0 == live1 == len(k0)
    assert world.calls[0] == world.calls[1]


def test_settings_digest_covers_buckets_and_is_compared():
    a = GraphSettings(buckets=(("rows", (1, 2, 4)),))
    b = GraphSettings(buckets=(("rows", (1, 2, 8)),))
    assert a.digest() != b.digest() and a.digest() == GraphSettings(buckets=(("rows", (1, 2, 4)),)).digest()
    check_same_settings(a, gather=lambda d: [d, a.digest()])
    with pytest.raises(GraphSettingsError, match="differ between ranks"):
        check_same_settings(a, gather=lambda d: [d, b.digest()])


@pytest.mark.gpu
def test_cuda_replay_equals_eager_bit_for_bit():
    import torch

    torch.manual_seed(0)
    dev = "cuda"
    w = torch.randn(512, 512, device=dev, dtype=torch.float16)
    x = torch.randn(8, 512, device=dev, dtype=torch.float16)
    out = torch.empty(8, 512, device=dev, dtype=torch.float16)

    def step():
        h = torch.nn.functional.silu(x @ w)
        out.copy_(torch.softmax(h.float(), dim=-1).half() + h)

    cache = GraphCache(GraphSettings(max_graphs=4, min_keep=1))
    expected = []
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        step()
        expected.append((x.clone(), out.clone()))
    for i, (xi, want) in enumerate(expected):
        x.copy_(xi)
        assert cache.run(8, step, [x, w, out]) is True
        torch.cuda.synchronize()
        assert torch.equal(out, want), f"replay {i} differs from eager"
    assert cache.stats.captures == 1 and cache.stats.hits == 2
    cache.clear()
