"""The parsed cost bounds what the strict parser really allocates (``tracemalloc``'s
peak while parsing, which also covers what the value keeps), for every shape of body
that costs more parsed than on the wire, and is not wildly above it."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable

import pytest

from slm_server.router.intake.parsed_cost import parsed_cost
from slm_server.router.intake.strict_json import loads

SIZE = 1024 * 1024


def array(item: str) -> bytes:
    return (
        '{"model":"m","input":[' + ",".join(item for _ in range(SIZE // (len(item) + 1))) + "]}"
    ).encode()


def content(text: str) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return json.dumps(body, ensure_ascii=False).encode()


SHAPES: dict[str, Callable[[], bytes]] = {
    "four-digit integers": lambda: array("1234"),
    "small integers": lambda: array("1"),
    "floats": lambda: array("0.123456"),
    "two-character strings": lambda: array('"ab"'),
    "one-key objects": lambda: array('{"a":1}'),
    "empty objects": lambda: array("{}"),
    "empty arrays": lambda: array("[]"),
    "nested arrays": lambda: array("[[1]]"),
    "an ASCII string": lambda: content("x" * SIZE),
    "a CJK string": lambda: content("中" * (SIZE // 3)),
    "ASCII with one emoji": lambda: content("x" * SIZE + "😀"),
    "escaped emoji": lambda: json.dumps({"model": "m", "input": "😀" * (SIZE // 12)}).encode(),
    "deep and wide": lambda: (
        "[" * 200 + ",".join("{}" for _ in range(SIZE // 3)) + "]" * 200
    ).encode(),
}


def peak_of(raw: bytes) -> int:
    tracemalloc.start()
    try:
        try:
            value = loads(raw)
        except Exception:  # a refused body's peak counts as much
            value = None
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del value
    return peak


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_cost_bounds_the_parsers_peak(shape: str) -> None:
    raw = SHAPES[shape]()
    peak, cost = peak_of(raw), parsed_cost(raw)
    assert peak <= cost, f"{shape}: peak {peak / SIZE:.1f} MiB above the cost {cost / SIZE:.1f}"
    # Pessimistic at worst for small integers, which CPython shares (6 times the peak).
    assert cost <= 8 * peak + 64 * 1024, f"{shape}: {cost / peak:.1f} times the peak"


def test_an_ordinary_request_costs_little() -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello"}]}).encode()
    assert parsed_cost(body) < 70 * 1024
