"""Command lines for llama.cpp servers, as pure functions of a registry entry.

``native_argv`` targets ``llama-server``; ``python_argv`` targets llama-cpp-python's
``python -m llama_cpp.server`` with the equivalent flags. Fields the Python server
cannot take are refused earlier (``NATIVE_ONLY_FIELDS``), and its missing server-side
sampling defaults are applied per request by the router (``python_request_defaults``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slm_server.registry.schema import CacheType, ModelEntry

# ggml_type values that llama-cpp-python's --type_k/--type_v take.
GGML_TYPE_IDS: dict[str, int] = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "q8_0": 8,
    "iq4_nl": 20,
    "bf16": 30,
}


@dataclass(frozen=True)
class ModelFiles:
    """The resolved files an entry names: model, and optional template/projector/draft."""

    model: str
    chat_template_file: str | None = None
    mmproj: str | None = None
    draft_model: str | None = None


def kv_cache_types(entry: ModelEntry) -> tuple[CacheType | None, CacheType | None]:
    """K and V cache types: explicit fields win; an 8-bit model defaults both to q8_0;
    otherwise llama.cpp decides (f16)."""
    quant = entry.quantization.lower().replace("-", "_")
    derived: CacheType | None = None
    if quant.startswith(("q8", "8bit")):
        derived = "q8_0"
    return (entry.cache_type_k or derived, entry.cache_type_v or derived)


def _on_off(value: bool) -> str:
    return "on" if value else "off"


def _num(value: float) -> str:
    """Integers as digits (never ``1e+06``); floats compactly (``0.7``, ``0``)."""
    return str(value) if isinstance(value, int) else format(value, ".10g")


# The logical batch of a native llama-server serving a language model (see native_argv).
PROGRESS_BATCH = 512


def native_argv(program: str, entry: ModelEntry, files: ModelFiles) -> list[str]:
    """The ``llama-server`` command line for ``entry``."""
    argv = [program, "--model", files.model, "--host", entry.host, "--port", str(entry.port)]
    argv += ["--alias", entry.id, "--parallel", str(entry.max_concurrency), "--metrics"]
    if entry.model_type == "lm":
        # A prompt progress report comes after each logical batch: a smaller one than
        # llama-server's 2048 reports four times as often, so the watchdog's silence
        # limit hears a healthy backend reading a long prompt every few seconds; the
        # same speed on all cores (benchmarks/results/progress-gaps-*.md).
        argv += ["--batch-size", str(max(PROGRESS_BATCH, entry.ubatch_size or 0))]
    if entry.context_length is not None:
        argv += ["--ctx-size", str(entry.context_length)]
    if entry.model_type == "embeddings":
        argv += ["--embedding"]
    elif entry.model_type == "rerank":
        argv += ["--embedding", "--pooling", "rank", "--reranking"]
    if entry.pooling is not None and entry.model_type != "rerank":
        argv += ["--pooling", entry.pooling]
    if entry.chat_template_file is not None or entry.chat_template_kwargs is not None:
        argv += ["--jinja"]
    if files.chat_template_file is not None:
        argv += ["--chat-template-file", files.chat_template_file]
    if entry.chat_template_kwargs is not None:
        argv += ["--chat-template-kwargs", json.dumps(entry.chat_template_kwargs)]
    sampling: list[tuple[str, float | int | None]] = [
        ("--temp", entry.temp),
        ("--top-p", entry.top_p),
        ("--top-k", entry.top_k),
        ("--min-p", entry.min_p),
        ("--presence-penalty", entry.presence_penalty),
        ("--repeat-penalty", entry.repetition_penalty),
        ("--n-predict", entry.n_predict),
        ("--ubatch-size", entry.ubatch_size),
        ("--cache-ram", entry.cache_ram),
        ("--spec-draft-n-max", entry.spec_draft_n_max),
    ]
    for flag, value in sampling:
        if value is not None:
            argv += [flag, _num(value)]
    cache_k, cache_v = kv_cache_types(entry)
    if cache_k is not None:
        argv += ["--cache-type-k", cache_k]
    if cache_v is not None:
        argv += ["--cache-type-v", cache_v]
    if entry.kv_offload is not None:
        argv += ["--kv-offload" if entry.kv_offload else "--no-kv-offload"]
    if entry.flash_attn is not None:
        mode = "auto" if entry.flash_attn == "auto" else _on_off(entry.flash_attn is True)
        argv += ["--flash-attn", mode]
    if entry.kv_unified is not None:
        argv += ["--kv-unified" if entry.kv_unified else "--no-kv-unified"]
    if entry.swa_full:
        argv += ["--swa-full"]
    if entry.fit is not None:
        argv += ["--fit", _on_off(entry.fit)]
    if entry.cont_batching is not None:
        argv += ["--cont-batching" if entry.cont_batching else "--no-cont-batching"]
    if entry.cache_prompt is not None:
        argv += ["--cache-prompt" if entry.cache_prompt else "--no-cache-prompt"]
    if entry.spec_type is not None:
        argv += ["--spec-type", entry.spec_type]
    if files.draft_model is not None:
        argv += ["--spec-draft-model", files.draft_model]
    if files.mmproj is not None:
        argv += ["--mmproj", files.mmproj]
    if entry.verbose:
        argv += ["--verbose"]
    return argv


def python_argv(python: str, entry: ModelEntry, files: ModelFiles) -> list[str]:
    """The ``python -m llama_cpp.server`` command line for ``entry``.

    ``--n_ctx 0`` asks for the model's own context length, like llama-server's default.
    ``--interrupt_requests false``: a request that arrives while a stream runs waits for
    it, where by default it would end that stream early, as if it were complete (the
    router's admission, or the watchdog's canary, would cut a client's answer short).
    """
    argv = [python, "-m", "llama_cpp.server", "--model", files.model]
    argv += ["--host", entry.host, "--port", str(entry.port), "--model_alias", entry.id]
    argv += ["--interrupt_requests", "false"]
    argv += ["--n_ctx", str(entry.context_length or 0)]
    if entry.model_type == "embeddings":
        argv += ["--embedding", "true"]
    if entry.chat_template_kwargs is not None:
        argv += ["--chat_template_kwargs", json.dumps(entry.chat_template_kwargs)]
    if entry.ubatch_size is not None:
        argv += ["--n_ubatch", str(entry.ubatch_size)]
    cache_k, cache_v = kv_cache_types(entry)
    if cache_k is not None:
        argv += ["--type_k", str(GGML_TYPE_IDS[cache_k])]
    if cache_v is not None:
        argv += ["--type_v", str(GGML_TYPE_IDS[cache_v])]
    if entry.flash_attn is not None and entry.flash_attn != "auto":
        argv += ["--flash_attn", "true" if entry.flash_attn else "false"]
    if entry.verbose is not None:
        argv += ["--verbose", "true" if entry.verbose else "false"]
    return argv


def python_request_defaults(entry: ModelEntry) -> dict[str, Any]:
    """Sampling defaults the Python server cannot take as flags, as request fields that
    the router sets when a request leaves them out."""
    fields: dict[str, float | int | None] = {
        "temperature": entry.temp,
        "top_p": entry.top_p,
        "top_k": entry.top_k,
        "min_p": entry.min_p,
        "presence_penalty": entry.presence_penalty,
        "repeat_penalty": entry.repetition_penalty,
        "max_tokens": entry.n_predict
        if entry.n_predict is not None and entry.n_predict > 0
        else None,
    }
    return {name: value for name, value in fields.items() if value is not None}
