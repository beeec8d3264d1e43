"""Where ``/upstream/<model>/<engine path>`` goes: the model by its shortest run of
leading segments (an id may hold ``/``), the rest the engine path, and every path or
query the engine could read otherwise than it is checked refused."""

from __future__ import annotations

from typing import Any

import pytest

from slm_server.errors import InvalidRequest, ModelNotFound
from slm_server.router.intake.engine_target import EngineTarget, engine_target

PREFIX = "/upstream/"
KNOWN = {"m", "org/m", "org/m/v2", "qwen3:8b"}


def lookup(name: str) -> str:
    if name not in KNOWN:
        raise ModelNotFound(f"The model '{name}' does not exist", param="model")
    return name


def scope(path: str, query: bytes = b"", raw: bytes | None = None, method: str = "POST") -> Any:
    return {"path": path, "raw_path": raw or path.encode(), "query_string": query, "method": method}


@pytest.mark.parametrize(
    ("path", "model", "engine"),
    [
        ("/upstream/m/tokenize", "m", "/tokenize"),
        ("/upstream/m", "m", "/"),
        ("/upstream/m/v1/chat/completions", "m", "/v1/chat/completions"),
        ("/upstream/org/m/props", "org/m", "/props"),  # the shortest run that names one
        ("/upstream/org/m/v2/props", "org/m", "/v2/props"),
        ("/upstream/qwen3:8b/slots/0", "qwen3:8b", "/slots/0"),
    ],
)
def test_the_model_and_the_engine_path(path: str, model: str, engine: str) -> None:
    target = engine_target(scope(path, b"action=save&x=1", method="GET"), PREFIX, lookup)
    assert target == EngineTarget(model, "GET", engine, "action=save&x=1")
    assert target.sent == f"{engine}?action=save&x=1"
    assert engine_target(scope(path), PREFIX, lookup).sent == engine


def test_no_model_is_the_first_segment_s_404() -> None:
    with pytest.raises(ModelNotFound, match="'nope'"):
        engine_target(scope("/upstream/nope/m/tokenize"), PREFIX, lookup)


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/upstream/m/../slots", None),
        ("/upstream/m/./tokenize", None),
        ("/upstream/m//tokenize", None),
        ("/upstream/m/tokenize/", None),
        ("/upstream/", None),
        ("/upstream/m/a b", None),
        ("/upstream/m/a\\b", None),
        ("/upstream/m/../slots", b"/upstream/m/%2e%2e/slots"),  # decoded by the server
        ("/upstream/m/slots/x", b"/upstream/m/slots%2Fx"),
        ("/upstream/m/tokenize", b"/upstream/m/tok%65nize"),  # even a harmless escape
    ],
)
def test_a_path_the_engine_could_read_otherwise_is_refused(path: str, raw: bytes | None) -> None:
    with pytest.raises(InvalidRequest) as caught:
        engine_target(scope(path, raw=raw), PREFIX, lookup)
    assert caught.value.code == "invalid_upstream_path"


@pytest.mark.parametrize("query", [b"a=1 2", b"a=\r\nx", b"a=\xff"])
def test_a_query_that_is_not_printable_ascii_is_refused(query: bytes) -> None:
    with pytest.raises(InvalidRequest, match="printable ASCII"):
        engine_target(scope("/upstream/m/tokenize", query), PREFIX, lookup)
