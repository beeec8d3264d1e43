"""The ``via`` fixture: a test that uses it (``pytest.mark.usefixtures("via")``) runs
twice, its in-process requests (:func:`tests.unit.router.inprocess.call`) sent once
through plain ASGI and once through the router's door on a fake connection.

Also the one warning the unit tests let pass: ``websockets`` (installed for the
openai-agents SDK) deprecates its legacy modules, which uvicorn's "auto" websocket
protocol imports whenever a test loads a ``uvicorn.Config``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.router.inprocess import VIA, Via


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("filterwarnings", "ignore:websockets\\.:DeprecationWarning")


@pytest.fixture(params=["asgi", "door"])
def via(request: pytest.FixtureRequest) -> Iterator[Via]:
    path: Via = request.param
    token = VIA.set(path)
    yield path
    VIA.reset(token)
