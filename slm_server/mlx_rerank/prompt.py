"""The Qwen3-Reranker prompt and how pairs are grouped into batches. Pure.

The model reads one ChatML conversation per (query, document) pair: a system turn
asking for a yes/no judgement, a user turn holding the instruction, the query and the
document, and an assistant turn opened with an empty think block. The relevance score
is the probability of "yes" against "no" as the next token.

Truncation follows the model card's method: the prompt's fixed head and tail are
tokenized on their own and kept whole; only the pair's text in between is cut, from
its end, so that the whole prompt fits ``max_length`` tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
SYSTEM_PROMPT = (
    "Judge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".'
)
PROMPT_HEAD = f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n"
PROMPT_TAIL = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
# The two answer tokens, in the order the score's softmax takes them.
ANSWER_NO = "no"
ANSWER_YES = "yes"


def pair_text(query: str, document: str, instruction: str = DEFAULT_INSTRUCTION) -> str:
    """The user turn's content for one pair."""
    return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"


def format_prompt(query: str, document: str, instruction: str = DEFAULT_INSTRUCTION) -> str:
    """The whole prompt for one pair, as text (untruncated)."""
    return PROMPT_HEAD + pair_text(query, document, instruction) + PROMPT_TAIL


def pair_budget(head_tokens: int, tail_tokens: int, max_length: int) -> int:
    """How many tokens of pair text fit beside the fixed head and tail; raises
    :class:`ValueError` when ``max_length`` leaves no room at all."""
    budget = max_length - head_tokens - tail_tokens
    if budget < 1:
        raise ValueError(
            f"max length {max_length} leaves no room for the query and document: the "
            f"prompt's fixed part alone is {head_tokens + tail_tokens} tokens"
        )
    return budget


def assemble(
    head: Sequence[int], pair: Sequence[int], tail: Sequence[int], max_length: int
) -> list[int]:
    """The prompt's token ids: ``head + pair + tail``, the pair cut from its end so the
    result is at most ``max_length`` long."""
    budget = pair_budget(len(head), len(tail), max_length)
    return [*head, *pair[:budget], *tail]


def plan_batches(
    lengths: Sequence[int], max_batch_size: int, max_batch_tokens: int
) -> list[list[int]]:
    """Indices into ``lengths`` grouped into batches, shortest prompts first so that
    each batch pads little. A batch holds at most ``max_batch_size`` prompts and, padded
    to its longest, at most ``max_batch_tokens`` tokens, but always at least one prompt.
    Equal lengths keep their order; every index appears exactly once."""
    if max_batch_size < 1 or max_batch_tokens < 1:
        raise ValueError("batch limits must be at least 1")
    batches: list[list[int]] = []
    current: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        # Sorted ascending, so the newcomer is the batch's longest.
        padded = (len(current) + 1) * lengths[index]
        if current and (len(current) >= max_batch_size or padded > max_batch_tokens):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches
