"""The table of API shapes: one row per path, the error shape by path (the Messages
API's routes and everything under them), the emit sites in the table's order, and a
translated shape naming the shape it is sent as."""

from __future__ import annotations

from slm_server.router.apis.table import CHAT, COUNT_TOKENS, MESSAGES, RESPONSES, TABLE
from slm_server.router.call.error_shape import Dialect


def test_each_path_is_one_row() -> None:
    paths = [row.shape.path for row in TABLE]
    assert len(paths) == len(set(paths)) == 10
    assert all(TABLE.at(path) is row.shape for path, row in zip(paths, TABLE, strict=True))
    assert TABLE.at("/v1/models") is None
    assert TABLE.at("/v1/chat/completions/") is None


def test_errors_take_the_messages_shape_on_its_routes_and_under_them() -> None:
    assert TABLE.dialect_at("/v1/messages") is Dialect.ANTHROPIC
    assert TABLE.dialect_at("/v1/messages/count_tokens") is Dialect.ANTHROPIC
    assert TABLE.dialect_at("/v1/messages/batches") is Dialect.ANTHROPIC
    assert TABLE.dialect_at("/v1/messagesx") is Dialect.OPENAI
    assert TABLE.dialect_at("/v1/chat/completions") is Dialect.OPENAI
    assert TABLE.dialect_at("/v1/models") is Dialect.OPENAI


def test_the_emit_sites_are_the_shapes_then_streaming() -> None:
    assert TABLE.emit_sites == (
        "chat",
        "completions",
        "responses",
        "messages",
        "count_tokens",
        "embeddings",
        "rerank",
        "image_generations",
        "image_edits",
        "transcriptions",
        "streaming",
    )


def test_the_translated_shapes_are_sent_as_chat_completions() -> None:
    for shape in (RESPONSES, MESSAGES, COUNT_TOKENS):
        assert shape.translated_to is CHAT
        assert shape.model_types == CHAT.model_types
    assert CHAT.translated_to is None
