"""The reranker prompt, truncation and batching plan (pure; no MLX)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slm_server.mlx_rerank import prompt


def test_format_prompt_is_the_qwen3_reranker_conversation() -> None:
    text = prompt.format_prompt("what is MLX", "MLX is an array framework.", "Find docs")
    assert text == (
        "<|im_start|>system\n"
        "Judge whether the Document meets the requirements based on the Query and the "
        'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
        "<|im_start|>user\n"
        "<Instruct>: Find docs\n"
        "<Query>: what is MLX\n"
        "<Document>: MLX is an array framework.<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n\n</think>\n\n"
    )


def test_default_instruction() -> None:
    text = prompt.format_prompt("q", "d")
    assert (
        "<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
        in text
    )
    assert prompt.pair_text("q", "d") == (
        f"<Instruct>: {prompt.DEFAULT_INSTRUCTION}\n<Query>: q\n<Document>: d"
    )


def test_assemble_keeps_head_and_tail_and_cuts_the_pair_end() -> None:
    head, pair, tail = [1, 2], [10, 11, 12, 13, 14], [3, 4, 5]
    assert prompt.assemble(head, pair, tail, 100) == [1, 2, 10, 11, 12, 13, 14, 3, 4, 5]
    assert prompt.assemble(head, pair, tail, 10) == [1, 2, 10, 11, 12, 13, 14, 3, 4, 5]
    assert prompt.assemble(head, pair, tail, 8) == [1, 2, 10, 11, 12, 3, 4, 5]
    assert prompt.assemble(head, pair, tail, 6) == [1, 2, 10, 3, 4, 5]


def test_max_length_must_leave_room_for_the_pair() -> None:
    assert prompt.pair_budget(2, 3, 6) == 1
    with pytest.raises(ValueError, match="leaves no room"):
        prompt.pair_budget(2, 3, 5)


def test_plan_batches_groups_short_prompts_first() -> None:
    lengths = [50, 10, 30, 10, 20]
    assert prompt.plan_batches(lengths, 2, 10_000) == [[1, 3], [4, 2], [0]]
    # 4 x 30 padded tokens would exceed 100: the length-30 prompt opens a new batch.
    assert prompt.plan_batches(lengths, 16, 100) == [[1, 3, 4], [2, 0]]
    # A prompt longer than the token budget still gets a batch of its own.
    assert prompt.plan_batches([500, 5], 16, 100) == [[1], [0]]
    assert prompt.plan_batches([], 4, 100) == []


def test_plan_batches_rejects_zero_limits() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        prompt.plan_batches([1], 0, 10)


@given(
    lengths=st.lists(st.integers(min_value=1, max_value=300), max_size=60),
    batch_size=st.integers(min_value=1, max_value=20),
    batch_tokens=st.integers(min_value=1, max_value=2000),
)
def test_plan_batches_properties(lengths: list[int], batch_size: int, batch_tokens: int) -> None:
    batches = prompt.plan_batches(lengths, batch_size, batch_tokens)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths)
    for batch in batches:
        assert 1 <= len(batch) <= batch_size
        longest = max(lengths[i] for i in batch)
        assert len(batch) == 1 or len(batch) * longest <= batch_tokens
