"""Aliases and presets on real processes: the real launcher runs a fake llama-server for
an on-demand model with aliases, the real router in front. A request naming an alias
loads the model and is routed to it; every alias shows in ``/v1/models``; two aliases
with different presets are two variants of one process, each request reaching it with
its own alias's preset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests import one_shot
from tests.integration.watched import fake_entry, watched
from tests.processes import poll

HELLO = [{"role": "user", "content": "hello"}]
ALIASES = [
    "gpt-4o-mini",
    {"name": "lazy-think", "preset": {"set": {"chat_template_kwargs": {"enable_thinking": True}}}},
    {
        "name": "lazy-cold",
        "preset": {"max_output_tokens": 16, "set": {"temperature": 0.0}, "strip": ["seed"]},
    },
]
PRESET = {"max_output_tokens": 256, "default": {"top_k": 40}}


def received(port: int) -> list[dict[str, Any]]:
    """The bodies of the chat requests the fake backend on ``port`` was sent."""
    records = one_shot.get(f"http://127.0.0.1:{port}/_requests", timeout=5).json()
    return [r["body"] for r in records if r["path"] == "/v1/chat/completions"]


def chat(url: str, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": HELLO, **extra}
    return one_shot.post(f"{url}/v1/chat/completions", json=body, timeout=30)


def test_aliases_route_load_on_demand_list_and_share_one_process(tmp_path: Path) -> None:
    lazy = fake_entry(
        tmp_path,
        "lazy",
        load="on_demand",
        chat_template_kwargs={"enable_thinking": False},
        aliases=ALIASES,
        preset=PRESET,
    )
    with watched(tmp_path, {"lazy": lazy}, SLM_MEMORY_BUDGET_MB="100000") as stack:
        url, model_id, port = stack.url, stack.model_id("lazy"), stack.port("lazy")

        # Listed, each alias after its model, before anything is loaded.
        listed = one_shot.get(f"{url}/v1/models", timeout=5).json()["data"]
        assert [m["id"] for m in listed] == [model_id, "gpt-4o-mini", "lazy-think", "lazy-cold"]
        assert all(m["status"]["state"] == "unloaded" for m in listed)
        assert [m.get("alias_of") for m in listed] == [None, model_id, model_id, model_id]

        # An alias loads the model on demand and is answered by it, under its id.
        first = chat(url, "lazy-cold", temperature=1.5, seed=3, max_tokens=4096)
        assert first.status_code == 200, first.text
        loaded = stack.wait_event("backend_loaded", role="lazy")
        pid = stack.pid("lazy")
        assert stack.state("lazy")["state"] == "ready"
        shown = one_shot.get(f"{url}/v1/models/lazy-cold", timeout=5).json()
        assert (shown["id"], shown["alias_of"], shown["status"]["state"]) == (
            "lazy-cold",
            model_id,
            "ready",
        )

        # Another alias, with another preset: the same process, no second load.
        second = chat(url, "lazy-think", temperature=1.5, seed=3)
        assert second.status_code == 200, second.text
        by_id = chat(url, model_id, seed=3)
        assert by_id.status_code == 200, by_id.text
        assert stack.pid("lazy") == pid
        assert stack.events("backend_loaded") == [loaded]

        cold, think, plain = received(port)
        assert cold["model"] == think["model"] == plain["model"] == model_id
        assert (cold["temperature"], cold["max_tokens"], "seed" in cold) == (0.0, 16, False)
        assert cold["chat_template_kwargs"] == {"enable_thinking": False}
        assert cold["top_k"] == 40
        assert (think["temperature"], think["max_tokens"], think["seed"]) == (1.5, 256, 3)
        assert think["chat_template_kwargs"] == {"enable_thinking": True}
        assert plain["chat_template_kwargs"] == {"enable_thinking": False}
        assert plain["max_tokens"] == 256

        # Unloaded and loaded again by an alias, as by the id.
        unloaded = one_shot.post(
            f"{url}/v1/models/unload", json={"model": "gpt-4o-mini"}, timeout=30
        )
        assert unloaded.status_code == 200, unloaded.text
        assert unloaded.json()["status"]["state"] == "unloaded"
        poll(lambda: stack.state("lazy").get("pid") is None, 10, "the backend to exit")
        reloaded = one_shot.post(f"{url}/v1/models/load", json={"model": "lazy-think"}, timeout=30)
        assert reloaded.status_code == 200, reloaded.text
        assert reloaded.json()["status"]["state"] == "ready"
        poll(lambda: len(stack.events("backend_loaded")) == 2, 10, "the second load logged")
