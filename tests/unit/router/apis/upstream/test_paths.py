"""The allow-list of engine paths ``/upstream/`` reaches: what llama-server and the other
engines serve to it by default, what is refused and why, and the entry's own rules over
both."""

from __future__ import annotations

import pytest

from slm_server.router.apis.upstream.paths import (
    DEFAULT_REASON,
    LLAMA_SERVER,
    OPENAI_ENGINE,
    defaults_for,
    verdict,
)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("POST", "/apply-template"),
        ("GET", "/props"),
        ("POST", "/infill"),
        ("POST", "/completion"),
        ("POST", "/embedding"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/messages/count_tokens"),
        ("POST", "/v1/chat/completions/input_tokens"),
        ("GET", "/v1/models"),
        ("GET", "/health"),
        ("GET", "/lora-adapters"),
    ],
)
def test_llama_server_s_reading_and_computing_paths_pass(method: str, path: str) -> None:
    assert verdict(method, path, [], LLAMA_SERVER).allowed


@pytest.mark.parametrize(
    ("method", "path", "why"),
    [
        ("GET", "/slots", "other clients' requests"),
        ("POST", "/slots/0", "saves, restores or erases"),
        ("POST", "/slots", "saves, restores or erases"),
        ("POST", "/props", "global properties"),
        ("POST", "/lora-adapters", "LoRA adapters"),
        ("GET", "/metrics", "engine's own metrics"),
        ("POST", "/models/load", "router mode"),
        ("POST", "/v1/chat/completions/control", "another client's generation"),
        ("GET", "/v1/stream", "another client's stream"),
        ("POST", "/v1/streams/lookup", "other clients' streams"),
        ("POST", "/tools", "server-side tools"),
        ("GET", "/cors-proxy", "fetch any URL"),
        ("GET", "/", DEFAULT_REASON),
        ("GET", "/tokenize", DEFAULT_REASON),  # the method counts
        ("DELETE", "/v1/chat/completions", DEFAULT_REASON),
        ("POST", "/brand-new-route", DEFAULT_REASON),  # an allow-list: unknown is refused
    ],
)
def test_what_changes_or_shows_state_is_refused_with_why(method: str, path: str, why: str) -> None:
    found = verdict(method, path, [], LLAMA_SERVER)
    assert not found.allowed
    assert why in found.why


def test_the_entry_s_rules_allow_what_they_list_even_what_is_refused_by_default() -> None:
    listed = ["GET /slots", "POST /slots/*", "/v1/chat/completions/control"]
    assert verdict("GET", "/slots", listed, LLAMA_SERVER).allowed
    assert verdict("POST", "/slots/0", listed, LLAMA_SERVER).allowed
    assert verdict("POST", "/v1/chat/completions/control", listed, LLAMA_SERVER).allowed
    assert not verdict("POST", "/props", listed, LLAMA_SERVER).allowed


def test_other_engines_serve_their_openai_routes() -> None:
    assert defaults_for("llama-server", "llamacpp") is LLAMA_SERVER
    assert defaults_for(None, "llamacpp") is LLAMA_SERVER  # before the launcher says
    assert defaults_for("llama_cpp.server", "llamacpp") is OPENAI_ENGINE
    assert defaults_for(None, "mlx") is OPENAI_ENGINE
    assert verdict("POST", "/v1/embeddings", [], OPENAI_ENGINE).allowed
    assert not verdict("POST", "/tokenize", [], OPENAI_ENGINE).allowed
