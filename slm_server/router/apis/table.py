"""The table of API shapes: every shape the router proxies, declared once, with its path
(those every model server also serves under the same name are
:mod:`~slm_server.contracts.engine_paths`', which the supervisor's canary asks too),
the model types that serve it, whether it streams, its span and metric names, the checks
its body takes, and the endpoint object that serves it. ``app.py`` builds the routes from
it; the orchestrator (:mod:`~slm_server.router.proxy`) hands each request to its row's
endpoint through :class:`Endpoint`, the one interface they all have.

Adding a shape is a folder under ``apis/`` with its endpoint, and one row here (see
``docs/development.md``, "Adding an API shape").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from starlette.responses import Response
from starlette.types import ASGIApp

from slm_server.contracts import engine_paths
from slm_server.contracts.verdicts import classify_engine_status
from slm_server.errors import GatewayError
from slm_server.router.answer.relay import Relay
from slm_server.router.apis.infill.endpoint import InfillApi, SuffixCompletions
from slm_server.router.apis.infill.to_infill import check_infill
from slm_server.router.apis.messages.endpoint import CountTokensApi, MessagesApi
from slm_server.router.apis.ollama.endpoint import (
    OllamaChatApi,
    OllamaEmbedApi,
    OllamaEmbeddingsApi,
    OllamaGenerateApi,
)
from slm_server.router.apis.passthrough.endpoint import PassThrough
from slm_server.router.apis.responses.endpoint import ResponsesApi
from slm_server.router.apis.upstream.endpoint import UpstreamApi
from slm_server.router.call.admitted_call import Call
from slm_server.router.call.error_shape import Dialect
from slm_server.router.call.shape import PING, Shape
from slm_server.router.intake.media_parts import check_chat_media, check_responses_media
from slm_server.router.intake.payload import check_grammar, check_top_n
from slm_server.router.intake.reception import Intake
from slm_server.router.intake.tool_calls import check_chat_tool_calls

TEXT = frozenset({"lm", "multimodal"})

CHAT = Shape(
    "chat",
    engine_paths.CHAT,
    "chat",
    TEXT,
    streams=True,
    token_stream=True,
    samples=True,
    checks=(check_chat_media, check_chat_tool_calls, check_grammar),
    gathers=True,
)
COMPLETIONS = Shape(
    "completions",
    engine_paths.COMPLETIONS,
    "text_completion",
    TEXT,
    streams=True,
    token_stream=True,
    samples=True,
    checks=(check_grammar,),
)
RESPONSES = Shape(
    "responses",
    "/v1/responses",
    "chat",
    TEXT,
    streams=True,
    checks=(check_responses_media, check_grammar),
    translated_to=CHAT,
)
MESSAGES = Shape(
    "messages",
    "/v1/messages",
    "chat",
    TEXT,
    streams=True,
    errors=Dialect.ANTHROPIC,
    translated_to=CHAT,
    keepalive=PING,
)
COUNT_TOKENS = Shape(
    "count_tokens",
    "/v1/messages/count_tokens",
    "count_tokens",
    TEXT,
    errors=Dialect.ANTHROPIC,
    translated_to=CHAT,
)
EMBEDDINGS = Shape("embeddings", engine_paths.EMBEDDINGS, "embeddings", frozenset({"embeddings"}))
RERANK = Shape(
    "rerank", engine_paths.RERANK, "rerank", frozenset({"rerank"}), checks=(check_top_n,)
)
IMAGE_GENERATIONS = Shape(
    "image_generations",
    "/v1/images/generations",
    "image_generation",
    frozenset({"image-generation"}),
)
IMAGE_EDITS = Shape(
    "image_edits", "/v1/images/edits", "image_edit", frozenset({"image-edit"}), form=True
)
TRANSCRIPTIONS = Shape(
    "transcriptions",
    "/v1/audio/transcriptions",
    "transcription",
    frozenset({"whisper"}),
    streams=True,
    form=True,
)
# Ollama's API: its errors, and those of every path under /api (its own routes too:
# /api/tags, /api/show, ...), are Ollama's; its answers stream by default, as JSON
# lines, which have no keep-alive a client would skip.
OLLAMA = "/api"
OLLAMA_CHAT = Shape(
    "ollama_chat",
    "/api/chat",
    "chat",
    TEXT,
    streams=True,
    errors=Dialect.OLLAMA,
    translated_to=CHAT,
    keepalive=None,
    stream_default=True,
)
OLLAMA_GENERATE = Shape(
    "ollama_generate",
    "/api/generate",
    "text_completion",
    TEXT,
    streams=True,
    errors=Dialect.OLLAMA,
    translated_to=CHAT,
    keepalive=None,
    stream_default=True,
)
OLLAMA_EMBED = Shape(
    "ollama_embed",
    "/api/embed",
    "embeddings",
    frozenset({"embeddings"}),
    errors=Dialect.OLLAMA,
)
OLLAMA_EMBEDDINGS = Shape(
    "ollama_embeddings",
    "/api/embeddings",
    "embeddings",
    frozenset({"embeddings"}),
    errors=Dialect.OLLAMA,
)

# llama-server's fill-in-the-middle route (llama.vscode's), a streamed answer in its own
# events; a request that names no model goes to the registry's infill_default.
INFILL = Shape(
    "infill",
    engine_paths.INFILL,
    "text_completion",
    TEXT,
    streams=True,
    token_stream=True,
    checks=(check_infill, check_grammar),
    defaults_model=True,
)
# Raw passthrough: /upstream/<model>/<engine path>, any method, to every kind of model.
UPSTREAM = Shape(
    "upstream",
    "/upstream/",
    "upstream",
    frozenset(
        {"lm", "multimodal", "embeddings", "rerank", "image-generation", "image-edit", "whisper"}
    ),
    streams=True,
    raw=True,
    statuses=classify_engine_status,
)


class Endpoint(Protocol):
    """What serves one API shape: its checks before the request waits for a slot, then
    the call, once admitted, sent to the backend and answered."""

    def before_admission(self, intake: Intake) -> Intake | Response:
        """``intake`` checked (400 naming the field for what cannot be served) and,
        for a translated shape, with its translation; or the whole answer, when it
        needs no backend."""

    async def send(self, call: Call, intake: Intake) -> Response | ASGIApp:
        """The admitted call sent to its backend, and the answer."""

    def stream_error(self, intake: Intake, error: GatewayError) -> bytes:
        """``error`` as the in-band end of a stream of this shape that began (its head
        and keep-alives went out) before its answer did."""


# An endpoint is built from its row's shape and the router's relay.
EndpointClass = Callable[[Shape, Relay], Endpoint]


@dataclass(frozen=True)
class Row:
    """One shape and the class of the endpoint that serves it."""

    shape: Shape
    endpoint: EndpointClass


class Table:
    """The rows, and each shape by its path."""

    def __init__(self, *rows: Row, prefixes: Mapping[str, Dialect] | None = None) -> None:
        self.rows = rows
        self._shapes = {row.shape.path: row.shape for row in rows}
        self._raw = tuple(row.shape for row in rows if row.shape.raw)  # served under their path
        # The paths whose errors are not OpenAI's, longest first: each, and under it;
        # ``prefixes`` adds whole families of routes (Ollama's ``/api``).
        own = [(row.shape.path, row.shape.errors) for row in rows]
        own += list((prefixes or {}).items())
        own = [(path, dialect) for path, dialect in own if dialect is not Dialect.OPENAI]
        self._dialects = sorted(own, key=lambda item: -len(item[0]))

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)

    def at(self, path: str) -> Shape | None:
        """The shape served at ``path`` exactly, or under it for a raw shape's
        (``/upstream/...``); None for any other path."""
        found = self._shapes.get(path)
        if found is None:
            for shape in self._raw:
                if path.startswith(shape.path):
                    return shape
        return found

    def dialect_at(self, path: str) -> Dialect:
        """The shape errors on ``path`` take: that of the shape served there, or of the
        shape whose path ``path`` is under (the Messages API's for
        ``/v1/messages/batches``); OpenAI's elsewhere."""
        for prefix, dialect in self._dialects:
            if path == prefix or path.startswith(prefix + "/"):
                return dialect
        return Dialect.OPENAI

    @property
    def emit_sites(self) -> tuple[str, ...]:
        """Every distinct ``slm.emit_path``: one per shape, and ``streaming`` for a
        streamed answer of OpenAI's token chunks."""
        return (*(row.shape.name for row in self.rows), "streaming")


TABLE = Table(
    Row(CHAT, PassThrough),
    Row(COMPLETIONS, SuffixCompletions),
    Row(RESPONSES, ResponsesApi),
    Row(MESSAGES, MessagesApi),
    Row(COUNT_TOKENS, CountTokensApi),
    Row(EMBEDDINGS, PassThrough),
    Row(RERANK, PassThrough),
    Row(IMAGE_GENERATIONS, PassThrough),
    Row(IMAGE_EDITS, PassThrough),
    Row(TRANSCRIPTIONS, PassThrough),
    Row(INFILL, InfillApi),
    Row(UPSTREAM, UpstreamApi),
    Row(OLLAMA_CHAT, OllamaChatApi),
    Row(OLLAMA_GENERATE, partial(OllamaGenerateApi, completions=COMPLETIONS, infill=INFILL)),
    Row(OLLAMA_EMBED, OllamaEmbedApi),
    Row(OLLAMA_EMBEDDINGS, OllamaEmbeddingsApi),
    prefixes={OLLAMA: Dialect.OLLAMA},
)

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "COUNT_TOKENS",
    "EMBEDDINGS",
    "IMAGE_EDITS",
    "IMAGE_GENERATIONS",
    "INFILL",
    "MESSAGES",
    "OLLAMA_CHAT",
    "OLLAMA_EMBED",
    "OLLAMA_EMBEDDINGS",
    "OLLAMA_GENERATE",
    "RERANK",
    "RESPONSES",
    "TABLE",
    "TEXT",
    "TRANSCRIPTIONS",
    "UPSTREAM",
    "Endpoint",
    "EndpointClass",
    "Row",
    "Table",
]
