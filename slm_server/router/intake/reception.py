"""Taking a request in: its body read within the limits, parsed, routed to a model by
its ``model`` field, checked and given the model's defaults."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from typing import Any

from starlette.requests import Request

from slm_server.contracts.records import BackendState
from slm_server.errors import BackendUnavailable, PayloadTooLarge
from slm_server.registry.schema import ModelSpec
from slm_server.router.call.backend_state import StateSource
from slm_server.router.call.drain import Drain
from slm_server.router.call.exchange import Exchange
from slm_server.router.call.fast_path import fast_path_of
from slm_server.router.call.shape import Shape
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.intake.body_budget import Held
from slm_server.router.intake.engine_target import EngineTarget, engine_target
from slm_server.router.intake.forms import read_form_fields
from slm_server.router.intake.parsed_cost import parsed_cost
from slm_server.router.intake.payload import (
    apply_defaults,
    ask_for_progress,
    ask_for_usage,
    check_fields,
    check_json_type,
    gather_stream,
    header_value,
    model_field,
    parse_body,
)
from slm_server.router.intake.presets import SHAPES, Rules, apply_preset, cap_binds, resolve
from slm_server.router.intake.strict_json import dumps_body
from slm_server.router.upstream.client import RETRY_AFTER_SECONDS

# The engines that report their prompt progress on a stream when asked.
PROGRESS_KINDS = frozenset({"llama-server"})

# Bodies larger than this are parsed and re-serialised in a thread: 30 MiB of JSON
# takes the better part of a second, which would stall every other request.
OFF_LOOP_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Intake:
    """A request taken in: the model it names, its parsed fields and the bytes it came
    as, whether the router asked a stream for usage the client did not, the alias the
    client named the model by, whether the preset's cap, not the client's own bound,
    limits the output, whether the router changed the fields (an alias, a preset,
    defaults, usage), so that :meth:`body` serialises them anew, and the request
    translated to the shape it is sent as (a Messages request's chat completions, set
    by its endpoint before admission); whether the router asked the engine for its
    prompt progress, and whether those reports are kept from the client; whether the
    engine reports it at all, and whether the router streams a request that did not
    ask to stream, to gather its whole answer."""

    spec: ModelSpec
    payload: dict[str, Any]
    raw: bytes
    hidden_usage: bool
    alias: str | None = None
    capped: bool = False
    rewritten: bool = False
    translated: dict[str, Any] | None = None
    watch_progress: bool = False
    hidden_progress: bool = False
    reports: bool = False
    gathered: bool = False
    # What the endpoint made of the request before it was admitted, for its ``send``
    # (an Ollama request's translation).
    prepared: object | None = None
    # A raw request's method, engine path and query (``/upstream/<model>/...``).
    target: EngineTarget | None = None

    async def body(self) -> bytes:
        """The request in its own shape as the backend is sent it: the bytes as they
        came, or the changed fields serialised (off the event loop when large). Built
        only by the paths that send it: a translated request (Messages, Responses on a
        backend without its own) sends its translation instead, and an agent's 90 KB
        body is not serialised for nothing."""
        if not self.rewritten:
            return self.raw
        if len(self.raw) > OFF_LOOP_BYTES:
            return await asyncio.to_thread(dumps_body, self.payload)
        return dumps_body(self.payload)


class Reception:
    """Reads, parses and routes requests for one registry."""

    def __init__(
        self, registry: Registry, states: StateSource, drain: Drain, max_body: int
    ) -> None:
        self.registry = registry
        self.states = states
        self.drain = drain
        self.max_body = max_body
        self._rules: dict[tuple[int, str | None], Rules] = {}

    def rules(self, spec: ModelSpec, alias: str | None) -> Rules:
        """The preset rules for requests naming ``spec``'s entry by its id or ``alias``
        (resolved once per name)."""
        key = (spec.index, alias)
        found = self._rules.get(key)
        if found is None:
            found = self._rules[key] = resolve(spec.entry, alias)
        return found

    def forget_rules(self) -> None:
        """The registry was replaced: its presets are resolved again as named."""
        self._rules = {}

    def sampling_defaults(self, spec: ModelSpec) -> dict[str, Any]:
        """The request fields the launcher published for this backend (the Python
        fallback's sampling defaults); none without a running launcher."""
        return _defaults(self.states.planned(spec.role, spec.entry.port))

    async def body(self, request: Request, held: Held) -> bytes:
        """The request body, refused with 413 past ``SLM_MAX_BODY_MB`` and with 503 past
        the budget for bodies in flight; both on ``Content-Length`` before reading."""
        limit = self.max_body
        declared = header_value(request.scope["headers"], b"content-length")
        stated = int(declared) if declared is not None and declared.isdigit() else None
        if stated is not None and stated > limit:
            raise _too_large(limit)
        if stated is not None:
            held.take(stated)
        door = fast_path_of(request.scope)
        whole = door.take_body() if door is not None else None
        if whole is not None:  # all in already: one piece, no ASGI message
            if len(whole) > limit:
                raise _too_large(limit)
            if stated is None or len(whole) > stated:
                held.take(len(whole))
            return whole
        parts: list[bytes] = []
        size = 0
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise _too_large(limit)
            if stated is None or size > stated:
                held.take(len(part))
            parts.append(part)
        return b"".join(parts)

    async def take(self, request: Request, shape: Shape, exchange: Exchange, held: Held) -> Intake:
        """The request in ``shape`` read, routed, checked and completed."""
        if self.drain.draining:
            raise BackendUnavailable(
                "The router is shutting down and takes no new requests",
                code="shutting_down",
                retry_after=RETRY_AFTER_SECONDS,
            )
        if shape.raw:
            return await self._take_raw(request, shape, exchange, held)
        if not shape.form:
            check_json_type(header_value(request.scope["headers"], b"content-type"))
        raw = await self.body(request, held)
        if not shape.form:
            held.take_parsed(parsed_cost(raw))
        if shape.form:
            # Only read for its routing fields: the form goes upstream byte for byte.
            content_type = header_value(request.scope["headers"], b"content-type")
            payload = await read_form_fields(raw, content_type)
        elif len(raw) > OFF_LOOP_BYTES:  # a large body is parsed off the event loop
            payload = await asyncio.to_thread(parse_body, raw)
        else:
            payload = parse_body(raw)
        exchange.note_request(payload)
        if shape.defaults_model and payload.get("model") is None:
            name = self.registry.default_model()  # llama.vscode's /infill names none
        else:
            name = model_field(payload)
        spec = self.registry.route(name, shape)
        alias = self.registry.alias(name)
        exchange.spec = spec
        changed = capped = False
        if not shape.form:
            if name != spec.entry.id:  # an alias, a tag: the backend knows it by its id
                payload["model"] = spec.entry.id
                changed = True
            names = SHAPES.get(shape.name)
            if names is not None:
                rules = self.rules(spec, alias)
                capped = cap_binds(payload, names, rules)
                preset = apply_preset(payload, names, rules)
                if preset is not payload:
                    payload, changed = preset, True
                    exchange.note_sampling(payload)
        # Checked as it will be sent: a preset may add what the backend would fail on.
        check_fields(payload, shape, model_type=spec.entry.model_type)
        # What the launcher planned for the backend, read once: its request defaults and
        # whether its engine reports prompt progress.
        planned = self.states.planned(spec.role, spec.entry.port)
        changed = apply_defaults(payload, shape, _defaults(planned)) or changed
        hidden_usage = ask_for_usage(payload, shape)
        reports = planned is not None and planned.kind in PROGRESS_KINDS
        watched, hidden = ask_for_progress(payload, shape, reports)
        gathered = gather_stream(payload, shape, reports)
        if gathered:
            watched = hidden = True
        changed = changed or hidden_usage or gathered or (hidden and not shape.translated_to)
        return Intake(
            spec,
            payload,
            raw,
            hidden_usage,
            alias,
            capped,
            changed,
            watch_progress=watched,
            hidden_progress=hidden,
            reports=reports,
            gathered=gathered,
        )

    async def _take_raw(
        self, request: Request, shape: Shape, exchange: Exchange, held: Held
    ) -> Intake:
        """A request relayed as the client wrote it (``/upstream/<model>/<path>``,
        :mod:`.engine_target`): routed by the model its path names, its body read within
        the limits and passed on unchanged, looked at only for ``"stream": true``."""
        target = engine_target(request.scope, shape.path, self.registry.lookup)
        raw = await self.body(request, held)
        spec = self.registry.route(target.model, shape)
        exchange.spec = spec
        held.take_parsed(parsed_cost(raw))
        exchange.note_request({"model": target.model, "stream": await _asks_stream(raw)})
        alias = self.registry.alias(target.model)
        return Intake(spec, {}, raw, False, alias, target=target)

    async def for_backend(self, intake: Intake, spec: ModelSpec, shape: Shape) -> Intake:
        """The request as ``spec``'s backend is sent it: a remote that knows the model
        by another name (``remote_model``) gets its name in ``model``. A multipart form
        goes byte for byte, its ``model`` unchanged."""
        entry = spec.entry
        if not entry.remote or entry.upstream_model == intake.payload.get("model"):
            return intake
        if shape.form:
            return intake
        payload = {**intake.payload, "model": entry.upstream_model}
        return replace(intake, payload=payload, rewritten=True)


async def _asks_stream(raw: bytes) -> bool:
    """Whether a raw body is a JSON object asking ``"stream": true`` (a body that is
    not, malformed or nested past the parser's depth, streams nothing)."""
    if b'"stream"' not in raw:
        return False
    try:
        if len(raw) > OFF_LOOP_BYTES:  # a large body is parsed off the event loop
            value = await asyncio.to_thread(json.loads, raw)
        else:
            value = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict) and value.get("stream") is True


def _defaults(planned: BackendState | None) -> dict[str, Any]:
    """The request fields a launcher's plan gives a backend's requests (the Python
    fallback's sampling defaults); none without a plan."""
    return dict(planned.request_defaults) if planned is not None else {}


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"The request body is larger than the router's limit of {limit} bytes (SLM_MAX_BODY_MB)"
    )


__all__ = ["OFF_LOOP_BYTES", "Intake", "Reception"]
