"""vLLM's /tokenize and /detokenize: a prompt or a conversation to the ids the model sees, ids back to text."""

from __future__ import annotations

import dataclasses

from tfc.runtime.server import chat as chats
from tfc.runtime.server.admission import BadRequest
from tfc.runtime.server.protocol import ChatRendering, DetokenizeRequest, TokenizeRequest
from tfc.runtime.server.state import ServerState

# fields that shape a rendered conversation: a `prompt` has none of them
CHAT_ONLY = ("add_generation_prompt", "continue_final_message", *ChatRendering.model_fields)


def tokenize(state: ServerState, body: TokenizeRequest, context: int) -> dict:
    """{count, max_model_len, tokens, token_strs} of a /tokenize body (a 400 naming the field it cannot take)."""
    _served(state, body.model)
    if (body.prompt is None) == (body.messages is None):
        raise BadRequest("give exactly one of `prompt` and `messages`", "prompt")
    given = body.model_fields_set
    if body.messages is None:
        wrong = next((name for name in CHAT_ONLY if name in given), None)
        if wrong is not None:
            raise BadRequest(f"`{wrong}` applies to `messages` only, not to a `prompt`", wrong)
        ids = _prompt_ids(state, body.prompt, body.add_special_tokens is not False)
    else:
        if body.continue_final_message and body.add_generation_prompt and "add_generation_prompt" in given:
            raise BadRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to true",
                             "continue_final_message")  # fmt: skip
        options = dataclasses.replace(
            chats.options(body),
            add_generation_prompt=body.add_generation_prompt and not body.continue_final_message,
            continue_final_message=body.continue_final_message,
        )
        ids = state.chat.render(chats.messages(body), options)
        if body.add_special_tokens:  # what a plain prompt gets in front, on top of the rendering's own
            ids = state.chat.encode("", chat=False) + list(ids)
    strs = [state.tokenizer.id_to_token(t) for t in ids] if body.return_token_strs else None
    return {"count": len(ids), "max_model_len": context, "tokens": list(ids), "token_strs": strs}


def _prompt_ids(state: ServerState, prompt: str, special: bool) -> list[int]:
    """A plain prompt's ids: with the special tokens the chat format puts in front (BOS), or the text's alone."""
    if special:
        return list(state.chat.encode(prompt, chat=False))
    return state.tokenizer.encode(prompt, add_special_tokens=False).ids


def detokenize(state: ServerState, body: DetokenizeRequest) -> dict:
    """{prompt} of a /detokenize body: the ids' text, special tokens spelled out."""
    _served(state, body.model)
    vocab = state.engine.info.vocab_size
    if any(t >= vocab for t in body.tokens):
        raise BadRequest(f"token ids must lie in [0, {vocab})", "tokens")
    return {"prompt": state.tokenizer.decode(body.tokens, skip_special_tokens=False)}


def _served(state: ServerState, model: str | None) -> None:
    """A 404 for a model name other than the served one, as the generation routes answer."""
    if model is not None and model != state.model_name:
        raise BadRequest(f"The model `{model}` does not exist.", "model", 404, "model_not_found")
