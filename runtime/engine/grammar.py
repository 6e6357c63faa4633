"""Grammar constraints with llguidance: a Lark grammar compiled against the served tokenizer, one matcher per request.

The tokenizer side (llguidance's token trie) is built once per tokenizer; each request compiles its grammar
into a matcher. The next token's mask is computed on a small thread pool (llguidance drops the GIL), so it
overlaps the model step that runs meanwhile; `allowed()` only waits for it.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from tfc.errors import TfcError

_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tfc-grammar")


class GrammarError(TfcError):
    """A grammar (a JSON schema, a tool's parameters) the constraint library cannot compile."""


class Grammars:
    """Compiles Lark grammars (with embedded `%json` schemas) against one tokenizer."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> None:
        self.tokenizer, self.vocab_size, self.eos_ids = tokenizer, vocab_size, eos_ids
        self._ll: Any = None
        self._lock = threading.Lock()

    def _lltok(self) -> Any:
        import llguidance

        with self._lock:
            if self._ll is None:
                self._ll = llguidance.LLTokenizer(
                    _added_special(self.tokenizer), eos_token=list(self.eos_ids)
                )
            return self._ll

    def compile(self, lark: str) -> GrammarConstraint:
        """A fresh constraint for one request; GrammarError with the library's reason when it does not compile."""
        import llguidance

        tok = self._lltok()
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        problem = llguidance.LLMatcher.validate_grammar(grammar, tok)
        if problem and not problem.startswith("WARNING"):
            raise GrammarError(problem.splitlines()[0])
        matcher = llguidance.LLMatcher(tok, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error().splitlines()[0])
        return GrammarConstraint(matcher, self.vocab_size)


def _added_special(tokenizer: Any) -> str:
    """The tokenizer.json with every added token marked special, so a grammar's free text never spells one.

    A vocabulary may mark markup tokens (DeepSeek's `</think>`, `｜DSML｜`) as not special; a grammar must
    still reach them only where it names them by id.
    """
    data = json.loads(tokenizer.to_str())
    for token in data.get("added_tokens", []):
        token["special"] = True
    return json.dumps(data, ensure_ascii=False)


class GrammarConstraint:
    """One request's grammar state: the next mask (computed ahead, off the engine thread) and each pick."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self.matcher, self.vocab_size = matcher, vocab_size
        self._next: Future | None = None
        self.failed: str | None = None

    def copy(self) -> GrammarConstraint:
        """A constraint in this one's state with its own matcher (for another choice of the request)."""
        return GrammarConstraint(self.matcher.deep_copy(), self.vocab_size)

    def start(self) -> None:
        if self._next is None:
            self._next = _POOL.submit(self.matcher.compute_bitmask)

    def allowed(self) -> torch.Tensor | None:
        self.start()
        bits = self._next.result()
        self._next = None
        if self.matcher.is_error():
            self.failed = self.failed or self.matcher.get_error()
            return None
        flags = np.unpackbits(np.frombuffer(bits, dtype=np.uint8), bitorder="little")[: self.vocab_size]
        if (
            flags.size < self.vocab_size
        ):  # a model vocabulary wider than the tokenizer's: the rest is never allowed
            flags = np.concatenate([flags, np.zeros(self.vocab_size - flags.size, dtype=np.uint8)])
        return torch.from_numpy(flags.view(np.bool_))

    def advance(self, token: int) -> None:
        if self._next is not None:  # a mask computed for a step whose pick came from elsewhere
            self._next.result()
            self._next = None
        if not self.matcher.is_error() and not self.matcher.consume_token(token):
            self.failed = self.failed or self.matcher.get_error()
