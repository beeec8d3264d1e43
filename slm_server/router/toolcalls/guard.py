"""One request's tools as the router handles them (issue 42): the request as its
backend is sent it, and the calls of its answer settled before the client sees them.

:func:`tool_guard` decides, for a chat completions request that offers tools, from the
entry's policy (``tools:`` in the registry) and whether the backend's template takes
tools: the tools rendered into the prompt (:mod:`.render`) or left to the template; a
forced call (``tool_choice`` ``required`` or named) constrained by the backend's JSON
schema decoding (:mod:`.forcing`), where the backend has it; the calls checked and
mended (:mod:`.settle`). :class:`ToolGuard` then changes the request, settles a whole
answer, and makes the :class:`~.stream_guard.StreamGuard` of a stream; a call that
cannot be mended is asked once more under a constraint, through ``ask``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from slm_server.registry.tools import ToolPolicy
from slm_server.router.toolcalls.forcing import LOOP_BREAKER, constrain
from slm_server.router.toolcalls.offer import Offer, offer_of
from slm_server.router.toolcalls.render import render_request
from slm_server.router.toolcalls.settle import Settled, Verdict, settle
from slm_server.router.toolcalls.stream_guard import StreamGuard

# The request header that turns the guard off for one request.
GUARD_HEADER: Final = b"x-slm-tool-guard"
# The servers that decode under a JSON schema (``response_format``).
# (llama-cpp-python's server reads only ``json_object`` with a schema: not among them.)
CONSTRAINED_KINDS: Final = frozenset({"llama-server"})

Mode = Literal["native", "render"]
# Sends a chat request (rendered and constrained) to the backend: its whole answer,
# None when it could not be had.
Ask = Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]]


@dataclass
class ToolGuard:
    """One request's tools: its offer, the mode that applies, whether a forced call is
    constrained, whether calls are checked, and what was done (``verdict``)."""

    offer: Offer
    mode: Mode
    constrained: bool
    repair: bool
    verdict: Verdict = field(default_factory=Verdict)
    # What a constrained request adds to the sampling (llama-server's loop breaker).
    sampling: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The mode as metrics and spans name it: ``forced`` for a call decoded under
        the schema (rendered whatever the mode), else the mode."""
        return "forced" if self.forced else self.mode

    @property
    def forced(self) -> bool:
        """Whether the answer is a constrained call's JSON."""
        return self.offer.forced and self.constrained

    def request(self, chat: dict[str, Any]) -> dict[str, Any]:
        """``chat`` as the backend is sent it (``chat`` itself when nothing changes)."""
        if self.forced:
            return constrain(render_request(chat, self.offer), self.offer, self.sampling)
        return render_request(chat, self.offer) if self.mode == "render" else chat

    def retry_request(self, chat: dict[str, Any], offer: Offer) -> dict[str, Any]:
        """``chat`` asked again for a call ``offer`` forces: under the constraint where
        the backend decodes under a schema (one that must end: the first answer may have
        looped), else by its own ``tool_choice``."""
        if self.constrained:
            return constrain(render_request(chat, offer), offer, self.sampling, bounded=True)
        choice: Any = "required"
        if offer.choice == "named":
            choice = {"type": "function", "function": {"name": offer.named}}
        sent = render_request(chat, offer) if self.mode == "render" else dict(chat)
        if self.mode != "render":
            sent["tool_choice"] = choice
        return sent

    async def whole(self, answer: dict[str, Any], chat: dict[str, Any], ask: Ask) -> dict[str, Any]:
        """A whole chat answer with its first choice's calls settled; one that cannot be
        mended asked again once (``chat`` the client's request)."""
        choices = answer.get("choices")
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            return answer
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            return answer
        cut = choice.get("finish_reason") == "length"
        settled = settle(
            message, self.offer, self.verdict, repair=self.repair, forced=self.forced, cut=cut
        )
        settled = await self._settled(settled, chat, ask)
        finish = settled.finish or choice.get("finish_reason")
        return {
            **answer,
            "choices": [{**choice, "message": settled.message, "finish_reason": finish}],
        }

    async def settled_stream(
        self, guard: StreamGuard, chat: dict[str, Any], ask: Ask
    ) -> list[dict[str, Any]]:
        """The chunks that end a guarded stream, its held part settled (asked again once
        when it cannot be mended)."""
        return guard.finish(await self._settled(guard.settle(), chat, ask))

    def stream(self) -> StreamGuard:
        return StreamGuard(self.offer, self.verdict, repair=self.repair, forced=self.forced)

    async def _settled(self, settled: Settled, chat: dict[str, Any], ask: Ask) -> Settled:
        """``settled``, or when it asks for a call again, the call asked again beside
        the valid ones it kept (the first answer's text, with its reason, when the call
        asked again is no better)."""
        if settled.retry is None or not self.repair:
            return settled
        again = await self._again(chat, settled.retry, ask)
        if again is None:
            if settled.kept:  # the valid calls go on without the one that failed
                self.verdict.calls += len(settled.kept)
                self.verdict.repairs.append("dropped")
                self.verdict.failed = None
                return Settled(
                    {**settled.message, "content": None, "tool_calls": list(settled.kept)},
                    "tool_calls",
                    None,
                )
            return settled
        self.verdict.calls += len(settled.kept)
        return again.with_calls(settled.kept)

    async def _again(self, chat: dict[str, Any], offer: Offer, ask: Ask) -> Settled | None:
        """The call asked again, settled; None when no valid call could be had (the
        first answer's text stands, with its reason)."""
        self.verdict.retried = True
        answer = await ask(self.retry_request(chat, offer))
        choices = answer.get("choices") if answer is not None else None
        choice = choices[0] if isinstance(choices, list) and choices else None
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            return None
        first = self.verdict.failed
        verdict = Verdict()
        settled = settle(message, offer, verdict, repair=True, forced=self.constrained)
        if settled.retry is not None or verdict.failed is not None or not verdict.calls:
            self.verdict.failed = first
            return None
        self.verdict.failed = None
        self.verdict.calls += verdict.calls
        self.verdict.repairs.extend(verdict.repairs)
        return settled


def tool_guard(
    chat: dict[str, Any],
    policy: ToolPolicy,
    *,
    template_takes_tools: bool | None,
    server_kind: str | None,
    off: bool = False,
) -> ToolGuard | None:
    """The guard of a chat request, or None when it offers no tools, asks for several
    choices, or the guard is off (``off``: the request's header says so)."""
    if off:
        return None
    offer = offer_of(chat)
    if offer is None or chat.get("n", 1) != 1:
        return None
    mode: Mode
    if policy.mode == "auto":
        mode = "render" if template_takes_tools is False else "native"
    else:
        mode = policy.mode
    if offer.choice == "none" and mode != "render":
        return None
    constrained = server_kind in CONSTRAINED_KINDS
    sampling = dict(LOOP_BREAKER) if server_kind == "llama-server" else {}
    repair = policy.repair and offer.choice != "none"
    return ToolGuard(offer, mode, constrained, repair, sampling=sampling)


__all__ = ["CONSTRAINED_KINDS", "GUARD_HEADER", "Ask", "ToolGuard", "tool_guard"]
