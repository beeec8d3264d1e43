"""A model's tool call checked and repaired (the pure core of issue 42), on the
malformed calls small models are known to write: each repairable one comes out valid
against the tool's schema, each other one says why, and a valid call is left byte for
byte as written."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from slm_server.router.toolcalls.repair import Repaired, Unrepairable, Valid, check_call

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "units": {"enum": ["metric", "imperial"]},
        "hourly": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {
            "type": "object",
            "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
            "required": ["lat", "lon"],
        },
    },
    "required": ["city"],
}
TOOLS: dict[str, Any] = {
    "get_weather": WEATHER,
    "list_directory": {"type": "object", "properties": {"path": {"type": "string"}}},
    "read_file": {"type": "object", "properties": {"path": {"type": "string"}}},
    "now": None,
}


def valid_against(schema: Any, arguments: str) -> bool:
    return Draft202012Validator(schema or {}).is_valid(json.loads(arguments))


@pytest.mark.parametrize(
    "arguments",
    [
        '{"city": "Paris"}',
        '{ "city" : "Paris",\n "days": 3 }',  # the model's own spacing
        '{"city": "Zürich", "where": {"lat": 47.37, "lon": 8.54}}',
    ],
)
def test_a_valid_call_passes_byte_for_byte(arguments: str) -> None:
    assert check_call("get_weather", arguments, TOOLS) == Valid("get_weather", arguments)


@pytest.mark.parametrize(
    ("arguments", "expected", "repairs"),
    [
        ('{"city": "Paris"', {"city": "Paris"}, ("arguments_json",)),  # cut off
        ("{'city': 'Paris'}", {"city": "Paris"}, ("arguments_json",)),  # single quotes
        ('{"city": "Paris", "days": 3,}', {"city": "Paris", "days": 3}, ("arguments_json",)),
        (
            '{"city": "Paris", "hourly": True}',  # Python's literal
            {"city": "Paris", "hourly": True},
            ("arguments_json",),
        ),
        ('```json\n{"city": "Paris"}\n```', {"city": "Paris"}, ("arguments_json",)),
        ('{"city": "Paris", "days": "3"}', {"city": "Paris", "days": 3}, ("arguments_schema",)),
        (
            '{"city": "Paris", "tags": "sunny"}',
            {"city": "Paris", "tags": ["sunny"]},
            ("arguments_schema",),
        ),
        (
            "{'city': 'Paris', 'days': '2'",
            {"city": "Paris", "days": 2},
            ("arguments_json", "arguments_schema"),
        ),
    ],
    ids=[
        "truncated",
        "single-quotes",
        "trailing-comma",
        "python-literal",
        "markdown-fence",
        "string-number",
        "lone-value-for-an-array",
        "several-at-once",
    ],
)
def test_repairable_arguments_come_out_valid(
    arguments: str, expected: dict[str, Any], repairs: tuple[str, ...]
) -> None:
    checked = check_call("get_weather", arguments, TOOLS)
    assert isinstance(checked, Repaired), checked
    assert json.loads(checked.arguments) == expected
    assert checked.repairs == repairs
    assert valid_against(WEATHER, checked.arguments)


@pytest.mark.parametrize(
    ("name", "fixed"),
    [("get_wether", "get_weather"), ("Get_Weather", "get_weather"), ("getweather", "get_weather")],
)
def test_a_misspelled_name_close_to_one_offered_is_that_one(name: str, fixed: str) -> None:
    checked = check_call(name, '{"city": "Paris"}', TOOLS)
    assert isinstance(checked, Repaired)
    assert checked.name == fixed and checked.repairs == ("name",)
    assert checked.arguments == '{"city": "Paris"}', "only the name is mended"


@pytest.mark.parametrize(
    ("name", "arguments", "why"),
    [
        ("delete_everything", "{}", "no offered tool"),
        ("list_file", '{"path": "."}', "no offered tool"),  # as close to two offered
        ("get_weather", "[1, 2]", "not a JSON object"),
        ("get_weather", "Paris", "not a JSON object"),
        ("get_weather", '{"days": 3}', "city"),  # required, cannot be invented
        ("get_weather", '{"city": "Paris", "units": "kelvin"}', "units"),
        ("get_weather", '{"city": "Paris", "days": "three"}', "days"),
        ("get_weather", '{"city": "Paris", "days": 2.5}', "days"),  # not lossless
        ("get_weather", '{"city": "Paris", "where": {"lat": 1}}', "where"),
    ],
)
def test_what_cannot_be_repaired_says_why(name: str, arguments: str, why: str) -> None:
    checked = check_call(name, arguments, TOOLS)
    assert isinstance(checked, Unrepairable), checked
    assert why in checked.reason


def test_a_tool_without_parameters_takes_an_empty_object() -> None:
    assert check_call("now", "{}", TOOLS) == Valid("now", "{}")
    # No arguments at all (several servers send "" for a call without): an empty object.
    assert check_call("now", "", TOOLS) == Repaired("now", "{}", ("arguments_json",))
    assert isinstance(check_call("get_weather", " ", TOOLS), Unrepairable)  # city required


def test_arguments_given_as_an_object_are_checked_and_serialised() -> None:
    checked = check_call("get_weather", {"city": "Paris", "days": "4"}, TOOLS)
    assert isinstance(checked, Repaired)
    assert json.loads(checked.arguments) == {"city": "Paris", "days": 4}
    checked = check_call("get_weather", {"city": "Paris"}, TOOLS)
    assert checked == Repaired("get_weather", '{"city":"Paris"}', ())


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "no-such-type"},
        {"$ref": "#/$defs/a~1b", "$defs": {"a~1b": {"type": "object"}}},  # not resolved
    ],
)
def test_a_tool_whose_schema_cannot_be_used_takes_any_object_and_never_raises(
    schema: dict[str, Any],
) -> None:
    tools = {"odd": schema}
    assert check_call("odd", '{"x": 1}', tools) == Valid("odd", '{"x": 1}')
    assert isinstance(check_call("odd", "[1]", tools), Unrepairable)


@pytest.mark.parametrize(
    ("arguments", "mended"),
    [
        (
            "{'city': 'Paris', 'note': None, 'hourly': True}",
            {"city": "Paris", "note": None, "hourly": True},
        ),
        ('{"city": "Paris", "days": NaN}', None),  # no number is had from it
        ('{"city": "\\ud800"}', None),  # a lone surrogate: no UTF-8 for it
    ],
)
def test_python_literals_mean_what_they_say_and_what_json_cannot_carry_is_refused(
    arguments: str, mended: dict[str, Any] | None
) -> None:
    tools = {
        "t": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        }
    }
    checked = check_call("t", arguments, tools)
    if mended is None:
        assert not isinstance(checked, Valid)
        if isinstance(checked, Repaired):
            value = json.loads(checked.arguments)
            assert value.get("days") is None or isinstance(value["days"], int)
            json.dumps(value, allow_nan=False).encode("utf-8")
    else:
        assert isinstance(checked, Repaired) and json.loads(checked.arguments) == mended


def test_a_long_broken_call_is_not_mended_on_the_event_loop() -> None:
    broken = '{"city": "' + "x" * 70_000  # cut off: json_repair would take seconds
    checked = check_call("get_weather", broken, TOOLS)
    assert isinstance(checked, Unrepairable) and "too long" in checked.reason
