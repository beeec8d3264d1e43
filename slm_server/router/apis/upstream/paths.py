"""Which engine paths ``/upstream/<model>/<path>`` reaches: an allow-list per engine, and
each entry's ``upstream_paths`` on top of it. Pure.

An allow-list, not a deny-list: an engine's paths change with its releases, and a path
added to llama-server tomorrow (it added ``/tools``, which runs commands, and
``/cors-proxy``, which fetches any URL, within a few months) would pass a deny-list the
day the pinned engine moves. What passes by default only computes or reads what any
client may read: tokenizing, templates, completions and embeddings, the server's
properties and model list, its health. What changes or shows the engine's state
(another client's prompts in ``/slots``, slot files, ``POST /props``, LoRA scales,
``/metrics``) passes only where the entry's ``upstream_paths`` lists it; the refusal
says why and names that field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from slm_server.contracts import engine_paths
from slm_server.registry.upstream_paths import PathRule, parse_rule


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a request may reach the engine, and (refused) why, in words."""

    allowed: bool
    why: str = ""


def _rules(*texts: str) -> tuple[PathRule, ...]:
    return tuple(parse_rule(text) for text in texts)


# llama-server: first the paths under /v1/ that act on other clients' generations, then
# what reads or computes.
LLAMA_SERVER_REFUSED: Final = _rules("/v1/chat/completions/control", "/v1/stream", "/v1/streams/*")
LLAMA_SERVER: Final = _rules(
    "GET /health",
    "GET /props",
    "GET /models",
    "GET /lora-adapters",
    "POST /tokenize",
    "POST /detokenize",
    "POST /apply-template",
    f"POST {engine_paths.INFILL}",
    "POST /completion",
    "POST /completions",
    "POST /chat/completions",
    "POST /chat/completions/input_tokens",
    "POST /responses",
    "POST /responses/input_tokens",
    "POST /audio/transcriptions",
    "POST /embedding",
    "POST /embeddings",
    "POST /rerank",
    "POST /reranking",
    "GET /v1/health",
    "GET /v1/models",
    # Named one by one, not /v1/*: the engine adds routes under /v1 that are not
    # computations (a generation's control, stream lookups), and more may come.
    "POST /v1/completions",
    "POST /v1/chat/completions",
    "POST /v1/chat/completions/input_tokens",
    "POST /v1/responses",
    "POST /v1/responses/input_tokens",
    "POST /v1/messages",
    "POST /v1/messages/count_tokens",
    "POST /v1/embeddings",
    "POST /v1/rerank",
    "POST /v1/reranking",
    "POST /v1/audio/transcriptions",
)
# Any other engine (llama-cpp-python's server, mlx-openai-server, the MLX reranker):
# its OpenAI-compatible routes.
OPENAI_ENGINE: Final = _rules("GET /health", "GET /v1/models", "POST /v1/*")

# Why the paths that change or show an engine's state are refused, by rule.
REASONS: Final = (
    (parse_rule("GET /slots"), "shows every slot's prompt and settings: other clients' requests"),
    (
        parse_rule("/slots/*"),
        "saves, restores or erases a slot's prompt cache (files on the engine's disk, "
        "another client's state)",
    ),
    (parse_rule("POST /props"), "changes the engine's global properties"),
    (parse_rule("POST /lora-adapters"), "changes the LoRA adapters every request uses"),
    (
        parse_rule("/metrics"),
        "is the engine's own metrics (the router's GET /metrics carries them as slm_engine_*)",
    ),
    (parse_rule("/models/*"), "loads or unloads models (llama-server's router mode)"),
    (parse_rule("/v1/chat/completions/control"), "steers another client's generation"),
    (parse_rule("/v1/stream"), "reads or drops another client's stream"),
    (parse_rule("/v1/streams/*"), "looks up other clients' streams"),
    (parse_rule("/tools"), "runs the engine's server-side tools"),
    (parse_rule("/cors-proxy"), "makes the engine fetch any URL"),
)
DEFAULT_REASON: Final = (
    "is not among the paths /upstream/ reaches by default (what only reads or computes)"
)


def defaults_for(kind: str | None, backend: str) -> tuple[PathRule, ...]:
    """The paths an engine of ``kind`` (the launcher's word for it; None before it has
    said: llama-server for a llama.cpp entry) serves to ``/upstream/`` by default."""
    if kind == "llama-server" or (kind is None and backend == "llamacpp"):
        return LLAMA_SERVER
    return OPENAI_ENGINE


def verdict(
    method: str,
    path: str,
    listed: Sequence[str],
    defaults: tuple[PathRule, ...],
) -> Verdict:
    """Whether ``method path`` may reach the engine: the entry's ``listed`` rules first
    (what the registry allows is allowed), then the paths llama-server acts on other
    clients' generations by, refused, then ``defaults``."""
    if any(parse_rule(rule).matches(method, path) for rule in listed):
        return Verdict(True)
    refused = any(rule.matches(method, path) for rule in LLAMA_SERVER_REFUSED)
    if not refused and any(rule.matches(method, path) for rule in defaults):
        return Verdict(True)
    for rule, why in REASONS:
        if rule.matches(method, path) or (rule.under and rule.path == path):
            return Verdict(False, why)
    return Verdict(False, DEFAULT_REASON)


__all__ = [
    "DEFAULT_REASON",
    "LLAMA_SERVER",
    "LLAMA_SERVER_REFUSED",
    "OPENAI_ENGINE",
    "REASONS",
    "Verdict",
    "defaults_for",
    "verdict",
]
