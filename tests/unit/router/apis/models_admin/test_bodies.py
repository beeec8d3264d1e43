"""The bodies of the pull and add endpoints, and which file an add through the API may
name: a listed model, or a file under the models folder, never one outside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slm_server.errors import GatewayError, InvalidRequest, ModelNotFound
from slm_server.router.apis.models_admin.bodies import (
    AddBody,
    PullBody,
    add_body,
    pull_body,
    source_of,
)


def test_a_pull_body_takes_its_defaults_and_refuses_wrong_types() -> None:
    assert pull_body({"model": " o/r:Q4_K_M "}) == PullBody("o/r:Q4_K_M")
    assert pull_body(
        {"model": "ollama:gemma3", "add": True, "id": "g", "load": "always", "other": 1}
    ) == PullBody("ollama:gemma3", True, "g", "always")
    assert add_body({"model": "models/x.gguf", "id": None}) == AddBody("models/x.gguf")
    refused: list[tuple[dict[str, Any], str]] = [
        ({}, "missing_model"),
        ({"model": 3}, "invalid_model"),
        ({"model": "o/r", "add": "yes"}, "invalid_add"),
        ({"model": "o/r", "id": ""}, "invalid_id"),
        ({"model": "o/r", "load": "sometimes"}, "invalid_load"),
        ({"model": "nope"}, "bad_reference"),
        ({"model": "https://example.com/x.gguf"}, "bad_reference"),
        ({"model": "o/r/../../etc/x.gguf"}, "unsafe_name"),
    ]
    for body, code in refused:
        with pytest.raises(InvalidRequest) as error:
            pull_body(body)
        assert (error.value.status, error.value.code) == (400, code), body


def refusal(given: str, env: dict[str, str], models: Path) -> GatewayError:
    with pytest.raises(GatewayError) as error:
        source_of(given, env, models)
    return error.value


def test_an_add_names_a_listed_model_or_a_file_in_the_models_folder(tmp_path: Path) -> None:
    models = tmp_path / "models"
    inside = models / "o" / "r" / "x.gguf"
    inside.parent.mkdir(parents=True)
    inside.write_bytes(b"GGUF")
    env = {"HOME": str(tmp_path / "home")}

    listed = source_of("models/o/r/x.gguf", env, models)
    assert (listed.path, listed.store) == (inside, "project")
    assert source_of("o/r/x.gguf", env, models).path == inside
    assert source_of(str(inside), env, models).path == inside


def test_no_file_outside_the_models_folder_is_ever_named(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    outside = tmp_path / "secret.gguf"
    outside.write_bytes(b"GGUF")
    (models / "link.gguf").symlink_to(outside)
    env = {"HOME": str(tmp_path / "home")}
    for given in (str(outside), "../secret.gguf", "link.gguf", str(models / "link.gguf"), "~/x"):
        error = refusal(given, env, models)
        assert (error.status, error.code) == (400, "outside_models_dir"), given
    missing = refusal("nothing/here.gguf", env, models)
    assert isinstance(missing, ModelNotFound) and missing.status == 404
