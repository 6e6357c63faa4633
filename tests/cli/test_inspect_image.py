"""`tfc inspect` on a prepared image: key, world and bytes by kind from the manifests, equal to the plan."""

from __future__ import annotations

import json

from click.testing import CliRunner
from tfc.compiler.prepare import prepare
from tfc.packs.pack import open_pack

from tfc.cli import cli
from tfc.cli.plan_cmd import plan_report


def test_inspect_image_matches_the_plan(tiny_pack, tmp_path):
    pack = open_pack(tiny_pack)
    result = prepare(pack, tmp_path / "store", 2, jobs=2)
    run = CliRunner().invoke(cli, ["inspect", str(result.path), "--json"])
    assert run.exit_code == 0, run.output
    s = json.loads(run.output)
    assert s["world"] == 2 and s["ranks_present"] == [0, 1] and s["world_key"] == result.world_key
    report = plan_report(pack, 2)
    for got, want in zip(s["ranks"], report["ranks"], strict=True):
        kinds = {}
        for layer in [*want["layers"], {"bytes": want["top"]}]:
            for k, v in layer["bytes"].items():
                kinds[k] = kinds.get(k, 0) + v
        assert got["bytes_by_kind"] == {k: v for k, v in kinds.items() if v}
        assert got["engram_tables"] is True
    text = CliRunner().invoke(cli, ["inspect", str(result.path / "rank1")])
    assert text.exit_code == 0 and "ranks present [1]" in text.output
