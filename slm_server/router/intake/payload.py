"""Reading and adjusting a client's request body before it goes upstream. Pure."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from slm_server.errors import InvalidRequest, UnsupportedMediaType
from slm_server.router.call.shape import Shape
from slm_server.router.intake import strict_json


def header_value(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first value of header ``name`` (lowercase, as ASGI gives names) among a
    request's raw ``headers``, decoded as Starlette's ``Headers`` decodes it; None
    when it is absent. (A look-up in ``Request.headers`` decodes every name before it
    and raises and catches a KeyError for an absent one.)"""
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


def check_json_type(content_type: str | None) -> None:
    """415 unless the request says its body is JSON: ``application/json`` or any
    ``application/*+json``, with or without parameters. A browser page on any site may
    POST ``text/plain``, a form, or a body with no type at all (a ``Blob`` in a
    ``no-cors`` fetch) to 127.0.0.1 without asking first; a JSON type it cannot send
    without a preflight, and every client of a JSON API sends one."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    ):
        return
    shown = media[:100] or "none"
    raise UnsupportedMediaType(
        f"This endpoint takes a JSON body: send Content-Type: application/json (not {shown})"
    )


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request's JSON object, read by :mod:`strict_json`'s rules (nothing a backend
    could fail to parse); 400 for anything else."""
    if not raw.strip():
        raise InvalidRequest("The request body is empty; send a JSON object", code="invalid_json")
    payload = strict_json.loads(raw)
    if not isinstance(payload, dict):
        raise InvalidRequest(
            f"The request body must be a JSON object, not {type(payload).__name__}",
            code="invalid_json",
        )
    return payload


def model_field(payload: dict[str, Any]) -> str:
    """The ``model`` the request names; 400 when missing or not a string."""
    model = payload.get("model")
    if model is None:
        raise InvalidRequest(
            "The request has no 'model' field; name one of GET /v1/models",
            code="missing_model",
            param="model",
        )
    if not isinstance(model, str) or not model:
        raise InvalidRequest(
            "The 'model' field must be a non-empty string", code="invalid_model", param="model"
        )
    return model


def check_fields(payload: dict[str, Any], shape: Shape, *, model_type: str) -> None:
    """Refuse values a backend would fail on with a 5xx of its own (which the watchdog
    would count against a healthy backend), as ``shape``'s checks say: images and audio
    for a model whose ``model_type`` is not multimodal
    (:func:`~slm_server.router.intake.media_parts.check_media`), on chat completions
    the tool calls, tool results and tools llama-server fails on
    (:func:`~slm_server.router.intake.tool_calls.check_tool_calls`), both a
    ``json_schema`` and a ``grammar`` (:func:`check_grammar`), a rerank ``top_n`` that
    is not a positive integer (:func:`check_top_n`)."""
    for check in shape.checks:
        check(payload, model_type)


def check_grammar(payload: dict[str, Any], _model_type: str) -> None:
    """Refuse both a ``json_schema`` and a ``grammar`` (llama-server answers them 500)."""
    if payload.get("json_schema") is not None and payload.get("grammar"):
        raise InvalidRequest(
            "Give either 'json_schema' or 'grammar', not both",
            code="invalid_request",
            param="grammar",
        )


def check_top_n(payload: dict[str, Any], _model_type: str) -> None:
    """Refuse a rerank ``top_n`` that is not a positive integer (llama-server throws on a
    negative one; 0 would rank nothing)."""
    if "top_n" in payload:
        top_n = payload["top_n"]
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
            raise InvalidRequest(
                f"'top_n' must be a positive integer, got {json.dumps(top_n)[:40]}",
                code="invalid_top_n",
                param="top_n",
            )


def is_stream(payload: dict[str, Any]) -> bool:
    return payload.get("stream") is True


def apply_defaults(
    payload: dict[str, Any], shape: Shape, sampling_defaults: dict[str, Any]
) -> bool:
    """Fill in the sampling defaults the backend cannot take as flags (the Python
    fallback's) where the request left them out. Returns whether ``payload`` changed.
    (What the registry's presets and ``chat_template_kwargs`` add is
    :mod:`~slm_server.router.intake.presets`'.)"""
    changed = False
    if shape.samples:
        for name, value in sampling_defaults.items():
            if name not in payload:
                payload[name] = value
                changed = True
    return changed


def ask_for_usage(payload: dict[str, Any], shape: Shape) -> bool:
    """Ask a streaming backend to end with a usage chunk; True when the client did not
    ask for it itself (so that chunk is kept from it)."""
    if not shape.token_stream or not is_stream(payload):
        return False
    options = payload.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    merged = dict(options) if isinstance(options, dict) else {}
    merged["include_usage"] = True
    payload["stream_options"] = merged
    return True


def ask_for_progress(payload: dict[str, Any], shape: Shape, reports: bool) -> tuple[bool, bool]:
    """Ask a stream of an engine that ``reports`` its prompt progress (llama-server's
    ``return_progress``) for it: (whether the router watches it, whether the reports are
    kept from the client, who did not ask). A translated shape's stream is asked by its
    endpoint, on the chat request it sends; its reports never reach the client."""
    if not reports or not shape.streams or not is_stream(payload):
        return False, False
    if shape.translated_to is not None:
        return True, True
    if not shape.token_stream:
        return False, False
    if payload.get("return_progress") is True:
        return True, False
    payload["return_progress"] = True
    return True, True


# What a request may ask that a whole answer carries and a stream carries otherwise.
_WHOLE_ONLY = ("logprobs", "top_logprobs", "n_probs", "post_sampling_probs", "verbose")


def gather_stream(payload: dict[str, Any], shape: Shape, reports: bool) -> bool:
    """Make a request that did not ask to stream one the router streams from an engine
    that ``reports`` its prompt progress, asking its usage and progress, to gather the
    whole answer from it (:mod:`slm_server.router.answer.gathered`): True when it did.
    Left whole when it asks for what only a whole answer carries as such (log
    probabilities, several choices, llama-server's debugging fields)."""
    if not (reports and shape.gathers) or ("stream" in payload and payload["stream"] is not False):
        return False
    if any(payload.get(name) not in (None, False, 0) for name in _WHOLE_ONLY):
        return False
    if payload.get("n", 1) != 1:
        return False
    payload["stream"] = True
    payload["stream_options"] = {"include_usage": True}
    payload["return_progress"] = True
    return True


def request_timeout(entry_timeout: float, header: str | None) -> tuple[float, bool]:
    """The request's deadline in seconds and whether the caller shortened it: the
    entry's ``default_timeout``, or less when ``X-Request-Timeout`` asks for less."""
    if header is None:
        return entry_timeout, False
    try:
        asked = float(header)
    except ValueError:
        asked = math.nan
    if not math.isfinite(asked) or asked <= 0:
        raise InvalidRequest(
            f"X-Request-Timeout must be a positive number of seconds, got {header[:40]!r}",
            code="invalid_timeout",
        )
    return (asked, True) if asked < entry_timeout else (entry_timeout, False)
