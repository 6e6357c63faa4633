"""The prompts a bench sends: synthetic random words, or a JSONL / ShareGPT dataset, in a seeded order."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tfc.bench import BenchError

# Common short English words: most BPE tokenizers spend about one token on each (with its leading space).
_WORD_TEXT = """the of and to in is you that it he was for on are as with his they at be this have from or one had by
    word but not what all were we when your can said there use an each which she do how their if will up other
    about out many then them these so some her would make like him into time has look two more write go see
    number no way could people my than first water been call who oil its now find long down day did get come
    made may part over new sound take only little work know place year live me back give most very after thing
    our just name good sentence man think say great where help through much before line right too mean old any
    same tell boy follow came want show also around form three small set put end does another well large must
    big even such because turn here why ask went men read need land different home us move try kind hand
    picture again change off play spell air away animal house point page letter mother answer found study
    still learn should world high every near add food between own below country plant last school father keep
    tree never start city earth eye light thought head under story saw left few while along might close
    something seem next hard open example begin life always those both paper together got group often run"""
WORDS = tuple(_WORD_TEXT.split())


class PromptSource:
    """Hands out prompts in order; a dataset cycles through a seeded shuffle, synthetic prompts never repeat."""

    def __init__(self, seed: int, input_words: int, dataset: list[str] | None = None):
        self._rng = random.Random(seed)
        self._input_words = input_words
        self._dataset = dataset
        self._order: list[int] = []
        self._taken = 0

    def take(self, n: int) -> list[str]:
        """The next `n` prompts (fresh synthetic ones, so a server's prefix cache never sees a repeat)."""
        return [self._next() for _ in range(n)]

    def _next(self) -> str:
        if self._dataset is None:
            return " ".join(self._rng.choices(WORDS, k=self._input_words))
        if self._taken % len(self._dataset) == 0:
            self._order = list(range(len(self._dataset)))
            self._rng.shuffle(self._order)
        prompt = self._dataset[self._order[self._taken % len(self._dataset)]]
        self._taken += 1
        return prompt


def load_dataset(path: Path) -> list[str]:
    """The prompts of a JSONL file (one object with `prompt` a line) or a ShareGPT-style JSON array
    (objects with `conversations`, the first human turn taken; objects with `prompt` are read too)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BenchError(f"{path}: not UTF-8 text") from None
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except ValueError as error:
            raise BenchError(f"{path}: not valid JSON ({error})") from None
        prompts = [_item_prompt(item, f"{path}: item {i}") for i, item in enumerate(items)]
    else:
        prompts = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError as error:
                raise BenchError(f"{path}: line {number} is not JSON ({error})") from None
            prompts.append(_item_prompt(item, f"{path}: line {number}"))
    prompts = [p for p in prompts if p is not None]
    if not prompts:
        raise BenchError(
            f"{path}: no prompts (JSONL with `prompt` fields, or ShareGPT JSON with `conversations`)"
        )
    return prompts


def _item_prompt(item: object, where: str) -> str | None:
    """One item's prompt; None for a ShareGPT conversation with no human turn (skipped, as other benches do)."""
    if isinstance(item, dict) and isinstance(item.get("prompt"), str):
        return item["prompt"]
    if isinstance(item, dict) and isinstance(item.get("conversations"), list):
        for turn in item["conversations"]:
            if (
                isinstance(turn, dict)
                and turn.get("from") in ("human", "user")
                and isinstance(turn.get("value"), str)
            ):
                return turn["value"]
        return None
    raise BenchError(f"{where} has neither a `prompt` string nor a `conversations` list")
