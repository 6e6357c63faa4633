"""A calls block the token limit cuts off: complete calls stay calls, the unfinished tag never becomes content."""

from __future__ import annotations

from test_chat_dsml import D, _ids, summary
from tfc.fixtures.tokenizer import build_tokenizer
from tfc.runtime.models.dsv41.chat.reply import ReplyReader

CUT = (
    f'\n\n<{D} calls>\n<{D} invoke name="ping">\n\n</{D} invoke>\n'
    f'<{D} invoke name="get_weather">\n<{D} parameter name="city" string="true">Par'
)


def _read(text: str, cut: bool):
    tok = build_tokenizer(640)
    reader = ReplyReader(tok, _ids(tok), thinking=False, tools=True)
    parts = []
    for t in tok.encode(text, add_special_tokens=False).ids:
        parts += reader.add(t)[0]
    return summary(parts + reader.flush(cut=cut))


def test_a_block_cut_by_max_tokens_keeps_its_calls_and_shows_no_markup():
    _, content, calls = _read(CUT, cut=True)
    assert content == "" and D not in content
    assert calls == [("ping", {}), ("get_weather", {})]


def test_the_same_block_ended_by_the_model_is_still_returned_as_text():
    assert _read(CUT, cut=False)[1] == f'<{D} parameter name="city" string="true">Par'
