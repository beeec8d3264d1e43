"""The MLX reranker for real, on the CPU: ``python -m slm_server mlx-rerank`` serving a
tiny random Qwen3 built here (``tests/models/tiny_qwen3.py``), checked against a
reference computed in this process with mlx-lm, prompt by prompt, unbatched.

The server runs with a batch size of 3, so the documents below (of very different
lengths) are scored in several padded batches; each score must still be the one the
lone, unpadded prompt gives. Last, the launcher starts the same server for a registry
entry (``backend: mlx-rerank``) and the router reaches it by model id.
"""

from __future__ import annotations

import importlib
import math
import signal
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import mlx_lm
import pytest

from tests import one_shot
from tests.integration.watched import watched
from tests.models.tiny_qwen3 import build
from tests.processes import Command, free_port, poll, start_command
from tests.registry_entries import registry_entry

# The test environment always has MLX (scripts/setup.sh --for-tests installs the mlx
# extra, on Linux too); a missing one fails here rather than skipping.
mx = importlib.import_module("mlx.core")  # used untyped, as the server does

# One worker runs the whole module: its module-scoped server starts once, not per worker.
pytestmark = pytest.mark.xdist_group("test_mlx_rerank")

MODEL_ID = "tiny-qwen3-rerank"
# Importing mlx-lm and transformers takes seconds before the model even loads.
START_TIMEOUT = 120.0
TOLERANCE = 1e-5
BATCH_SIZE = 3

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
QUERY = "what is the tallest mountain on earth"
DOCUMENTS = [
    "Mount Everest is the highest mountain above sea level.",
    "The river flows through the valley towards the sea.",
    "Paris is the capital of France.",
    "def add(a, b):\n    return a + b",
    "yes",
    "",
    "Plants use sunlight, water and carbon dioxide to make sugar. " * 6,
    "Grüße aus 東京: ünïcödé, emoji 🙂 and <tags>.",
]


def reference_prompt(query: str, document: str, instruction: str) -> str:
    """The Qwen3-Reranker prompt, written out independently of the server's code."""
    return (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on "
        "the Query and the Instruct provided. Note that the answer can only be "
        '"yes" or "no".<|im_end|>\n<|im_start|>user\n'
        f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
        "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


@dataclass
class Reference:
    model: Any
    tokenizer: Any
    cache: dict[tuple[str, str, str], tuple[float, int]] = field(default_factory=dict)

    def score(
        self, query: str, document: str, instruction: str = DEFAULT_INSTRUCTION
    ) -> tuple[float, int]:
        """P(yes) against no at the last position of the lone prompt, and its length."""
        key = (query, document, instruction)
        if key not in self.cache:
            prompt = reference_prompt(query, document, instruction)
            ids = self.tokenizer.encode(prompt, add_special_tokens=False)
            logits = self.model(mx.array([ids]))[0, -1]
            yes = logits[self.tokenizer.convert_tokens_to_ids("yes")].item()
            no = logits[self.tokenizer.convert_tokens_to_ids("no")].item()
            self.cache[key] = (1.0 / (1.0 + math.exp(no - yes)), len(ids))
        return self.cache[key]

    def scores(
        self, query: str, documents: list[str], instruction: str = DEFAULT_INSTRUCTION
    ) -> list[float]:
        return [self.score(query, doc, instruction)[0] for doc in documents]


@dataclass
class Server:
    url: str
    command: Command
    health_seen: list[tuple[int, Any]]

    def rerank(self, body: Any, path: str = "/v1/rerank") -> httpx.Response:
        return one_shot.post(f"{self.url}{path}", json=body, timeout=60)

    def ok(self, body: Any, path: str = "/v1/rerank") -> Any:
        response = self.rerank(body, path)
        assert response.status_code == 200, response.text
        return response.json()


def health(url: str) -> tuple[int, Any] | None:
    try:
        response = one_shot.get(f"{url}/health", timeout=2)
    except httpx.HTTPError:
        return None
    return response.status_code, response.json()


def start_reranker(tmp: Path, model_path: Path, name: str, *extra: str) -> tuple[Command, str]:
    port = free_port()
    command = start_command(
        "mlx-rerank",
        {},
        tmp / f"{name}.out",
        "--model-path",
        str(model_path),
        "--port",
        str(port),
        "--model-id",
        MODEL_ID,
        *extra,
    )
    return command, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tiny-qwen3") / "model")


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> Reference:
    model, tokenizer = mlx_lm.load(str(model_dir))[:2]
    return Reference(model, tokenizer)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("mlx-rerank")
    command, url = start_reranker(tmp, model_dir, "rerank", "--batch-size", str(BATCH_SIZE))
    seen: list[tuple[int, Any]] = []

    def ready_or_gone() -> bool:
        if command.popen.poll() is not None:
            return True
        answer = health(url)
        if answer is not None:
            seen.append(answer)
        return answer is not None and answer[0] == 200

    try:
        poll(ready_or_gone, START_TIMEOUT, "the reranker to load", interval=0.1)
        assert command.popen.poll() is None, f"the reranker exited:\n{command.text()}"
        yield Server(url, command, seen)
    finally:
        code = command.stop()
    assert code == 0, command.text()


def by_index(answer: dict[str, Any]) -> dict[int, float]:
    return {item["index"]: item["relevance_score"] for item in answer["results"]}


def test_health_says_loading_and_then_ok(server: Server) -> None:
    statuses = [status for status, _body in server.health_seen]
    assert statuses[-1] == 200
    assert server.health_seen[-1][1] == {"status": "ok"}
    # Loading takes seconds (imports, then the model), and the port is open meanwhile.
    loading = [body for status, body in server.health_seen if status == 503]
    assert loading, statuses
    assert loading[0]["status"] == "loading"
    assert loading[0]["error"]["type"] == "unavailable_error"
    assert set(statuses) <= {503, 200}


def test_models_lists_the_model_id(server: Server) -> None:
    answer = one_shot.get(f"{server.url}/v1/models", timeout=10).json()
    assert [m["id"] for m in answer["data"]] == [MODEL_ID]


def test_answer_shape_and_order(server: Server, reference: Reference) -> None:
    answer = server.ok({"model": MODEL_ID, "query": QUERY, "documents": DOCUMENTS})
    assert set(answer) == {"model", "object", "usage", "results"}
    assert answer["model"] == MODEL_ID
    assert answer["object"] == "list"
    results = answer["results"]
    assert sorted(item["index"] for item in results) == list(range(len(DOCUMENTS)))
    for item in results:
        assert set(item) == {"index", "relevance_score"}  # no echo unless asked
        assert isinstance(item["relevance_score"], float)
        assert 0.0 < item["relevance_score"] < 1.0
    scores = [item["relevance_score"] for item in results]
    assert scores == sorted(scores, reverse=True)
    tokens = sum(reference.score(QUERY, doc)[1] for doc in DOCUMENTS)
    assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_scores_equal_the_unbatched_reference(server: Server, reference: Reference) -> None:
    errors: list[float] = []
    for query in (QUERY, "", "yes or no?"):
        answer = server.ok({"model": MODEL_ID, "query": query, "documents": DOCUMENTS})
        got = by_index(answer)
        expected = reference.scores(query, DOCUMENTS)
        errors += [abs(got[i] - want) for i, want in enumerate(expected)]
        # The random weights spread the scores well apart, so the order is the reference's.
        ranking = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
        assert [item["index"] for item in answer["results"]] == ranking
    assert max(errors) <= TOLERANCE, errors
    spread = reference.scores(QUERY, DOCUMENTS)
    assert max(spread) - min(spread) > 0.05


def test_a_request_s_own_instruction(server: Server, reference: Reference) -> None:
    instruction = "Given a question, find code that answers it"
    body = {"query": QUERY, "documents": DOCUMENTS, "instruction": instruction}
    got = by_index(server.ok(body))
    expected = reference.scores(QUERY, DOCUMENTS, instruction)
    assert [got[i] for i in range(len(DOCUMENTS))] == pytest.approx(expected, abs=TOLERANCE)
    default = reference.scores(QUERY, DOCUMENTS)
    assert max(abs(a - b) for a, b in zip(expected, default, strict=True)) > 1e-3


def test_a_score_does_not_depend_on_its_batch(server: Server) -> None:
    together = by_index(server.ok({"query": QUERY, "documents": DOCUMENTS}))
    for i, doc in enumerate(DOCUMENTS):
        alone = by_index(server.ok({"query": QUERY, "documents": [doc]}))
        assert alone[0] == pytest.approx(together[i], abs=TOLERANCE)


def test_top_n_and_document_echo(server: Server) -> None:
    body: dict[str, Any] = {"model": MODEL_ID, "query": QUERY, "documents": DOCUMENTS}
    full = server.ok(body)["results"]
    for top_n in (1, 3):
        assert server.ok({**body, "top_n": top_n})["results"] == full[:top_n]
    assert server.ok({**body, "top_n": 100})["results"] == full
    echoed = server.ok({**body, "top_n": 2, "return_documents": True})["results"]
    assert [item["index"] for item in echoed] == [item["index"] for item in full[:2]]
    for item in echoed:
        assert item["document"] == {"text": DOCUMENTS[item["index"]]}
    objects = [{"text": doc} for doc in DOCUMENTS]
    assert server.ok({**body, "documents": objects})["results"] == full


def test_aliases_and_the_tei_format(server: Server) -> None:
    body = {"model": MODEL_ID, "query": QUERY, "documents": DOCUMENTS[:3]}
    expected = server.ok(body)["results"]
    for path in ("/rerank", "/v1/reranking", "/reranking"):
        assert server.ok(body, path)["results"] == expected
    tei = server.ok({"query": QUERY, "texts": DOCUMENTS[:3], "return_text": True})
    assert tei == [
        {
            "index": item["index"],
            "score": item["relevance_score"],
            "text": DOCUMENTS[item["index"]],
        }
        for item in expected
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"documents": ["a"]}, '"query" must be provided'),
        ({"query": 3, "documents": ["a"]}, '"query" must be a string'),
        ({"query": "q", "documents": []}, '"documents" must be a non-empty array'),
        ({"query": "q", "documents": "a"}, '"documents" must be a non-empty array'),
        ({"query": "q", "documents": [None]}, '"documents[0]" must be a string'),
        ({"query": "q", "documents": ["a"], "top_n": 0}, '"top_n" must be at least 1'),
        ({"query": "q", "documents": ["a"], "top_n": "1"}, '"top_n" must be an integer'),
        (["not", "an", "object"], "must be a JSON object"),
    ],
)
def test_bad_requests_get_400(server: Server, body: Any, message: str) -> None:
    response = server.rerank(body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code"}
    assert message in error["message"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == 400


def test_invalid_json_and_unknown_paths(server: Server) -> None:
    response = one_shot.post(f"{server.url}/v1/rerank", content=b"{oops", timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "the request body is not valid JSON"
    missing = one_shot.get(f"{server.url}/v1/chat/completions", timeout=10)
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"


def test_concurrent_requests_are_all_answered_exactly(server: Server, reference: Reference) -> None:
    queries = [QUERY, "where is Paris", "how to add numbers", "", "sea", "yes"]

    def ask(query: str) -> dict[int, float]:
        return by_index(server.ok({"query": query, "documents": DOCUMENTS}))

    with ThreadPoolExecutor(len(queries)) as pool:
        answers = list(pool.map(ask, queries))
    for query, got in zip(queries, answers, strict=True):
        expected = reference.scores(query, DOCUMENTS)
        assert [got[i] for i in range(len(DOCUMENTS))] == pytest.approx(expected, abs=TOLERANCE)
    # /health answered throughout; it still does.
    assert health(server.url) == (200, {"status": "ok"})


def test_sigterm_while_loading_exits_cleanly(tmp_path: Path, model_dir: Path) -> None:
    command, url = start_reranker(tmp_path, model_dir, "early")
    try:
        poll(
            lambda: health(url) is not None or command.popen.poll() is not None,
            START_TIMEOUT,
            "the reranker to listen",
        )
        loading = health(url)
        assert loading is not None, command.text()
        # Importing mlx-lm alone takes longer than this: the model is still loading.
        assert loading[0] == 503, loading
        command.popen.send_signal(signal.SIGTERM)
        assert command.popen.wait(timeout=30) == 0, command.text()
    finally:
        command.stop()


def test_a_model_that_cannot_load_exits_1(tmp_path: Path) -> None:
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    command, _url = start_reranker(tmp_path, empty, "broken")
    try:
        assert command.popen.wait(timeout=START_TIMEOUT) == 1, command.text()
    finally:
        command.stop()
    assert "failed to load" in command.text()


def test_a_port_in_use_exits_1(tmp_path: Path, model_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = start_command(
            "mlx-rerank",
            {},
            tmp_path / "taken.out",
            "--model-path",
            str(model_dir),
            "--port",
            str(port),
        )
        try:
            assert command.popen.wait(timeout=START_TIMEOUT) == 1, command.text()
        finally:
            command.stop()
    assert "address already in use" in command.text().lower()


def test_the_launcher_and_router_serve_an_mlx_rerank_entry(
    tmp_path: Path, model_dir: Path, reference: Reference
) -> None:
    entry = registry_entry(
        MODEL_ID,
        free_port(),
        backend="mlx-rerank",
        model_type="rerank",
        model_path=str(model_dir),
        quantization="f32",
        default_timeout=60,
    )
    with watched(
        tmp_path,
        {"rerank": entry},
        wait_ready=False,
        SLM_WATCHDOG_STARTUP_GRACE_SECONDS="2",
        SLM_STOP_TIMEOUT_SECONDS="10",
    ) as stack:
        stack.wait_ready("rerank", timeout=START_TIMEOUT)
        listed = one_shot.get(f"{stack.url}/v1/models", timeout=10).json()["data"]
        assert [m["id"] for m in listed] == [MODEL_ID]
        body = {"model": MODEL_ID, "query": QUERY, "documents": DOCUMENTS, "top_n": 4}
        response = one_shot.post(f"{stack.url}/v1/rerank", json=body, timeout=60)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["model"] == MODEL_ID
        expected = reference.scores(QUERY, DOCUMENTS)
        ranking = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])[:4]
        assert [item["index"] for item in answer["results"]] == ranking
        for item in answer["results"]:
            assert item["relevance_score"] == pytest.approx(expected[item["index"]], abs=TOLERANCE)
        log = (stack.log_dir / f"mlx-rerank-{MODEL_ID}-{entry['port']}.log").read_text()
        assert "loaded in" in log
