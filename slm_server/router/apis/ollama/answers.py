"""A chat completion (or a text completion, for a raw ``/api/generate``), whole or as
a stream of chunks, translated into Ollama's answer: one JSON object, or a stream of
JSON lines, each a piece of the answer with ``"done": false``, then one with
``"done": true``, the reason, the token counts and the durations. Pure but for the
clock.

Ollama's durations are nanoseconds: ``total_duration`` is the router's own, from the
request's arrival; ``load_duration`` the wait for an on-demand load; the prompt's and
the answer's are the engine's (llama-server's ``timings``), and where an engine gives
none, the answer's is the rest of the time and the prompt's 0. ``prompt_eval_count``
is the whole prompt, cached or not (llama-server's ``usage.prompt_tokens``).

A tool call is sent whole, once its arguments are, in a line of its own before the
last (Ollama's tool calls carry their arguments as an object, never as pieces).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from slm_server.router.answer.chat_walk import CallPiece, reasoning_text, walk_chunk, walk_delta
from slm_server.router.apis.messages.from_chat import tool_input

# Chat finish reasons as Ollama's done_reason.
DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop", "function_call": "stop"}


_last_stamp: list[Any] = [0, ""]  # the millisecond last stamped, and its stamp


def now_stamp() -> str:
    """The time now as Ollama writes ``created_at`` (RFC 3339, UTC), made once per
    millisecond (a stream's pieces come faster)."""
    now = time.time()
    millisecond = int(now * 1000)
    if _last_stamp[0] != millisecond:
        stamp = datetime.fromtimestamp(now, UTC).isoformat(timespec="microseconds")
        _last_stamp[:] = [millisecond, stamp.replace("+00:00", "Z")]
    stamp_now: str = _last_stamp[1]
    return stamp_now


def line(payload: dict[str, Any]) -> bytes:
    """One line of an Ollama stream."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ms(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


@dataclass
class Clock:
    """When the request came (``time.perf_counter()``) and how long it waited for its
    model's load."""

    started: float
    load_seconds: float | None = None


def final_fields(
    clock: Clock, usage: Any, timings: Any, finish_reason: Any, *, called: bool = False
) -> dict[str, Any]:
    """The last object's fields: ``done``, the reason, the counts and the durations."""
    total = max(0.0, time.perf_counter() - clock.started)
    load = min(total, clock.load_seconds or 0.0)
    usage = usage if isinstance(usage, dict) else {}
    timings = timings if isinstance(timings, dict) else {}
    prompt = _count(usage.get("prompt_tokens"))
    if prompt is None:
        done, cached = _count(timings.get("prompt_n")), _count(timings.get("cache_n"))
        prompt = None if done is None else done + (cached or 0)
    answer = _count(usage.get("completion_tokens"))
    if answer is None:
        answer = _count(timings.get("predicted_n"))
    prompt_ms, answer_ms = _ms(timings.get("prompt_ms")), _ms(timings.get("predicted_ms"))
    if answer_ms is None:
        prompt_ms, answer_ms = 0.0, (total - load) * 1000
    found = DONE_REASONS.get(finish_reason) if isinstance(finish_reason, str) else None
    reason = "stop" if called else (found or "stop")
    return {
        "done": True,
        "done_reason": reason,
        "total_duration": int(total * 1e9),
        "load_duration": int(load * 1e9),
        "prompt_eval_count": prompt or 0,
        "prompt_eval_duration": int((prompt_ms or 0.0) * 1e6),
        "eval_count": answer or 0,
        "eval_duration": int(answer_ms * 1e6),
    }


def ollama_call(call_id: str, index: int, name: str, arguments: Any) -> dict[str, Any]:
    """One tool call as Ollama gives it: its arguments an object."""
    function = {"index": index, "name": name, "arguments": tool_input(arguments)}
    return {"id": call_id, "function": function}


def _logprobs(choice: dict[str, Any]) -> list[Any] | None:
    found = choice.get("logprobs")
    content = found.get("content") if isinstance(found, dict) else None
    return content if isinstance(content, list) else None


@dataclass(frozen=True, slots=True)
class Kind:
    """Which answer: ``/api/chat``'s (a ``message``) or ``/api/generate``'s (a
    ``response``), from a chat completion or, raw, a text completion, or (``native``)
    llama-server's own infill answer (``content``, ``stop_type``, token counts)."""

    chat: bool
    completions: bool = False
    native: bool = False


def native_usage(native: dict[str, Any]) -> dict[str, Any]:
    """llama-server's own token counts as chat usage."""
    return {
        "prompt_tokens": native.get("tokens_evaluated"),
        "completion_tokens": native.get("tokens_predicted"),
    }


def native_finish(native: dict[str, Any]) -> str:
    return "length" if native.get("stop_type") == "limit" else "stop"


def _piece(kind: Kind, model: str, text: str, thought: str = "") -> dict[str, Any]:
    head: dict[str, Any] = {"model": model, "created_at": now_stamp()}
    if kind.chat:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thought:
            message["thinking"] = thought
        head["message"] = message
    else:
        head["response"] = text
        if thought:
            head["thinking"] = thought
    head["done"] = False
    return head


def whole_answer(answer: dict[str, Any], kind: Kind, model: str, clock: Clock) -> dict[str, Any]:
    """Ollama's whole answer for a whole chat (or text, or infill) completion."""
    if kind.native:
        content = answer.get("content")
        out = _piece(kind, model, content if isinstance(content, str) else "")
        out.update(
            final_fields(clock, native_usage(answer), answer.get("timings"), native_finish(answer))
        )
        return out
    choices = answer.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    choice = choice if isinstance(choice, dict) else {}
    calls: list[dict[str, Any]] = []
    if kind.completions:
        text = choice.get("text")
        thought = ""
    else:
        message = choice.get("message")
        message = message if isinstance(message, dict) else {}
        text = message.get("content")
        thought = reasoning_text(message)
        made = message.get("tool_calls")
        for index, call in enumerate(made if isinstance(made, list) else []):
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                assert isinstance(call, dict)
                given = call.get("id")
                call_id = given if isinstance(given, str) and given else f"call_{index}"
                calls.append(
                    ollama_call(call_id, index, function["name"], function.get("arguments"))
                )
    out = _piece(kind, model, text if isinstance(text, str) else "", thought)
    if calls and kind.chat:  # /api/generate offers no tools: a call is no answer of its
        out["message"]["tool_calls"] = calls
    logprobs = _logprobs(choice)
    if logprobs is not None:
        out["logprobs"] = logprobs
    out.update(
        final_fields(
            clock,
            answer.get("usage"),
            answer.get("timings"),
            choice.get("finish_reason"),
            called=bool(calls),
        )
    )
    return out


@dataclass
class _Call:
    call_id: str
    name: str = ""
    arguments: list[str] = field(default_factory=list)


def _quoted(text: str) -> str:
    """``text`` as a JSON string: as it is between quotes when nothing in it needs an
    escape (a token of plain text), else as ``json.dumps`` writes it."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'
    return json.dumps(text, ensure_ascii=False)


class _Pieces:
    """The lines of a stream's pieces, written from their fixed parts: a piece of text
    is most of a stream, and each is one line."""

    def __init__(self, kind: Kind, model: str) -> None:
        head = '{"model":' + json.dumps(model, ensure_ascii=False) + ',"created_at":"'
        self.head = head
        if kind.chat:
            self.text = '","message":{"role":"assistant","content":'
            self.thought = '","message":{"role":"assistant","content":"","thinking":'
            self.tail = '},"done":false}\n'
        else:
            self.text = '","response":'
            self.thought = '","response":"","thinking":'
            self.tail = ',"done":false}\n'

    def said(self, text: str) -> bytes:
        quoted = _quoted(text)
        return (self.head + now_stamp() + self.text + quoted + self.tail).encode()

    def thought_of(self, text: str) -> bytes:
        quoted = _quoted(text)
        return (self.head + now_stamp() + self.thought + quoted + self.tail).encode()


def _only_text(chunk: dict[str, Any]) -> str | None:
    """The text of a chunk whose one choice's delta is text alone (with its role, at
    most) and that ends nothing; None for any other chunk."""
    choices = chunk.get("choices")
    if type(choices) is not list or len(choices) != 1:
        return None
    choice = choices[0]
    if type(choice) is not dict or choice.get("finish_reason") is not None:
        return None
    if choice.get("index", 0) != 0:
        return ""
    delta = choice.get("delta")
    if type(delta) is not dict or not delta.keys() <= {"content", "role"}:
        return None
    text = delta.get("content")
    return text if type(text) is str else None


class OllamaLines:
    """Turns one chat (or text) completions stream into Ollama's stream of JSON lines:
    :meth:`feed` per chunk, then :meth:`finish`, or :meth:`error` when it broke."""

    def __init__(self, kind: Kind, model: str, clock: Clock) -> None:
        self.kind = kind
        self.model = model
        self.clock = clock
        self._pieces = _Pieces(kind, model)
        self._calls: dict[int, _Call] = {}
        self._usage: Any = None
        self._timings: Any = None
        self._finish: Any = None
        self._closed = False

    def start(self) -> list[bytes]:
        return []

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        if self._closed:
            return []
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        if chunk.get("timings") is not None:
            self._timings = chunk["timings"]
        if self.kind.native:
            return self._native_chunk(chunk)
        if self.kind.completions:
            return self._text_chunk(chunk)
        said = _only_text(chunk)
        if said is not None:  # most of a stream: one piece of text, nothing else
            return [self._pieces.said(said)] if said else []
        told, finish = walk_chunk(chunk, self._delta)
        if finish is not None:
            self._finish = finish
        return told

    def _native_chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        """One event of llama-server's own stream: a piece of ``content``; the last
        (``stop``) carries the counts and timings."""
        if chunk.get("stop") is True:
            self._usage = native_usage(chunk)
            self._finish = native_finish(chunk)
        content = chunk.get("content")
        return [self._pieces.said(content)] if isinstance(content, str) and content else []

    def _text_chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        lines: list[bytes] = []
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            text = choice.get("text")
            if isinstance(text, str) and text:
                lines.append(self._pieces.said(text))
            if isinstance(choice.get("finish_reason"), str):
                self._finish = choice["finish_reason"]
        return lines

    def _delta(self, delta: dict[str, Any]) -> list[bytes]:
        return walk_delta(
            delta,
            reasoning=lambda text: [self._pieces.thought_of(text)],
            content=lambda text: [self._pieces.said(text)],
            tool_call=self._call,
        )

    def _call(self, piece: CallPiece) -> list[bytes]:
        position = piece.index if piece.index is not None else len(self._calls)
        call = self._calls.get(position)
        if call is None:
            call = self._calls[position] = _Call(f"call_{position}")
        if piece.call_id is not None:
            call.call_id = piece.call_id
        if piece.name is not None and not call.name:
            call.name = piece.name
        if piece.arguments is not None:
            call.arguments.append(piece.arguments)
        return []

    def finish(self) -> list[bytes]:
        if self._closed:
            return []
        self._closed = True
        lines: list[bytes] = []
        if self._calls and self.kind.chat:
            calls = [
                ollama_call(c.call_id, i, c.name or "unnamed", "".join(c.arguments))
                for i, c in enumerate(self._calls[k] for k in sorted(self._calls))
            ]
            told = _piece(self.kind, self.model, "")
            told["message"]["tool_calls"] = calls
            lines.append(line(told))
        last = _piece(self.kind, self.model, "")
        last.update(
            final_fields(
                self.clock, self._usage, self._timings, self._finish, called=bool(self._calls)
            )
        )
        lines.append(line(last))
        return lines

    def error(self, message: str) -> list[bytes]:
        if self._closed:
            return []
        self._closed = True
        return [line({"error": message})]


__all__ = [
    "Clock",
    "Kind",
    "OllamaLines",
    "final_fields",
    "line",
    "now_stamp",
    "ollama_call",
    "whole_answer",
]
