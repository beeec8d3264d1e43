"""Fixtures shared by the integration tests: fake backends and a router in front of them.

A test module says which fake backends it wants and how its router is set up::

    FAKE_ROLES = ("alpha", "embed")  # one fake backend per role; the role is its model id


    @pytest.fixture(scope="module")
    def router_process(fakes: dict[str, FakeBackend], start_router: StartRouter) -> RunningRouter:
        models = {
            "alpha": registry_entry("alpha", fakes["alpha"].port),
            "embed": registry_entry("embed", fakes["embed"].port, model_type="embeddings"),
        }
        return start_router(models, SLM_OTEL_ENABLED="false")

and its tests ask for ``fakes`` (or ``fake`` when there is one role), ``router`` (the
router's base URL), ``router_process`` (its pid, output and directory) and ``http`` (an
httpx client on the router). The fakes and the router live as long as the module; every
test that uses the fakes starts with them reset (no script, nothing recorded). A module
with other needs defines its own fixture of the same name, which wins over these.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.fakes.control import FakeBackend
from tests.processes import RunningRouter, StartRouter, registry_env, running_router


def pytest_configure(config: pytest.Config) -> None:
    """In a parallel run, each llama-server a test starts computes on one thread
    (``LLAMA_ARG_THREADS``, read by llama-server, inherited through the launcher). The
    workers outnumber the CPUs, and a server's second thread spun waiting for the first
    whenever the other tests held the CPU: two servers answering three 320-token
    prompts each beside two busy processes took twice the CPU time and 1.6 times as
    long with llama.cpp's default (one thread per core) as with one thread. The tests
    that run alone (``serial``) keep the default."""
    del config
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("LLAMA_ARG_THREADS", "1")


@pytest.fixture(scope="module")
def fakes(request: pytest.FixtureRequest) -> Iterator[dict[str, FakeBackend]]:
    """One fake backend per role in the module's ``FAKE_ROLES``, by role."""
    roles: tuple[str, ...] = getattr(request.module, "FAKE_ROLES", ())
    assert roles, f"{request.module.__name__} uses fakes but sets no FAKE_ROLES"
    with ExitStack() as stack:
        yield {role: stack.enter_context(FakeBackend.start(model_id=role)) for role in roles}


@pytest.fixture(scope="module")
def fake(fakes: dict[str, FakeBackend]) -> FakeBackend:
    """The fake backend of a module with one role in ``FAKE_ROLES``."""
    [only] = fakes.values()
    return only


@pytest.fixture(autouse=True)
def _reset_fakes(request: pytest.FixtureRequest) -> None:
    """Before each test that uses ``fakes`` (directly or through ``fake`` or the router),
    forget their scripts and the requests they recorded."""
    if "fakes" in request.fixturenames:
        for backend in request.getfixturevalue("fakes").values():
            backend.reset()


@pytest.fixture(scope="module")
def start_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartRouter]:
    """Start routers serving a registry of the test's backends (no llama-server of their
    own); each is stopped when the module is done."""
    with ExitStack() as stack:

        def start(
            models: Mapping[str, object], *, workdir: Path | None = None, **settings: str
        ) -> RunningRouter:
            where = workdir or tmp_path_factory.mktemp("router")
            env = registry_env(where, models, **settings)
            command, url = stack.enter_context(running_router(env, where))
            return RunningRouter(command, url, where)

        yield start


@pytest.fixture(scope="module")
def router(router_process: RunningRouter) -> str:
    """The base URL of the module's router (``router_process``, which the module defines)."""
    return router_process.url


@pytest.fixture
def http(router: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=router, timeout=10.0, trust_env=False) as client:
        yield client
