"""A custom tool's input read back from its stand-in function's arguments, whole and as
they stream (:mod:`slm_server.router.apis.responses.custom_input`)."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slm_server.router.apis.responses.custom_input import (
    InputReader,
    custom_arguments,
    custom_input,
)

PATCH = '*** Begin Patch\n*** Update File: a.py\n-x = 1\n+x = "é" \\ 😀\n*** End Patch'


def streamed(arguments: str, cuts: list[int]) -> tuple[list[str], str, str]:
    """The deltas a reader hands out for ``arguments`` cut at ``cuts``, its rest, and
    the whole input."""
    reader = InputReader()
    bounds = [0, *sorted(c % (len(arguments) + 1) for c in cuts), len(arguments)]
    deltas = [reader.feed(arguments[a:b]) for a, b in pairwise(bounds)]
    rest, whole = reader.finish()
    return deltas, rest, whole


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"input": "ls -la"}', "ls -la"),
        ('{"patch": "diff"}', "diff"),
        ('"just a string"', "just a string"),
        ('{"input": 3}', '{"input": 3}'),
        ('{"a": "x", "b": "y"}', '{"a": "x", "b": "y"}'),
        ("not json at all", "not json at all"),
        ("[1, 2]", "[1, 2]"),
    ],
)
def test_the_input_of_whole_arguments(arguments: str, expected: str) -> None:
    assert custom_input(arguments) == expected


def test_arguments_carry_the_input_back() -> None:
    assert custom_input(custom_arguments(PATCH)) == PATCH
    assert json.loads(custom_arguments(PATCH)) == {"input": PATCH}


def test_the_input_streams_as_it_is_decoded() -> None:
    arguments = json.dumps({"input": PATCH})
    reader = InputReader()
    deltas = [reader.feed(arguments[i : i + 3]) for i in range(0, len(arguments), 3)]
    rest, whole = reader.finish()
    assert whole == PATCH
    assert "".join(deltas) + rest == PATCH
    assert rest == ""  # the string's end was seen: nothing was held back
    assert sum(1 for d in deltas if d) > 10  # it streamed, not all at the end


@given(text=st.text(max_size=40), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_deltas_always_add_up_to_the_whole_input(text: str, cuts: list[int]) -> None:
    for arguments in (
        json.dumps({"input": text}),
        json.dumps({"input": text}, ensure_ascii=False, indent=2),
        json.dumps({"other": text}),
        text,
    ):
        deltas, rest, whole = streamed(arguments, cuts)
        assert whole == custom_input(arguments)
        assert "".join(deltas) + rest == whole


def test_arguments_of_another_shape_give_the_input_at_the_end() -> None:
    deltas, rest, whole = streamed('{"command": "ls"}', [3, 9])
    assert deltas == ["", "", ""]
    assert rest == whole == "ls"


@pytest.mark.parametrize(
    "arguments",
    [
        '{"input": "a\\ud800b"}',  # a high surrogate alone
        '{"input": "a\\udc00b"}',  # a low surrogate alone
        '{"input": "a\\qb"}',  # no such escape
    ],
)
def test_broken_escapes_stop_the_stream_and_the_whole_arguments_decide(arguments: str) -> None:
    deltas, rest, whole = streamed(arguments, list(range(len(arguments))))
    assert "".join(deltas) == "a"
    assert whole == custom_input(arguments)
    assert rest == (whole[1:] if whole.startswith("a") else "")
    whole.encode("utf-8")  # never a lone surrogate: the answer must encode


def test_a_lone_surrogate_is_never_handed_out() -> None:
    assert custom_input('{"input": "a\\udc00"}') == '{"input": "a\\udc00"}'
