"""FedTokens: a restored prefix (kept, not copied) and the ids fed after it read as one list would read."""

from __future__ import annotations

import pytest
from tfc.runtime.models.dsv41.fast.fed_tokens import FedTokens


def _pair(prefix, more):
    fed, want = FedTokens(tuple(prefix)), list(prefix)
    for t in more:
        fed.append(t)
        want.append(t)
    return fed, want


@pytest.mark.parametrize(("prefix", "more"), [((), (4, 5, 6)), ((1, 2, 3), ()), ((1, 2, 3), (4, 5, 6, 7))])
def test_it_reads_as_the_list_of_every_id(prefix, more):
    fed, want = _pair(prefix, more)
    assert len(fed) == len(want) and list(fed) == want and tuple(fed) == tuple(want)
    for i in range(-len(want), len(want)):
        assert fed[i] == want[i]
    for a in range(-8, 9):
        for b in (*range(-8, 9), None):
            assert fed[a:b] == want[a:b], (a, b)
    assert fed[::2] == want[::2] and fed[::-1] == want[::-1]
    with pytest.raises(IndexError):
        fed[len(want)]


@pytest.mark.parametrize("keep", [0, 1, 3, 5, 9])
def test_truncate_keeps_the_first_ids_and_appends_after_them(keep):
    fed, want = _pair((1, 2, 3), (4, 5, 6, 7))
    fed.truncate(keep)
    del want[keep:]
    assert list(fed) == want
    fed.append(99)
    want.append(99)
    assert list(fed) == want and fed[-2:] == want[-2:]


def test_the_prefix_is_kept_not_copied():
    prefix = tuple(range(1000))
    fed = FedTokens(prefix)
    fed.append(7)
    assert fed._prefix is prefix and len(fed) == 1001
