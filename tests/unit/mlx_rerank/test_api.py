"""Rerank request validation and the llama-server-shaped answer (pure; no MLX)."""

from __future__ import annotations

from typing import Any

import pytest

from slm_server.mlx_rerank.api import (
    RequestError,
    RerankRequest,
    parse_rerank,
    rerank_response,
    response_body,
    tei_response,
)
from slm_server.mlx_rerank.prompt import DEFAULT_INSTRUCTION


def test_minimal_request_gets_the_defaults() -> None:
    request = parse_rerank({"query": "q", "documents": ["a", "b"]})
    assert request == RerankRequest(
        query="q",
        documents=("a", "b"),
        top_n=2,
        return_documents=False,
        instruction=DEFAULT_INSTRUCTION,
        model=None,
    )


def test_full_request() -> None:
    body = {
        "model": "m",
        "query": "q",
        "documents": ["a", {"text": "b", "title": "ignored"}],
        "top_n": 5,
        "return_documents": True,
        "instruction": "Find code",
        "unknown": "ignored, as llama-server does",
    }
    assert parse_rerank(body) == RerankRequest(
        query="q",
        documents=("a", "b"),
        top_n=5,
        return_documents=True,
        instruction="Find code",
        model="m",
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "must be a JSON object"),
        ("text", "must be a JSON object"),
        ({"documents": ["a"]}, '"query" must be provided'),
        ({"query": None, "documents": ["a"]}, '"query" must be provided'),
        ({"query": 1, "documents": ["a"]}, '"query" must be a string'),
        ({"query": "q"}, '"documents" must be a non-empty array'),
        ({"query": "q", "documents": []}, '"documents" must be a non-empty array'),
        ({"query": "q", "documents": "a"}, '"documents" must be a non-empty array'),
        ({"query": "q", "documents": ["a", 2]}, '"documents\\[1\\]" must be a string'),
        ({"query": "q", "documents": [{"txt": "a"}]}, '"documents\\[0\\]" must be a string'),
        ({"query": "q", "documents": [{"text": 3}]}, '"documents\\[0\\]" must be a string'),
        ({"query": "q", "documents": ["a"], "top_n": 0}, '"top_n" must be at least 1'),
        ({"query": "q", "documents": ["a"], "top_n": -3}, '"top_n" must be at least 1'),
        ({"query": "q", "documents": ["a"], "top_n": "2"}, '"top_n" must be an integer'),
        ({"query": "q", "documents": ["a"], "top_n": 1.5}, '"top_n" must be an integer'),
        ({"query": "q", "documents": ["a"], "top_n": True}, '"top_n" must be an integer'),
        ({"query": "q", "documents": ["a"], "return_documents": "yes"}, '"return_documents"'),
        ({"query": "q", "documents": ["a"], "instruction": 1}, '"instruction" must be a string'),
        ({"query": "q", "documents": ["a"], "model": 1}, '"model" must be a string'),
    ],
)
def test_bad_requests_are_400_with_a_reason(body: Any, message: str) -> None:
    with pytest.raises(RequestError, match=message) as caught:
        parse_rerank(body)
    error = caught.value.body()["error"]
    assert set(error) == {"message", "type", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == caught.value.status == 400


def _request(**overrides: Any) -> RerankRequest:
    fields: dict[str, Any] = {
        "query": "q",
        "documents": ("d0", "d1", "d2", "d3"),
        "top_n": 4,
        "return_documents": False,
        "instruction": DEFAULT_INSTRUCTION,
        "model": None,
    }
    fields.update(overrides)
    return RerankRequest(**fields)


def test_response_is_sorted_by_score_with_usage() -> None:
    body = rerank_response(_request(), "rr", [0.1, 0.9, 0.5, 0.7], 40)
    assert body == {
        "model": "rr",
        "object": "list",
        "usage": {"prompt_tokens": 40, "total_tokens": 40},
        "results": [
            {"index": 1, "relevance_score": 0.9},
            {"index": 3, "relevance_score": 0.7},
            {"index": 2, "relevance_score": 0.5},
            {"index": 0, "relevance_score": 0.1},
        ],
    }


def test_equal_scores_keep_document_order() -> None:
    body = rerank_response(_request(), "rr", [0.5, 0.7, 0.5, 0.5], 4)
    assert [r["index"] for r in body["results"]] == [1, 0, 2, 3]


def test_top_n_and_document_echo_and_request_model() -> None:
    request = _request(top_n=2, return_documents=True, model="alias")
    body = rerank_response(request, "rr", [0.1, 0.9, 0.5, 0.7], 4)
    assert body["model"] == "alias"
    assert body["results"] == [
        {"index": 1, "relevance_score": 0.9, "document": {"text": "d1"}},
        {"index": 3, "relevance_score": 0.7, "document": {"text": "d3"}},
    ]


def test_top_n_beyond_the_documents_returns_all() -> None:
    body = rerank_response(_request(top_n=10), "rr", [0.1, 0.2, 0.3, 0.4], 4)
    assert len(body["results"]) == 4


def test_scores_must_match_the_documents() -> None:
    with pytest.raises(ValueError, match="3 scores for 4 documents"):
        rerank_response(_request(), "rr", [0.1, 0.2, 0.3], 4)


def test_texts_selects_the_tei_format() -> None:
    request = parse_rerank({"query": "q", "texts": ["a", "bb", "c"], "return_text": True})
    assert request.tei
    assert request.documents == ("a", "bb", "c")
    assert response_body(request, "rr", [0.2, 0.9, 0.4], 9) == [
        {"index": 1, "score": 0.9, "text": "bb"},
        {"index": 2, "score": 0.4, "text": "c"},
        {"index": 0, "score": 0.2, "text": "a"},
    ]
    plain = parse_rerank({"query": "q", "texts": ["a", "bb", "c"], "top_n": 1})
    assert tei_response(plain, [0.2, 0.9, 0.4]) == [{"index": 1, "score": 0.9}]
    jina = parse_rerank({"query": "q", "documents": ["a"]})
    assert response_body(jina, "rr", [0.5], 3) == rerank_response(jina, "rr", [0.5], 3)


def test_documents_win_over_texts_but_the_format_is_tei() -> None:
    """As llama-server: ``texts`` anywhere means TEI; ``documents`` still holds the list."""
    request = parse_rerank({"query": "q", "documents": ["d"], "texts": ["t", "u"]})
    assert request.tei
    assert request.documents == ("d",)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"query": "q", "texts": []}, '"texts" must be a non-empty array'),
        ({"query": "q", "texts": ["a"], "return_text": 1}, '"return_text" must be true or false'),
    ],
)
def test_bad_tei_requests(body: Any, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        parse_rerank(body)
