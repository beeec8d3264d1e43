"""Aliases and presets through the router in-process: a request naming an alias reaches
its entry's backend under the entry's id, with the alias's preset over the entry's, on
chat, completions and the Responses API (translated); the model list, the model view
and load/unload know every alias."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from tests.openai_shapes import strict_response
from tests.unit.router.inprocess import (
    FakeResponse,
    Router,
    Sent,
    call,
    entry_text,
    make_router,
    run,
    serving,
    whole,
)

MODEL = "org/chat-model"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": MODEL,
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
# The entry: capped at 100 tokens, top_k 40 unless the client says, no seed; thinking
# off unless the client says (the entry's chat_template_kwargs). Its aliases: a plain
# name, a thinking variant, and a cold variant capped lower.
ALIASES = """\
    chat_template_kwargs: {enable_thinking: false}
    preset:
      max_output_tokens: 100
      default: {top_k: 40}
      strip: [seed]
    aliases:
      - gpt-4o-mini
      - name: chat-thinking
        preset: {set: {chat_template_kwargs: {enable_thinking: true}}}
      - name: chat-cold
        preset: {max_output_tokens: 10, set: {temperature: 0.0}}
"""


async def answer(_sent: Sent) -> FakeResponse:
    return whole(ANSWER)


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def sent_by(tmp_path: Path, path: str, body: dict[str, Any], **env: str) -> dict[str, Any]:
    """What the backend was sent for one request to ``path``."""
    router = make_router(tmp_path, answer, chat=ALIASES, env=env)

    async def scenario() -> dict[str, Any]:
        async with serving(router):
            got = await call(router.app, path, body)
            assert got.status == 200, got.body
            [sent] = router.transport.sent
            assert sent.spec.role == "chat"
            found: dict[str, Any] = sent.json()
            return found

    return asyncio.run(asyncio.wait_for(scenario(), 10))


@pytest.mark.usefixtures("via")
def test_an_alias_routes_to_its_entry_under_the_entrys_id(tmp_path: Path) -> None:
    sent = sent_by(tmp_path, CHAT, chat("gpt-4o-mini", seed=7, max_tokens=5000))
    assert sent == {
        **chat(MODEL),
        "max_tokens": 100,
        "top_k": 40,
        "chat_template_kwargs": {"enable_thinking": False},
    }


def test_the_id_gets_the_entry_preset_too(tmp_path: Path) -> None:
    sent = sent_by(tmp_path, CHAT, chat(MODEL, top_k=3))
    assert sent == {
        **chat(MODEL),
        "top_k": 3,
        "max_tokens": 100,
        "chat_template_kwargs": {"enable_thinking": False},
    }


def test_an_alias_preset_lies_over_the_entrys(tmp_path: Path) -> None:
    own = {"enable_thinking": False, "x": 1}
    sent = sent_by(tmp_path, CHAT, chat("chat-thinking", chat_template_kwargs=own))
    assert sent["chat_template_kwargs"] == {"enable_thinking": True}
    assert sent["max_tokens"] == 100
    cold = sent_by(tmp_path, CHAT, chat("chat-cold", temperature=1.5, max_completion_tokens=-1))
    assert cold["temperature"] == 0.0
    assert cold["max_completion_tokens"] == 10
    assert "max_tokens" not in cold  # the client bounded the output: that bound is capped


def test_completions_take_the_cap_but_no_chat_template(tmp_path: Path) -> None:
    body = {"model": "chat-cold", "prompt": "Once", "n_predict": 500, "stream": True}
    sent = sent_by(tmp_path, COMPLETIONS, body)
    assert sent == {
        "model": MODEL,
        "prompt": "Once",
        "n_predict": 10,
        "stream": True,
        "stream_options": {"include_usage": True},
        "top_k": 40,
        "temperature": 0.0,
    }


def test_the_responses_api_is_capped_on_its_own_names_then_translated(tmp_path: Path) -> None:
    body = {"model": "chat-cold", "input": "hi", "max_output_tokens": 4000, "n_predict": -1}
    sent = sent_by(tmp_path, RESPONSES, body)
    assert sent["model"] == MODEL
    assert sent["max_tokens"] == 10
    assert sent["n_predict"] == 10
    assert sent["temperature"] == 0.0
    assert sent["chat_template_kwargs"] == {"enable_thinking": False}
    none_asked = sent_by(tmp_path, RESPONSES, {"model": "gpt-4o-mini", "input": "hi"})
    assert none_asked["max_tokens"] == 100


def test_the_responses_answer_echoes_the_capped_bound(tmp_path: Path) -> None:
    router = make_router(tmp_path, answer, chat=ALIASES)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, RESPONSES, {"model": "chat-cold", "input": "hi"})
            assert got.status == 200
            response = strict_response(got.json())
            assert response.max_output_tokens == 10
            assert response.model == MODEL

    run(scenario())


def test_embeddings_by_alias_are_routed_untouched(tmp_path: Path) -> None:
    more = entry_text(
        "embed",
        18002,
        "aliases: [text-embedding-3-small]",
        model_path="models/e.gguf",
        model_type="embeddings",
    )
    router = make_router(tmp_path, answer, more=more)

    async def scenario() -> None:
        async with serving(router):
            body = {"model": "text-embedding-3-small", "input": "hi", "seed": 1}
            got = await call(router.app, "/v1/embeddings", body)
            assert got.status == 200
            [sent] = router.transport.sent
            assert sent.spec.role == "embed"
            assert sent.json() == {"model": "embed-model", "input": "hi", "seed": 1}

    run(scenario())


# --- the model list, the model view, load and unload -------------------------------------


def models(router: Router, path: str = "/v1/models") -> Any:
    async def scenario() -> Any:
        async with serving(router):
            got = await call(router.app, path, b"", method="GET")
            return got.status, got.json()

    return asyncio.run(asyncio.wait_for(scenario(), 10))


def test_the_model_list_shows_each_alias_after_its_model(tmp_path: Path) -> None:
    status, listed = models(make_router(tmp_path, answer, chat=ALIASES))
    assert status == 200
    data = listed["data"]
    assert [m["id"] for m in data] == [MODEL, "gpt-4o-mini", "chat-thinking", "chat-cold"]
    assert data[0]["aliases"] == ["gpt-4o-mini", "chat-thinking", "chat-cold"]
    assert "alias_of" not in data[0]
    for alias in data[1:]:
        assert alias["alias_of"] == MODEL
        assert "aliases" not in alias
        assert alias["object"] == "model"
        assert alias["status"] == data[0]["status"]
        assert alias["role"] == "chat"


def test_a_setting_hides_aliases_from_the_list_but_not_from_the_view(tmp_path: Path) -> None:
    hidden = make_router(tmp_path, answer, chat=ALIASES, env={"SLM_LIST_ALIASES": "false"})
    _status, listed = models(hidden)
    assert [m["id"] for m in listed["data"]] == [MODEL]
    assert listed["data"][0]["aliases"] == ["gpt-4o-mini", "chat-thinking", "chat-cold"]
    status, one = models(hidden, "/v1/models/chat-cold")
    assert status == 200
    assert one["id"] == "chat-cold"
    assert one["alias_of"] == MODEL


def test_the_model_view_by_alias_and_by_id(tmp_path: Path) -> None:
    router = make_router(tmp_path, answer, chat=ALIASES)
    status, by_alias = models(router, "/v1/models/gpt-4o-mini")
    assert status == 200
    assert (by_alias["id"], by_alias["alias_of"]) == ("gpt-4o-mini", MODEL)
    status, by_id = models(router, f"/v1/models/{MODEL}")
    assert (by_id["id"], by_id["aliases"][0]) == (MODEL, "gpt-4o-mini")
    status, missing = models(router, "/v1/models/gpt-5")
    assert status == 404
    assert "gpt-4o-mini" in missing["error"]["message"]


def test_an_on_demand_model_loads_and_unloads_by_its_alias(tmp_path: Path) -> None:
    router = make_router(tmp_path, answer, chat=ALIASES + "    load: on_demand\n")

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat("chat-cold"))
            assert got.status == 200
            assert [c.op for c in router.supervisor.commands] == ["load"]
            again = await call(router.app, CHAT, chat("chat-thinking"))
            assert again.status == 200
            assert router.supervisor.loads == 1  # one process for every alias
            unloaded = await call(router.app, "/v1/models/unload", {"model": "gpt-4o-mini"})
            assert unloaded.status == 200
            assert unloaded.json()["id"] == "gpt-4o-mini"
            assert unloaded.json()["status"]["state"] == "unloaded"
            loaded = await call(router.app, "/v1/models/load", {"model": "chat-cold"})
            assert loaded.status == 200
            assert loaded.json()["status"]["state"] == "ready"
            assert router.supervisor.loads == 2

    run(scenario())


def test_a_disabled_models_alias_is_named_disabled(tmp_path: Path) -> None:
    more = entry_text(
        "off", 18002, "aliases: [old-name]", model_path="models/o.gguf", enabled=False
    )
    router = make_router(tmp_path, answer, more=more)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/v1/models/load", {"model": "old-name"})
            assert got.status == 409
            assert "disabled" in got.json()["error"]["message"]
            chat_got = await call(router.app, CHAT, chat("old-name"))
            assert chat_got.status == 404

    run(scenario())


def test_the_access_line_names_the_alias_asked_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="slm_server.access")
    router = make_router(tmp_path, answer, chat=ALIASES)

    async def scenario() -> None:
        async with serving(router):
            assert (await call(router.app, CHAT, chat("chat-cold"))).status == 200
            assert (await call(router.app, CHAT, chat(MODEL))).status == 200
            health = (await call(router.app, "/v1/backends/health", b"", method="GET")).json()
            assert health["chat"]["aliases"] == ["gpt-4o-mini", "chat-thinking", "chat-cold"]

    run(scenario())
    by_alias, by_id = [r for r in caplog.records if r.name == "slm_server.access"][:2]
    assert getattr(by_alias, "model", None) == MODEL
    assert getattr(by_alias, "alias", None) == "chat-cold"
    assert by_alias.getMessage().endswith(f"model={MODEL} alias=chat-cold")
    assert getattr(by_id, "alias", None) is None
    assert by_id.getMessage().endswith(f"model={MODEL}")


def test_a_body_a_preset_makes_unservable_is_refused_before_it_is_sent(tmp_path: Path) -> None:
    """A preset's grammar beside the client's json_schema would be a llama-server 500,
    counted against a healthy backend: the body is checked as it would be sent."""
    grammar = "    preset: {set: {grammar: 'root ::= \"a\"'}}\n"
    router = make_router(tmp_path, answer, chat=grammar)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat(MODEL, json_schema={"type": "object"}))
            assert got.status == 400
            assert got.json()["error"]["param"] == "grammar"
            assert router.transport.sent == []

    run(scenario())
