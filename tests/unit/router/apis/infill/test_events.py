"""llama-server's infill answers (its own shape) in OpenAI's completions shape: whole,
and streamed event by event, checked against the openai package's types."""

from __future__ import annotations

from typing import Any

from slm_server.router.apis.infill.events import InfillStreamTranslator
from slm_server.router.apis.infill.from_infill import Head, infill_to_completion
from tests.openai_shapes import strict_completion, strict_completion_chunks

LAST = {
    "content": "",
    "stop": True,
    "stop_type": "limit",
    "tokens_predicted": 3,
    "tokens_evaluated": 11,
    "timings": {"predicted_ms": 1.5},
}


def test_a_whole_answer() -> None:
    head = Head("m", "cmpl-1", 7)
    answer = infill_to_completion({**LAST, "content": "x = 1", "stop_type": "eos"}, head)
    assert answer == {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 7,
        "model": "m",
        "choices": [{"text": "x = 1", "index": 0, "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
    }
    strict_completion(answer)


def stream(include_usage: bool) -> list[dict[str, Any]]:
    translator = InfillStreamTranslator(Head("m"), include_usage=include_usage)
    chunks = []
    for native in ({"content": "a", "stop": False}, {"content": "b", "stop": False}, LAST):
        chunks += translator.feed(native)
    return chunks + translator.finish()


def test_a_stream_ends_with_its_finish_and_the_usage_when_asked() -> None:
    chunks = stream(include_usage=True)
    strict_completion_chunks(chunks)
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == ["a", "b", ""]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert len({c["id"] for c in chunks}) == 1
    assert stream(include_usage=False)[-1]["choices"][0]["finish_reason"] == "length"
