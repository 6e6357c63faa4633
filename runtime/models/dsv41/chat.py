"""The DeepSeek-V4.1 chat format for the engine: messages or one prompt rendered to ids (thinking off)."""

from __future__ import annotations

from typing import Any

from tfc.runtime.engine.request import PromptError

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

    def render(self, messages: list[dict]) -> list[int]:
        """The ids of a conversation rendered for the model to answer (chat mode)."""
        return self.tokenizer.encode(render_chat(messages), add_special_tokens=False).ids


SYSTEM, EOS = "<｜System｜>", "<｜end▁of▁sentence｜>"


class ChatError(PromptError):
    """Messages the DeepSeek-V4.1 chat format cannot render."""


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ChatError(f"{where}.content[{k}]: only text parts are supported", f"{where}.content")
        parts.append(part["text"])
    return "".join(parts)


def render_chat(messages: list[dict]) -> str:
    """Plain system / user / assistant turns in chat mode (thinking off), as spec/deepseek_v41.md section 11 says.

    A system turn opens with <｜System｜>; a user turn with <｜User｜>; after a user turn (or a system turn
    after the first message) that an assistant turn or the end follows comes <｜Assistant｜></think>;
    a historical assistant turn is its content and EOS.
    """
    out = [BOS]
    for i, m in enumerate(messages):
        role, where = m.get("role"), f"messages[{i}]"
        text = _text(m.get("content"), where)
        if role == "system":
            out.append(SYSTEM + text)
        elif role == "user":
            out.append(USER + text)
        elif role == "assistant":
            out.append(text + EOS)
        else:
            raise ChatError(f"{where}.role: {role!r} is not a role this chat format renders", f"{where}.role")
        nxt = messages[i + 1].get("role") if i + 1 < len(messages) else None
        if (role == "user" or (role == "system" and i > 0)) and nxt in (None, "assistant"):
            out.append(ASSISTANT + THINK_END)
    if messages[-1].get("role") == "assistant":
        raise ChatError(
            "the last message is an assistant turn; end with a user turn", f"messages[{len(messages) - 1}]"
        )
    return "".join(out)
