"""Ollama's API through the official ``ollama`` client, unchanged, on the real
llama-server with the default models: ``list``, ``show`` (the GGUF's family, size,
quantization, template and the context served), ``ps``, ``chat`` whole and streamed,
``generate`` templated and raw, ``embed`` and ``embeddings`` on the default embedding
model loaded on demand (its load timed in ``load_duration``, and ``keep_alive: 0``
unloading it again), and Ollama's typed errors; nothing of it counts against a
backend."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import ollama
import pytest

from tests import one_shot
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.integration.watched import Watched, watched
from tests.processes import free_port

pytestmark = [pytest.mark.real_model, pytest.mark.xdist_group("test_ollama_real")]

CHAT_MODEL = "smollm2-135m-instruct"
EMBED_MODEL = "gemma-3-270m-embed"
ASK = [{"role": "user", "content": "Say hello."}]
SHORT = {"num_predict": 8, "temperature": 0}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    registry = example_registry(
        {"standard": free_port(), "gemma": 0, "embeddings": free_port()},
        roles=("standard", "embeddings"),
    )
    registry["models"]["embeddings"].update({"load": "on_demand", "idle_ttl": 600})
    tmp: Path = tmp_path_factory.mktemp("ollama-real")
    with watched(
        tmp, registry["models"], llama_server=llama_server_bin(), SLM_MAX_BODY_MB="1"
    ) as running:
        yield running


@pytest.fixture
def client(stack: Watched) -> Iterator[ollama.Client]:
    with ollama.Client(host=stack.url, timeout=120) as made:
        yield made


def test_list_and_show_read_the_model_file(client: ollama.Client) -> None:
    names = {m.model for m in client.list().models}
    assert {CHAT_MODEL, EMBED_MODEL} <= names
    shown = client.show(CHAT_MODEL)
    assert shown.details is not None
    assert shown.details.family == "llama" and shown.details.format == "gguf"
    assert shown.details.parameter_size == "135M"
    assert shown.details.quantization_level == "Q4_1"
    assert shown.modelinfo is not None and shown.modelinfo["llama.context_length"] == 4096
    assert "im_start" in (shown.template or "")
    # SmolLM2's template takes no tools (llama-server says so), and it does not reason.
    assert shown.capabilities == ["completion"]
    assert client.show(EMBED_MODEL).capabilities == ["embedding"]


def test_chat_whole_and_streamed_with_the_engine_s_counts(client: ollama.Client) -> None:
    whole = client.chat(model=CHAT_MODEL, messages=ASK, options=SHORT, stream=False)
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.prompt_eval_count and whole.eval_count and 0 < whole.eval_count <= 8
    assert whole.eval_duration and whole.total_duration
    assert whole.total_duration >= whole.eval_duration
    parts = list(client.chat(model=CHAT_MODEL, messages=ASK, options=SHORT, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content or "" for p in parts)
    assert parts[-1].eval_count and parts[-1].prompt_eval_duration is not None


def test_generate_templated_and_raw(client: ollama.Client) -> None:
    answer = client.generate(model=CHAT_MODEL, prompt="Say hello.", options=SHORT)
    assert answer.done and answer.response
    parts = list(
        client.generate(model=CHAT_MODEL, prompt="1, 2, 3,", raw=True, options=SHORT, stream=True)
    )
    assert parts[-1].done and parts[-1].eval_count
    assert "".join(p.response or "" for p in parts)


def test_embed_loads_on_demand_and_keep_alive_zero_unloads(client: ollama.Client) -> None:
    assert EMBED_MODEL not in {m.model for m in client.ps().models}
    many = client.embed(model=EMBED_MODEL, input=["a cat", "a dog"])
    assert len(many.embeddings) == 2 and len(many.embeddings[0]) == 640
    assert many.load_duration and many.load_duration > 0
    one = client.embeddings(model=EMBED_MODEL, prompt="a cat")
    assert len(one.embedding) == 640
    loaded = {m.model: m for m in client.ps().models}
    assert CHAT_MODEL in loaded and EMBED_MODEL in loaded
    assert loaded[EMBED_MODEL].expires_at is not None
    assert loaded[CHAT_MODEL].context_length == 4096
    client.embed(model=EMBED_MODEL, input=[], keep_alive=0)
    deadline = time.monotonic() + 60
    while EMBED_MODEL in {m.model for m in client.ps().models}:
        assert time.monotonic() < deadline, "keep_alive 0 did not unload the model"
        time.sleep(0.2)


def test_a_larger_num_ctx_is_served_at_the_entry_s_and_named(stack: Watched) -> None:
    """Clients send their own num_ctx (8192, 32768...): the entry's context serves them,
    and the answer names the option it left alone."""
    body = {
        "model": CHAT_MODEL,
        "messages": ASK,
        "stream": False,
        "options": {**SHORT, "num_ctx": 100_000, "num_predict": 100_000, "num_thread": 2},
    }
    answer = one_shot.post(f"{stack.url}/api/chat", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-slm-ignored-options"] == "num_ctx,num_thread"
    assert answer.json()["eval_count"] > 0


def test_errors_are_typed(client: ollama.Client, stack: Watched) -> None:
    with pytest.raises(ollama.ResponseError) as unknown:
        client.chat(model="no-such-model", messages=ASK)
    assert unknown.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as bad:
        client.chat(model=CHAT_MODEL, messages=[{"role": "robot", "content": "x"}])
    assert bad.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as oversized:
        client.generate(model=CHAT_MODEL, prompt="x" * (2 << 20), stream=False)
    assert oversized.value.status_code == 413
    with pytest.raises(ollama.ResponseError) as kept:
        client.generate(model=CHAT_MODEL, prompt="", keep_alive=0)
    assert kept.value.status_code == 409 and "load: always" in kept.value.error
    assert not stack.events("backend_failure")
