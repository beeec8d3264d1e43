"""Scoring (query, document) pairs with a Qwen3-Reranker-style model under mlx-lm.

MLX and mlx-lm are imported when a model is loaded, not when this module is, so the
package (and its unit tests) work on machines without MLX; they are imported through
``importlib`` and used untyped, so type checking needs neither installed.

A batch is padded on the right to its longest prompt. Attention is causal, so a
prompt's own positions never see the padding after them and its last real position
holds exactly what it would hold unbatched: the score is read there. Only those
positions go through the output head, not every position of the batch.

MLX is not re-entrant: one :class:`Reranker` serves one call at a time (a lock), and
the server makes every MLX call from one thread.
"""

from __future__ import annotations

import importlib
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slm_server.mlx_rerank.prompt import (
    ANSWER_NO,
    ANSWER_YES,
    DEFAULT_INSTRUCTION,
    PROMPT_HEAD,
    PROMPT_TAIL,
    assemble,
    pair_budget,
    pair_text,
    plan_batches,
)

DEFAULT_MAX_LENGTH = 8192
DEFAULT_BATCH_SIZE = 16
DEFAULT_BATCH_TOKENS = 8192


class ModelLoadError(Exception):
    """The checkpoint cannot serve as a reranker (the message says why)."""


@dataclass(frozen=True)
class Scores:
    """One relevance score per document, in document order, and the prompt tokens read."""

    scores: tuple[float, ...]
    prompt_tokens: int


@dataclass(frozen=True)
class Limits:
    max_length: int = DEFAULT_MAX_LENGTH
    batch_size: int = DEFAULT_BATCH_SIZE
    batch_tokens: int = DEFAULT_BATCH_TOKENS


def _token_id(tokenizer: Any, token: str) -> int:
    """The id of ``token`` as one vocabulary entry; :class:`ModelLoadError` if absent."""
    token_id = tokenizer.convert_tokens_to_ids(token)
    unknown = getattr(tokenizer, "unk_token_id", None)
    if not isinstance(token_id, int) or (unknown is not None and token_id == unknown):
        raise ModelLoadError(
            f"the tokenizer has no single token {token!r}: not a Qwen3-Reranker-style model"
        )
    return token_id


class Reranker:
    """A loaded reranker model and its tokenizer."""

    def __init__(self, model: Any, tokenizer: Any, mx: Any, limits: Limits) -> None:
        self._model = model
        # mlx-lm's TokenizerWrapper hands every public member it lacks (encode,
        # convert_tokens_to_ids, pad_token_id) to the Hugging Face tokenizer it wraps.
        self._tokenizer = tokenizer
        self._mx = mx
        self._limits = limits
        self._lock = threading.Lock()
        self._no = _token_id(self._tokenizer, ANSWER_NO)
        self._yes = _token_id(self._tokenizer, ANSWER_YES)
        head, tail = self._encode([PROMPT_HEAD, PROMPT_TAIL])
        try:  # fail now, not on every request
            pair_budget(len(head), len(tail), limits.max_length)
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
        self._head, self._tail = head, tail
        pad = getattr(self._tokenizer, "pad_token_id", None)
        self._pad = pad if isinstance(pad, int) else 0

    @classmethod
    def load(cls, model_path: str, limits: Limits) -> Reranker:
        """Load ``model_path`` (a local directory or a Hugging Face id, downloaded on
        first use) with mlx-lm."""
        try:
            mx = importlib.import_module("mlx.core")
            mlx_lm = importlib.import_module("mlx_lm")
        except ImportError as exc:
            raise ModelLoadError(f"mlx-lm is not installed ({exc}): uv sync --extra mlx") from None
        model, tokenizer = mlx_lm.load(model_path)[:2]
        return cls(model, tokenizer, mx, limits)

    def _encode(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(self._tokenizer.encode(text, add_special_tokens=False)) for text in texts]

    def prompts(self, query: str, documents: Sequence[str], instruction: str) -> list[list[int]]:
        """The token ids of each document's prompt, truncated to the maximum length."""
        pairs = self._encode([pair_text(query, doc, instruction) for doc in documents])
        return [assemble(self._head, p, self._tail, self._limits.max_length) for p in pairs]

    def score(
        self, query: str, documents: Sequence[str], instruction: str = DEFAULT_INSTRUCTION
    ) -> Scores:
        """P("yes") against "no" for each document, in document order."""
        with self._lock:
            prompts = self.prompts(query, documents, instruction)
            scores = [0.0] * len(prompts)
            batches = plan_batches(
                [len(p) for p in prompts], self._limits.batch_size, self._limits.batch_tokens
            )
            for batch in batches:
                values = self._score_batch([prompts[i] for i in batch])
                for index, value in zip(batch, values, strict=True):
                    scores[index] = value
            return Scores(tuple(scores), sum(len(p) for p in prompts))

    def _score_batch(self, prompts: list[list[int]]) -> list[float]:
        mx = self._mx
        longest = max(len(p) for p in prompts)
        inputs = mx.array([p + [self._pad] * (longest - len(p)) for p in prompts])
        last = mx.array([len(p) - 1 for p in prompts])
        rows = mx.arange(len(prompts))
        backbone = getattr(self._model, "model", None)
        if backbone is not None and hasattr(backbone, "embed_tokens"):
            hidden = backbone(inputs)[rows, last]
            lm_head = getattr(self._model, "lm_head", None)
            if lm_head is not None:
                logits = lm_head(hidden)
            else:
                logits = backbone.embed_tokens.as_linear(hidden)
        else:  # not the usual decoder layout: take the full logits and pick
            logits = self._model(inputs)[rows, last]
        pair = mx.stack([logits[:, self._no], logits[:, self._yes]], axis=-1)
        probabilities = mx.softmax(pair.astype(mx.float32), axis=-1)[:, 1]
        mx.eval(probabilities)
        values = [float(v) for v in probabilities.tolist()]
        if not all(math.isfinite(v) for v in values):
            raise ArithmeticError("the model produced a non-finite score")
        return values
