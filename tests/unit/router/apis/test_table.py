"""The table of API shapes: one row per path, the error shape by path (the Messages
API's routes and everything under them), the emit sites in the table's order, and a
translated shape naming the shape it is sent as."""

from __future__ import annotations

from slm_server.router.apis.table import CHAT, COUNT_TOKENS, MESSAGES, RESPONSES, TABLE, UPSTREAM
from slm_server.router.call.error_shape import Dialect


def test_each_path_is_one_row() -> None:
    paths = [row.shape.path for row in TABLE]
    assert len(paths) == len(set(paths)) == 16
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


def test_errors_take_ollama_s_shape_on_every_path_under_api() -> None:
    for path in ("/api/chat", "/api/tags", "/api/show", "/api/pull", "/api/blobs/sha256:x", "/api"):
        assert TABLE.dialect_at(path) is Dialect.OLLAMA
    assert TABLE.dialect_at("/apix") is Dialect.OPENAI
    assert TABLE.dialect_at("/") is Dialect.OPENAI


def test_the_raw_passthrough_is_served_under_its_path_and_nowhere_else() -> None:
    for path in ("/upstream/", "/upstream/m/tokenize", "/upstream/org/m/v1/models"):
        assert TABLE.at(path) is UPSTREAM
    assert UPSTREAM.raw and not any(row.shape.raw for row in TABLE if row.shape is not UPSTREAM)
    assert TABLE.at("/upstream") is None
    assert TABLE.at("/v1/upstream/m/x") is None
    assert TABLE.dialect_at("/upstream/m/tokenize") is Dialect.OPENAI


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
        "infill",
        "upstream",
        "ollama_chat",
        "ollama_generate",
        "ollama_embed",
        "ollama_embeddings",
        "streaming",
    )


def test_the_translated_shapes_are_sent_as_chat_completions() -> None:
    for shape in (RESPONSES, MESSAGES, COUNT_TOKENS):
        assert shape.translated_to is CHAT
        assert shape.model_types == CHAT.model_types
    assert CHAT.translated_to is None
