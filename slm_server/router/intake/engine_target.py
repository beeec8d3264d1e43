"""Where a raw request goes: ``/upstream/<model>/<engine path>?<query>`` split into the
model its path names and the engine path and query it is relayed to. Pure.

The model is the shortest run of leading segments that names an enabled model, as
llama-swap finds it (a model id may hold ``/``: ``/upstream/org/model/tokenize``). The
rest must be an engine path as a rule may name one
(:func:`~slm_server.registry.upstream_paths.is_engine_path`): what is checked against
the allow-list is then exactly what the engine is sent. So a path is refused (400)
when it holds a ``.`` or ``..`` segment, an empty one (``//``) or anything
percent-encoded (``%2e%2e``, ``%2f``: the engine would decode it into a path the
check never saw), and a query that is not printable ASCII.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from slm_server.errors import InvalidRequest, ModelNotFound
from slm_server.registry.upstream_paths import is_engine_path

# How many leading segments may name the model (an id of a few ``/``-joined parts).
MAX_MODEL_SEGMENTS: Final = 8


@dataclass(frozen=True, slots=True)
class EngineTarget:
    """The model a raw request names (an id or alias), and the method, engine path and
    query (``""``: none) it is relayed with."""

    model: str
    method: str
    path: str
    query: str = ""

    @property
    def sent(self) -> str:
        """The path and query as the engine is sent them."""
        return f"{self.path}?{self.query}" if self.query else self.path


def _refused(message: str) -> InvalidRequest:
    return InvalidRequest(message, code="invalid_upstream_path")


def engine_target(
    scope: Mapping[str, Any], prefix: str, lookup: Callable[[str], Any]
) -> EngineTarget:
    """The target of the request of ``scope``, whose path is under ``prefix``;
    ``lookup`` raises :class:`ModelNotFound` for a name that is no enabled model.
    400 for a path or query the engine could read otherwise than it is checked; 404
    (the first segment's) when no run of leading segments names a model."""
    raw_path = scope.get("raw_path")
    path: str = scope["path"]
    if (raw_path is not None and b"%" in raw_path) or "%" in path:
        raise _refused(
            "An /upstream/ path may hold nothing percent-encoded: an encoded '.', '/' or "
            "'\\\\' could reach another engine path than the one the router allows"
        )
    rest = path[len(prefix) :] if path.startswith(prefix) else ""
    if not rest or not is_engine_path("/" + rest):
        raise _refused(
            f"{path[:200]!r} is not /upstream/<model>/<engine path>: every segment must be "
            "letters, digits or -._~:@!$&'()+,; and = (no empty, '.' or '..' segment)"
        )
    query = scope.get("query_string", b"")
    if any(byte < 0x21 or byte > 0x7E for byte in query):
        raise _refused("The query of an /upstream/ path must be printable ASCII")
    segments = rest.split("/")
    missing: ModelNotFound | None = None
    for count in range(1, min(len(segments), MAX_MODEL_SEGMENTS) + 1):
        name = "/".join(segments[:count])
        try:
            lookup(name)
        except ModelNotFound as error:
            missing = missing or error
            continue
        engine_path = "/" + "/".join(segments[count:])
        return EngineTarget(name, scope["method"], engine_path, query.decode("ascii"))
    assert missing is not None
    raise missing


__all__ = ["MAX_MODEL_SEGMENTS", "EngineTarget", "engine_target"]
