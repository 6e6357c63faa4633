"""Config numbers the runtime uses are range-checked at inspect/plan: one ConfigError line naming the field."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest
from tfc.packs.deepseek_v41_config import config_from_dict, load_config
from tfc.packs.errors import ConfigError


@pytest.fixture(scope="module")
def raw(tiny_pack) -> dict:
    return json.loads((tiny_pack / "config.json").read_text())


def _with(raw: dict, **text) -> dict:
    out = json.loads(json.dumps(raw))
    out["text_config"].update(text)
    return out


def _refused(raw: dict, field: str, **text) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(_with(raw, **text))
    msg = str(info.value)
    assert field in msg and "\n" not in msg, msg
    return msg


def test_tiny_config_accepted(raw):
    c = config_from_dict(raw)
    assert c.rope_theta == 10000 and c.rms_norm_eps > 0


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0, -1, 1e300])
def test_rope_theta(raw, value):
    _refused(raw, "rope_theta", rope_theta=value)
    _refused(raw, "compress_rope_theta", compress_rope_theta=value)


@pytest.mark.parametrize(
    "field, value",
    [
        ("rms_norm_eps", 0.0), ("rms_norm_eps", -1e-6), ("rms_norm_eps", 2.0), ("rms_norm_eps", math.nan),
        ("hc_eps", -1e-6), ("hc_eps", math.inf),
        ("swiglu_limit", -1.0), ("swiglu_limit", math.inf), ("swiglu_limit", 1e30),
        ("routed_scaling_factor", 0.0), ("hc_post_alpha", -2.0), ("engram_gate_clamp", -1.0),
        ("max_position_embeddings", 0), ("max_position_embeddings", -4096), ("max_position_embeddings", 1 << 30),
        ("sliding_window", 0), ("sliding_window", -1), ("sliding_window", 1 << 20),
        ("hc_sinkhorn_iters", 0), ("hc_sinkhorn_iters", 10**6),
        ("index_topk", 1 << 20), ("vocab_size", 1 << 50),
    ],
)  # fmt: skip
def test_out_of_range(raw, field, value):
    _refused(raw, field, **{field: value})


def test_zero_swiglu_limit_turns_it_off(raw):
    assert config_from_dict(_with(raw, swiglu_limit=0)).swiglu_limit == 0


@pytest.mark.parametrize(
    "scaling, field",
    [
        ({"factor": math.nan}, "factor"), ({"factor": 0}, "factor"), ({"beta_fast": -32}, "beta_fast"),
        ({"original_max_position_embeddings": 1 << 22}, "original_max_position_embeddings"),
    ],
)  # fmt: skip
def test_rope_scaling(raw, scaling, field):
    _refused(raw, field, rope_scaling={**raw["text_config"]["rope_scaling"], **scaling})


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_literals_in_the_file(tiny_pack, tmp_path, literal):
    path = tmp_path / "config.json"
    path.write_text(
        (tiny_pack / "config.json").read_text().replace('"rope_theta": 10000', f'"rope_theta": {literal}')
    )
    with pytest.raises(ConfigError, match=r"rope_theta = (-?inf|nan) is not a finite number"):
        load_config(path)


@pytest.mark.parametrize("depth", [33, 980, 100_000])
def test_deep_json_refused(raw, tmp_path, depth):
    path = tmp_path / "config.json"
    text = json.dumps({**raw, "vision_config": "DEEP"}).replace('"DEEP"', "[" * depth + "]" * depth)
    path.write_text(text)
    with pytest.raises(ConfigError, match="nested more than 32 levels deep"):
        load_config(path)


def test_nesting_within_the_bound_accepted(raw):
    nested: list = []
    for _ in range(30):  # with the config's own object and vision_config's list: 32 levels
        nested = [nested]
    config_from_dict({**raw, "vision_config": nested})


@pytest.mark.parametrize("command", [["inspect"], ["plan", "--tp", "1"]])
def test_cli_one_line_exit_2(tiny_pack, tmp_path, command):
    pack = tmp_path / "pack"
    shutil.copytree(tiny_pack, pack)
    cfg = json.loads((pack / "config.json").read_text())
    cfg["text_config"]["rope_theta"] = -1.0
    (pack / "config.json").write_text(json.dumps(cfg))
    r = subprocess.run(
        [sys.executable, "-m", "tfc", command[0], str(pack), *command[1:]],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "rope_theta" in r.stderr, r.stderr
