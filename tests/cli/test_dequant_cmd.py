"""`tfc dequant` on the tiny pack: the written weight against a float64 decode, and a clear unknown-group error."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest


def _fp64_weight(trellis, suh, svh, codebook):
    from tfc.kernels.exl3 import reference as ref

    what = ref.decode_rotated(trellis, codebook).astype(np.float64)
    h = np.ones((1, 1))
    for _ in range(7):
        h = np.kron(h, np.array([[1.0, 1.0], [1.0, -1.0]]))
    k, n = what.shape
    hk = np.kron(np.eye(k // 128), h) / np.sqrt(128.0)
    hn = np.kron(np.eye(n // 128), h) / np.sqrt(128.0)
    return suh.astype(np.float64)[:, None] * (hk @ what @ hn) * svh.astype(np.float64)[None, :]


def _tfc(*args):
    return subprocess.run([sys.executable, "-m", "tfc", *args], capture_output=True, text=True, check=False)


@pytest.mark.parametrize("group", ["head", "layers.0.attn.wq_a", "layers.1.ffn.experts.3.w2"])
def test_dequant_writes_dense_weight(tiny_pack, tmp_path, group):
    from tfc.kernels.exl3.codebook import codebook_id
    from tfc.packs.pack import open_pack, read_tensor

    g = open_pack(tiny_pack).groups[group]
    out = tmp_path / "w.npy"
    proc = _tfc("dequant", str(tiny_pack), group, "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["shape"] == [g.k, g.n]
    w = np.load(out)
    assert w.dtype == np.float32 and w.shape == (g.k, g.n)
    want = _fp64_weight(
        read_tensor(g.trellis), read_tensor(g.suh), read_tensor(g.svh), codebook_id(g.codebook)
    )
    assert np.abs(w - want).max() <= 1e-6 * np.abs(want).max()


def test_dequant_rotated_is_the_decoded_tiles(tiny_pack, tmp_path):
    from tfc.kernels.exl3 import reference as ref
    from tfc.kernels.exl3.codebook import codebook_id
    from tfc.packs.pack import open_pack, read_tensor

    g = open_pack(tiny_pack).groups["head"]
    out = tmp_path / "what.npy"
    assert _tfc("dequant", str(tiny_pack), "head", "-o", str(out), "--rotated").returncode == 0
    want = ref.decode_rotated(read_tensor(g.trellis), codebook_id(g.codebook)).astype(np.float32)
    np.testing.assert_array_equal(np.load(out), want)


def test_unknown_group_is_one_line_with_suggestions(tiny_pack, tmp_path):
    proc = _tfc("dequant", str(tiny_pack), "layers.0.attn.wq_c", "-o", str(tmp_path / "x.npy"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no EXL3 group named 'layers.0.attn.wq_c'" in lines[0]
    assert "layers.0.attn.wq_a" in lines[0]
    assert not (tmp_path / "x.npy").exists()


@pytest.mark.slow
def test_every_group_dequantises_to_the_forwards_weight(tiny_pack, tiny_image, tmp_path):
    """One EXL3 decode: what `tfc dequant` writes is, bit for bit, the weight the reference forward runs (every
    group through the decode the command streams; a few through the command itself)."""
    from click.testing import CliRunner
    from tfc.kernels.exl3 import reference as ref
    from tfc.kernels.exl3.codebook import codebook_id
    from tfc.packs.pack import open_pack, read_tensor
    from tfc.runtime.models.dsv41.reference.weights import open_dense

    from tfc.cli import cli

    _, weights, opened = open_dense(tiny_image)
    groups = open_pack(tiny_pack).groups
    assert len(groups) > 200
    for name, g in groups.items():
        trellis, suh, svh = read_tensor(g.trellis), read_tensor(g.suh), read_tensor(g.svh)
        streamed = np.concatenate(
            [b for _, b in ref.iter_dequant(trellis, suh, svh, codebook_id(g.codebook))]
        )
        np.testing.assert_array_equal(streamed, weights[name].numpy(), err_msg=name)
    out = tmp_path / "w.npy"
    for name in ("head", "layers.0.attn.wq_a", "layers.1.ffn.experts.3.w2", "layers.1.ffn.shared_experts.w1"):
        result = CliRunner().invoke(cli, ["dequant", str(tiny_pack), name, "-o", str(out)])
        assert result.exit_code == 0, result.output
        np.testing.assert_array_equal(np.load(out), weights[name].numpy(), err_msg=name)
    opened.close()
