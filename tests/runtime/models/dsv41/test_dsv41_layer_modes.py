"""Layer modes are derived once (packs), recorded by `tfc prepare` in the image, and only read by the runtime."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import pytest
from click.testing import CliRunner
from tfc.cache.key import image_key
from tfc.cache.writer import ImageWriter
from tfc.compiler.prepare import image_meta
from tfc.fixtures.layer_modes import layer_mode_records
from tfc.fixtures.tiny import tiny_config
from tfc.packs.deepseek_v41_config import config_from_dict as pack_config
from tfc.packs.deepseek_v41_config import load_config
from tfc.packs.pack import open_pack
from tfc.runtime.models.dsv41.config import LayerModeError
from tfc.runtime.models.dsv41.config import config_from_dict as runtime_config
from tfc.runtime.models.dsv41.reference.weights import load_dense_weights

from tfc.cli import cli, main


def _prepare(pack, store):
    result = CliRunner().invoke(cli, ["prepare", str(pack), "-o", str(store)])
    assert result.exit_code == 0, result.output
    return next(p for p in store.iterdir() if p.is_dir() and not p.name.startswith("."))


@pytest.fixture(scope="module")
def tiny_image(tiny_pack, tmp_path_factory):
    """The tiny pack's prepared TP=1 image (no Engram tables) and its manifest's meta."""
    image = _prepare(tiny_pack, tmp_path_factory.mktemp("modes"))
    meta = json.loads((image / "rank0" / "manifest.json").read_text())["meta"]
    return image, meta


def test_tiny_image_carries_the_packs_layer_modes(tiny_pack, tiny_image):
    image, meta = tiny_image
    packs = load_config(tiny_pack / "config.json")
    assert meta["layer_modes"] == packs.layer_mode_records()
    assert [r["layer"] for r in meta["layer_modes"]] == list(range(packs.num_hidden_layers))
    cfg, _ = load_dense_weights(image)
    assert [asdict(m) for m in cfg.modes] == [asdict(packs.layer_mode(i)) for i in range(8)]
    assert {m.mode for m in cfg.modes} == {"swa", "full", "reindex", "reuse"}


def test_flash_image_meta_records_the_packs_layer_modes(flash_headers_pack):
    pack = open_pack(flash_headers_pack)
    meta = json.loads(json.dumps(image_meta(pack)))  # as the manifest stores it
    assert meta["layer_modes"] == pack.config.layer_mode_records() and len(meta["layer_modes"]) == 40
    cfg = runtime_config(meta["pack_config"], meta["layer_modes"])
    assert [asdict(m) for m in cfg.modes] == [asdict(pack.config.layer_mode(i)) for i in range(40)]
    # spec deepseek_v41.md section 2: layer 20 is the candidate source, reindex layers 24/28/32/36 use it
    assert [m.layer for m in cfg.modes if m.is_candidate_source] == [20]
    assert [m.layer for m in cfg.modes if m.uses_candidates] == [24, 28, 32, 36]


# Candidate source 2 (ratio 2); reindex 3 scores KV source 2; full 4 owns its KV; reindex 6 scores KV source 4.
LATE_KV = {"candidate_source_layer_id": 2, "index_source_layer_ids": [2, 3, 4, 6]}


def test_only_reindex_layers_on_the_candidate_source_kv_use_its_candidates():
    """Spec deepseek_v41.md section 2 (table: "uses candidates" on reindex rows only) and section 8 ("reindex
    layers score the source's keys with their own query (restricted to layer 20's candidates)"): candidates
    are blocks of the candidate source's compressed entries, so only a reindex layer whose KV source is the
    candidate source can use them. The runtime's old rule (`is_index_source and cand < layer`) also marked
    full layer 4 and reindex layer 6, packs' old rule (`reindex and layer > cand`) layer 6: both forwards
    then fail on the mask's shape. On the tiny fixture and on Flash all three rules agree."""
    raw = tiny_config()
    raw["text_config"].update(LATE_KV)
    packs = pack_config(raw)
    records = packs.layer_mode_records()
    assert [(r["layer"], r["mode"]) for r in records if r["uses_candidates"]] == [(3, "reindex")]
    assert (records[4]["mode"], records[6]["mode"]) == ("full", "reindex")
    cfg = runtime_config(json.loads(json.dumps(asdict(packs))), records)
    assert [m.layer for m in cfg.modes if m.uses_candidates] == [3]
    for old in (4, 6):  # what the old derivations recorded
        damaged = [dict(r, uses_candidates=r["uses_candidates"] or r["layer"] == old) for r in records]
        with pytest.raises(LayerModeError, match=f"record {old}: uses candidates"):
            runtime_config(asdict(packs), damaged)


def test_the_forward_runs_a_candidate_source_before_a_later_kv_source():
    import torch
    from support.dsv41_random import random_weights, tiny_config_dict
    from tfc.runtime.models.dsv41.reference.forward import Dsv41Model

    raw = tiny_config_dict()
    raw["text_config"].update(LATE_KV)
    cfg = runtime_config(raw, layer_mode_records(raw))
    model = Dsv41Model(cfg, random_weights(cfg, seed=1), engram=False)
    out = model.forward([list(range(3, 23))], [model.new_state()])[0]  # 10 ratio-2 groups: 5 blocks of 2
    assert out.shape == (20, cfg.vocab_size) and bool(torch.isfinite(out).all())


def test_no_candidate_source_means_no_layer_uses_candidates():
    """The spec (section 1.3) gives candidate_source_layer_id no default; packs reads null/absent as none,
    where the runtime's old derivation silently took the last KV source."""
    for absent in (True, False):
        raw = tiny_config()
        if absent:
            del raw["text_config"]["candidate_source_layer_id"]
        else:
            raw["text_config"]["candidate_source_layer_id"] = None
        packs = pack_config(raw)
        cfg = runtime_config(asdict(packs), packs.layer_mode_records())
        assert cfg.candidate_source_layer_id is None
        assert not any(m.uses_candidates or m.is_candidate_source for m in cfg.modes)


def test_random_weight_configs_take_their_modes_from_packs():
    from support.dsv41_random import tiny_config_dict

    raw = tiny_config_dict()
    cfg = runtime_config(raw, layer_mode_records(raw))
    got = [(m.mode, m.compress_ratio, m.kv_source, m.index_source, m.uses_candidates) for m in cfg.modes]
    assert got == [
        ("swa", 0, None, None, False),
        ("swa", 0, None, None, False),
        ("full", 2, 2, 2, False),
        ("reuse", 2, 2, 2, False),
        ("full", 1, 4, 4, False),
        ("reuse", 1, 4, 4, False),
        ("reindex", 1, 4, 6, True),
        ("reuse", 1, 4, 6, False),
    ]


def _damaged(meta, records):
    """`meta` with its layer mode records replaced (None: removed), as an older or damaged image holds."""
    meta = json.loads(json.dumps(meta))
    if records is None:
        del meta["layer_modes"]
    else:
        meta["layer_modes"] = records(meta["layer_modes"])
    return meta


DAMAGE = {
    "missing": (None, "no layer mode records (meta.layer_modes)"),
    "not a list": (lambda r: {"0": r[0]}, "must list 8 layer mode records"),
    "one short": (lambda r: r[:-1], "must list 8 layer mode records, one per backbone layer; got 7"),
    "extra key": (lambda r: [*r[:3], dict(r[3], extra=1), *r[4:]], "record 3 is not an object"),
    "bool as int": (lambda r: [dict(r[0], layer=False), *r[1:]], "record 0: layer = False is not int"),
    "unknown mode": (lambda r: [*r[:5], dict(r[5], mode="dense"), *r[6:]], "record 5: mode 'dense'"),
    "swapped": (lambda r: [r[1], r[0], *r[2:]], "record 0: is for layer 1"),
    "bad source": (lambda r: [*r[:3], dict(r[3], kv_source=5), *r[4:]], "record 3: KV source 5"),
    "reuse as reindex": (lambda r: [*r[:7], dict(r[7], mode="reindex"), *r[8:]], "record 7: a reindex layer"),
}


def _publish(root, meta):
    """A one-segment DeepSeek-V4.1 TP=1 image (the tiny model's final norm) whose manifest carries `meta`."""
    inputs = {"family": "deepseek_v41", "world": 1}
    world_key = image_key(inputs)
    with ImageWriter(root, world_key, 0) as writer:
        slot = writer.add_segment("norm.weight", "float32", (256,), "native.v1", 1024)
        writer.write(slot, 0, b"\0" * 1024)
        return writer.publish(
            {
                "family": "deepseek_v41",
                "key": image_key({"world_key": world_key, "rank": 0}),
                "key_inputs": inputs,
                "world": 1,
                "plan": {},
                "meta": meta,
            }
        )


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_images_with_missing_or_damaged_mode_records_are_refused_in_one_line(tiny_image, tmp_path, damage):
    records, words = DAMAGE[damage]
    image = _publish(tmp_path / "store", _damaged(tiny_image[1], records))
    with pytest.raises(LayerModeError) as refused:
        load_dense_weights(image)
    message = str(refused.value)
    assert words in message and message.startswith(str(image)), message
    assert "\n" not in message and message.endswith("re-run `tfc prepare` to rebuild it"), message


def test_generate_refuses_an_image_without_mode_records_in_one_line(
    tiny_image, tmp_path, capsys, monkeypatch
):
    image = _publish(tmp_path / "store", _damaged(tiny_image[1], None))
    monkeypatch.setattr(sys, "argv", ["tfc", "generate", str(image), "--prompt", "hi"])
    with pytest.raises(SystemExit) as done:
        main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(lines) == 1, lines
    assert "no layer mode records" in lines[0] and "re-run `tfc prepare`" in lines[0], lines[0]
