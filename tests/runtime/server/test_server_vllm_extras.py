"""vLLM's extras through the official openai client: /tokenize and /detokenize in vLLM's shape, min_tokens."""

from __future__ import annotations

import openai
import pytest

PROMPT = "The model reads the prompt"
HELLO = [{"role": "user", "content": "Hello"}]
BOS, EOS, SYSTEM, USER, ASSISTANT, THINK, THINK_END, WORD = 0, 1, 633, 634, 635, 636, 637, 404  # tiny's ids


def tokenize(client, body: dict) -> dict:
    return client.post("/tokenize", body={"model": "tiny", **body}, cast_to=object)


def refusal(client, path: str, body: dict) -> tuple[int, dict]:
    with pytest.raises(openai.BadRequestError) as caught:
        client.post(path, body=body, cast_to=object)
    return caught.value.status_code, caught.value.body


def test_tokenize_answers_in_vllms_shape(client):
    out = tokenize(client, {"messages": HELLO})
    assert out == {"count": 5, "max_model_len": 4096, "tokens": [BOS, USER, WORD, ASSISTANT, THINK_END],
                   "token_strs": None}  # fmt: skip
    strs = tokenize(client, {"prompt": PROMPT, "return_token_strs": True})
    assert len(strs["token_strs"]) == strs["count"] == 9
    assert strs["token_strs"][0] == "<｜begin▁of▁sentence｜>"
    text = tokenize(client, {"prompt": PROMPT, "add_special_tokens": False})["tokens"]
    assert text == strs["tokens"][1:]
    back = client.post("/detokenize", body={"model": "tiny", "tokens": text}, cast_to=object)
    assert back == {"prompt": PROMPT}


def test_tokenize_takes_vllms_chat_fields(client):
    bare = tokenize(client, {"messages": HELLO, "add_generation_prompt": False})
    assert bare["tokens"] == [BOS, USER, WORD]
    # vLLM's default for messages is false; true puts the plain prompt's BOS before the rendering's own
    assert tokenize(client, {"messages": HELLO, "add_special_tokens": True})["tokens"][:3] == [BOS, BOS, USER]
    kwargs = {"chat_template_kwargs": {"thinking": True, "reasoning_effort": "high"}}
    thinking = tokenize(client, {"messages": HELLO, **kwargs})["tokens"]
    assert thinking[:2] == [BOS, SYSTEM] and thinking[-2:] == [ASSISTANT, THINK]


def test_continue_final_message_leaves_the_last_turn_open(client):
    answered = [*HELLO, {"role": "assistant", "content": "Hello"}]
    body = {"messages": answered, "continue_final_message": True, "add_generation_prompt": False}
    out = tokenize(client, body)
    assert out["tokens"] == [BOS, USER, WORD, ASSISTANT, THINK_END, WORD]  # no EOS after the answer
    thinking = [*HELLO, {"role": "assistant", "content": "", "reasoning_content": "Hello"}]
    body = {"messages": thinking, "continue_final_message": True, "chat_template_kwargs": {"thinking": True}}
    assert tokenize(client, body)["tokens"][-3:] == [ASSISTANT, THINK, WORD]  # the reasoning goes on
    closed = tokenize(client, {"messages": answered[:1]})["tokens"] + [WORD, EOS]
    assert tokenize(client, {"messages": [*answered, *HELLO]})["tokens"][: len(closed)] == closed


ANSWERED = [*HELLO, {"role": "assistant", "content": "Hi"}]
BOTH = {"messages": ANSWERED, "continue_final_message": True, "add_generation_prompt": True}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (BOTH, "continue_final_message"),
        ({"messages": HELLO, "continue_final_message": True}, "messages[0]"),
        ({"messages": ANSWERED}, "messages[1]"),
        ({"prompt": PROMPT, "add_generation_prompt": False}, "add_generation_prompt"),
        ({"prompt": PROMPT, "tools": []}, "tools"),
        ({"messages": HELLO, "chat_template_kwargs": {"add_bos": True}}, "chat_template_kwargs.add_bos"),
        ({"messages": HELLO, "chat_template": "{{ messages }}"}, "chat_template"),
        ({"prompt": PROMPT, "messages": HELLO}, "prompt"),
    ],
)
def test_tokenize_refuses_what_it_cannot_do_by_name(client, body, param):
    status, error = refusal(client, "/tokenize", body)
    assert status == 400 and error["param"] == param and "\n" not in error["message"]


def test_tokenize_and_detokenize_name_only_the_served_model(client):
    for path, body in (("/tokenize", {"prompt": PROMPT}), ("/detokenize", {"tokens": [WORD]})):
        with pytest.raises(openai.NotFoundError) as caught:
            client.post(path, body={"model": "other", **body}, cast_to=object)
        assert caught.value.body["param"] == "model" and caught.value.body["code"] == "model_not_found"


def _completion(client, **kw):
    return client.completions.create(model="tiny", prompt=PROMPT, temperature=0, **kw)


def test_min_tokens_holds_eos_off_until_it_is_reached(client):
    forced = {"logit_bias": {str(EOS): 100}}
    assert _completion(client, max_tokens=8, **forced).usage.completion_tokens == 1
    r = _completion(client, max_tokens=8, **forced, extra_body={"min_tokens": 5})
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 6  # 5 tokens, then the EOS
    serial = _completion(client, max_tokens=8, **forced, extra_body={"min_tokens": 5, "draft": False})
    assert serial.choices[0].token_sha == r.choices[0].token_sha
    chat = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=8, temperature=0, **forced,
                                          extra_body={"min_tokens": 3})  # fmt: skip
    assert chat.choices[0].finish_reason == "stop" and chat.usage.completion_tokens == 4
    chunks = list(client.chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True},
        **forced, extra_body={"min_tokens": 3}))  # fmt: skip
    assert chunks[-1].usage.completion_tokens == 4


def test_min_tokens_holds_stop_ids_and_stop_strings(client):
    first = _completion(client, max_tokens=12).choices[0].text
    ids = _completion(client, max_tokens=12, extra_body={"stop_token_ids": [211]})  # the first greedy id
    assert ids.usage.completion_tokens == 1
    held = _completion(client, max_tokens=12, extra_body={"stop_token_ids": [211], "min_tokens": 4})
    assert held.usage.completion_tokens > 4
    stop = first[1:3]
    assert _completion(client, max_tokens=12, stop=[stop]).choices[0].text == first[:1]
    text = _completion(client, max_tokens=12, stop=[stop], extra_body={"min_tokens": 5}).choices[0].text
    assert text.startswith(first[:3])  # the stop string inside the first five tokens ended nothing


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"min_tokens": 9}, "min_tokens"), ({"min_tokens": -1}, "min_tokens"), ({"min_token": 2}, "min_token")],
)
def test_min_tokens_is_checked_and_a_misspelling_is_refused_by_name(client, extra, param):
    with pytest.raises(openai.BadRequestError) as caught:
        _completion(client, max_tokens=8, extra_body=extra)
    assert caught.value.body["param"] == param
