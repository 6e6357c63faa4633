"""Grammars (llguidance Lark) that hold a DeepSeek-V4.1 reply to a calls block or to a JSON schema.

`tool_choice` required or a named function: the reply is (reasoning `</think>`, in thinking mode) the blank
line and a V4.1 calls block of those tools, EOS after it. Each parameter follows its tool's schema: a
string property is written `string="true"` (its enum or maxLength kept), any other as a JSON value of its
schema; required properties appear, optional ones may, in the schema's order. `response_format`: the reply
is one JSON value of the schema (`json_object`: any object). Special tokens are named by id (`<[id]>`),
so ordinary tokens can never spell the markup.
"""

from __future__ import annotations

import json
from typing import Any

REASONING = "REASONING: /(.|\\n)*/"
STRING_VALUE = "STRING_VALUE: /(.|\\n)*<\\//"  # a raw value runs up to the `</` before the close tag


def _lit(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def _schema(schema: Any, lenient: bool) -> str:
    """A `%json` island: the schema with compact JSON (no free whitespace a sampler could loop in)."""
    schema = dict(schema) if isinstance(schema, dict) else {}
    schema["x-guidance"] = {"whitespace_flexible": False, "lenient": lenient}
    return "%json " + json.dumps(schema, ensure_ascii=False)


def json_grammar(schema: Any, think_end: int | None, lenient: bool = False) -> str:
    """The reply is one JSON value of `schema` (after the reasoning when `think_end` is given)."""
    if think_end is None:
        return f"start: {_schema(schema, lenient)}\n"
    return f"start: REASONING <[{think_end}]> {_schema(schema, lenient)}\n{REASONING}\n"


def tool_grammar(functions: list[dict], dsml: int, think_end: int | None, parallel: bool) -> str:
    """The reply is a calls block of these functions (one call, or several when `parallel`)."""
    d = f"<[{dsml}]>"
    rules, names = [], []
    for f, fn in enumerate(functions):
        params = _params(fn.get("parameters"), d, f, rules)
        names.append(f"invoke_{f}")
        opening = _lit(f' invoke name="{fn["name"]}">' + "\n")
        rules.append(f'invoke_{f}: "<" {d} {opening} {params} "\\n</" {d} " invoke>"')
    one = " | ".join(names)
    calls = 'call ("\\n" call)*' if parallel else "call"
    head = f"REASONING <[{think_end}]> " if think_end is not None else ""
    top = [f'start: {head}"\\n\\n<" {d} " calls>\\n" {calls} "\\n</" {d} " calls>"', f"call: {one}"]
    return "\n".join([*top, *rules, REASONING, STRING_VALUE]) + "\n"


def _params(schema: Any, d: str, f: int, rules: list[str]) -> str:
    """The parameters of function f, one per line (none: nothing, so the invoke holds a blank line as encoded)."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    props = props if isinstance(props, dict) else {}
    required = set(schema.get("required") or ()) if isinstance(schema, dict) else set()
    items = []
    for p, (key, sub) in enumerate(props.items()):
        rules.append(f"param_{f}_{p}: {_param(key, sub if isinstance(sub, dict) else {}, d)}")
        items.append((f"param_{f}_{p}", key in required))
    if not items:
        return ""
    ways = []
    for k, (rule, _) in enumerate(items):
        if any(req for _, req in items[:k]):
            break  # the first parameter written cannot come after a required one
        rest = " ".join(f'"\\n" {r}' if req else f'("\\n" {r})?' for r, req in items[k + 1 :])
        ways.append(f"{rule} {rest}".strip())
    return "(" + " | ".join(ways) + (")" if any(req for _, req in items) else ")?")


def _param(key: str, schema: dict, d: str) -> str:
    """One parameter element: raw text for a string property, a JSON value of its schema otherwise."""
    if schema.get("type") == "string" and not schema.get("format"):
        head = _lit(f' parameter name="{key}" string="true">')
        if isinstance(schema.get("enum"), list) and all(isinstance(v, str) for v in schema["enum"]):
            value = "(" + " | ".join(_lit(v) for v in schema["enum"]) + ') "</"'
        elif isinstance(schema.get("maxLength"), int):
            value = f"/(.|\\n){{0,{schema['maxLength']}}}<\\//"
        else:
            value = "STRING_VALUE"
        return f'"<" {d} {head} {value} {d} " parameter>"'
    head = _lit(f' parameter name="{key}" string="false">')
    return f'"<" {d} {head} {_schema(schema, lenient=True)} "</" {d} " parameter>"'
