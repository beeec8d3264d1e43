"""Ollama's own API through the official ``ollama`` client, unchanged, against a router
on a real socket in front of fake backends (real processes): listing, showing, the
loaded models, chat whole and streamed with a tool round trip, generate (templated and
raw), embeddings, typed errors for an unknown model, a bad body and an oversized one,
and Ollama's stream ending in an ``{"error": ...}`` line when a deadline or the backend
cuts it; nothing the client got wrong reaches a backend or counts against it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import ollama
import pytest

from tests.fakes.control import FakeBackend
from tests.processes import RunningRouter, StartRouter
from tests.registry_entries import registry_entry

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_ollama_api")

FAKE_ROLES = ("chat", "embed", "slow", "coder")
CHAT = "/v1/chat/completions"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def router_process(fakes: dict[str, FakeBackend], start_router: StartRouter) -> RunningRouter:
    models = {
        "chat": registry_entry("chat", fakes["chat"].port, context_length=4096),
        "embed": registry_entry("embed", fakes["embed"].port, model_type="embeddings"),
        "slow": registry_entry(
            "slow", fakes["slow"].port, default_timeout=1, max_concurrency=1, max_queue=0
        ),
        "coder": registry_entry("coder", fakes["coder"].port, infill=True),
    }
    return start_router(models, SLM_OTEL_ENABLED="false", SLM_MAX_BODY_MB="1")


@pytest.fixture
def client(router: str) -> Iterator[ollama.Client]:
    with ollama.Client(host=router) as made:
        yield made


@pytest.fixture(autouse=True)
def _reset(fakes: dict[str, FakeBackend]) -> None:
    for fake in fakes.values():
        fake.reset()


def lines(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.text.splitlines()]


def test_version_tags_show_and_ps(client: ollama.Client, http: httpx.Client) -> None:
    assert http.get("/api/version").json()["version"]
    assert http.get("/").text == "Ollama is running"
    assert http.head("/").status_code == 200
    listed = client.list()
    names = {m.model for m in listed.models}
    assert names == {"chat", "embed", "slow", "coder"}
    chat = next(m for m in listed.models if m.model == "chat")
    assert chat.details is not None and chat.details.quantization_level == "Q4_0"
    shown = client.show("chat")
    assert shown.capabilities is not None and "completion" in shown.capabilities
    assert shown.modelinfo is not None
    assert shown.modelinfo[f"{shown.modelinfo['general.architecture']}.context_length"] == 4096
    assert client.show("embed").capabilities == ["embedding"]
    # A model that fills in the middle takes a suffix on /api/generate: Ollama's "insert".
    assert "insert" in (client.show("coder").capabilities or [])
    assert "insert" not in shown.capabilities
    # The fakes run under the router's own launcher-less test stack: none is "ready" to it
    # unless a state says so; ps lists exactly the ready ones.
    loaded = client.ps()
    assert all(m.model in names for m in loaded.models)


def test_copilot_s_bring_your_own_model_sequence(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    """What VS Code's Copilot reads before it chats (its OllamaModelRegistry): a version
    of at least 0.6.4, the models' ``model`` ids, each one's architecture, name,
    context window and capabilities; then it chats on /v1/chat/completions by id."""
    major, minor, patch = (int(p) for p in http.get("/api/version").json()["version"].split("."))
    assert (major, minor, patch) >= (0, 6, 4)
    ids = [m["model"] for m in http.get("/api/tags").json()["models"]]
    info = http.post("/api/show", json={"model": "chat"}).json()
    model_info = info["model_info"]
    assert model_info[f"{model_info['general.architecture']}.context_length"] == 4096
    assert model_info["general.basename"]
    assert isinstance(info["capabilities"], list) and "vision" not in info["capabilities"]
    fakes["chat"].script(reply="ok")
    answer = http.post(
        "/v1/chat/completions",
        json={"model": ids[0], "messages": [{"role": "user", "content": "hi"}]},
    )
    assert answer.status_code == 200
    latest = http.post(
        "/v1/chat/completions",
        json={"model": "chat:latest", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert latest.status_code == 200
    assert fakes["chat"].requests()[-1]["body"]["model"] == "chat"


def test_chat_whole_and_streamed(client: ollama.Client, fakes: dict[str, FakeBackend]) -> None:
    fakes["chat"].script(reply="Hello!", chunks=3, chunk_text="Hi ")
    whole = client.chat(model="chat", messages=[{"role": "user", "content": "hi"}], stream=False)
    assert whole.message.content == "Hello!"
    assert whole.done and whole.done_reason == "stop"
    assert whole.total_duration is not None and whole.total_duration > 0
    assert whole.eval_count is not None and whole.prompt_eval_count is not None
    parts = list(
        client.chat(
            model="chat",
            messages=[{"role": "user", "content": "hi"}],
            options={"temperature": 0.2, "num_predict": 16, "num_thread": 4},
            stream=True,
        )
    )
    assert "".join(p.message.content or "" for p in parts) == "Hi Hi Hi "
    assert [p.done for p in parts][-1] is True
    assert parts[-1].done_reason == "stop" and parts[-1].eval_count is not None
    sent = fakes["chat"].requests()[-1]["body"]
    assert sent["temperature"] == 0.2 and sent["max_tokens"] == 16
    assert "num_thread" not in json.dumps(sent)


def test_a_request_that_says_nothing_of_stream_streams(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["chat"].script(chunks=2, chunk_text="ab")
    response = http.post(
        "/api/chat", json={"model": "chat", "messages": [{"role": "user", "content": "x"}]}
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-ndjson")
    got = lines(response)
    assert [g["done"] for g in got] == [False, False, True]
    assert "".join(g["message"]["content"] for g in got) == "abab"


def test_a_tool_round_trip(client: ollama.Client, fakes: dict[str, FakeBackend]) -> None:
    fakes["chat"].script(
        tool_calls=[{"name": "get_weather", "arguments": '{"city": "Paris"}'}],
        body_lacks='"role":"tool"',
    )
    asked = [{"role": "user", "content": "Weather in Paris?"}]
    for stream in (False, True):
        if stream:
            parts = list(client.chat(model="chat", messages=asked, tools=[WEATHER], stream=True))
            calls = [c for p in parts for c in (p.message.tool_calls or [])]
        else:
            answer = client.chat(model="chat", messages=asked, tools=[WEATHER], stream=False)
            calls = list(answer.message.tool_calls or [])
        assert len(calls) == 1
        assert calls[0].function.name == "get_weather"
        assert calls[0].function.arguments == {"city": "Paris"}
    fakes["chat"].script(reply="It is sunny.")
    history: list[dict[str, Any]] = [
        *asked,
        {"role": "assistant", "content": "", "tool_calls": [c.model_dump() for c in calls]},
        {"role": "tool", "content": "sunny, 21C", "tool_name": "get_weather"},
    ]
    final = client.chat(model="chat", messages=history, tools=[WEATHER], stream=False)
    assert final.message.content == "It is sunny."
    sent = fakes["chat"].requests()[-1]["body"]
    call_id = sent["messages"][1]["tool_calls"][0]["id"]
    assert sent["messages"][2] == {
        "role": "tool",
        "tool_call_id": call_id,
        "content": "sunny, 21C",
    }
    assert json.loads(sent["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Paris"
    }


def test_generate_templated_and_raw(client: ollama.Client, fakes: dict[str, FakeBackend]) -> None:
    fakes["chat"].script(reply="Paris.")
    answer = client.generate(model="chat", prompt="Capital of France?", system="Be brief.")
    assert answer.response == "Paris." and answer.done
    sent = fakes["chat"].requests()[-1]
    assert sent["path"] == CHAT
    assert sent["body"]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
    ]
    parts = list(client.generate(model="chat", prompt="1, 2, 3,", raw=True, stream=True))
    assert parts[-1].done and "".join(p.response or "" for p in parts)
    assert fakes["chat"].requests()[-1]["path"] == "/v1/completions"
    assert fakes["chat"].requests()[-1]["body"]["prompt"] == "1, 2, 3,"


def test_a_suffix_fills_in_the_middle_as_continue_asks(
    client: ollama.Client, http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    """Continue's autocomplete on its ollama provider: /api/generate with the code
    before the cursor as the prompt, the code after it as ``suffix``, raw, streamed:
    sent to llama-server's /infill and answered as Ollama's lines."""
    before, after = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))"
    parts = list(
        client.generate(
            model="coder",
            prompt=before,
            suffix=after,
            raw=True,
            stream=True,
            options={"num_predict": 32, "temperature": 0.01, "stop": ["\n\n"]},
            keep_alive=1800,
        )
    )
    middle = "".join(p.response or "" for p in parts)
    assert middle == f"middle({before[-20:]}|{after[:20]})"
    assert parts[-1].done and parts[-1].eval_count
    sent = fakes["coder"].requests()[-1]
    assert sent["path"] == "/infill"
    assert (sent["body"]["input_prefix"], sent["body"]["input_suffix"]) == (before, after)
    assert sent["body"]["n_predict"] == 32 and sent["body"]["stop"] == ["\n\n"]
    whole = client.generate(model="coder", prompt=before, suffix=after, stream=False)
    assert whole.response == middle and whole.done_reason == "stop"
    refused = http.post(
        "/api/generate", json={"model": "chat", "prompt": "a", "suffix": "b", "stream": False}
    )
    assert refused.status_code == 400 and "fill in the middle" in refused.json()["error"]
    assert [r["path"] for r in fakes["chat"].requests()] == []


def test_an_empty_generate_loads_the_model_and_asks_nothing(
    client: ollama.Client, fakes: dict[str, FakeBackend]
) -> None:
    answer = client.generate(model="chat", prompt="")
    assert answer.done and answer.done_reason == "load"
    assert fakes["chat"].requests() == []


def test_embed_and_the_older_embeddings(client: ollama.Client) -> None:
    many = client.embed(model="embed", input=["a", "b"])
    assert len(many.embeddings) == 2 and all(len(v) > 0 for v in many.embeddings)
    one = client.embeddings(model="embed", prompt="a")
    assert len(one.embedding) > 0


def test_errors_are_ollama_shaped_and_typed(
    client: ollama.Client, http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    with pytest.raises(ollama.ResponseError) as unknown:
        client.chat(model="nope", messages=[{"role": "user", "content": "x"}])
    assert unknown.value.status_code == 404 and "nope" in unknown.value.error
    with pytest.raises(ollama.ResponseError) as bad:
        client.chat(model="chat", messages=[{"role": "robot", "content": "x"}], stream=False)
    assert bad.value.status_code == 400 and "role" in bad.value.error
    with pytest.raises(ollama.ResponseError) as large:
        client.generate(model="chat", prompt="x" * (2 << 20), stream=False)
    assert large.value.status_code == 413
    with pytest.raises(ollama.ResponseError) as pulled:
        client.pull("gemma3")
    assert pulled.value.status_code == 501 and "registry" in pulled.value.error
    body = http.post(
        "/api/chat", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert body.status_code == 400 and set(body.json()) == {"error"}
    assert fakes["chat"].requests() == []


def test_a_stream_cut_by_the_deadline_ends_with_an_error_line(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["slow"].script(chunks=50, chunk_interval_seconds=0.1)
    response = http.post(
        "/api/chat", json={"model": "slow", "messages": [{"role": "user", "content": "x"}]}
    )
    got = lines(response)
    assert got[0]["done"] is False
    assert "error" in got[-1] and set(got[-1]) == {"error"}


def test_a_backend_failing_mid_stream_ends_with_an_error_line(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["chat"].script(chunks=6, fail_mid_stream_after=2)
    response = http.post("/api/generate", json={"model": "chat", "prompt": "x", "stream": True})
    got = lines(response)
    assert "error" in got[-1]
    assert all("error" not in g for g in got[:-1])
