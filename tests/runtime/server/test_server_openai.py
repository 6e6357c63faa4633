"""`tfc serve` through the official openai client: models, chat and completions, JSON and SSE, usage, stops, seeds."""

from __future__ import annotations

import hashlib

import pytest

PROMPT = "The model reads the prompt"
GREEDY = [211, 328, 53, 279, 120, 314, 282, 21, 143, 422, 209, 269, 232, 557, 585, 313]  # tfc generate's pin


def sha(ids: list[int]) -> str:
    return hashlib.sha256(b"".join(int(t).to_bytes(4, "little", signed=True) for t in ids)).hexdigest()


def test_models_lists_the_served_name(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_completion_equals_tfc_generate(client):
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].token_sha == sha(GREEDY) == r.token_sha
    assert r.usage.prompt_tokens == 9 and r.usage.completion_tokens == 16 and r.usage.total_tokens == 25
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_completion_from_token_ids_equals_text(client):
    ids = [0, 297, 315, 522, 363, 331, 265, 317, 518]
    r = client.completions.create(model="tiny", prompt=ids, max_tokens=16, temperature=0)
    assert r.choices[0].token_sha == sha(GREEDY)


def test_chat_json_and_stream_agree(client):
    msgs = [{"role": "user", "content": "Hello"}]
    whole = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.usage.prompt_tokens == 5 and whole.usage.completion_tokens == 8
    chunks = list(client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
    ))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert finals[0].choices[0].token_sha == whole.choices[0].token_sha
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_stream_without_usage_ends_with_a_finish(client):
    chunks = list(
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, stream=True)
    )
    assert chunks[-1].choices[0].finish_reason == "length" and all(c.usage is None for c in chunks)


@pytest.mark.slow
def test_seeds_repeat_and_differ(client):
    kw = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 1.0, "top_p": 0.95}
    a = client.completions.create(seed=5, **kw).token_sha
    assert client.completions.create(seed=5, **kw).token_sha == a
    assert client.completions.create(seed=6, **kw).token_sha != a
    extra = {"top_k": 40, "min_p": 0.01}
    b = client.completions.create(seed=5, extra_body=extra, **kw).token_sha
    assert client.completions.create(seed=5, extra_body=extra, **kw).token_sha == b


@pytest.mark.slow
def test_penalties_and_logit_bias_through_the_client(client):
    kw = {"model": "tiny", "prompt": PROMPT, "max_tokens": 20, "temperature": 0}
    plain = client.completions.create(**kw).choices[0].token_sha
    # the 20-token greedy reply would take an id it already took: each penalty changes it from there
    for extra in (
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"extra_body": {"repetition_penalty": 3.0}},
    ):
        assert client.completions.create(**kw, **extra).choices[0].token_sha != plain, extra
    short = {**kw, "max_tokens": 6}
    biased = client.completions.create(**short, logit_bias={"100": 100})
    assert biased.choices[0].token_sha == sha([100] * 6)  # +100 outweighs every logit of the tiny model
    sampled = {**short, "temperature": 1.0, "seed": 3, "frequency_penalty": 0.7, "presence_penalty": -0.4}
    a = client.completions.create(**sampled, extra_body={"repetition_penalty": 1.3, "draft": False})
    b = client.completions.create(**sampled, extra_body={"repetition_penalty": 1.3})
    assert a.choices[0].token_sha == b.choices[0].token_sha  # drafted == serial with penalties


@pytest.mark.slow
def test_echo_returns_the_prompt_and_its_logprobs(client):
    ids = client.post("/tokenize", body={"model": "tiny", "prompt": PROMPT}, cast_to=object)["tokens"]
    kw = {"model": "tiny", "prompt": ids, "max_tokens": 2, "temperature": 0, "echo": True}
    plain = client.completions.create(model="tiny", prompt=ids, max_tokens=2, temperature=0)
    r = client.completions.create(logprobs=2, **kw).choices[0]
    assert r.token_sha == plain.choices[0].token_sha and r.text.endswith(plain.choices[0].text)
    lp, n = r.logprobs, len(ids)
    assert len(lp.tokens) == n + 2 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    # the prompt's ids are whole characters here: their texts tile the echoed text, as text_offset says
    assert lp.text_offset[:n] == [len("".join(lp.tokens[:j])) for j in range(n)]
    assert r.text.startswith("".join(lp.tokens[:n]))
    for k in (
        1,
        n // 2,
        n - 1,
    ):  # each prompt id's logprob is the one the model gives it after the ids before it
        forced = client.completions.create(model="tiny", prompt=ids[:k], max_tokens=1, temperature=0, logprobs=0,
                                           logit_bias={str(ids[k]): 100})  # fmt: skip
        assert forced.choices[0].logprobs.token_logprobs[0] == lp.token_logprobs[k], k
    again = client.completions.create(logprobs=2, **kw).choices[0].logprobs  # the prefix cache holds it now
    assert again.token_logprobs == lp.token_logprobs
    streamed = [c.choices[0] for c in client.completions.create(logprobs=2, stream=True, **kw) if c.choices]
    assert "".join(c.text for c in streamed) == r.text
    assert [v for c in streamed if c.logprobs for v in c.logprobs.token_logprobs] == lp.token_logprobs
    bare = client.completions.create(**kw).choices[0]
    assert bare.text == r.text and bare.logprobs is None
    scored = client.completions.create(
        logprobs=2, **{**kw, "max_tokens": 0}
    )  # the prompt scored, nothing made
    assert scored.usage.completion_tokens == 0 and scored.choices[0].finish_reason == "length"
    assert scored.choices[0].logprobs.token_logprobs == lp.token_logprobs[:n]
    assert scored.choices[0].text == "".join(lp.tokens[:n])


def test_n_choices_each_with_their_own_seed(client):
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=1.0, seed=9, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    shas = [c.token_sha for c in r.choices]
    assert len(set(shas)) == 3
    one = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=1.0, seed=9)
    assert one.token_sha == shas[0]  # choice 0 samples with the request's seed
    assert r.usage.completion_tokens == 24 and r.usage.prompt_tokens == 9


@pytest.mark.slow
def test_stop_string_cuts_the_text_and_never_streams_a_part(client):
    whole = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0)
    text = whole.choices[0].text
    stop = text[5:9]
    assert len(stop) == 4 and stop not in text[:8]
    cut = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].text == text[: text.index(stop)]
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, stop=stop,
                                            stream=True))  # fmt: skip
    pieces = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(pieces) == cut.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "stop"
    for k in range(1, len(stop)):
        assert not "".join(pieces).endswith(stop[:k]) or text[: text.index(stop)].endswith(stop[:k])


def test_stop_token_ids_and_ignore_eos(client):
    whole = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0)
    cut = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0,
                                    extra_body={"stop_token_ids": [GREEDY[3]]})  # fmt: skip
    assert cut.choices[0].finish_reason == "stop" and cut.usage.completion_tokens == 4
    assert whole.choices[0].text.startswith(cut.choices[0].text)


def test_tokenize_and_detokenize(server):
    status, body, _ = server.request(
        "POST", "/tokenize", {"messages": [{"role": "user", "content": "Hello"}]}
    )
    assert status == 200 and body["tokens"] == [0, 634, 404, 635, 637] and body["count"] == 5
    status, body, _ = server.request("POST", "/tokenize", {"prompt": PROMPT})
    assert body["tokens"] == [0, 297, 315, 522, 363, 331, 265, 317, 518] and body["max_model_len"] == 4096
    status, body, _ = server.request("POST", "/detokenize", {"tokens": [297, 315]})
    assert status == 200 and isinstance(body["prompt"], str)


def test_chat_with_system_and_history_renders_the_v41_encoding(server):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Hello"}]  # fmt: skip
    status, body, _ = server.request("POST", "/tokenize", {"messages": msgs})
    bos, system, user, assistant, think_end, eos, hello = 0, 633, 634, 635, 637, 1, 404
    assert status == 200
    ids = body["tokens"]
    assert ids[:2] == [bos, system] and ids[-3:] == [hello, assistant, think_end]
    assert ids.count(eos) == 1 and ids.count(assistant) == 2 and ids.count(user) == 2
