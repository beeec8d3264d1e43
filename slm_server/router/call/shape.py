"""What the router knows of one API shape (chat completions, the Messages API, ...):
a row of the table of shapes, :data:`~slm_server.router.apis.table.TABLE`, where every
shape is declared with its path and the object that serves it.

The layers below the table never name a path: they are handed the request's
:class:`Shape` (the orchestrator's argument, or ``Exchange.shape``, set at the door) and
read what they need from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from slm_server.contracts.verdicts import Outcome, classify_status
from slm_server.router.call.error_shape import Dialect

# A check of a request body before it is admitted, given the model's ``model_type``:
# raises a 4xx naming the field for what the backend would fail on.
Check = Callable[[dict[str, Any], str], None]


# A streamed answer's keep-alives: an SSE comment, which every parser skips; the
# Messages API's own ``ping`` event.
COMMENT: Final = b": keep-alive\n\n"
PING: Final = b'event: ping\ndata: {"type": "ping"}\n\n'


@dataclass(frozen=True, eq=False, slots=True)
class Shape:
    """One API shape the router serves, at one path.

        ``name`` is its span's and metrics' ``slm.emit_path`` and its presets' row;
        ``operation`` its OpenTelemetry ``gen_ai.operation.name``; ``model_types`` the
        entries' ``model_type`` that serve it; ``streams``: whether ``"stream": true``
        makes its answer a stream (elsewhere, an embeddings request say, it is no stream
        and arms no first-byte timer); ``token_stream``: a streamed answer is OpenAI's
        chunks of tokens (emitted as ``streaming``, asked for its usage chunk);
        ``samples``: the backend's sampling defaults that it cannot take as flags apply;
        ``form``: its body is a multipart form, forwarded byte for byte; ``errors``: the
        shape its errors (and those of every path under it) take;
        ``checks``: what its body is checked for before it is admitted, in order;
        ``translated_to``: the shape its requests are translated to for a backend without
        its own (the Messages API's, the Responses API's: chat completions), None when
        always sent as they are; ``keepalive``: what a streamed answer's client is sent
        while it waits (an SSE comment; the Messages API's ``ping`` event; None: nothing, for
    a stream of JSON lines, which has no line a client skips); ``gathers``:
        a whole answer of this shape can be gathered from its stream (chat completions,
        see :mod:`slm_server.router.answer.gathered`); ``stream_default``: a request that
        says nothing of ``stream`` streams (Ollama's API)."""

    name: str
    path: str
    operation: str
    model_types: frozenset[str]
    streams: bool = False
    token_stream: bool = False
    samples: bool = False
    form: bool = False
    errors: Dialect = Dialect.OPENAI
    checks: tuple[Check, ...] = ()
    translated_to: Shape | None = None
    keepalive: bytes | None = COMMENT
    gathers: bool = False
    stream_default: bool = False
    # ``raw``: served at every path under ``path`` (``/upstream/<model>/<engine path>``),
    # each request relayed to the engine as the client wrote it: the model named by the
    # path, the body unread. ``defaults_model``: a request that names no ``model`` goes
    # to the registry's default (the entry with ``infill_default``: llama.vscode names
    # none). ``statuses``: the watchdog's verdict on the engine's status answers.
    raw: bool = False
    defaults_model: bool = False
    statuses: Callable[[int], Outcome] = classify_status


__all__ = ["COMMENT", "PING", "Check", "Shape"]
