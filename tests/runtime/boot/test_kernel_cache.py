"""Triton's cache folder in the store: keyed by architecture and Triton version, never over an operator's choice."""

from __future__ import annotations

from pathlib import Path

from tfc.runtime.boot import kernel_cache as kc


def test_the_folder_is_in_the_store_keyed_by_arch_and_version(tmp_path):
    rank = tmp_path / "store" / "0123456789abcdef" / "rank0"
    want = tmp_path / "store" / ".kernels" / "sm_90-triton-3.6.0"
    assert kc.cache_dir(rank, (9, 0), "3.6.0") == want
    assert kc.cache_dir(rank.parent, (9, 0), "3.6.0") == want  # a world folder names the same store
    assert kc.cache_dir(rank, (10, 0), "3.6.0") != want and kc.cache_dir(rank, (9, 0), "3.7.0") != want


def test_cpu_and_an_operators_folder_are_left_alone(tmp_path, monkeypatch):
    monkeypatch.delenv(kc.ENV, raising=False)
    assert kc.use_store_cache(tmp_path / "s" / "k" / "rank0", "cpu") is None
    monkeypatch.setenv(kc.ENV, "/somewhere")
    assert kc.use_store_cache(tmp_path / "s" / "k" / "rank0", "cuda") is None
    assert Path(kc.os.environ[kc.ENV]) == Path("/somewhere")
