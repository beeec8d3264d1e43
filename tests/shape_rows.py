"""The router's API shapes by path, for tests that name a shape by the path it is served
at."""

from __future__ import annotations

from slm_server.router.apis.table import TABLE
from slm_server.router.call.shape import Shape


def shape(path: str) -> Shape:
    """The shape served at ``path`` (which must be one of the table's)."""
    found = TABLE.at(path)
    assert found is not None, f"no API shape is served at {path}"
    return found


MODEL_TYPES: dict[str, frozenset[str]] = {row.shape.path: row.shape.model_types for row in TABLE}
