"""Raw passthrough and filling in the middle on the real llama-server, launched by
slm_server, through the router: ``/upstream/<model>/...`` answers byte for byte as the
engine does directly; ``/infill`` and completions with ``suffix`` return the middle on
a model with fill-in-the-middle tokens (a copy of SmolLM2 with the token ids added,
:mod:`tests.models.fim_gguf`: neither default model has them) and a 400 on SmolLM2,
whose own llama-server answers 501 (``/infill``) or ignores the suffix."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests import one_shot
from tests.integration.real_stack import Stack, example_registry, running_registry
from tests.models.fim_gguf import with_fim_tokens
from tests.openai_shapes import strict_completion, strict_completion_chunks
from tests.processes import ROOT, free_port, running_router

# One worker runs the whole module: its module-scoped stack starts once, not per worker.
pytestmark = [pytest.mark.real_model, pytest.mark.xdist_group("test_upstream_infill_real")]

PLAIN = "smollm2-135m-instruct"
CODER = "smollm2-fim"
JSON = {"content-type": "application/json"}
# Greedy and uncached, so two requests give the same middle.
GREEDY = {"top_k": 1, "samplers": ["top_k"], "cache_prompt": False, "seed": 1}
PREFIX = "def add(a, b):\n"
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str]]:
    workdir: Path = tmp_path_factory.mktemp("upstream-real")
    ports = {"standard": free_port(), "gemma": 0, "embeddings": 0}  # only standard is kept
    registry = example_registry(ports, roles=("standard",))
    fim = with_fim_tokens(
        ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf", workdir / "smollm2-fim.gguf"
    )
    registry["models"]["coder"] = {
        "id": CODER,
        "backend": "llamacpp",
        "port": free_port(),
        "model_path": str(fim),
        "default_timeout": 120,
        "quantization": "Q4_1",
        "context_length": 2048,
        "infill_default": True,
    }
    with (
        running_registry(workdir, registry) as stack,
        running_router(stack.env, workdir) as (_router, url),
    ):
        yield stack, url


def direct(stack: Stack, role: str) -> str:
    return f"http://127.0.0.1:{stack.ports[role]}"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/tokenize", {"content": "Hello, world!", "with_pieces": True}),
        ("POST", "/detokenize", {"tokens": [19556, 28, 905, 17]}),
        ("GET", "/props", None),
        ("POST", "/apply-template", {"messages": [{"role": "user", "content": "hi"}]}),
        ("POST", "/tokenize", {"content": 5}),  # its own error (a 500, as it answers)
        ("POST", "/tokenize", b'{"content": "x"'),  # malformed: its 500, relayed as it is
    ],
)
def test_upstream_answers_byte_for_byte_as_llama_server_does(
    gateway: tuple[Stack, str], method: str, path: str, body: Any
) -> None:
    stack, url = gateway
    content = (
        body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
    )
    through = one_shot.request(
        method, f"{url}/upstream/{PLAIN}{path}", content=content, headers=JSON, timeout=60
    )
    itself = one_shot.request(
        method, f"{direct(stack, 'standard')}{path}", content=content, headers=JSON, timeout=60
    )
    assert (through.status_code, through.content) == (itself.status_code, itself.content)
    assert through.headers["content-type"] == itself.headers["content-type"]


def test_the_engine_s_500s_on_a_client_s_body_never_count_against_it(
    gateway: tuple[Stack, str],
) -> None:
    _stack, url = gateway
    for _ in range(4):  # past the default failure threshold (3)
        answer = one_shot.post(
            f"{url}/upstream/{PLAIN}/tokenize", content=b'{"content": 5}', headers=JSON
        )
        assert answer.status_code == 500
    health = one_shot.get(f"{url}/v1/backends/health").json()["standard"]
    assert (health["status"], health["failure_streak"]) == ("healthy", 0)


def test_a_state_changing_path_is_403_with_why(gateway: tuple[Stack, str]) -> None:
    _stack, url = gateway
    for method, path in (("POST", "/slots/0?action=erase"), ("GET", "/slots"), ("GET", "/metrics")):
        answer = one_shot.request(method, f"{url}/upstream/{PLAIN}{path}", json={}, timeout=30)
        assert answer.status_code == 403, path
        assert "upstream_paths" in answer.json()["error"]["message"]


def infill_body(**fields: Any) -> dict[str, Any]:
    """llama.vscode's /infill body (src/llama-server.ts), greedy, a few tokens."""
    return {
        "input_prefix": PREFIX,
        "input_suffix": SUFFIX,
        "input_extra": [{"text": "import os\n", "time": 1700000000000, "filename": "util.py"}],
        "prompt": "    return",
        "n_predict": 8,
        "top_p": 0.99,
        "stream": False,
        "n_indent": 4,
        "t_max_prompt_ms": 5000,
        "t_max_predict_ms": 5000,
        **GREEDY,
        **fields,
    }


def test_infill_returns_llama_server_s_middle(gateway: tuple[Stack, str]) -> None:
    stack, url = gateway
    itself = one_shot.post(f"{direct(stack, 'coder')}/infill", json=infill_body(), timeout=120)
    assert itself.status_code == 200, itself.text
    for path in ("/infill", f"/upstream/{CODER}/infill"):  # the plugin names no model
        through = one_shot.post(f"{url}{path}", json=infill_body(), timeout=120)
        assert through.status_code == 200, through.text
        ours, theirs = through.json(), itself.json()
        assert set(ours) == set(theirs)  # the same answer, but for its timings
        for field in ("content", "stop_type", "tokens_predicted", "tokens_evaluated", "prompt"):
            assert ours[field] == theirs[field], field


def test_a_streamed_infill_is_llama_server_s_own_stream(gateway: tuple[Stack, str]) -> None:
    stack, url = gateway
    body = infill_body(stream=True)
    itself = one_shot.post(f"{direct(stack, 'coder')}/infill", json=body, timeout=120)
    through = one_shot.post(f"{url}/infill", json=body, timeout=120)
    assert through.status_code == 200
    assert through.headers["content-type"].startswith("text/event-stream")

    def contents(text: str) -> list[str]:
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
        assert events[-1]["stop"] is True
        return [e["content"] for e in events]

    assert contents(through.text) == contents(itself.text)


def test_a_suffix_gets_the_middle_in_completions_shape(gateway: tuple[Stack, str]) -> None:
    stack, url = gateway
    prompt = PREFIX + "    return"
    itself = one_shot.post(
        f"{direct(stack, 'coder')}/infill",
        json={
            "input_prefix": prompt,
            "input_suffix": SUFFIX,
            "prompt": "",
            "max_tokens": 8,
            **GREEDY,
        },
        timeout=120,
    ).json()
    fields: dict[str, Any] = {"model": CODER, "prompt": prompt, "suffix": SUFFIX, "max_tokens": 8}
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        whole = client.completions.create(**fields, extra_body=GREEDY)
        stream = client.completions.create(
            **fields, stream=True, stream_options={"include_usage": True}, extra_body=GREEDY
        )
        chunks = [c.model_dump(exclude_unset=True) for c in stream]
    strict_completion(whole.model_dump(exclude_unset=True))
    assert whole.choices[0].text == itself["content"]
    assert whole.usage is not None
    assert whole.usage.completion_tokens == itself["tokens_predicted"]
    strict_completion_chunks(chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == itself["content"]


def test_a_model_without_the_tokens_is_400_where_llama_server_fails_or_ignores(
    gateway: tuple[Stack, str],
) -> None:
    stack, url = gateway
    itself = one_shot.post(f"{direct(stack, 'standard')}/infill", json=infill_body(), timeout=60)
    assert itself.status_code == 501  # "Infill is not supported by this model"
    ignored = one_shot.post(
        f"{direct(stack, 'standard')}/v1/completions",
        json={"prompt": "a", "suffix": "b", "max_tokens": 2},
        timeout=60,
    )
    assert ignored.status_code == 200  # its own /v1/completions drops the suffix
    for path, body in (
        ("/infill", infill_body(model=PLAIN)),
        ("/v1/completions", {"model": PLAIN, "prompt": "a", "suffix": "b", "max_tokens": 2}),
    ):
        answer = one_shot.post(f"{url}{path}", json=body, timeout=60)
        assert answer.status_code == 400, path
        error = answer.json()["error"]
        assert error["code"] == "infill_not_supported"
        assert "no fill-in-the-middle prefix or suffix or middle token" in error["message"]
    models = {m["id"]: m["infill"] for m in one_shot.get(f"{url}/v1/models").json()["data"]}
    assert models == {PLAIN: False, CODER: True}
