"""A completions request with ``suffix`` as llama-server's ``/infill`` request, and what
it refuses (its answer could not carry it back)."""

from __future__ import annotations

from typing import Any

import pytest

from slm_server.errors import InvalidRequest
from slm_server.router.apis.infill.to_infill import check_infill, check_suffix, to_infill


def test_prompt_and_suffix_become_the_prefix_and_the_suffix_and_the_rest_goes_as_it_is() -> None:
    payload = {
        "model": "m",
        "prompt": "def f():\n",
        "suffix": "\nf()\n",
        "max_tokens": 8,
        "stop": ["\n\n"],
        "temperature": 0.2,
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": 1,
        "echo": False,
        "logprobs": None,
    }
    check_suffix(payload)
    assert to_infill(payload) == {
        "model": "m",
        "max_tokens": 8,
        "stop": ["\n\n"],
        "temperature": 0.2,
        "stream": True,
        "stream_options": {"include_usage": True},
        "input_prefix": "def f():\n",
        "input_suffix": "\nf()\n",
        "prompt": "",
    }


@pytest.mark.parametrize(
    ("prompt", "prefix"),
    [("x", "x"), (["x"], "x"), ([1, 2, 3], [1, 2, 3]), ([[1, 2]], [1, 2])],
)
def test_one_prompt_in_any_of_openai_s_forms(prompt: Any, prefix: Any) -> None:
    payload = {"prompt": prompt, "suffix": ""}
    check_suffix(payload)
    assert to_infill(payload)["input_prefix"] == prefix


@pytest.mark.parametrize("prompt", [None, ["a", "b"], [[1], [2]], [True], 5, {"a": 1}])
def test_anything_but_one_prompt_is_refused(prompt: Any) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_suffix({"prompt": prompt, "suffix": ""})
    assert caught.value.param == "prompt"


def test_llama_vscode_s_warm_up_request_passes() -> None:
    """Its ring-buffer update (updateExtraContext): empty ends, no prediction."""
    check_infill(
        {
            "input_prefix": "",
            "input_suffix": "",
            "input_extra": [{"text": "x = 1\n", "time": 1, "filename": "a.py"}],
            "prompt": "",
            "n_predict": 0,
            "samplers": [],
            "cache_prompt": True,
            "t_max_prompt_ms": 500,
            "t_max_predict_ms": 1,
        },
        "lm",
    )
    check_infill({"input_prefix": [1, "a", 2], "input_suffix": ""}, "lm")  # tokenize_mixed
