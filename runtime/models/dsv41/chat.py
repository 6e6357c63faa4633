"""The DeepSeek-V4.1 chat format for the engine: a prompt as one user turn (thinking off), or as plain text."""

from __future__ import annotations

from typing import Any

# spec/deepseek_v41.md section 11, chat mode (thinking off), one user turn: BOS, User, Assistant, </think>.
BOS, USER, ASSISTANT, THINK_END = "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "</think>"


def chat_text(prompt: str) -> str:
    """The prompt as one user turn, rendered with the V4.1 chat template in chat (non-thinking) mode."""
    return f"{BOS}{USER}{prompt}{ASSISTANT}{THINK_END}"


class Dsv41ChatFormat:
    """Renders prompts to the ids the model sees, with the image's tokenizer."""

    def __init__(self, tokenizer: Any, bos_id: int | None) -> None:
        self.tokenizer = tokenizer
        self.bos_id = bos_id

    def encode(self, prompt: str, chat: bool) -> list[int]:
        """Prompt ids: the chat rendering (special tokens matched), or BOS + the plain text."""
        if chat:
            return self.tokenizer.encode(chat_text(prompt), add_special_tokens=False).ids
        ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        return ([self.bos_id] if self.bos_id is not None else []) + ids
