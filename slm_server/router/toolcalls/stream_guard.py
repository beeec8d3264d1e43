"""A stream's tool calls held until they are settled, its text sent as it comes. Pure.

:class:`StreamGuard` takes the chat chunks of a stream whose request offered tools and
gives the chunks the client is to see. Text goes on at once, up to where a call may
begin in it (:func:`~.extract.hold_from`); from there it is held, with every
``tool_calls`` delta (and all of a forced answer). When the answer finishes, the held
part is gathered into one message and settled (:mod:`.settle`) — asked again under a
constraint first, where it says so (:meth:`StreamGuard.retry`, by the caller) — and its
text and calls go out whole, each call in one delta, before the finish and the usage
that followed it.
"""

from __future__ import annotations

from typing import Any

from slm_server.router.toolcalls.extract import hold_from
from slm_server.router.toolcalls.offer import Offer
from slm_server.router.toolcalls.settle import Settled, Verdict, settle


class StreamGuard:
    """One stream's calls held and settled (``forced``: its text is a constrained
    call's JSON; ``render``: the tools were written into the prompt, so calls come as
    text; ``repair``: calls are checked)."""

    def __init__(self, offer: Offer, verdict: Verdict, *, repair: bool, forced: bool) -> None:
        self.offer = offer
        self.verdict = verdict
        self.repair = repair
        self.forced = forced
        self._base: dict[str, Any] = {}
        self._began = False  # whether the client has had text that is not blank
        self._held: list[str] = []  # text held since a call may have begun
        self._holding = forced
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish: str | None = None
        self._after: list[dict[str, Any]] = []  # chunks after the finish (usage)
        self._extra: dict[str, Any] = {}  # other fields of the finishing choice

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The chunks to send now for one chunk of the backend's."""
        if self._finish is not None:
            self._after.append(chunk)
            return []
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices:
            return [chunk]  # usage, or anything else without a choice
        choice = choices[0]
        if not isinstance(choice, dict):
            return [chunk]
        self._base = {k: v for k, v in chunk.items() if k not in ("choices", "usage")}
        delta = choice.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        out: dict[str, Any] = {k: v for k, v in delta.items() if k not in ("content", "tool_calls")}
        text = delta.get("content")
        if isinstance(text, str) and text:
            shown = self._text(text)
            if shown:
                out["content"] = shown
        for piece in delta.get("tool_calls") or ():
            self._call_piece(piece)
        finish = choice.get("finish_reason")
        if finish is not None:
            self._finish = finish
            self._extra = {
                k: v for k, v in choice.items() if k not in ("delta", "finish_reason", "index")
            }
            if chunk.get("usage") is not None:
                self._after.append({**self._base, "choices": [], "usage": chunk["usage"]})
        return [self._chunk(out)] if out else []

    def settle(self) -> Settled:
        """The held part settled: what the client is to see of it."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._held)}
        if self._calls:
            message["tool_calls"] = [_joined(self._calls[i]) for i in sorted(self._calls)]
        return settle(
            message,
            self.offer,
            self.verdict,
            repair=self.repair,
            forced=self.forced,
            cut=self._finish == "length",
        )

    def unsettled(self) -> list[dict[str, Any]]:
        """What was held, as text, for a stream that ends in an error before it could be
        settled (the client keeps what the model wrote)."""
        held = "".join(self._held)
        return [self._chunk({"content": held})] if held else []

    def finish(self, settled: Settled) -> list[dict[str, Any]]:
        """The chunks that end the stream: the held part as ``settled`` gives it, the
        finish, and what came after it."""
        message = settled.message
        out: list[dict[str, Any]] = []
        text = message.get("content")
        if isinstance(text, str) and text:
            out.append(self._chunk({"content": text}))
        calls = message.get("tool_calls") or []
        for index, call in enumerate(calls):
            out.append(self._chunk({"tool_calls": [{"index": index, **call}]}))
        finish = settled.finish or self._finish or "stop"
        if settled.finish is None and self._finish is None and not calls:
            finish = "stop"
        out.append(self._chunk({}, finish))
        return out + self._after

    def _text(self, text: str) -> str:
        """What of ``text`` goes to the client now; the rest is held."""
        if self._holding:  # pieces kept as they came: joined once, at the end
            self._held.append(text)
            return ""
        pending = "".join(self._held) + text  # only a marker's first characters, or blanks
        at, sure = hold_from(pending, at_start=not self._began)
        shown = pending[:at]
        self._held = [pending[at:]] if at < len(pending) else []
        self._holding = sure
        self._began = self._began or bool(shown.strip())
        return shown

    def _call_piece(self, piece: Any) -> None:
        if not isinstance(piece, dict):
            return
        index = piece.get("index", 0)
        index = index if isinstance(index, int) else 0
        call = self._calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": []}}
        )
        if isinstance(piece.get("id"), str):
            call["id"] = piece["id"]
        function = piece.get("function")
        if isinstance(function, dict):
            if isinstance(function.get("name"), str) and not call["function"]["name"]:
                call["function"]["name"] = function["name"]  # sent once, with the id
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                call["function"]["arguments"].append(arguments)
            elif arguments is not None:
                call["function"]["arguments"] = [arguments]

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        if finish is not None:
            choice.update(self._extra)
        return {**self._base, "choices": [choice]}


def _joined(call: dict[str, Any]) -> dict[str, Any]:
    """A held call with its pieces of arguments joined (an object, when one came as
    such, as it came)."""
    pieces = call["function"]["arguments"]
    if len(pieces) == 1 and not isinstance(pieces[0], str):
        arguments: Any = pieces[0]
    else:
        arguments = "".join(p for p in pieces if isinstance(p, str))
    return {**call, "function": {**call["function"], "arguments": arguments}}


__all__ = ["StreamGuard"]
