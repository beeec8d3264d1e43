"""Which files of a repository a reference means."""

from __future__ import annotations

import pytest

from slm_server.pull.choose import RemoteFile, choose, quant_of
from slm_server.pull.errors import PullError


def files(*paths: str) -> list[RemoteFile]:
    return [RemoteFile(p, 100 + i, f"{i:064x}") for i, p in enumerate(paths)]


REPO = files(
    "README.md",
    "gemma-3-270m-it-Q4_K_M.gguf",
    "gemma-3-270m-it-Q8_0.gguf",
    "gemma-3-270m-it-F16.gguf",
    "mmproj-gemma-3-270m-it-F16.gguf",
    "mmproj-gemma-3-270m-it-Q8_0.gguf",
)


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("gemma-3-270m-it-Q4_K_M.gguf", "Q4_K_M"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
        ("model-IQ2_XXS.gguf", "IQ2_XXS"),
        ("m-bf16-00001-of-00002.gguf", "BF16"),
        ("dir/q8_0/m-q8_0.gguf", "Q8_0"),
        ("model.gguf", None),
    ],
)
def test_the_quantization_is_read_from_the_name(name: str, quant: str | None) -> None:
    assert quant_of(name) == quant


def test_without_a_quantization_q4_k_m_is_taken_with_its_f16_projector() -> None:
    choice = choose("o/r", REPO, None, None)
    assert [f.path for f in choice.parts] == ["gemma-3-270m-it-Q4_K_M.gguf"]
    assert choice.projector is not None
    assert choice.projector.path == "mmproj-gemma-3-270m-it-F16.gguf"
    assert choice.quant == "Q4_K_M"


def test_a_quantization_is_matched_whatever_its_case() -> None:
    choice = choose("o/r", REPO, "q8_0", None)
    assert [f.path for f in choice.parts] == ["gemma-3-270m-it-Q8_0.gguf"]


def test_a_missing_quantization_names_what_the_repository_holds() -> None:
    with pytest.raises(PullError, match="F16, Q4_K_M, Q8_0") as raised:
        choose("o/r", REPO, "Q2_K", None)
    assert raised.value.kind == "not_found"


def test_a_file_is_taken_by_its_path() -> None:
    choice = choose("o/r", REPO, None, "gemma-3-270m-it-F16.gguf")
    assert choice.parts[0].path == "gemma-3-270m-it-F16.gguf"
    with pytest.raises(PullError) as raised:
        choose("o/r", REPO, None, "nope.gguf")
    assert raised.value.kind == "not_found"


def test_several_models_with_no_usual_default_is_ambiguous() -> None:
    with pytest.raises(PullError, match="o/r:QUANT") as raised:
        choose("o/r", files("m-Q3_K_S.gguf", "m-Q6_K.gguf"), None, None)
    assert raised.value.kind == "ambiguous"


def test_a_single_model_is_taken_whatever_its_quantization() -> None:
    assert choose("o/r", files("m-Q6_K.gguf", "notes.txt"), None, None).quant == "Q6_K"


def test_a_split_model_is_taken_whole_in_order() -> None:
    listed = files(
        "Q4_K_M/m-Q4_K_M-00002-of-00003.gguf",
        "Q4_K_M/m-Q4_K_M-00001-of-00003.gguf",
        "Q4_K_M/m-Q4_K_M-00003-of-00003.gguf",
        "m-Q8_0.gguf",
    )
    choice = choose("o/r", listed, "Q4_K_M", None)
    assert [f.path.rsplit("-", 3)[-3] for f in choice.parts] == ["00001", "00002", "00003"]


def test_a_split_model_missing_a_part_is_not_offered() -> None:
    listed = files("m-Q4_K_M-00001-of-00003.gguf", "m-Q4_K_M-00003-of-00003.gguf")
    with pytest.raises(PullError) as raised:
        choose("o/r", listed, None, None)
    assert raised.value.kind == "not_found"


def test_a_hub_listing_a_climbing_name_is_refused() -> None:
    with pytest.raises(PullError) as raised:
        choose("o/r", files("../evil-Q4_K_M.gguf"), None, None)
    assert raised.value.kind == "unsafe_name"
    with pytest.raises(PullError) as projector:
        choose("o/r", files("m-Q4_K_M.gguf", "/abs/mmproj-F16.gguf"), None, None)
    assert projector.value.kind == "unsafe_name"


def test_no_gguf_at_all_is_not_found() -> None:
    with pytest.raises(PullError) as raised:
        choose("o/r", files("README.md", "model.safetensors"), None, None)
    assert raised.value.kind == "not_found"
