"""The fields an Ollama request shares between ``/api/chat`` and ``/api/generate`` —
``options``, ``format``, ``think``, ``keep_alive`` — checked and read as chat
completions fields. Pure.

Ollama's ``options`` (its ``api/types.go``, ``Options`` and ``Runner``) mix sampling,
which a request sets per call, with how the model is loaded (threads, GPU layers,
batch, mmap), which the registry sets per entry here: the sampling options become the
chat completions (and llama-server) fields of the same meaning; the load options are
accepted and left alone, as Ollama leaves an option it cannot apply; ``num_ctx`` may
ask for more context than the entry serves (the registry's, one per model: no request
reloads a model to change it), and is left alone when it does (a prompt longer than the
context gets the engine's own error); ``num_predict`` is capped at that context.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from slm_server.errors import InvalidRequest

# Sampling options and the chat completions (llama-server) field each becomes.
SAMPLING: Final[Mapping[str, str]] = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "seed": "seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "mirostat": "mirostat",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
    "num_keep": "n_keep",
    "penalize_newline": "penalize_nl",
}
INTEGER_OPTIONS: Final = frozenset(
    {"top_k", "seed", "repeat_last_n", "mirostat", "num_keep", "num_predict", "num_ctx"}
)
BOOLEAN_OPTIONS: Final = frozenset({"penalize_newline"})
# How the model is loaded and run: the registry's, per entry.
LOAD_OPTIONS: Final = frozenset(
    {
        "numa",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "low_vram",
        "f16_kv",
        "logits_all",
        "vocab_only",
        "use_mmap",
        "use_mlock",
        "num_thread",
        "embedding_only",
        "tfs_z",
        "num_gqa",
        "rope_frequency_base",
        "rope_frequency_scale",
    }
)
THINK_LEVELS: Final = frozenset({"low", "medium", "high"})
MAX_KEEP_ALIVE: Final = 100 * 365 * 86400.0  # seconds; longer is for good
# A Go duration as Ollama's keep_alive takes it: "5m", "1h30m", "-1s", "300ms".
_DURATION = re.compile(r"^-?(\d+(\.\d*)?(ns|us|µs|ms|s|m|h))+$")
_UNIT_SECONDS: Final[Mapping[str, float]] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+(?:\.\d*)?)(ns|us|µs|ms|s|m|h)")


@dataclass(frozen=True, slots=True)
class Sampling:
    """What a request's ``options`` say, as chat completions fields: the sampling
    fields, the output bound (None: unbounded), and the options left alone (the load
    options, and any Ollama does not know either)."""

    fields: dict[str, Any]
    max_tokens: int | None
    ignored: tuple[str, ...]


def _bad(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _number(value: Any, name: str, *, integer: bool) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = "an integer" if integer else "a number"
        raise _bad(f"options.{name} must be {kind}, got {json.dumps(value)[:40]}", name)
    if isinstance(value, float) and not math.isfinite(value):
        raise _bad(f"options.{name} must be a finite number", name)
    if integer:
        if isinstance(value, float) and not value.is_integer():
            raise _bad(f"options.{name} must be an integer, got {value}", name)
        return int(value)
    return value


def sampling(options: Any, context_length: int | None) -> Sampling:
    """``options`` checked and read (400 naming the option for a wrong type), with
    ``context_length`` the context the entry serves, when known: a ``num_ctx`` past it
    is left alone, a ``num_predict`` past it capped."""
    if options is None:
        return Sampling({}, None, ())
    if not isinstance(options, dict):
        raise _bad("options must be an object", "options")
    fields: dict[str, Any] = {}
    ignored: list[str] = []
    max_tokens: int | None = None
    for name, value in options.items():
        if value is None:
            continue
        if name == "stop":
            fields["stop"] = _stops(value)
        elif name in SAMPLING:
            if name in BOOLEAN_OPTIONS:
                if not isinstance(value, bool):
                    raise _bad(f"options.{name} must be true or false", name)
                fields[SAMPLING[name]] = value
            else:
                fields[SAMPLING[name]] = _number(value, name, integer=name in INTEGER_OPTIONS)
        elif name == "num_predict":
            max_tokens = _num_predict(value, context_length)
        elif name == "num_ctx":
            if not _num_ctx(value, context_length):
                ignored.append("num_ctx")
        else:  # a load option, or one Ollama would not know either: left alone
            ignored.append(str(name))
    return Sampling(fields, max_tokens, tuple(ignored))


def _stops(value: Any) -> list[str]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _bad("options.stop must be a string or a list of strings", "stop")
    return [s for s in stops if s]


def _num_predict(value: Any, context_length: int | None) -> int | None:
    count = int(_number(value, "num_predict", integer=True))
    if count in (-1, -2):  # Ollama's "until it stops" and "until the context is full"
        return None
    if count < 1:
        raise _bad(
            f"options.num_predict must be a positive number of tokens, or -1 or -2 "
            f"(no bound), got {count}",
            "num_predict",
        )
    if context_length is not None and count > context_length:
        return context_length  # no answer is longer than the context it is written in
    return count


def _num_ctx(value: Any, context_length: int | None) -> bool:
    """Whether the context ``value`` asks for is served (within ``context_length``)."""
    asked = int(_number(value, "num_ctx", integer=True))
    if asked < 1:
        raise _bad(f"options.num_ctx must be positive, got {asked}", "num_ctx")
    return context_length is None or asked <= context_length


def response_format(value: Any) -> dict[str, Any] | None:
    """Ollama's ``format`` as chat completions' ``response_format``: ``"json"`` any JSON
    object, a JSON schema that schema; ``""`` or null nothing."""
    if value is None or value == "":
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": value}}
    raise _bad('format must be "json" or a JSON schema object', "format")


def thinking(value: Any) -> bool | str | None:
    """Ollama's ``think``: True, False, a level (``low``, ``medium``, ``high``), or None
    when not given."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value in THINK_LEVELS:
        return value
    raise _bad('think must be true, false, "low", "medium" or "high"', "think")


def think_fields(think: bool | str | None) -> dict[str, Any]:
    """The chat completions fields that ask for ``think``: the template's
    ``enable_thinking`` switch, and the level as ``reasoning_effort``."""
    if think is None:
        return {}
    fields: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": think is not False}}
    if isinstance(think, str):
        fields["reasoning_effort"] = think
    return fields


def keep_alive_seconds(value: Any) -> float | None:
    """Ollama's ``keep_alive`` in seconds: a number of seconds or a Go duration
    (``"5m"``); a negative one is ``inf`` (kept loaded); None when not given."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise _bad(
            'keep_alive must be a duration ("5m", "1h") or a number of seconds', "keep_alive"
        )
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and _DURATION.match(value.strip()):
        text = value.strip()
        seconds = sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _PART.findall(text))
        if text.startswith("-"):
            seconds = -seconds
    elif isinstance(value, str) and _is_number(value):
        seconds = float(value)
    else:
        raise _bad(
            f'keep_alive must be a duration ("5m", "1h") or a number of seconds, got '
            f"{json.dumps(value)[:40]}",
            "keep_alive",
        )
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_KEEP_ALIVE:
        return math.inf  # kept loaded (beyond a century is for good)
    return seconds


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


__all__ = [
    "LOAD_OPTIONS",
    "SAMPLING",
    "Sampling",
    "keep_alive_seconds",
    "response_format",
    "sampling",
    "think_fields",
    "thinking",
]
