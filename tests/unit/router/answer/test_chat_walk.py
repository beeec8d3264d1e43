"""The one walk over chat chunks both translated API shapes take: the first choice's
delta in its order, its finish reason, and tool call pieces read once."""

from __future__ import annotations

from typing import Any

from slm_server.router.answer.chat_walk import CallPiece, walk_chunk, walk_delta


def told(delta: dict[str, Any]) -> list[bytes]:
    return walk_delta(
        delta,
        reasoning=lambda text: [b"r:" + text.encode()],
        content=lambda text: [b"c:" + text.encode()],
        tool_call=lambda piece: [f"t:{piece.index}:{piece.name}:{piece.arguments}".encode()],
    )


def test_only_the_first_choice_is_walked_and_its_finish_reason_kept() -> None:
    chunk = {
        "choices": [
            {"index": 1, "delta": {"content": "other"}, "finish_reason": "length"},
            {"index": 0, "delta": {"content": "mine"}, "finish_reason": None},
            "not a choice",
        ]
    }
    assert walk_chunk(chunk, told) == ([b"c:mine"], None)
    chunk["choices"].append({"delta": {}, "finish_reason": "stop"})  # index 0 by default
    assert walk_chunk(chunk, told) == ([b"c:mine"], "stop")
    assert walk_chunk({"choices": "nope"}, told) == ([], None)


def test_a_delta_is_told_reasoning_then_content_then_each_call() -> None:
    delta = {
        "tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{"}}, 7],
        "content": "hi",
        "reasoning_content": "think",
    }
    assert told(delta) == [b"r:think", b"c:hi", b"t:0:f:{"]


def test_a_call_piece_keeps_only_what_it_says() -> None:
    assert CallPiece.of({"index": 2, "id": "c1", "function": {"name": "f", "arguments": ""}}) == (
        CallPiece(2, "c1", "f", "")
    )
    assert CallPiece.of({"index": "2", "id": "", "function": {"name": "", "arguments": 3}}) == (
        CallPiece(None, None, None, None)
    )
    assert CallPiece.of({"function": "not an object"}) == CallPiece(None, None, None, None)
