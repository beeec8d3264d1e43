"""One answer's tool calls settled before the client sees them. Pure.

:func:`settle` takes the assistant message of an answer to a request that offered
tools — whole, or a stream's held part gathered (:mod:`.stream_guard`) — and gives the
message the client is to see: each call the model made (as ``tool_calls``, as text in
the rendered form or a code block, or as a forced answer's JSON) checked against the
offered tools by :mod:`.repair`; valid calls as written, repairable ones repaired, and
for one that cannot be, the tool to ask again under a constraint (:attr:`Settled.retry`).
An answer that is still not a valid call where one was due is the model's text, with
the reason (:attr:`Verdict.failed`) — never a malformed call.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from slm_server.router.toolcalls.extract import TextCall, extract_calls
from slm_server.router.toolcalls.forcing import forced_call
from slm_server.router.toolcalls.offer import Offer
from slm_server.router.toolcalls.repair import Repaired, Unrepairable, Valid, check_call


@dataclass(slots=True)
class Verdict:
    """What was done to one answer's calls: how many reached the client, the repairs
    made (``name``, ``arguments_json``, ``arguments_schema``, ``extracted`` for a call
    read from text), whether a call was asked again, and why the answer is text in the
    place of a call (None: it is not)."""

    calls: int = 0
    repairs: list[str] = field(default_factory=list)
    retried: bool = False
    failed: str | None = None

    @property
    def changed(self) -> bool:
        return bool(self.repairs) or self.retried or self.failed is not None


@dataclass(frozen=True, slots=True)
class Settled:
    """The message as the client is to see it, its ``finish_reason`` (None: as the
    backend gave it), the offer to ask again under a constraint (None: nothing to ask)
    and, when there is one, the valid calls the answer made beside the one that failed
    (kept beside the call asked again)."""

    message: dict[str, Any]
    finish: str | None
    retry: Offer | None
    kept: tuple[dict[str, Any], ...] = ()

    def with_calls(self, calls: tuple[dict[str, Any], ...]) -> Settled:
        """This settled call answer with ``calls`` (the valid ones beside the call that
        was asked again) before its own."""
        own = tuple(self.message.get("tool_calls") or ())
        return Settled({**self.message, "tool_calls": [*calls, *own]}, self.finish, None)


def settle(
    message: dict[str, Any],
    offer: Offer,
    verdict: Verdict,
    *,
    repair: bool,
    forced: bool,
    cut: bool = False,
) -> Settled:
    """``message`` (an assistant message of chat completions) with its calls settled;
    ``forced``: its content is a constrained call's JSON; ``repair`` False: calls pass as
    the model wrote them (read out of text, however the tools reached the model);
    ``cut``: the answer ended at its token limit, so a call whose JSON had to be closed
    was cut off, not mended (a cut ``write_file`` would write half a file). A named
    choice takes a call to that tool alone; without ``parallel_tool_calls`` only the
    first call is kept."""
    text = message.get("content")
    text = text if isinstance(text, str) else ""
    written = message.get("tool_calls")
    calls: list[tuple[str | None, TextCall]] = []
    if forced:
        found = forced_call(text)
        if found is None:
            # Under the grammar only the end can be missing (the token limit): closed.
            mended = (
                extract_calls(text, offer.schemas.keys())[1] if text.lstrip()[:1] == "{" else []
            )
            if len(mended) != 1:
                return _failed(message, offer, verdict, "the forced answer is not a call", text)
            verdict.repairs.extend(("arguments_json", "cut") if cut else ("arguments_json",))
            found = (mended[0].name, mended[0].arguments)
        calls.append((None, TextCall(*found)))
        text = ""
    elif isinstance(written, list) and written:
        calls.extend(_native(written))
    elif offer.choice != "none":
        text, extracted = extract_calls(text, offer.schemas.keys())
        calls.extend((None, call) for call in extracted)
        if extracted:
            verdict.repairs.append("extracted")
    if not calls:
        if offer.forced:
            return _failed(message, offer, verdict, "the model answered text, not a call", text)
        return Settled(message, None, None)
    if not offer.parallel and len(calls) > 1:
        calls = calls[:1]
        verdict.repairs.append("dropped")
    schemas = offer.schemas
    if offer.choice == "named" and offer.named is not None:
        schemas = {offer.named: schemas[offer.named]}
    settled: list[dict[str, Any]] = []
    broken: Unrepairable | None = None
    for call_id, call in calls:
        if not repair:
            settled.append(_call(call_id, call.name, _as_text(call.arguments)))
            continue
        checked = _checked(call, offer, schemas, cut, forced)
        if isinstance(checked, Unrepairable):
            broken = broken or checked
            continue
        if isinstance(checked, Repaired):
            verdict.repairs.extend(checked.repairs)
        settled.append(_call(call_id, checked.name, checked.arguments))
    if broken is not None:
        retry = offer.only(broken.name) if broken.name in schemas else None
        if retry is None and offer.forced:
            retry = offer
        if retry is None and settled:
            # A call to no offered tool beside valid ones: those go on, it is dropped.
            verdict.repairs.append("dropped")
            broken = None
        else:
            original = message.get("content")
            shown = original if isinstance(original, str) and original else _calls_text(calls)
            return _failed(message, retry, verdict, broken.reason, shown, tuple(settled))
    verdict.calls += len(settled)
    kept = {k: v for k, v in message.items() if k not in ("content", "tool_calls")}
    out = {**kept, "content": text.strip() or None, "tool_calls": settled}
    return Settled(out, "tool_calls", None)


def _checked(
    call: TextCall, offer: Offer, schemas: dict[str, Any], cut: bool, forced: bool
) -> Valid | Repaired | Unrepairable:
    """One call checked: a call to another offered tool than a named choice names is
    not that tool misspelled; a call the model wrote freely and that was cut off at the
    token limit is not mended (a forced one is, its last value cut: ``cut``)."""
    if call.name in offer.schemas and call.name not in schemas:
        return Unrepairable(call.name, f"the choice names {offer.named!r}, not {call.name!r}")
    checked = check_call(call.name, call.arguments, schemas)
    if cut and isinstance(checked, Repaired) and "arguments_json" in checked.repairs:
        if not forced:
            return Unrepairable(checked.name, "the call was cut off at the token limit")
        # Decoded under the call's grammar: only its last value was cut; closed, and
        # said so.
        return Repaired(checked.name, checked.arguments, (*checked.repairs, "cut"))
    return checked


def _failed(
    message: dict[str, Any],
    retry: Offer | None,
    verdict: Verdict,
    reason: str,
    text: str,
    valid: tuple[dict[str, Any], ...] = (),
) -> Settled:
    """The answer as text, with the reason; the offer to ask again, when there is one,
    and the ``valid`` calls kept beside it."""
    verdict.failed = reason
    kept = {k: v for k, v in message.items() if k not in ("content", "tool_calls")}
    return Settled({**kept, "content": text}, "stop", retry, valid)


def _native(written: list[Any]) -> list[tuple[str | None, TextCall]]:
    calls: list[tuple[str | None, TextCall]] = []
    for call in written:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        call_id = call.get("id") if isinstance(call.get("id"), str) else None
        name = function.get("name")
        calls.append(
            (
                call_id,
                TextCall(name if isinstance(name, str) else "", function.get("arguments", "")),
            )
        )
    return calls


def _call(call_id: str | None, name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": call_id or "call_" + uuid.uuid4().hex[:24],
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _as_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _calls_text(calls: list[tuple[str | None, TextCall]]) -> str:
    return "\n".join(
        json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False) for _, c in calls
    )


__all__ = ["Settled", "Verdict", "settle"]
