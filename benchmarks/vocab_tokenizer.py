"""A tokenizer.json that names every id of a vocabulary ("<0>" .. "<N-1>", words split on whitespace), so a
model's replies always decode to text: for images that carry no tokenizer (the Flash-slice fixture) served
with `tfc serve --tokenizer`, where a small tokenizer would decode most ids to nothing.

    python3 benchmarks/vocab_tokenizer.py OUT.json --vocab 129280
"""

from __future__ import annotations

import argparse


def vocab_tokenizer(vocab: int):
    """The tokenizer (WordLevel over "<i>", unknown words as id 0)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(vocab)}, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, required=True)
    args = ap.parse_args()
    vocab_tokenizer(args.vocab).save(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
