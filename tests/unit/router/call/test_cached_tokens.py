"""The prompt tokens an engine read from its cache, as each API shape's usage says it
(and llama-server's ``timings``), kept on the request's record."""

from __future__ import annotations

from typing import Any

import pytest

from slm_server.router.call.exchange import Exchange


def noted(*bodies: dict[str, Any]) -> Exchange:
    exchange = Exchange(request_id="r", method="POST", path="/v1/chat/completions")
    for body in bodies:
        exchange.note_response(body)
    return exchange


@pytest.mark.parametrize(
    ("body", "cached"),
    [
        # OpenAI's chat completions, and llama-server's
        ({"usage": {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 32}}}, 32),
        # the Responses API
        ({"usage": {"input_tokens": 40, "input_tokens_details": {"cached_tokens": 16}}}, 16),
        # Anthropic's Messages API
        ({"type": "message", "usage": {"input_tokens": 8, "cache_read_input_tokens": 30}}, 30),
        # llama-server's timings, with or without usage
        ({"timings": {"cache_n": 24, "prompt_n": 16}}, 24),
        ({"usage": {"prompt_tokens": 40}, "timings": {"cache_n": 7}}, 7),
        # the usage's own figure first
        ({"usage": {"prompt_tokens_details": {"cached_tokens": 3}}, "timings": {"cache_n": 9}}, 3),
        # nothing said, or nothing usable
        ({"usage": {"prompt_tokens": 40, "completion_tokens": 2}}, None),
        ({"usage": {"prompt_tokens_details": {"cached_tokens": "12"}}}, None),
        ({"usage": {"prompt_tokens_details": {"cached_tokens": True}}}, None),
        ({"timings": {"cache_n": 1.5}}, None),
        ({"choices": []}, None),
    ],
)
def test_cached_tokens_from_each_shape(body: dict[str, Any], cached: int | None) -> None:
    assert noted(body).cached_tokens == cached


def test_a_later_chunk_that_says_nothing_keeps_what_an_earlier_one_said() -> None:
    exchange = noted(
        {"choices": [{"delta": {"content": "x"}}]},
        {"usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 5}}},
        {"choices": [{"delta": {}, "finish_reason": "stop"}]},
    )
    assert (exchange.cached_tokens, exchange.input_tokens) == (5, 9)
