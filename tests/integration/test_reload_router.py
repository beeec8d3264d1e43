"""A real router process following a reloaded registry, in front of fake backends. This
test process plays the supervisor: it publishes the state file (as a running launcher,
its own pid) and the applied registry's snapshot by hand, and answers the command
socket (:class:`SupervisorSocket`, which records every command). A new stamp adds a
model to ``/v1/models``; a stream in flight on the entry it removed completes, and only
then is the retiring backend told ``retired``; ``POST /v1/config/reload`` answers once
the router routes by what the supervisor applied, and relays a refusal."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from slm_server.contracts import commands
from slm_server.contracts.applied_registry import (
    RegistryStamp,
    Retiring,
    version_of,
    write_snapshot,
)
from slm_server.contracts.commands import Command, Reply
from slm_server.contracts.records import BackendState, process_create_time, write_state
from tests import one_shot
from tests.fakes.control import FakeBackend
from tests.processes import RunningRouter, StartRouter, poll
from tests.registry_entries import registry_entry

# Its fakes start once for the module: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_reload_router")

FAKE_ROLES = ("alpha", "beta")
CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hi"}]
OLD_PID = 4242  # the retiring backend's process, as the state file names it


class SupervisorSocket:
    """The supervisor's command socket for ``log_dir``, answered in a thread of this
    process: every command kept, a reload answered by ``on_reload``, the rest ok."""

    def __init__(self, log_dir: Path) -> None:
        self.path = commands.socket_path(log_dir)
        self.received: list[Command] = []
        self.on_reload: Callable[[], Reply] = lambda: Reply(False, error="no reload scripted")
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _answer(self, command: Command) -> Reply:
        with self._lock:
            self.received.append(command)
        return self.on_reload() if command.op == "reload" else Reply(True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(commands.serve(self.path, self._answer))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            # A connection still open (the router's, idle) is a task of the loop: ended
            # here, its socket closed, rather than left to the garbage collector (CI once:
            # a ResourceWarning failing whichever test ran next).
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(asyncio.sleep(0))  # the transports' close callbacks
            self._loop.run_until_complete(server.wait_closed())
            self._loop.close()

    def sent(self, op: str) -> list[Command]:
        with self._lock:
            return [command for command in self.received if command.op == op]

    def __enter__(self) -> SupervisorSocket:
        self._thread.start()
        assert self._ready.wait(10), "the command socket did not start"
        return self

    def __exit__(self, *_exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self.path.unlink(missing_ok=True)


class Supervisor:
    """What the supervisor publishes for the router of ``workdir``: backends ready, the
    registry in force (its snapshot, then its stamp) and the backends it retires."""

    def __init__(self, workdir: Path, fakes: dict[str, FakeBackend]) -> None:
        self.log_dir = workdir / "logs"
        self.fakes = fakes
        self.created = process_create_time(os.getpid())

    def backend(self, role: str) -> BackendState:
        return BackendState(
            role=role,
            model_id=role,
            backend="llamacpp",
            port=self.fakes[role].port,
            state="ready",
            pid=os.getpid(),
            since=time.time(),
            started_at=time.time(),
            exit_status=None,
            restarts=0,
            reason=None,
            log_path="-",
        )

    def publish(
        self, text: str, generation: int, retiring: tuple[Retiring, ...] = ()
    ) -> RegistryStamp:
        write_snapshot(self.log_dir, text)
        stamp = RegistryStamp(version_of(text), generation, time.time(), "/srv/models.yaml")
        roles = yaml.safe_load(text)["models"]
        write_state(
            self.log_dir / "backends.state.json",
            os.getpid(),
            [self.backend(role) for role in roles],
            self.created,
            registry=stamp,
            retiring=list(retiring),
        )
        return stamp


def registry_of(fakes: dict[str, FakeBackend], *roles: str) -> str:
    """A registry of the fakes of ``roles``, as text."""
    models = {role: registry_entry(role, fakes[role].port) for role in roles}
    return yaml.safe_dump({"models": models})


def model_ids(router: str) -> list[str]:
    listed = one_shot.get(f"{router}/v1/models", timeout=5).json()
    return [model["id"] for model in listed["data"]]


def health(router: str) -> dict[str, Any]:
    answer: dict[str, Any] = one_shot.get(f"{router}/health", timeout=5).json()
    return answer


def chat(router: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": HELLO}
    return one_shot.post(f"{router}{CHAT}", json=body, timeout=10)


@contextmanager
def supervised_router(
    tmp_path: Path, fakes: dict[str, FakeBackend], start_router: StartRouter, *roles: str
) -> Iterator[tuple[RunningRouter, Supervisor, SupervisorSocket]]:
    """A router started on the fakes of ``roles``, with this process as its supervisor
    (publishing generation 1 of the file the router read) and its command socket."""
    models = {role: registry_entry(role, fakes[role].port) for role in roles}
    router = start_router(models, workdir=tmp_path, SLM_OTEL_ENABLED="false")
    supervisor = Supervisor(tmp_path, fakes)
    with SupervisorSocket(supervisor.log_dir) as socket:
        text = (tmp_path / "models.yaml").read_text(encoding="utf-8")
        supervisor.publish(text, generation=1)
        poll(
            lambda: health(router.url)["registry"]["generation"] == 1,
            10,
            "the router to follow the supervisor's first registry",
        )
        assert health(router.url)["registry"]["version"] == version_of(text)
        yield router, supervisor, socket


def test_a_reload_adds_a_model_and_a_stream_on_the_removed_one_completes_before_it_retires(
    tmp_path: Path, fakes: dict[str, FakeBackend], start_router: StartRouter
) -> None:
    fakes["alpha"].script(chunks=40, chunk_interval_seconds=0.1)
    with (
        supervised_router(tmp_path, fakes, start_router, "alpha") as (router, supervisor, socket),
        httpx.Client(base_url=router.url, timeout=30.0, trust_env=False) as client,
        client.stream(
            "POST", CHAT, json={"model": "alpha", "messages": HELLO, "stream": True}
        ) as stream,
    ):
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))
        alpha = fakes["alpha"].port
        gone = Retiring("alpha", "alpha", alpha, OLD_PID, "removed", time.time(), time.time() + 30)
        stamp = supervisor.publish(registry_of(fakes, "beta"), 2, retiring=(gone,))
        poll(lambda: model_ids(router.url) == ["beta"], 10, "the reload to be followed")
        retired_early = socket.sent("retired")
        # Read after the commands: the stream was in flight when they were read.
        in_flight = not fakes["alpha"].requests()[0]["completed"]
        refused = chat(router.url, "alpha")
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "model_not_found"
        assert chat(router.url, "beta").status_code == 200
        rest = [line for line in lines if line]
        assert in_flight and retired_early == []
        assert stream.status_code == 200
        assert rest[-1] == "data: [DONE]"
        pieces = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
        text = "".join(p["choices"][0]["delta"].get("content") or "" for p in pieces)
        assert text.count("tok") >= 39  # the first piece was read before the reload
        poll(
            lambda: socket.sent("retired") == [Command("retired", "alpha", pid=OLD_PID)],
            10,
            "the drained backend to be retired",
        )
        assert health(router.url)["registry"] == {
            "version": stamp.version,
            "generation": 2,
            "loaded_at": stamp.loaded_at,
            "path": "/srv/models.yaml",
        }


def test_the_reload_endpoint_answers_once_the_router_routes_by_the_new_registry(
    tmp_path: Path, fakes: dict[str, FakeBackend], start_router: StartRouter
) -> None:
    with supervised_router(tmp_path, fakes, start_router, "alpha") as (router, supervisor, socket):
        reload_url = f"{router.url}/v1/config/reload"
        socket.on_reload = lambda: Reply(
            False,
            problems=("models.yaml: 'beta' (id 'beta'): port: not a port",),
            refused="invalid",
        )
        refused = one_shot.post(reload_url, timeout=35)
        assert refused.status_code == 400
        assert refused.json()["error"]["problems"] == [
            "models.yaml: 'beta' (id 'beta'): port: not a port"
        ]
        text = registry_of(fakes, "alpha", "beta")

        def applied() -> Reply:
            stamp = supervisor.publish(text, 2)
            return Reply(
                True,
                version=stamp.version,
                generation=2,
                added=("beta",),
                removed=(),
                replaced=(),
                unchanged=("alpha",),
            )

        socket.on_reload = applied
        answered = one_shot.post(reload_url, json={}, timeout=35)
        assert answered.status_code == 200, answered.text
        assert answered.json()["added"] == ["beta"]
        # No poll in between: the answer came once the router routes by the new registry.
        assert chat(router.url, "beta").status_code == 200
        assert model_ids(router.url) == ["alpha", "beta"]
    # The socket is gone: no supervisor answers.
    unreachable = one_shot.post(f"{router.url}/v1/config/reload", timeout=35)
    assert unreachable.status_code == 503
    assert unreachable.json()["error"]["code"] == "supervisor_not_running"
