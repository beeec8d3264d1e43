"""The reranker's tokenization and truncation, with the tiny model's tokenizer behind
a stand-in for the Hugging Face one (no MLX: nothing here runs the model)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from slm_server.mlx_rerank.prompt import format_prompt
from slm_server.mlx_rerank.scoring import Limits, ModelLoadError, Reranker
from tests.models import tiny_qwen3

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_scoring")


class HfLike:
    """The few Hugging Face tokenizer members the reranker uses."""

    def __init__(self, tokenizer: Tokenizer, drop: str | None = None) -> None:
        self._inner = tokenizer
        self._drop = drop
        self.unk_token_id = None
        self.pad_token_id = tokenizer.token_to_id("<|endoftext|>")

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        assert add_special_tokens is False
        ids: list[int] = self._inner.encode(text, add_special_tokens=False).ids
        return ids

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return None if token == self._drop else self._inner.token_to_id(token)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = tiny_qwen3.build(tmp_path_factory.mktemp("tiny") / "model")
    return Tokenizer.from_file(str(Path(path) / "tokenizer.json"))


def test_prompts_are_the_formatted_text_tokenized(tokenizer: Tokenizer) -> None:
    reranker = Reranker(None, HfLike(tokenizer), None, Limits())
    prompts = reranker.prompts("what is up", ["the sky", "yes"], "Find it")
    for document, ids in zip(["the sky", "yes"], prompts, strict=True):
        assert ids == tokenizer.encode(format_prompt("what is up", document, "Find it")).ids


def test_long_pairs_are_cut_at_the_document_end(tokenizer: Tokenizer) -> None:
    full = Reranker(None, HfLike(tokenizer), None, Limits()).prompts("q", ["word " * 200], "i")
    cut = Reranker(None, HfLike(tokenizer), None, Limits(max_length=150)).prompts(
        "q", ["word " * 200], "i"
    )
    assert len(full[0]) > 150
    assert len(cut[0]) == 150
    tail = tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n").ids
    assert cut[0][-len(tail) :] == tail
    assert cut[0][: 150 - len(tail)] == full[0][: 150 - len(tail)]


def test_a_max_length_without_room_fails_at_load(tokenizer: Tokenizer) -> None:
    with pytest.raises(ModelLoadError, match="leaves no room"):
        Reranker(None, HfLike(tokenizer), None, Limits(max_length=20))


def test_a_vocabulary_without_yes_is_not_a_reranker(tokenizer: Tokenizer) -> None:
    with pytest.raises(ModelLoadError, match="no single token 'yes'"):
        Reranker(None, HfLike(tokenizer, drop="yes"), None, Limits())


def test_mlx_lms_tokenizer_wrapper_serves_the_reranker(tmp_path: Path) -> None:
    """The reranker uses mlx-lm's TokenizerWrapper through its public members only;
    this fails if the wrapper stops handing them to the Hugging Face tokenizer it wraps."""
    mlx_lm_utils = importlib.import_module("mlx_lm.utils")
    path = Path(tiny_qwen3.build(tmp_path / "model"))
    wrapped = mlx_lm_utils.load_tokenizer(path)
    reranker = Reranker(None, wrapped, None, Limits())
    plain = Tokenizer.from_file(str(path / "tokenizer.json"))
    expected = plain.encode(format_prompt("q", "d", "i"), add_special_tokens=False).ids
    assert reranker.prompts("q", ["d"], "i")[0] == expected
