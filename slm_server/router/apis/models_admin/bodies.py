"""The bodies of ``POST /v1/models/pull`` and ``POST /v1/models/add``, and the file an
add through the API may name. Pure but for looking at the disk."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slm_server.add.source import Source, find_listed
from slm_server.errors import InvalidRequest, ModelNotFound
from slm_server.pull.errors import PullError
from slm_server.pull.reference import parse_reference

LOADS = ("on_demand", "always")


@dataclass(frozen=True)
class PullBody:
    """``{"model": "<reference>", "add": false, "id": null, "load": "on_demand"}``."""

    model: str
    add: bool = False
    model_id: str | None = None
    load: str = "on_demand"


@dataclass(frozen=True)
class AddBody:
    """``{"model": "<a listed name, or a path under SLM_MODELS_DIR>", "id", "load"}``."""

    model: str
    model_id: str | None = None
    load: str = "on_demand"


def _model(payload: dict[str, Any], what: str) -> str:
    model = payload.get("model")
    if model is None:
        raise InvalidRequest(
            f"The request has no 'model' field: name {what}", code="missing_model", param="model"
        )
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequest(
            "The 'model' field must be a non-empty string", code="invalid_model", param="model"
        )
    return model.strip()


def _id_and_load(payload: dict[str, Any]) -> tuple[str | None, str]:
    model_id = payload.get("id")
    if model_id is not None and (not isinstance(model_id, str) or not model_id.strip()):
        raise InvalidRequest(
            "The 'id' field must be a non-empty string or null", code="invalid_id", param="id"
        )
    load = payload.get("load")
    if load is None:
        load = "on_demand"
    if load not in LOADS:
        raise InvalidRequest(
            'The \'load\' field must be "on_demand" or "always"', code="invalid_load", param="load"
        )
    return (model_id.strip() if isinstance(model_id, str) else None), load


def pull_body(payload: dict[str, Any]) -> PullBody:
    """The pull asked for; 400 for a field of the wrong type or a reference that does
    not parse (``bad_reference``, ``unsafe_name``)."""
    model = _model(payload, "what to pull (owner/repo[:QUANT], owner/repo/file.gguf, ollama:name)")
    try:
        parse_reference(model)
    except PullError as exc:
        raise InvalidRequest(str(exc), code=exc.kind, param="model") from None
    add = payload.get("add")
    if add is None:
        add = False
    if not isinstance(add, bool):
        raise InvalidRequest(
            "The 'add' field must be true or false", code="invalid_add", param="add"
        )
    model_id, load = _id_and_load(payload)
    return PullBody(model, add, model_id, load)


def add_body(payload: dict[str, Any]) -> AddBody:
    """The add asked for; 400 for a field of the wrong type."""
    model = _model(payload, "a model GET /v1/models/local lists, or a file under SLM_MODELS_DIR")
    model_id, load = _id_and_load(payload)
    return AddBody(model, model_id, load)


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):
        return False


def source_of(given: str, env: Mapping[str, str], models_dir: Path) -> Source:
    """The file an add through the API names: a name ``GET /v1/models/local`` lists,
    else a file under ``models_dir`` (absolute, or relative to it), symlinks resolved
    and still inside it. 400 for a path outside, 404 for anything else not found: no
    other file is ever served from the API."""
    path = Path(given)
    if not path.is_absolute() and not given.startswith("~"):
        listed = find_listed(given, env, models_dir)
        if listed is not None:
            return listed
        path = models_dir / path
    elif not _inside(path, models_dir) or not path.absolute().is_relative_to(models_dir.absolute()):
        raise InvalidRequest(
            f"{given} is not under the models folder ({models_dir}, SLM_MODELS_DIR): the "
            "API adds only a file there, or a model GET /v1/models/local lists",
            code="outside_models_dir",
            param="model",
        )
    if not _inside(path, models_dir):
        raise InvalidRequest(
            f"{given} leads outside the models folder ({models_dir}, SLM_MODELS_DIR)",
            code="outside_models_dir",
            param="model",
        )
    if not path.is_file():
        raise ModelNotFound(
            f"No model named {given!r} (GET /v1/models/local lists them) and no such file "
            f"in the models folder ({models_dir})",
            param="model",
        )
    return Source(path.absolute(), path.name, None)


__all__ = ["LOADS", "AddBody", "PullBody", "add_body", "pull_body", "source_of"]
