"""The ``via`` fixture: a test that uses it (``pytest.mark.usefixtures("via")``) runs
twice, its in-process requests (:func:`tests.unit.router.inprocess.call`) sent once
through plain ASGI and once through the router's door on a fake connection."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.router.inprocess import VIA, Via


@pytest.fixture(params=["asgi", "door"])
def via(request: pytest.FixtureRequest) -> Iterator[Via]:
    path: Via = request.param
    token = VIA.set(path)
    yield path
    VIA.reset(token)
