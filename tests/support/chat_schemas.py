"""The JSON schemas and the weather tool the chat and Responses tests constrain replies with, and a
checker for the subset of JSON Schema they use."""

from __future__ import annotations

import math

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
     "age": {"type": "integer", "minimum": 0, "maximum": 120}, "ok": {"type": "boolean"}},
     "required": ["name", "age", "ok"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
     "tags": {"type": "array", "maxItems": 3, "items": {"type": "integer", "minimum": 1, "maximum": 9}}},
     "required": ["color", "tags"], "additionalProperties": False},
    {"type": "array", "minItems": 1, "maxItems": 4, "items": {"type": "boolean"}},
    {"type": "object", "properties": {"answer": {"type": "integer", "minimum": -50, "maximum": 50},
     "unit": {"type": ["string", "null"], "maxLength": 4}}, "required": ["answer"], "additionalProperties": False},
]  # fmt: skip
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "metric": {"type": "boolean"},
            },
            "required": ["city"],
        },
    },
}


def valid(value, schema: dict) -> bool:
    """The subset of JSON Schema the test schemas use."""
    if "enum" in schema:
        return value in schema["enum"]
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    for kind in kinds:
        if (kind == "null" and value is None) or (kind == "boolean" and isinstance(value, bool)):
            return True
        if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
            return schema.get("minimum", -math.inf) <= value <= schema.get("maximum", math.inf)
        if kind == "string" and isinstance(value, str):
            return len(value) <= schema.get("maxLength", math.inf)
        if kind == "array" and isinstance(value, list):
            return schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", math.inf) and all(
                valid(v, schema["items"]) for v in value
            )
        if kind == "object" and isinstance(value, dict):
            props = schema.get("properties", {})
            return (set(schema.get("required", ())) <= set(value) and (schema.get("additionalProperties", True)
                    or set(value) <= set(props)) and all(valid(v, props[k]) for k, v in value.items() if k in props))  # fmt: skip
    return False
