"""``POST /v1/rerank``: the request it accepts and the answer it gives. Pure.

The shapes are llama-server's. The Jina/Cohere one::

    request   {"model"?, "query": str, "documents": [str | {"text": str}, ...],
               "top_n"?: int >= 1, "return_documents"?: bool, "instruction"?: str}
    answer    {"model", "object": "list",
               "usage": {"prompt_tokens", "total_tokens"},
               "results": [{"index", "relevance_score", "document"?: {"text"}}, ...]}

and, when the request names its documents ``texts`` (Hugging Face TEI's name), TEI's:
a bare list of ``{"index", "score", "text"?}``, ``text`` only with ``return_text: true``.

Results are sorted by score, highest first (equal scores keep document order), and cut
to ``top_n``. Like llama-server, documents are not echoed by default; unlike it (it
ignores the field), ``return_documents: true`` adds ``document: {"text"}`` to each
Jina-style result, as Jina and Cohere do. ``top_n`` below 1 is refused (llama-server
answers an empty list for 0). ``model`` in the answer is the request's, else the
server's id. Other request fields are ignored, as llama-server does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slm_server.mlx_rerank.prompt import DEFAULT_INSTRUCTION


class RequestError(Exception):
    """The request cannot be served; rendered as an OpenAI-shaped error body."""

    def __init__(
        self, message: str, status: int = 400, kind: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.status)


def error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    """``{"error": {"message", "type", "code"}}``, as llama-server and OpenAI answer."""
    return {"error": {"message": message, "type": kind, "code": code}}


@dataclass(frozen=True)
class RerankRequest:
    query: str
    documents: tuple[str, ...]
    top_n: int
    return_documents: bool
    instruction: str
    model: str | None = None
    tei: bool = False
    return_text: bool = False


def _document(index: int, item: Any) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and isinstance(item.get("text"), str):
        return str(item["text"])
    raise RequestError(
        f'"documents[{index}]" must be a string or an object with a string "text" field'
    )


def parse_rerank(body: Any) -> RerankRequest:
    """Validate a decoded JSON body; raises :class:`RequestError` saying what is wrong."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if "query" not in body or body["query"] is None:
        raise RequestError('"query" must be provided')
    query = body["query"]
    if not isinstance(query, str):
        raise RequestError('"query" must be a string')
    tei = "texts" in body
    raw_documents = body["documents"] if "documents" in body else body.get("texts")
    if not isinstance(raw_documents, list) or not raw_documents:
        name = "texts" if tei and "documents" not in body else "documents"
        raise RequestError(f'"{name}" must be a non-empty array of strings')
    documents = tuple(_document(i, item) for i, item in enumerate(raw_documents))
    top_n = body.get("top_n")
    if top_n is None:
        top_n = len(documents)
    elif isinstance(top_n, bool) or not isinstance(top_n, int):
        raise RequestError('"top_n" must be an integer')
    elif top_n < 1:
        raise RequestError('"top_n" must be at least 1')
    return_documents = _flag(body, "return_documents")
    return_text = _flag(body, "return_text")
    instruction = body.get("instruction")
    if instruction is None:
        instruction = DEFAULT_INSTRUCTION
    elif not isinstance(instruction, str):
        raise RequestError('"instruction" must be a string')
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError('"model" must be a string')
    return RerankRequest(
        query=query,
        documents=documents,
        top_n=top_n,
        return_documents=return_documents,
        instruction=instruction,
        model=model,
        tei=tei,
        return_text=return_text,
    )


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f'"{name}" must be true or false')
    return value


def _ranked(request: RerankRequest, scores: Sequence[float]) -> list[int]:
    if len(scores) != len(request.documents):
        raise ValueError(f"{len(scores)} scores for {len(request.documents)} documents")
    return sorted(range(len(scores)), key=lambda i: -scores[i])[: request.top_n]


def rerank_response(
    request: RerankRequest, model_id: str, scores: Sequence[float], prompt_tokens: int
) -> dict[str, Any]:
    """The Jina/Cohere-style answer given one score per document, in order."""
    results: list[dict[str, Any]] = []
    for index in _ranked(request, scores):
        result: dict[str, Any] = {"index": index, "relevance_score": scores[index]}
        if request.return_documents:
            result["document"] = {"text": request.documents[index]}
        results.append(result)
    return {
        "model": request.model if request.model is not None else model_id,
        "object": "list",
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        "results": results,
    }


def tei_response(request: RerankRequest, scores: Sequence[float]) -> list[dict[str, Any]]:
    """The TEI-style answer given one score per document, in order."""
    results: list[dict[str, Any]] = []
    for index in _ranked(request, scores):
        result: dict[str, Any] = {"index": index, "score": scores[index]}
        if request.return_text:
            result["text"] = request.documents[index]
        results.append(result)
    return results


def response_body(
    request: RerankRequest, model_id: str, scores: Sequence[float], prompt_tokens: int
) -> dict[str, Any] | list[dict[str, Any]]:
    """The answer in the format the request chose."""
    if request.tei:
        return tei_response(request, scores)
    return rerank_response(request, model_id, scores, prompt_tokens)
