"""A tool's ``parameters`` walked as the pinned llama-server's schema builder walks them:
refused where it throws (a 500 with Qwen3-Coder's template), passed where it builds or
ignores. Each case was checked against the pinned build."""

from __future__ import annotations

from typing import Any

import pytest

from slm_server.errors import InvalidRequest
from slm_server.router.intake.tool_schema import check_schema

SCHEMA_REFUSED: dict[str, Any] = {
    "not an object": "x",
    "a boolean schema": True,
    "a boolean property": {"type": "object", "properties": {"a": False}},
    "properties a string": {"type": "object", "properties": "x"},
    "additionalProperties a string": {"type": "object", "additionalProperties": "x"},
    "an unknown type": {"properties": {"a": {"type": "foo"}}},
    "an empty type list": {"properties": {"a": {"type": []}}},
    "a type that is a number": {"properties": {"a": {"type": 5}}},
    "an empty enum": {"properties": {"a": {"enum": []}}},
    "an empty anyOf": {"properties": {"a": {"anyOf": []}}},
    "oneOf not a list": {"properties": {"a": {"oneOf": {}}}},
    "a remote $ref": {"properties": {"a": {"$ref": "https://example.com/s.json"}}},
    "a $ref to the root": {"properties": {"a": {"$ref": "#"}}},
    "a $ref to nothing": {"properties": {"a": {"$ref": "#/$defs/nope"}}},
    "a $ref past an array": {"properties": {"a": {"$ref": "#/x/3"}}, "x": [{}]},
    "a $ref that is a number": {"properties": {"a": {"$ref": 5}}},
    "a negative minItems": {"properties": {"a": {"type": "array", "minItems": -1}}},
    "a fractional maxLength": {"properties": {"a": {"type": "string", "maxLength": 1.5}}},
    "a pattern that is a number": {"properties": {"a": {"type": "string", "pattern": 5}}},
    "a format that is a number": {"properties": {"a": {"type": "string", "format": 5}}},
    "a minimum that is a string": {"properties": {"a": {"type": "integer", "minimum": "1"}}},
    "a bad schema behind a $ref": {"properties": {"a": {"$ref": "#/$defs/b"}}, "$defs": {"b": 5}},
    "a bad item": {"properties": {"a": {"type": "array", "items": {"type": "nope"}}}},
    "a bad type in a list": {"properties": {"a": {"type": ["string", "nope"]}}},
}
SCHEMA_SERVED: dict[str, Any] = {
    "null": None,
    "empty": {},
    "a cycle through $defs": {
        "$ref": "#/$defs/a",
        "$defs": {"a": {"properties": {"b": {"$ref": "#/$defs/a"}}}},
    },
    "a $ref into an array": {"properties": {"a": {"$ref": "#/x/0"}}, "x": [{"type": "string"}]},
    "an enum of anything": {"properties": {"a": {"enum": [1, "x", None]}}},
    "a const": {"properties": {"a": {"const": {"deep": [1]}}}},
    "tuples skip their counts": {
        "properties": {"a": {"type": "array", "items": [{}], "minItems": -1}}
    },
    "an integer with fractional bounds": {"properties": {"a": {"type": "integer", "minimum": 0.5}}},
    "an exclusive bound beside a bad one it hides": {
        "properties": {"a": {"type": "integer", "minimum": 1, "exclusiveMinimum": "x"}}
    },
    "an unknown format": {"properties": {"a": {"type": "string", "format": "email"}}},
    "a format on a typeless schema after a pattern": {
        "properties": {"a": {"pattern": "a", "format": "date"}}
    },
    "additionalProperties true": {"type": "object", "additionalProperties": True},
    "a numeric type's unread fields": {"properties": {"a": {"type": "number", "minimum": "x"}}},
}


@pytest.mark.parametrize("name", sorted(SCHEMA_REFUSED))
def test_a_schema_llama_server_cannot_build_is_refused(name: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        check_schema(SCHEMA_REFUSED[name], "tools[0].function.parameters")
    assert refused.value.param == "tools[0].function.parameters"


@pytest.mark.parametrize("name", sorted(SCHEMA_SERVED))
def test_a_schema_llama_server_builds_passes(name: str) -> None:
    check_schema(SCHEMA_SERVED[name], "p")
