"""Where each store lives, and how each store's layout is walked."""

from __future__ import annotations

from pathlib import Path

from slm_server.discover.places import (
    HF,
    LLAMACPP,
    LMSTUDIO,
    OLLAMA,
    PROJECT,
    Candidate,
    Place,
    candidates,
    hf_hub_cache,
    llamacpp_cache,
    lmstudio_models,
    models_among,
    ollama_models,
    places,
)
from tests.unit.discover.stores import hf_file, ollama_model, tiny_gguf


def names(place: Place) -> list[str]:
    return [c.name for c in candidates(place)]


def test_the_hugging_face_cache_is_found_as_huggingface_hub_finds_it(tmp_path: Path) -> None:
    home = {"HOME": str(tmp_path)}
    assert hf_hub_cache(home) == tmp_path / ".cache" / "huggingface" / "hub"
    xdg = {**home, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert hf_hub_cache(xdg) == tmp_path / "xdg" / "huggingface" / "hub"
    hf_home = {**xdg, "HF_HOME": str(tmp_path / "hf")}
    assert hf_hub_cache(hf_home) == tmp_path / "hf" / "hub"
    assert hf_hub_cache({**hf_home, "HF_HUB_CACHE": "/x/hub"}) == Path("/x/hub")


def test_the_other_stores_honour_their_own_variables(tmp_path: Path) -> None:
    home = {"HOME": str(tmp_path)}
    assert ollama_models(home) == tmp_path / ".ollama" / "models"
    assert ollama_models({**home, "OLLAMA_MODELS": "/o"}) == Path("/o")
    assert llamacpp_cache({**home, "LLAMA_CACHE": "/l"}) == Path("/l")
    assert lmstudio_models(home) == [
        tmp_path / ".lmstudio" / "models",
        tmp_path / ".cache" / "lm-studio" / "models",
    ]
    (tmp_path / ".lmstudio-home-pointer").write_text(str(tmp_path / "moved") + "\n")
    assert lmstudio_models(home)[0] == tmp_path / "moved" / "models"


def test_a_store_whose_folder_is_missing_is_absent(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "OLLAMA_MODELS": str(tmp_path / "ollama")}
    assert places(env, tmp_path / "models") == []
    (tmp_path / "ollama").mkdir()
    (tmp_path / ".lmstudio" / "models").mkdir(parents=True)
    (tmp_path / "models").mkdir()
    assert places(env, tmp_path / "models") == [
        Place(LMSTUDIO, tmp_path / ".lmstudio" / "models"),
        Place(OLLAMA, tmp_path / "ollama"),
        Place(PROJECT, tmp_path / "models"),
    ]


def test_the_hugging_face_layout_is_shown_as_owner_repo_file(tmp_path: Path) -> None:
    link = hf_file(tmp_path, "bartowski/Qwen3-GGUF", "Qwen3-Q4_K_M.gguf")
    hf_file(tmp_path, "bartowski/Qwen3-GGUF", "mmproj-Qwen3-f16.gguf")
    hf_file(tmp_path, "ggml-org/big", "sub/big-Q8_0-00001-of-00002.gguf")
    hf_file(tmp_path, "ggml-org/big", "sub/big-Q8_0-00002-of-00002.gguf")
    found = list(candidates(Place(HF, tmp_path)))
    assert [c.name for c in found] == [
        "bartowski/Qwen3-GGUF/Qwen3-Q4_K_M.gguf",
        "ggml-org/big/sub/big-Q8_0-00001-of-00002.gguf",
    ]
    assert found[0].path == link
    assert found[0].path.is_symlink()
    assert [p.name for p in found[1].parts] == [
        "big-Q8_0-00001-of-00002.gguf",
        "big-Q8_0-00002-of-00002.gguf",
    ]


def test_a_file_in_two_snapshots_is_told_apart_by_revision(tmp_path: Path) -> None:
    hf_file(tmp_path, "o/r", "m.gguf", revision="1111111111")
    hf_file(tmp_path, "o/r", "m.gguf", revision="2222222222")
    assert names(Place(HF, tmp_path)) == ["o/r/m.gguf@11111111", "o/r/m.gguf@22222222"]


def test_lm_studio_llama_cpp_and_the_project_folder_are_plain_folders(tmp_path: Path) -> None:
    tiny_gguf(tmp_path / "lms" / "lmstudio-community" / "Qwen3-GGUF" / "Qwen3-Q4_K_M.gguf")
    tiny_gguf(tmp_path / "lms" / "lmstudio-community" / "Qwen3-GGUF" / "mmproj-model.gguf")
    tiny_gguf(tmp_path / "lcpp" / "ggml-org_gemma_gemma-Q8_0.gguf")
    tiny_gguf(tmp_path / "proj" / "SmolLM2.Q4_1.gguf")
    (tmp_path / "proj" / "notes.txt").write_text("not a model")
    assert names(Place(LMSTUDIO, tmp_path / "lms")) == [
        "lmstudio:lmstudio-community/Qwen3-GGUF/Qwen3-Q4_K_M.gguf"
    ]
    assert names(Place(LLAMACPP, tmp_path / "lcpp")) == ["llama.cpp:ggml-org_gemma_gemma-Q8_0.gguf"]
    assert names(Place(PROJECT, tmp_path / "proj")) == ["models/SmolLM2.Q4_1.gguf"]


def test_an_ollama_manifest_names_its_model_layers_blob(tmp_path: Path) -> None:
    blob = ollama_model(tmp_path, "qwen3", "0.6b")
    other = ollama_model(tmp_path, "tiny", "latest", namespace="someone")
    gone = ollama_model(tmp_path, "gone", "latest")
    gone.unlink()
    bad = tmp_path / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    assert list(candidates(Place(OLLAMA, tmp_path))) == [
        Candidate("ollama:qwen3:0.6b", OLLAMA, (blob,)),
        Candidate("ollama:someone/tiny:latest", OLLAMA, (other,)),
    ]


def test_split_parts_are_gathered_under_part_one_and_projectors_dropped() -> None:
    d = Path("/m")
    paths = [
        d / "a-00002-of-00003.gguf",
        d / "a-00001-of-00003.gguf",
        d / "a-00003-of-00003.gguf",
        d / "mmproj-a.gguf",
        d / "b.gguf",
        d / "orphan-00002-of-00002.gguf",
    ]
    assert models_among(paths) == [
        (d / "b.gguf",),
        (d / "a-00001-of-00003.gguf", d / "a-00002-of-00003.gguf", d / "a-00003-of-00003.gguf"),
    ]
