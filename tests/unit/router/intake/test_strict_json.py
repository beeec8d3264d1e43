"""Strict JSON for request bodies: everything a backend's parser would refuse is a 400
here, and everything RFC 8259 allows still parses."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import pytest

from slm_server.errors import InvalidRequest
from slm_server.router.intake.strict_json import MAX_DEPTH, dumps_body, loads

DOUBLE_MAX = int(sys.float_info.max)  # 309 digits


def refusal(raw: bytes) -> str:
    """The message of the 400 ``loads`` must give for ``raw``."""
    with pytest.raises(InvalidRequest) as caught:
        loads(raw)
    assert caught.value.status == 400
    assert caught.value.error_type == "invalid_request_error"
    assert caught.value.code == "invalid_json"
    assert caught.value.message.startswith("The request body is not valid JSON: ")
    return caught.value.message.removeprefix("The request body is not valid JSON: ")


def nested(depth: int) -> bytes:
    return b'{"a": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


# --- what must be refused ---------------------------------------------------------------


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("where", ['{"a": %s}', '{"a": [1, %s]}', "%s"])
def test_nan_and_infinity(literal: str, where: str) -> None:
    message = refusal((where % literal).encode())
    assert message == f"{literal} is not a JSON number (RFC 8259 has no NaN or Infinity)"


@pytest.mark.parametrize(
    "literal",
    [
        "1e999",
        "-1e400",
        "1E+309",
        "1.8e308",
        "0.5e00309",
        "1" + "0" * 250 + "e99",  # overflows through its mantissa, not its exponent
        "1" + "0" * 400 + ".5",
        "9" * 309,  # an integer past the largest double
        "-" + "1" * 310,
        str(DOUBLE_MAX * 2),
    ],
)
def test_numbers_that_overflow_a_double(literal: str) -> None:
    message = refusal(f'{{"temperature": {literal}}}'.encode())
    assert message.startswith(f"the number {literal[:40]}")
    assert message.endswith("is too large for a double")


def test_an_integer_too_long_for_python_is_the_same_refusal() -> None:
    message = refusal(b'{"n": ' + b"7" * 5000 + b"}")
    assert message == f"the number {'7' * 40}... (5000 characters) is too large for a double"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"a": "\\ud800"}', "the string at a holds"),
        (b'{"a": "x\\uDBFF y"}', "the string at a holds"),
        (b'{"a": "\\udc00"}', "the string at a holds"),  # a low half with no high one
        (b'{"a": "\\ude00\\ud83d"}', "the string at a holds"),  # the halves swapped
        (b'{"a": "\\ud83d\\u0041"}', "the string at a holds"),
        (b'{"\\ud800": 1}', "a key of the object at the top level holds"),
        (b'{"m": [{"c": 1}, {"c": "ok \\ud83d"}]}', "the string at m[1].c holds"),
        (b'{"m": {"odd key": ["\\udfff"]}}', 'the string at m["odd key"][0] holds'),
        (b'{"m": [{"\\udead": 0}]}', "a key of the object at m[0] holds"),
        (b'"\\ud800"', "the string holds"),
    ],
)
def test_lone_surrogates(raw: bytes, message: str) -> None:
    assert refusal(raw) == (
        f"{message} a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair)"
    )


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"])
def test_utf16_and_utf32_bodies(codec: str) -> None:
    # Python's json.loads would read each of these, guessing the encoding.
    raw = '{"model": "m", "messages": []}'.encode(codec)
    assert refusal(raw) == "it is UTF-16 or UTF-32; send UTF-8"


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b'{"a": "\xff"}', "invalid start byte at byte 7"),
        (b'{"a": "caf\xe9"}', "invalid continuation byte at byte 10"),
        (b'{"a": "\xed\xa0\x80"}', "invalid continuation byte at byte 7"),  # a UTF-8 surrogate
        (b'{"a": "\xc0\xaf"}', "invalid start byte at byte 7"),  # an overlong "/"
        (b'{"a": "\xf4\x90\x80\x80"}', "invalid continuation byte at byte 7"),  # > U+10FFFF
        (b'{"a": "\xe2\x9c"}', "invalid continuation byte at byte 7"),  # cut short
    ],
)
def test_bodies_that_are_not_utf8(raw: bytes, where: str) -> None:
    assert refusal(raw) == f"it is not UTF-8 ({where})"


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 100_000])
def test_nesting_past_the_limit(depth: int) -> None:
    assert refusal(nested(depth)) == f"arrays and objects are nested more than {MAX_DEPTH} deep"


@pytest.mark.parametrize("opener", [b"[", b'{"a":', b'[{"a":'])
def test_extremely_deep_input_is_a_400_not_a_recursion_error(opener: bytes) -> None:
    assert "nested more than" in refusal(opener * 100_000)


def test_depth_counts_objects_and_arrays_alike() -> None:
    raw = b'{"a": ' * (MAX_DEPTH // 2) + b"[" * (MAX_DEPTH // 2 + 1) + b"]" * (MAX_DEPTH // 2 + 1)
    assert "nested more than" in refusal(raw + b"}" * (MAX_DEPTH // 2))


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": "\x01"}',  # a raw control character in a string
        b'{"a": "\t"}',
        b"{'a': 1}",
        b'{"a": 1,}',
        b'{"a": 1} x',
        b'{"a": 01}',
        b'{"a": .5}',
        b'{"a": +1}',
        b'{"a": 0x10}',
        b'{"a": "\\x41"}',
        b'{"a": "\\u12"}',
        '{"a": 1\u0662}'.encode(),  # an Arabic-Indic digit: \\d in a regex, not in JSON
        '{"a": \u0661}'.encode(),
        b'{"a": 1}\x0c',  # form feed is not JSON whitespace
        b'\xef\xbb\xbf\xef\xbb\xbf{"a": 1}',  # one byte order mark is ignored, not two
        b"/* c */ {}",
    ],
)
def test_what_json_already_refuses_stays_refused(raw: bytes) -> None:
    refusal(raw)


# --- what must still pass ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ('{"a": "héllo ✓ 日本語 😀"}'.encode(), {"a": "héllo ✓ 日本語 😀"}),
        (b'{"a": "\\ud83d\\ude00"}', {"a": "\U0001f600"}),  # a surrogate pair: one emoji
        (b'{"a": "\\uD83D\\uDE00 and \\u00e9"}', {"a": "\U0001f600 and \u00e9"}),
        (b'{"\\ud83d\\ude00": "\\\\ud800"}', {"\U0001f600": "\\ud800"}),  # an escaped backslash
        (b'{"a": "\\u0000"}', {"a": "\x00"}),
        (b'{"a": "\x7f"}', {"a": "\x7f"}),
        (b'{"a": 1.7e308, "b": -1.7976931348623157e308}', {"a": 1.7e308, "b": -sys.float_info.max}),
        (b'{"a": 1e-999, "b": 5e-324}', {"a": 0.0, "b": 5e-324}),
        (b'{"a": 0e99999}', {"a": 0.0}),
        (b'{"a": 2.5E+3, "b": 1E2}', {"a": 2500.0, "b": 100.0}),
        (f'{{"a": {2**63}, "b": {2**64 + 1}, "c": {-(2**63) - 1}}}'.encode(), None),
        (
            f'{{"a": {DOUBLE_MAX}, "b": -{DOUBLE_MAX}}}'.encode(),
            {"a": DOUBLE_MAX, "b": -DOUBLE_MAX},
        ),
        (b'{"a": null, "b": true, "c": false, "d": [], "e": {}}', None),
        (b' \t\r\n{"a": 1} \t\r\n', {"a": 1}),
        (b'{"a": 1, "a": 2}', {"a": 2}),  # the last wins, as in llama-server's parser
        (b'{"a": "NaN", "Infinity": "1e999"}', None),
        (b'["\\ud83d\\ude00", 1e308]', ["\U0001f600", 1e308]),
    ],
)
def test_valid_edge_cases_still_parse(raw: bytes, value: Any) -> None:
    assert loads(raw) == (json.loads(raw) if value is None else value)


def test_negative_zero_keeps_its_sign() -> None:
    value = loads(b'{"a": -0.0, "b": -0}')
    assert math.copysign(1.0, value["a"]) == -1.0
    assert value["b"] == 0


def test_a_utf8_byte_order_mark_is_ignored() -> None:
    # RFC 8259 lets a parser ignore it, and llama-server's nlohmann::json skips it.
    assert loads(b'\xef\xbb\xbf{"model": "m"}') == {"model": "m"}


def test_nesting_up_to_the_limit_parses() -> None:
    value = loads(nested(MAX_DEPTH))
    depth, node = 2, value["a"]  # the object, then its array
    while node:
        node = node[0]
        depth += 1
    assert depth == MAX_DEPTH


def test_many_brackets_in_strings_are_not_depth() -> None:
    text = "[{" * 10_000
    assert loads(json.dumps({"code": text, "more": [[1]] * 500}).encode())["code"] == text


def test_a_long_run_of_digits_in_a_string_is_not_a_number() -> None:
    digits = "9" * 1000
    assert loads(json.dumps({"a": digits, "b": 7, "c": [1, 2]}).encode())["a"] == digits


def test_large_but_valid_body_with_escaped_emoji() -> None:
    messages = [{"role": "user", "content": f"message {i} 😀 ✓"} for i in range(2000)]
    raw = json.dumps({"model": "m", "messages": messages}).encode()  # ensure_ascii: pairs
    assert b"\\ud83d\\ude00" in raw
    assert loads(raw)["messages"] == messages


# --- dumps_body --------------------------------------------------------------------------


def test_dumps_body_round_trips_as_compact_utf8() -> None:
    payload = {"a": "héllo 😀", "b": [1, 2.5, -0.0, 2**70], "c": None}
    raw = dumps_body(payload)
    assert raw == '{"a":"héllo 😀","b":[1,2.5,-0.0,1180591620717411303424],"c":null}'.encode()
    assert loads(raw) == payload


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_dumps_body_never_writes_nan_or_infinity(value: float) -> None:
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        dumps_body({"temperature": value})


def test_dumps_body_never_writes_a_lone_surrogate() -> None:
    with pytest.raises(UnicodeEncodeError):
        dumps_body({"content": "\ud800"})
