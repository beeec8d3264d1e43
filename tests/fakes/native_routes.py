"""llama-server's own routes, as the fake backend answers them: ``/infill`` and
``/completion`` (its native answer, whole or streamed as its own events, with no
``[DONE]``), ``/tokenize``, ``/detokenize``, ``/apply-template``, and ``/echo/...``
(any method: what the request was, for the passthrough tests).

Shapes as llama-server gives them at the pinned commit (``to_json_non_oaicompat`` of
``server-task.cpp``; ``post_infill`` of ``server-context.cpp``): ``content``, ``stop``,
``stop_type``, ``tokens_predicted``, ``tokens_evaluated``, ``timings``... An infill
request without ``input_prefix`` or ``input_suffix`` is answered 500, as llama-server
answers it; a model said to have no fill-in-the-middle tokens, 501.

The middle the fake fills in names the ends it was given (``middle(<last 20 characters
of the prefix>|<first 20 of the suffix>)``), so that a test sees which text went where.
"""

from __future__ import annotations

import json
import time
from typing import Any

JSON = dict[str, Any]
NATIVE_PATHS = ("/infill", "/completion", "/tokenize", "/detokenize", "/apply-template")
NO_FIM = (
    "Infill is not supported by this model: prefix token is missing. suffix token is "
    "missing. middle token is missing. "
)


def sse(data: JSON) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def error(status: int, message: str, kind: str) -> JSON:
    return {"error": {"code": status, "message": message, "type": kind}}


def middle(body: JSON) -> str:
    """What the fake fills in between ``input_prefix`` (and ``prompt``) and
    ``input_suffix``."""
    prefix = str(body.get("input_prefix", "")) + str(body.get("prompt", ""))
    return f"middle({prefix[-20:]}|{str(body.get('input_suffix', ''))[:20]})"


def _tokens(text: str) -> int:
    return max(1, len(text.split()))


def final(content: str, body: JSON, model: str, predicted: int, evaluated: int) -> JSON:
    """llama-server's last (or whole) native answer."""
    limit = body.get("n_predict", body.get("max_tokens"))
    stop_type = "limit" if isinstance(limit, int) and 0 <= limit <= predicted else "eos"
    return {
        "index": 0,
        "content": content,
        "tokens": [],
        "id_slot": 0,
        "stop": True,
        "model": model,
        "tokens_predicted": predicted,
        "tokens_evaluated": evaluated,
        "generation_settings": {"n_predict": limit if isinstance(limit, int) else -1},
        "prompt": "",
        "has_new_line": "\n" in content,
        "truncated": False,
        "stop_type": stop_type,
        "stopping_word": "",
        "tokens_cached": 0,
        "timings": {"prompt_n": evaluated, "predicted_n": predicted, "predicted_ms": 1.0},
    }


def partial(content: str, predicted: int, evaluated: int, progress: JSON | None = None) -> JSON:
    """One of llama-server's native stream events (a prompt progress report when
    ``progress`` is given)."""
    chunk: JSON = {
        "index": 0,
        "content": content,
        "tokens": [],
        "stop": False,
        "id_slot": 0,
        "tokens_predicted": predicted,
        "tokens_evaluated": evaluated,
    }
    if progress is not None:
        chunk["prompt_progress"] = progress
    return chunk


def generated(path: str, body: JSON, reply: str | None) -> tuple[str, int]:
    """The text a native request is answered with, and its prompt's token count."""
    if path == "/infill":
        prompt = str(body.get("input_prefix", "")) + str(body.get("input_suffix", ""))
        return (reply if reply is not None else middle(body)), _tokens(prompt)
    prompt = str(body.get("prompt", ""))
    return (reply if reply is not None else f"fake completion of: {prompt[-40:]}"), _tokens(prompt)


def pieces(text: str, count: int) -> list[str]:
    """``text`` in at most ``count`` pieces (one at least)."""
    step = max(1, -(-len(text) // max(1, count)))
    return [text[at : at + step] for at in range(0, len(text), step)] or [""]


def native_events(path: str, body: JSON, model: str, chunks: int, reply: str | None) -> list[bytes]:
    """A native stream's content events and its last event, as SSE."""
    text, evaluated = generated(path, body, reply)
    parts = pieces(text, chunks)
    events = [sse(partial(part, n + 1, evaluated)) for n, part in enumerate(parts)]
    return [*events, sse(final("", body, model, len(parts), evaluated))]


def progress_report(per_mille: int, total: int) -> bytes:
    processed = total * per_mille // 1000
    report = {"total": total, "cache": 0, "processed": processed, "time_ms": 1.0}
    return sse(partial("", 0, total, report))


def whole(path: str, body: JSON, model: str, reply: str | None) -> JSON:
    text, evaluated = generated(path, body, reply)
    return final(text, body, model, _tokens(text), evaluated)


def invalid_infill(body: JSON) -> JSON | None:
    """llama-server's 500 for an infill body it reads past its own checks."""
    for name in ("input_prefix", "input_suffix"):
        if name not in body:
            message = f"[json.exception.out_of_range.403] key '{name}' not found"
            return error(500, message, "server_error")
    return None


def tokenize(body: JSON) -> JSON:
    """Each character's code point as its token id (so ``/detokenize`` reverses it)."""
    content = body.get("content", "")
    if not isinstance(content, str):
        return error(400, '"content" must be a string', "invalid_request_error")
    ids = [ord(c) for c in content]
    if body.get("with_pieces"):
        return {"tokens": [{"id": i, "piece": chr(i)} for i in ids]}
    return {"tokens": ids}


def detokenize(body: JSON) -> JSON:
    tokens = body.get("tokens", [])
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        return error(400, '"tokens" must be a list of ids', "invalid_request_error")
    return {"content": "".join(chr(t) for t in tokens)}


def apply_template(body: JSON) -> JSON:
    messages = body.get("messages", [])
    turns = [
        f"<|im_start|>{m.get('role')}\n{m.get('content')}<|im_end|>\n"
        for m in messages
        if isinstance(m, dict)
    ]
    return {"prompt": "".join(turns) + "<|im_start|>assistant\n"}


def echo(method: str, path: str, query: str, raw: bytes, headers: dict[str, str]) -> JSON:
    """What a request to ``/echo/...`` was."""
    return {
        "method": method,
        "path": path,
        "query": query,
        "body": raw.decode("utf-8", "replace"),
        "content_type": headers.get("content-type"),
        "at": time.time(),
    }


__all__ = [
    "NATIVE_PATHS",
    "NO_FIM",
    "apply_template",
    "detokenize",
    "echo",
    "error",
    "invalid_infill",
    "middle",
    "native_events",
    "progress_report",
    "tokenize",
    "whole",
]
