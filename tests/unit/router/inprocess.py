"""The router in-process, with no process and no socket: ``create_app`` handed a
scripted upstream transport, a settable source of backend states and an event sink
that keeps what it hears, driven by a small client that can also leave halfway:
through plain ASGI, or through the router's real door protocol on a fake connection
(:mod:`tests.unit.router.door_client`), the path every real request takes. :data:`VIA`
says which: ``"asgi"`` unless a test (or the ``via`` fixture, which runs a test both
ways) says ``"door"``.

A script is an async function of what the router sent (:class:`Sent`) returning a
:class:`FakeResponse`: status, headers, and body steps — bytes, an exception to raise
while reading, or an :class:`asyncio.Event` to wait for (a backend that stalls).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.types import Message

from slm_server.contracts.applied_registry import RegistryStamp, Retiring, version_of
from slm_server.contracts.commands import Command, CommandError, Reply
from slm_server.contracts.events import EVENTS
from slm_server.contracts.records import BackendState
from slm_server.http1 import Headers
from slm_server.registry.schema import ModelSpec, RegistryFile, parse_registry
from slm_server.router.app import Dependencies, create_app, gates_for
from slm_server.router.call.drain import Drain
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.observe.metrics import Metrics
from slm_server.router.observe.telemetry import Telemetry
from slm_server.router.reload.follower import POLL_SECONDS, Follower
from slm_server.router.upstream.client import Probe, UpstreamResponse
from slm_server.settings import Settings
from tests.fakes.memory import ScriptedMemory
from tests.registry_entries import registry_entry, registry_yaml
from tests.unit.router.door_client import through_door

Step = bytes | BaseException | asyncio.Event
Via = Literal["asgi", "door"]
# How :func:`call` reaches the app: plain ASGI, or the door on a fake connection.
VIA: ContextVar[Via] = ContextVar("slm_inprocess_via", default="asgi")


@dataclass(frozen=True)
class Sent:
    """One request the router sent upstream."""

    spec: ModelSpec
    path: str
    body: bytes
    headers: Mapping[str, str]
    method: str = "POST"

    def json(self) -> Any:
        return json.loads(self.body)


class FakeResponse:
    """An opened backend response whose body is played from ``steps``."""

    def __init__(
        self,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        steps: Iterable[Step] = (),
    ) -> None:
        self.status_code = status
        self.headers = Headers({k.lower(): v for k, v in (headers or {}).items()})
        self.steps = list(steps)
        self.closed = asyncio.Event()
        self.sink: Callable[[bytes], None] | None = None
        self.paused = False
        self.spliced = False  # its body was handed to a sink (the door's splice)

    @property
    def complete(self) -> bool:
        return all(isinstance(step, bytes) for step in self.steps)

    async def receive(self) -> bytes:
        while self.steps:
            step = self.steps.pop(0)
            if isinstance(step, asyncio.Event):
                await step.wait()
            elif isinstance(step, BaseException):
                raise step
            elif step:
                return step
        return b""

    def spliceable(self) -> FakeResponse:
        """Spliceable, as the router's own HTTP client's responses are: through the
        door, a stream is spliced (its steps played by :meth:`settle`)."""
        return self

    def splice(self, sink: Callable[[bytes], None]) -> None:
        self.sink = sink
        self.spliced = True

    def unsplice(self) -> None:
        self.sink = None

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    async def settle(self) -> bool:
        """Play the steps into the sink until they end (True, closed) or the sink
        paused reading (False), as :meth:`slm_server.http1.Response.settle` does."""
        while True:
            if self.paused:
                return False
            if not self.steps:
                self.close()
                return True
            step = self.steps.pop(0)
            if isinstance(step, asyncio.Event):
                await step.wait()
            elif isinstance(step, BaseException):
                self.close()
                raise step
            elif step and self.sink is not None:
                self.sink(step)

    def close(self) -> None:
        self.closed.set()

    async def aclose(self) -> None:
        self.close()


def whole(body: Any, status: int = 200, content_type: str = "application/json") -> FakeResponse:
    """A complete answer: ``body`` as JSON unless it is bytes already."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return FakeResponse(status, {"content-type": content_type}, [raw])


def sse(*events: Any, done: bool = True, then: Iterable[Step] = ()) -> FakeResponse:
    """A stream of ``data:`` events (objects as JSON), ``[DONE]`` at the end."""
    steps: list[Step] = [b"data: " + json.dumps(event).encode() + b"\n\n" for event in events]
    steps += list(then)
    if done:
        steps.append(b"data: [DONE]\n\n")
    return FakeResponse(200, {"content-type": "text/event-stream"}, steps)


Script = Callable[[Sent], Awaitable[FakeResponse]]


def held_until(release: asyncio.Event, answer: Any, roles: Iterable[str] | None = None) -> Script:
    """A backend that answers ``answer`` whole, only once ``release`` is set (only the
    models of ``roles`` wait, when given)."""
    waiting = None if roles is None else frozenset(roles)

    async def script(sent: Sent) -> FakeResponse:
        if waiting is None or sent.spec.role in waiting:
            await release.wait()
        return whole(answer)

    return script


class FakeTransport:
    """The upstream transport, answering every request with the script."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.sent: list[Sent] = []
        self.responses: list[FakeResponse] = []
        self.closed = False
        # GET pages by (role, path): (status, body), or an Event never set (a hang).
        self.pages: dict[tuple[str, str], tuple[int, bytes] | asyncio.Event] = {}
        self.targets: list[tuple[ModelSpec, ...]] = []  # what each reload retargeted to

    async def open(
        self,
        spec: ModelSpec,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        method: str = "POST",
    ) -> UpstreamResponse:
        sent = Sent(spec, path, body, dict(headers), method)
        self.sent.append(sent)
        response = await self.script(sent)
        self.responses.append(response)
        return response

    async def probe(self, spec: ModelSpec) -> Probe:
        return Probe("healthy", http_status=200)

    async def fetch(
        self, spec: ModelSpec, path: str, timeout: float, max_bytes: int
    ) -> tuple[int, bytes] | None:
        answer = self.pages.get((spec.role, path))
        if isinstance(answer, asyncio.Event):
            await answer.wait()  # an engine that never answers
            return None
        return answer

    def retarget(self, models: tuple[ModelSpec, ...]) -> None:
        self.targets.append(models)

    async def aclose(self) -> None:
        self.closed = True


class FakeStates:
    """Backend states as a test sets them; no launcher unless one is said to run, and
    no registry stamp nor retiring backend unless a test publishes them."""

    def __init__(self) -> None:
        self.states: dict[tuple[str, int], BackendState] = {}
        self.alive = False
        self.registry: RegistryStamp | None = None
        self.retired: list[Retiring] = []
        # While set, what get() answers: the real view's file read up to 20 ms ago
        # (current() reads ``states``, the file as it is now).
        self.stale: dict[tuple[str, int], BackendState] | None = None

    def get(self, role: str, port: int) -> BackendState | None:
        return (self.stale if self.stale is not None else self.states).get((role, port))

    def current(self, role: str, port: int) -> BackendState | None:
        return self.states.get((role, port))

    def planned(self, role: str, port: int) -> BackendState | None:
        state = self.get(role, port)
        return state if state is not None and self.alive else None

    def launcher_alive(self) -> bool:
        return self.alive

    def stamp(self) -> RegistryStamp | None:
        return self.registry

    def retiring(self) -> list[Retiring]:
        return self.retired


def backend_state(spec: ModelSpec, state: str, **fields: Any) -> BackendState:
    """A published state for ``spec``, as the supervisor would write it."""
    values: dict[str, Any] = {
        "role": spec.role,
        "model_id": spec.entry.id,
        "backend": spec.entry.backend,
        "port": spec.entry.port,
        "state": state,
        "pid": 4242 if state in ("ready", "loading", "unloading") else None,
        "since": 0.0,
        "started_at": None,
        "exit_status": None,
        "restarts": 0,
        "reason": None,
        "log_path": "logs/x.log",
        "load": spec.entry.load,
        **fields,
    }
    return BackendState(**values)


class FakeSupervisor:
    """Carries out load and unload commands on :class:`FakeStates`: a load is ready
    ``load_seconds`` later (or fails, when ``fail_load`` names why), an unload is done
    ``unload_seconds`` later. ``footprints`` by role; every command is kept. A reload
    or a retirement is answered by ``on_reload`` or ``on_retired`` (ok when unset);
    with ``unreachable`` set, every command fails as a supervisor that is not there."""

    def __init__(self, states: FakeStates, specs: Iterable[ModelSpec]) -> None:
        self.states = states
        self.specs = {spec.role: spec for spec in specs}
        self.commands: list[Command] = []
        self.load_seconds = 0.05
        self.unload_seconds = 0.02
        self.fail_load: str | None = None
        self.footprints: dict[str, int] = {}
        self.loads = 0
        self.on_reload: Callable[[], Reply] | None = None
        self.on_retired: Callable[[Command], Reply] | None = None
        self.unreachable = False
        states.alive = True
        for spec in self.specs.values():
            first = "unloaded" if spec.entry.load == "on_demand" else "ready"
            self.publish(spec, first)

    def publish(self, spec: ModelSpec, state: str, **fields: Any) -> None:
        footprint = self.footprints.get(spec.role)
        self.states.states[(spec.role, spec.entry.port)] = backend_state(
            spec, state, footprint_mb=footprint, memory_estimate_mb=footprint, **fields
        )

    def state(self, role: str) -> str:
        spec = self.specs[role]
        return self.states.states[(role, spec.entry.port)].state

    def sent(self, op: str) -> list[Command]:
        """The commands of ``op`` received, in order."""
        return [command for command in self.commands if command.op == op]

    async def __call__(self, command: Command) -> Reply:
        self.commands.append(command)
        if self.unreachable:
            raise CommandError("the supervisor cannot be reached (a test said so)")
        if command.op == "reload":
            return self.on_reload() if self.on_reload is not None else Reply(True)
        if command.op == "retired":
            return self.on_retired(command) if self.on_retired is not None else Reply(True)
        spec = self.specs[command.role]
        loop = asyncio.get_running_loop()
        if command.op == "load":
            if self.state(spec.role) != "unloaded":
                return Reply(False, self.state(spec.role), "not unloaded")
            self.loads += 1
            self.publish(spec, "loading")
            if self.fail_load is not None:
                why = self.fail_load
                loop.call_later(
                    self.load_seconds, lambda: self.publish(spec, "restarting", reason=why)
                )
            else:
                loop.call_later(self.load_seconds, self.publish, spec, "ready")
            return Reply(True, "loading")
        self.publish(spec, "unloading")
        loop.call_later(self.unload_seconds, self.publish, spec, "unloaded")
        return Reply(True, "unloading")


@dataclass
class FakeEvents:
    """The watchdog's event sink, keeping every event."""

    events: list[dict[str, Any]] = field(default_factory=list)

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        if event not in EVENTS:  # as the real log refuses it
            raise ValueError(f"unknown watchdog event {event!r}")
        record = {"event": event, **{k: v for k, v in fields.items() if v is not None}}
        self.events.append(record)
        return record

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]


REGISTRY = """
models:
  chat:
    id: org/chat-model
    backend: llamacpp
    port: 18001
    model_path: models/chat.gguf
    default_timeout: {timeout}
    max_concurrency: {concurrency}
    max_queue: {queue}
    quantization: Q4_1
{more}"""


@dataclass
class Router:
    """An in-process router and its fakes."""

    app: Starlette
    transport: FakeTransport
    states: FakeStates
    events: FakeEvents
    supervisor: FakeSupervisor
    deps: Dependencies
    settings: Settings
    registry: RegistryFile
    memory: ScriptedMemory  # the machine's free memory as the router reads it

    @property
    def spec(self) -> ModelSpec:
        return self.registry.models[0]

    def gate_active(self) -> int:
        return self.deps.gates[self.spec.role].active

    def spec_of(self, role: str) -> ModelSpec:
        return next(spec for spec in self.registry.models if spec.role == role)

    @property
    def follower(self) -> Follower:
        """What keeps the router on the supervisor's applied registry."""
        follower = self.app.state.follower
        assert isinstance(follower, Follower)
        return follower


def registry_text(
    *,
    timeout: float = 5.0,
    concurrency: int = 2,
    queue: int = 4,
    more: str = "",
    chat: str = "",
) -> str:
    """The registry :func:`make_router` serves: one chat model, ``chat`` added to its
    entry and ``more`` entries after it."""
    text = REGISTRY.format(timeout=timeout, concurrency=concurrency, queue=queue, more=more)
    if chat:
        text = text.replace("    quantization: Q4_1\n", f"    quantization: Q4_1\n{chat}", 1)
    return text


def entry_text(role: str, port: int, *extra: str, **fields: Any) -> str:
    """One more model for :func:`registry_text` (its ``more``): ``<role>-model`` on
    ``port``, written as the chat model is (the file ``models/<role>.gguf``, timeout 5 s,
    Q4_1); ``fields`` add to it or override it, and the ``extra`` YAML lines follow."""
    written = {"model_path": f"models/{role}.gguf", "default_timeout": 5, "quantization": "Q4_1"}
    return registry_yaml(role, registry_entry(f"{role}-model", port, **(written | fields)), *extra)


def make_router(
    tmp_path: Path,
    script: Script,
    *,
    timeout: float = 5.0,
    concurrency: int = 2,
    queue: int = 4,
    env: Mapping[str, str] | None = None,
    more: str = "",
    chat: str = "",
    follow_seconds: float = POLL_SECONDS,
) -> Router:
    """A router for one llama.cpp chat model, answering through ``script``; it looks
    at the supervisor's applied registry every ``follow_seconds``."""
    environ = {
        "SLM_ENV_FILE": str(tmp_path / "no.env"),
        "SLM_BACKEND_LOG_DIR": str(tmp_path / "logs"),
        "SLM_OTEL_ENABLED": "false",
        "SLM_WATCHDOG_FAILURE_THRESHOLD": "2",
        **(env or {}),
    }
    settings = Settings.from_env(environ)
    text = registry_text(
        timeout=timeout, concurrency=concurrency, queue=queue, more=more, chat=chat
    )
    registry_file = parse_registry(text, tmp_path / "models.yaml")
    registry = Registry(registry_file.models)
    transport, states, events = FakeTransport(script), FakeStates(), FakeEvents()
    memory = ScriptedMemory()
    supervisor = FakeSupervisor(states, registry.enabled)
    if not any(spec.entry.load == "on_demand" for spec in registry.enabled):
        states.states.clear()  # no launcher: nothing published
        states.alive = False
    deps = Dependencies(
        upstream=transport,
        states=states,
        events=events,
        gates=gates_for(registry),
        telemetry=Telemetry(settings.telemetry, environ={}),
        metrics=Metrics(registry, states),
        drain=Drain(settings.serving.drain_timeout_seconds),
        commander=supervisor,
        memory=memory,
    )
    app = create_app(
        settings,
        registry_file,
        deps,
        registry,
        version=version_of(text),
        follow_seconds=follow_seconds,
    )
    return Router(app, transport, states, events, supervisor, deps, settings, registry_file, memory)


async def until(condition: Callable[[], object], what: str, seconds: float = 5.0) -> None:
    """Wait, yielding to the loop, until ``condition()`` holds; fail naming ``what``
    after ``seconds``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():
        assert loop.time() < deadline, f"never: {what}"
        await asyncio.sleep(0.005)


@dataclass
class Answer:
    """What the client received."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)
    complete: bool = False

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[Any]:
        """The ``data:`` payloads of an SSE answer (``[DONE]`` as the string)."""
        found: list[Any] = []
        for line in self.body.decode().splitlines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                found.append(data if data == "[DONE]" else json.loads(data))
        return found


async def call(
    app: Starlette,
    path: str,
    body: Any,
    *,
    headers: Mapping[str, str] | None = None,
    method: str = "POST",
    leave: asyncio.Event | None = None,
    answer: Answer | None = None,
    via: Via | None = None,
) -> Answer:
    """One request to the app (``path`` may carry a query string), through plain ASGI
    or through the door (``via``, else :data:`VIA`). ``body`` is sent as JSON unless it
    is bytes; the client disconnects when ``leave`` is set (else only after the
    answer); ``answer`` is filled as the response arrives, for a test to watch."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    path, _, query = path.partition("?")
    sent_headers = {
        "host": "127.0.0.1:8000",
        "content-type": "application/json",
        "content-length": str(len(raw)),
        **(headers or {}),
    }
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in sent_headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    gone = leave or asyncio.Event()
    delivered = False
    got = answer or Answer()
    if (via or VIA.get()) == "door":
        head = f"{method} {path}{'?' + query if query else ''} HTTP/1.1\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in sent_headers.items())
        await through_door(app, head.encode("latin-1") + b"\r\n" + raw, got, gone)
        return got

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if gone.is_set():
            return  # as uvicorn does: what is sent to a client that left is dropped
        if message["type"] == "http.response.start":
            got.status = message["status"]
            got.headers = {k.decode(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            if message.get("body"):
                got.chunks.append(message["body"])
            if not message.get("more_body", False):
                got.complete = True

    try:
        await app(scope, receive, send)
    finally:
        gone.set()  # whatever still watches for the client sees it leave
    return got


__all__ = [
    "VIA",
    "Answer",
    "FakeResponse",
    "FakeTransport",
    "Router",
    "Sent",
    "call",
    "held_until",
    "make_router",
    "registry_text",
    "sse",
    "whole",
]


@asynccontextmanager
async def serving(router: Router) -> AsyncIterator[Router]:
    """``router``'s app with its lifespan started (and ended on leaving)."""
    async with router.app.router.lifespan_context(router.app):
        yield router


def run(scenario: Awaitable[None]) -> None:
    """Run an async test body, failing it after 10 s instead of hanging."""
    asyncio.run(asyncio.wait_for(scenario, 10))
