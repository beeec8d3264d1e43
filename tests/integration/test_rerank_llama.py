"""llama.cpp reranking for real: a tiny random-weight BERT cross-encoder built from
scratch (``tests/models/tiny_rerank_gguf.py``), served by the pinned llama-server that
the launcher starts for a ``model_type: rerank`` entry, reached through the router, and
scored against a numpy forward pass of the same weights.

Two entries serve the same file: ``tiny-rerank`` with flash attention off, where
llama-server's float32 math meets the reference to float32 rounding except where ggml's
float16 GELU table rounds one input the other way; and ``tiny-rerank-fa`` with
llama-server's default (``--flash-attn auto``, which turns it on for the CPU), where
flash attention's float16 Q/K/V cost about three decimal places.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import one_shot
from tests.integration.real_stack import Stack, running_registry
from tests.models.tiny_rerank_gguf import N_CTX_TRAIN, Reference, build
from tests.processes import free_port, running_router
from tests.registry_entries import registry_entry

pytestmark = [pytest.mark.real_model, pytest.mark.xdist_group("test_rerank_llama")]

MODEL = "tiny-rerank"
MODEL_FA = "tiny-rerank-fa"
# Flash attention off. The median is float32 rounding (measured: about 4e-7, nine pairs
# in ten under 1e-5); the bound covers a GELU input that llama-server's float32 sum and
# the reference's float64 put on opposite sides of a float16 rounding boundary, which
# moves a score by up to about 3e-4 (worst seen in 300 random pairs: 3.1e-4).
MEDIAN_TOLERANCE = 1e-5
TOLERANCE = 1e-3
# Flash attention on: K, V and Q in float16 (worst seen in 300 pairs: 3.4e-3).
FA_TOLERANCE = 1e-2

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital of France.",
    "The cat sat on the mat.",
    "Berlin is a city in Germany, on a river.",
    "Bread is baked in an oven.",
    "PYTHON code: snakes and languages!",
    "Naïve walkers eat 42 oranges",
    "",
]
QUERIES = [QUERY, "where do fish sail?", "", "how fast is the train"]


@dataclass
class Gateway:
    stack: Stack
    url: str
    reference: Reference

    def rerank(self, body: dict[str, Any]) -> httpx.Response:
        return one_shot.post(f"{self.url}/v1/rerank", json=body, timeout=60)

    def ok(self, body: dict[str, Any]) -> dict[str, Any]:
        response = self.rerank(body)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    workdir: Path = tmp_path_factory.mktemp("rerank")
    model = build(workdir / "tiny-rerank.gguf")
    common: dict[str, Any] = {
        "model_path": str(model),
        "default_timeout": 60,
        "quantization": "F32",
        "model_type": "rerank",
    }
    registry = {
        "models": {
            "rerank": registry_entry(MODEL, free_port(), **common, flash_attn=False),
            "rerank_fa": registry_entry(MODEL_FA, free_port(), **common),
        }
    }
    with (
        running_registry(workdir, registry) as stack,
        running_router(stack.env, workdir) as (_router, url),
    ):
        yield Gateway(stack, url, Reference())


def scores_by_index(answer: dict[str, Any]) -> dict[int, float]:
    return {item["index"]: item["relevance_score"] for item in answer["results"]}


def test_the_entry_is_listed_healthy_and_started_for_reranking(gateway: Gateway) -> None:
    models = one_shot.get(f"{gateway.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL, MODEL_FA]
    health = one_shot.get(f"{gateway.url}/v1/backends/health").json()
    assert {role: item["status"] for role, item in health.items()} == {
        "rerank": "healthy",
        "rerank_fa": "healthy",
    }


def test_the_reference_tokenizer_is_llama_cpp_s(gateway: Gateway) -> None:
    tokenize_url = f"http://127.0.0.1:{gateway.stack.ports['rerank']}/tokenize"
    for text in [*QUERIES, *DOCUMENTS, "Cats, DOGS & trees: played/baking?! x-ray"]:
        answer = one_shot.post(tokenize_url, json={"content": text}, timeout=10).json()
        assert answer["tokens"] == gateway.reference.tokenize(text), text


def test_the_answer_has_the_jina_cohere_shape_sorted_by_score(gateway: Gateway) -> None:
    answer = gateway.ok({"model": MODEL, "query": QUERY, "documents": DOCUMENTS})
    assert answer["object"] == "list"
    assert answer["model"] == MODEL
    results = answer["results"]
    assert sorted(item["index"] for item in results) == list(range(len(DOCUMENTS)))
    for item in results:
        assert set(item) == {"index", "relevance_score"}
        assert isinstance(item["index"], int)
        assert isinstance(item["relevance_score"], float)
    scores = [item["relevance_score"] for item in results]
    assert scores == sorted(scores, reverse=True)
    # Usage counts every token of every "[CLS] query [SEP] document [SEP]" prompt.
    prompts = [gateway.reference.rerank_tokens(QUERY, doc) for doc in DOCUMENTS]
    expected_tokens = sum(len(prompt) for prompt in prompts)
    assert answer["usage"] == {"prompt_tokens": expected_tokens, "total_tokens": expected_tokens}


def test_scores_are_the_reference_s_raw_logits(gateway: Gateway) -> None:
    errors = []
    for query in QUERIES:
        answer = gateway.ok({"model": MODEL, "query": query, "documents": DOCUMENTS})
        got = scores_by_index(answer)
        expected = [gateway.reference.score(query, doc) for doc in DOCUMENTS]
        errors += [abs(got[i] - want) for i, want in enumerate(expected)]
        # The weights spread the scores well beyond the tolerance, so the order is the
        # reference's order.
        gaps = [abs(a - b) for i, a in enumerate(expected) for b in expected[i + 1 :]]
        assert min(gaps) > 10 * TOLERANCE
        ranking = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
        assert [item["index"] for item in answer["results"]] == ranking
    assert max(errors) <= TOLERANCE, errors
    assert statistics.median(errors) <= MEDIAN_TOLERANCE, errors
    # A logit, not a probability: some scores fall outside [0, 1].
    assert any(not 0.0 <= gateway.reference.score(q, d) <= 1.0 for q in QUERIES for d in DOCUMENTS)


def test_a_document_s_score_does_not_depend_on_its_neighbours(gateway: Gateway) -> None:
    together = scores_by_index(gateway.ok({"model": MODEL, "query": QUERY, "documents": DOCUMENTS}))
    for i, doc in enumerate(DOCUMENTS[:3]):
        alone = scores_by_index(gateway.ok({"model": MODEL, "query": QUERY, "documents": [doc]}))
        assert alone[0] == pytest.approx(together[i], abs=MEDIAN_TOLERANCE)


def test_flash_attention_scores_are_close_to_the_reference(gateway: Gateway) -> None:
    answer = gateway.ok({"model": MODEL_FA, "query": QUERY, "documents": DOCUMENTS})
    assert answer["model"] == MODEL_FA
    got = scores_by_index(answer)
    for i, doc in enumerate(DOCUMENTS):
        assert got[i] == pytest.approx(gateway.reference.score(QUERY, doc), abs=FA_TOLERANCE)


def test_top_n_keeps_the_best_n(gateway: Gateway) -> None:
    full = gateway.ok({"model": MODEL, "query": QUERY, "documents": DOCUMENTS})["results"]
    for top_n in (1, 3):
        body = {"model": MODEL, "query": QUERY, "documents": DOCUMENTS, "top_n": top_n}
        assert gateway.ok(body)["results"] == full[:top_n]
    body = {"model": MODEL, "query": QUERY, "documents": DOCUMENTS, "top_n": 100}
    assert gateway.ok(body)["results"] == full


def test_documents_are_never_echoed_in_the_jina_cohere_format(gateway: Gateway) -> None:
    """llama-server ignores ``return_documents``: results carry index and score only."""
    body = {"model": MODEL, "query": QUERY, "documents": DOCUMENTS, "return_documents": True}
    for item in gateway.ok(body)["results"]:
        assert set(item) == {"index", "relevance_score"}


def test_the_tei_format_echoes_texts_on_request(gateway: Gateway) -> None:
    """With ``texts`` instead of ``documents`` llama-server answers in the TEI format:
    a bare list of ``{index, score}``, plus ``text`` when ``return_text`` is set."""
    body = {"model": MODEL, "query": QUERY, "texts": DOCUMENTS[:3], "return_text": True}
    response = gateway.rerank(body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert isinstance(answer, list)
    assert [set(item) for item in answer] == [{"index", "score", "text"}] * 3
    assert all(item["text"] == DOCUMENTS[item["index"]] for item in answer)
    for item in answer:
        want = gateway.reference.score(QUERY, DOCUMENTS[item["index"]])
        assert item["score"] == pytest.approx(want, abs=TOLERANCE)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"documents": ["Paris"]}, '"query" must be provided'),
        ({"query": 7, "documents": ["Paris"]}, '"query" must be a string'),
        ({"query": QUERY}, '"documents" must be a non-empty string array'),
        ({"query": QUERY, "documents": []}, '"documents" must be a non-empty string array'),
        ({"query": QUERY, "documents": "Paris"}, '"documents" must be a non-empty string array'),
        ({"query": QUERY, "documents": [1, 2]}, '"documents" must be a non-empty string array'),
        (
            {"query": QUERY, "documents": [{"text": "Paris"}]},
            '"documents" must be a non-empty string array',
        ),
    ],
)
def test_bad_input_is_an_openai_shaped_400(
    gateway: Gateway, body: dict[str, Any], message: str
) -> None:
    response = gateway.rerank({"model": MODEL, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert {"message", "type", "code"} <= set(error)
    assert error["message"] == message
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "400"


def test_a_prompt_longer_than_the_context_is_a_400(gateway: Gateway) -> None:
    fits = " ".join(["cat"] * (N_CTX_TRAIN - 4))  # [CLS] a [SEP] cat... [SEP]
    assert len(gateway.reference.rerank_tokens("a", fits)) == N_CTX_TRAIN
    answer = gateway.ok({"model": MODEL, "query": "a", "documents": [fits]})
    want = gateway.reference.score("a", fits)
    assert answer["results"][0]["relevance_score"] == pytest.approx(want, abs=TOLERANCE)

    response = gateway.rerank({"model": MODEL, "query": "a", "documents": [fits + " cat"]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "exceed_context_size_error"
    assert {"message", "type", "code"} <= set(error)


@pytest.mark.parametrize("top_n", [0, -1, "3", 2.5, True])
def test_a_bad_top_n_is_refused_by_the_router(gateway: Gateway, top_n: object) -> None:
    # llama-server resizes its result list to top_n unchecked: a negative one throws
    # inside it and would come back as a 500 the watchdog counts. The router refuses it,
    # and 0 too, as the MLX reranker does (an empty ranking is never what was meant).
    body = {"model": MODEL, "query": QUERY, "documents": DOCUMENTS, "top_n": top_n}
    response = gateway.rerank(body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_top_n"
    assert error["param"] == "top_n"
