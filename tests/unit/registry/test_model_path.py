"""Resolving ``model_path`` and the other path fields of an entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slm_server.registry.model_path import (
    ModelPathError,
    first_gguf,
    looks_like_hub_id,
    project_path,
    resolve_file_field,
    resolve_model_path,
)
from slm_server.registry.schema import ModelEntry
from slm_server.settings import PROJECT_ROOT
from tests.registry_entries import model_entry

HUB_ID = "mlx-community/Qwen3-8B-MLX-8bit"


def entry(model_path: str, backend: str = "llamacpp", **fields: Any) -> ModelEntry:
    if backend == "mlx-rerank":
        fields = {"model_type": "rerank", **fields}
    return model_entry(model_path=model_path, backend=backend, **fields)


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_gguf_file(tmp_path: Path) -> None:
    model = touch(tmp_path / "model.Q4_1.gguf")
    assert resolve_model_path(entry(str(model)), tmp_path) == str(model)


def test_directory_yields_first_gguf_alphabetically_skipping_projectors(tmp_path: Path) -> None:
    touch(tmp_path / "mmproj-a.gguf")
    touch(tmp_path / "mmproj-model-f16.gguf")
    touch(tmp_path / "c-model.gguf")
    touch(tmp_path / "b-model.gguf")
    touch(tmp_path / "a-readme.txt")
    (tmp_path / "a-dir.gguf").mkdir()
    assert resolve_model_path(entry(str(tmp_path)), tmp_path) == str(tmp_path / "b-model.gguf")


def test_directory_without_gguf(tmp_path: Path) -> None:
    touch(tmp_path / "mmproj-only.gguf")
    touch(tmp_path / "model.safetensors")
    with pytest.raises(ModelPathError) as caught:
        resolve_model_path(entry(str(tmp_path)), tmp_path)
    assert caught.value.field == "model_path"
    assert caught.value.message == f"directory {tmp_path} holds no .gguf file"
    assert str(caught.value) == caught.value.message
    assert caught.value.missing is False


def test_non_gguf_file(tmp_path: Path) -> None:
    model = touch(tmp_path / "model.bin")
    with pytest.raises(ModelPathError) as caught:
        resolve_model_path(entry(str(model)), tmp_path)
    assert caught.value.field == "model_path"
    assert caught.value.message == f"{model} is not a .gguf file"
    assert caught.value.missing is False


def test_missing_path(tmp_path: Path) -> None:
    model = tmp_path / "absent.gguf"
    with pytest.raises(ModelPathError) as caught:
        resolve_model_path(entry(str(model)), tmp_path)
    assert caught.value.field == "model_path"
    assert caught.value.message == f"{model} does not exist"
    assert caught.value.missing is True


def test_missing_path_for_mlx(tmp_path: Path) -> None:
    with pytest.raises(ModelPathError) as caught:
        resolve_model_path(entry(str(tmp_path / "gone"), backend="mlx"), tmp_path)
    assert caught.value.missing is True


@pytest.mark.parametrize("backend", ["mlx", "mlx-rerank"])
def test_hub_id_accepted_for_mlx_backends(tmp_path: Path, backend: str) -> None:
    assert resolve_model_path(entry(HUB_ID, backend=backend), tmp_path) == HUB_ID


def test_hub_id_rejected_for_llamacpp(tmp_path: Path) -> None:
    with pytest.raises(ModelPathError) as caught:
        resolve_model_path(entry(HUB_ID), tmp_path)
    assert caught.value.field == "model_path"
    assert caught.value.missing is False
    assert caught.value.message == (
        f"'{HUB_ID}' is neither a local file nor a directory; Hugging Face model ids work "
        "for backend mlx only, llamacpp needs a local .gguf file or a directory holding one"
    )


def test_relative_gguf_resolved_from_root(tmp_path: Path) -> None:
    model = touch(tmp_path / "models" / "m.gguf")
    assert resolve_model_path(entry("models/m.gguf"), tmp_path) == str(model)


def test_relative_missing_gguf_is_missing_not_a_hub_id(tmp_path: Path) -> None:
    with pytest.raises(ModelPathError) as caught:
        resolve_model_path(entry("models/absent.gguf"), tmp_path)
    assert caught.value.missing is True
    assert caught.value.message == f"{tmp_path / 'models' / 'absent.gguf'} does not exist"


def test_relative_directory_that_exists_is_local_not_a_hub_id(tmp_path: Path) -> None:
    gguf = touch(tmp_path / "owner" / "name" / "weights.gguf")
    assert resolve_model_path(entry("owner/name"), tmp_path) == str(gguf)
    assert resolve_model_path(entry("owner/name", backend="mlx"), tmp_path) == str(gguf.parent)


def test_mlx_local_directory_is_passed_as_is(tmp_path: Path) -> None:
    directory = tmp_path / "Qwen3-8B"
    touch(directory / "model.safetensors")
    assert resolve_model_path(entry(str(directory), backend="mlx"), tmp_path) == str(directory)


def test_dot_relative_path_resolved_from_root(tmp_path: Path) -> None:
    model = touch(tmp_path / "m.gguf")
    assert Path(resolve_model_path(entry("./m.gguf"), tmp_path)) == model


def test_home_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    model = touch(tmp_path / "m.gguf")
    assert resolve_model_path(entry("~/m.gguf"), PROJECT_ROOT) == str(model)


def test_default_root_is_the_project() -> None:
    assert project_path("config/models.yaml") == PROJECT_ROOT / "config" / "models.yaml"


def test_project_path_keeps_absolute_paths(tmp_path: Path) -> None:
    assert project_path("/abs/m.gguf", tmp_path) == Path("/abs/m.gguf")
    assert project_path("rel/m.gguf", tmp_path) == tmp_path / "rel" / "m.gguf"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (HUB_ID, True),
        ("Qwen/Qwen3-0.6B", True),
        ("owner/name_with.dots-and_underscores", True),
        ("./owner/name", False),
        ("/owner/name", False),
        ("~/owner/name", False),
        ("owner/name.gguf", False),
        ("just-a-name", False),
        ("a/b/c", False),
        ("-owner/name", False),
        ("owner/", False),
    ],
)
def test_looks_like_hub_id(tmp_path: Path, raw: str, expected: bool) -> None:
    assert looks_like_hub_id(raw, tmp_path) is expected


def test_first_gguf_of_empty_directory(tmp_path: Path) -> None:
    assert first_gguf(tmp_path) is None


def test_resolve_file_field_existing(tmp_path: Path) -> None:
    template = touch(tmp_path / "config" / "t.jinja")
    assert resolve_file_field("chat_template_file", "config/t.jinja", tmp_path) == str(template)
    assert resolve_file_field("chat_template_file", str(template), PROJECT_ROOT) == str(template)


@pytest.mark.parametrize("field", ["chat_template_file", "mmproj_path", "spec_model_path"])
def test_resolve_file_field_missing(tmp_path: Path, field: str) -> None:
    with pytest.raises(ModelPathError) as caught:
        resolve_file_field(field, "nope.bin", tmp_path)
    assert caught.value.field == field
    assert caught.value.message == f"{tmp_path / 'nope.bin'} does not exist"
    assert caught.value.missing is True


def test_resolve_file_field_rejects_a_directory(tmp_path: Path) -> None:
    (tmp_path / "templates").mkdir()
    with pytest.raises(ModelPathError) as caught:
        resolve_file_field("chat_template_file", "templates", tmp_path)
    assert caught.value.field == "chat_template_file"
