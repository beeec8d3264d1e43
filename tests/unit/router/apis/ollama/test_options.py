"""Ollama's ``options``, ``format``, ``think`` and ``keep_alive`` read as chat
completions fields: wrong types are 400s naming the option, the output bound and the
context stay within what the entry serves, and every duration Ollama's clients send is
understood."""

from __future__ import annotations

import math
from typing import Any

import pytest

from slm_server.errors import InvalidRequest
from slm_server.router.apis.ollama.options import (
    keep_alive_seconds,
    response_format,
    sampling,
    thinking,
)

CONTEXT = 4096


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        (None, None),
        (0, 0.0),
        (300, 300.0),
        (2.5, 2.5),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("300ms", 0.3),
        ("90s", 90.0),
        (" 10m ", 600.0),
        ("600", 600.0),
        (-1, math.inf),  # Ollama's "keep it loaded"
        ("-1", math.inf),
        ("-1m", math.inf),
        ("1e400", math.inf),
    ],
)
def test_keep_alive_is_seconds(given: Any, seconds: float | None) -> None:
    found = keep_alive_seconds(given)
    assert found == pytest.approx(seconds) if seconds is not None else found is None


@pytest.mark.parametrize("given", [True, False, "soon", "", "5 minutes", "m5", [], {}, "1d"])
def test_a_keep_alive_that_is_no_duration_is_a_400(given: Any) -> None:
    with pytest.raises(InvalidRequest) as refused:
        keep_alive_seconds(given)
    assert refused.value.param == "keep_alive"


def test_sampling_options_become_the_backends_fields() -> None:
    read = sampling(
        {
            "temperature": 0.2,
            "top_k": 40.0,
            "num_keep": 5,
            "penalize_newline": False,
            "stop": ["\n", "", "###"],
            "seed": None,
            "num_thread": 8,
            "num_gpu": 99,
            "made_up": 1,
        },
        CONTEXT,
    )
    assert read.fields == {
        "temperature": 0.2,
        "top_k": 40,
        "n_keep": 5,
        "penalize_nl": False,
        "stop": ["\n", "###"],
    }
    assert isinstance(read.fields["top_k"], int)
    assert read.ignored == ("num_thread", "num_gpu", "made_up")
    assert read.max_tokens is None


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"temperature": "0.2"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": [1]}, "top_p"),
        ({"top_k": 2.5}, "top_k"),
        ({"seed": "1"}, "seed"),
        ({"mirostat": 1.5}, "mirostat"),
        ({"penalize_newline": 1}, "penalize_newline"),
        ({"stop": 3}, "stop"),
        ({"stop": ["a", None]}, "stop"),
        ({"num_predict": 0}, "num_predict"),
        ({"num_predict": -3}, "num_predict"),
        ({"num_predict": 1.5}, "num_predict"),
        ({"num_predict": "8"}, "num_predict"),
        ({"num_ctx": 0}, "num_ctx"),
        ({"num_ctx": -1}, "num_ctx"),
        ({"num_ctx": "2048"}, "num_ctx"),
        ({"num_ctx": {}}, "num_ctx"),
    ],
    ids=str,
)
def test_an_option_of_the_wrong_type_is_a_400_naming_it(
    options: dict[str, Any], named: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        sampling(options, CONTEXT)
    assert refused.value.param == named
    assert named in refused.value.message


@pytest.mark.parametrize(
    ("asked", "context", "bound"),
    [
        (16, CONTEXT, 16),
        (CONTEXT, CONTEXT, CONTEXT),
        (CONTEXT + 1, CONTEXT, CONTEXT),
        (10**18, CONTEXT, CONTEXT),
        (10**18, None, 10**18),
        (-1, CONTEXT, None),
        (-2, CONTEXT, None),
    ],
)
def test_num_predict_is_bounded_by_the_context(
    asked: int, context: int | None, bound: int | None
) -> None:
    assert sampling({"num_predict": asked}, context).max_tokens == bound


@pytest.mark.parametrize(
    ("asked", "context", "left_alone"),
    [(CONTEXT, CONTEXT, False), (CONTEXT + 1, CONTEXT, True), (10**9, None, False)],
)
def test_num_ctx_past_the_served_context_is_left_alone(
    asked: int, context: int | None, left_alone: bool
) -> None:
    read = sampling({"num_ctx": asked}, context)
    assert read.ignored == (("num_ctx",) if left_alone else ())
    assert read.fields == {} and read.max_tokens is None


@pytest.mark.parametrize("given", ["xml", "JSON", 0, False, [], ["json"]])
def test_a_format_that_is_no_schema_is_a_400(given: Any) -> None:
    with pytest.raises(InvalidRequest) as refused:
        response_format(given)
    assert refused.value.param == "format"


@pytest.mark.parametrize("given", [0, 1, "yes", "max", "", [], {}])
def test_a_think_that_is_no_level_is_a_400(given: Any) -> None:
    with pytest.raises(InvalidRequest) as refused:
        thinking(given)
    assert refused.value.param == "think"
