"""`tfc generate` on the tiny image: tokens equal the reference forward's, seeds repeat, bad input is one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from tokenizers import Tokenizer

from tfc.cli import cli, main

PROMPT = "The model reads the prompt"


def _prepare(pack: Path, store: Path, *extra: str) -> Path:
    result = CliRunner().invoke(cli, ["prepare", str(pack), "-o", str(store), "--json", *extra])
    assert result.exit_code == 0, result.output
    return next(p for p in store.iterdir() if p.is_dir() and not p.name.startswith("."))


@pytest.fixture(scope="module")
def images(tiny_pack, tmp_path_factory):
    """The tiny image with Engram tables, and one prepared without them."""
    root = tmp_path_factory.mktemp("gen")
    bare = root / "bare-pack"  # the pack without its Engram table files, as EXL3 packs ship
    bare.mkdir()
    for f in tiny_pack.iterdir():
        if not f.name.startswith("engram-") and f.name != "model.safetensors.index.json":
            (bare / f.name).symlink_to(f)
    index = json.loads((tiny_pack / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not v.startswith("engram-")}
    (bare / "model.safetensors.index.json").write_text(json.dumps(index))
    return {
        "engram": _prepare(tiny_pack, root / "a", "--engram-dir", str(tiny_pack)),
        "bare": _prepare(bare, root / "b"),
    }


@pytest.fixture(scope="module")
def dense(images):
    """The engram image's config, weights (decoded once) and Engram feed, for in-process references."""
    from tfc.runtime.models.dsv41.reference.weights import engram_feed, load_dense_weights

    cfg, weights = load_dense_weights(images["engram"])
    return cfg, weights, engram_feed(weights, cfg.engram_layer_ids, cfg.engram_head_dim)


def _generate(image: Path, tokenizer: Path, *extra: str) -> dict:
    args = ["generate", str(image), "--prompt", PROMPT, "--tokenizer", str(tokenizer), "--json", *extra]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


def _main(capsys, monkeypatch, *args: str) -> tuple[int, str]:
    """Run the real entry point (typed errors -> one line, exit 2) in-process; (exit code, stderr)."""
    monkeypatch.setattr(sys, "argv", ["tfc", *args])
    with pytest.raises(SystemExit) as done:
        main()
    return done.value.code, capsys.readouterr().err


@pytest.mark.slow
def test_generate_greedy_equals_the_reference_forward(images, tiny_pack, dense):
    from tfc.runtime.engine.generate import generate
    from tfc.runtime.models.dsv41.reference.forward import Dsv41Model
    from tfc.runtime.models.dsv41.reference.runner import ReferenceRunner

    cfg, weights, feed = dense
    tok = Tokenizer.from_file(str(tiny_pack / "tokenizer.json"))
    got = _generate(images["engram"], tiny_pack / "tokenizer.json", "--max-tokens", "6")
    prompt = [cfg.bos_token_id, *tok.encode(PROMPT, add_special_tokens=False).ids]
    want = generate(
        ReferenceRunner(Dsv41Model(cfg, weights), feed), [prompt], 6, stop_ids=[cfg.eos_token_id]
    )[0]
    assert got["prompt_tokens"] == prompt
    assert got["tokens"] == want.tokens and got["finish"] == want.finish
    # the same image without Engram is a different model
    plain = generate(
        ReferenceRunner(Dsv41Model(cfg, weights, engram=False)), [prompt], 6, stop_ids=[cfg.eos_token_id]
    )[0]
    assert plain.tokens != want.tokens


@pytest.mark.slow
def test_same_seed_same_sampled_tokens_and_chat_encoding(images, tiny_pack, dense):
    from tfc.runtime.engine.generate import generate
    from tfc.runtime.engine.sampling import SamplingParams
    from tfc.runtime.models.dsv41.reference.forward import Dsv41Model
    from tfc.runtime.models.dsv41.reference.runner import ReferenceRunner

    cfg, weights, feed = dense
    tok = tiny_pack / "tokenizer.json"
    args = (
        "--max-tokens",
        "5",
        "--temperature",
        "1.5",
        "--top-p",
        "0.9",
        "--top-k",
        "40",
        "--seed",
        "11",
        "--chat",
    )
    first, again = _generate(images["engram"], tok, *args), _generate(images["engram"], tok, *args)
    assert first["tokens"] == again["tokens"]
    t = Tokenizer.from_file(str(tok))
    user, assistant, think_end = (t.token_to_id(s) for s in ("<｜User｜>", "<｜Assistant｜>", "</think>"))
    ids = first["prompt_tokens"]
    assert ids[:2] == [0, user] and ids[-2:] == [assistant, think_end]
    model, stop = Dsv41Model(cfg, weights), [cfg.eos_token_id]
    p = SamplingParams(temperature=1.5, top_p=0.9, top_k=40, seed=11)
    assert generate(ReferenceRunner(model, feed), [ids], 5, p, stop_ids=stop)[0].tokens == first["tokens"]
    other = SamplingParams(temperature=1.5, top_p=0.9, top_k=40, seed=12)
    assert generate(ReferenceRunner(model, feed), [ids], 5, other, stop_ids=stop)[0].tokens != first["tokens"]


@pytest.mark.slow
def test_no_engram_runs_an_image_without_tables(images, tiny_pack):
    out = _generate(images["bare"], tiny_pack / "tokenizer.json", "--max-tokens", "3", "--no-engram")
    assert len(out["tokens"]) == 3 or out["finish"] == "stop"
    # and says so loudly: the outputs are not the model's
    args = ["generate", str(images["bare"]), "--prompt", PROMPT, "--max-tokens", "1", "--no-engram", "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0 and "WITHOUT their memory tables" in result.stderr


@pytest.mark.slow
def test_generate_reads_the_tokenizer_the_image_carries(images, tiny_pack):
    carried = _generate(images["bare"], tiny_pack / "tokenizer.json", "--max-tokens", "4", "--no-engram")
    args = ["generate", str(images["bare"]), "--prompt", PROMPT, "--json", "--max-tokens", "4", "--no-engram"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["tokens"] == carried["tokens"]


def _one_line_exit_2(result: tuple[int, str], *words: str) -> None:
    code, err = result
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfc: error:"), err
    for w in words:
        assert w in lines[0], lines[0]


def test_bad_input_is_one_clear_line(images, tiny_pack, tmp_path, capsys, monkeypatch):
    from tfc.cache.key import image_key
    from tfc.cache.writer import ImageWriter

    tok = str(tiny_pack / "tokenizer.json")
    inputs = {"family": "llama3", "world": 1}
    wk = image_key(inputs)
    with ImageWriter(tmp_path / "other", wk, 0) as w:
        slot = w.add_segment("x", "float32", (4,), "native.v1", 16)
        w.write(slot, 0, b"\0" * 16)
        foreign = w.publish(
            {"family": "llama3", "key": image_key({"world_key": wk, "rank": 0}), "key_inputs": inputs,
             "world": 1, "plan": {}, "meta": {}}
        )  # fmt: skip
    _one_line_exit_2(
        _main(capsys, monkeypatch, "generate", str(foreign), "--prompt", "hi", "--tokenizer", tok), "llama3"
    )
    _one_line_exit_2(
        _main(
            capsys,
            monkeypatch,
            "generate",
            str(images["engram"]),
            "--prompt",
            "word " * 5000,
            "--tokenizer",
            tok,
        ),
        "context",
    )
    _one_line_exit_2(
        _main(capsys, monkeypatch, "generate", str(images["bare"]), "--prompt", "hi", "--tokenizer", tok),
        "Engram",
        "--no-engram",
    )
    _one_line_exit_2(
        _main(
            capsys, monkeypatch, "generate", str(tmp_path / "nowhere"), "--prompt", "hi", "--tokenizer", tok
        )
    )


def test_generate_warms_up_before_its_clock(images, tiny_pack):
    # the one-row decode step runs (on a GPU: its graph is captured) before the first token's clock, as tfc
    # serve warms up before ready, so decode_tok_s is the steady rate
    run = _generate(images["bare"], tiny_pack / "tokenizer.json", "--max-tokens", "3", "--no-engram")
    assert run["warmup_s"] > 0 and run["decode_s"] >= 0 and len(run["tokens"]) == 3


def test_generate_reports_its_runners_notes(images, tiny_pack):
    # the fast forward says how it runs (here: no GPU, so its kernels' torch references stand in)
    got = _generate(images["engram"], tiny_pack / "tokenizer.json", "--fast", "--device", "cpu", "--max-tokens", "2",
                    "--no-draft")  # fmt: skip
    assert got["runner"] == "fast"
    assert any("torch references" in note for note in got["notes"]), got["notes"]
