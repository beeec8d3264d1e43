"""What ``launch`` asks of the running gateway before it starts an agent: whether it
answers (``GET /health``), its models (``GET /v1/models``, and ``GET /v1/models/{id}``
for a name asked for, which may be an alias the list leaves out), and, from the registry
file ``/health`` names when it can be read here and is the text the gateway loaded, what
the API does not show: each name's output cap (``max_output_tokens`` of the alias's
preset, else the entry's) and the size of the entry's weights.

The one module of ``launch`` that does I/O before the agent runs; what it gathers is a
:class:`Survey`, which :mod:`.preflight` judges."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from slm_server.cli.launch.gateway import Unreachable, get_json
from slm_server.contracts.applied_registry import version_of
from slm_server.registry.model_path import ModelPathError, resolve_model_path
from slm_server.registry.schema import (
    ConfigError,
    ModelEntry,
    RegistryFile,
    inspect_registry,
    read_registry_text,
)

TIMEOUT = 10.0  # /v1/models may ask a backend's /props (2 s each) for its template


@dataclass(frozen=True)
class Local:
    """What the registry says of one name a client may send: the entry's id, the output
    cap requests by that name get (None: none), the bytes of the entry's weights (None:
    not a local file or directory)."""

    entry: str
    cap: int | None
    weights_bytes: int | None


@dataclass(frozen=True)
class Survey:
    """What the gateway at ``url`` said. ``down``: why it could not be asked, and
    ``key_refused``: it refused the key (either way nothing else is known).
    ``models``: ``GET /v1/models``'s list; ``named``: the objects of the names asked
    for (None: no such model), ``refused``: why one could not be looked up.
    ``local``: the registry's word by name (None when it could not be read here, and
    ``local_note`` says why)."""

    url: str
    down: str | None = None
    key_refused: bool = False
    models: tuple[dict[str, Any], ...] = ()
    named: Mapping[str, dict[str, Any] | None] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)
    local: Mapping[str, Local] | None = None
    local_note: str | None = None

    def model(self, name: str) -> dict[str, Any] | None:
        """The gateway's object for ``name``: looked up, else from the list."""
        if name in self.named:
            return self.named[name]
        return next((m for m in self.models if m.get("id") == name), None)


def weights_bytes(entry: ModelEntry) -> int | None:
    """The size of ``entry``'s weights on disk: its file, or the files at the top of its
    directory; None for a remote, a Hugging Face id or a path that cannot be read."""
    if entry.remote:
        return None
    try:
        path = Path(resolve_model_path(entry))
        if path.is_file():
            return path.stat().st_size
        if path.is_dir():
            return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    except (ModelPathError, OSError):
        return None
    return None


def local_facts(
    registry: RegistryFile, weights: Callable[[ModelEntry], int | None] = weights_bytes
) -> dict[str, Local]:
    """Each enabled entry's id and aliases, with the cap requests by that name get (the
    alias's ``max_output_tokens`` over the entry's, as the router resolves them)."""
    facts: dict[str, Local] = {}
    for spec in registry.enabled:
        entry = spec.entry
        if entry.id in facts:  # another replica of an entry already seen
            continue
        size = weights(entry)
        own = entry.preset.max_output_tokens if entry.preset is not None else None
        facts[entry.id] = Local(entry.id, own, size)
        for name in entry.alias_names:
            preset = entry.alias_preset(name)
            cap = preset.max_output_tokens if preset is not None else None
            facts.setdefault(name, Local(entry.id, cap if cap is not None else own, size))
    return facts


def read_local(health: Any) -> tuple[dict[str, Local] | None, str | None]:
    """The registry ``/health`` names, if it is the text the gateway routes by; else
    None and why not."""
    stamp = health.get("registry") if isinstance(health, dict) else None
    path = stamp.get("path") if isinstance(stamp, dict) else None
    if not isinstance(stamp, dict) or not isinstance(path, str) or not path:
        return None, "the gateway does not say which registry it routes by"
    try:
        text = read_registry_text(Path(path))
        registry = inspect_registry(text, Path(path))
    except (ConfigError, OSError) as exc:
        why = "; ".join(str(p) for p in exc.problems) if isinstance(exc, ConfigError) else exc
        return None, f"its registry {path} cannot be read here ({why})"
    if version_of(text) != stamp.get("version"):
        return None, f"its registry {path} has changed since the gateway loaded it"
    return local_facts(registry), None


def take_survey(url: str, key: str | None, names: tuple[str, ...] = ()) -> Survey:
    """Ask the gateway at ``url`` (with ``key``) about its models and ``names``."""
    try:
        health = get_json(f"{url}/health", key, TIMEOUT)
        if health.status != 200:
            return Survey(url, down=f"GET /health answered {health.status}")
        listed = get_json(f"{url}/v1/models", key, TIMEOUT)
        if listed.status == 401:
            return Survey(url, key_refused=True)
        if listed.status != 200:
            return Survey(url, down=_refusal("GET /v1/models", listed.status, listed.body))
        data = listed.body.get("data") if isinstance(listed.body, dict) else None
        models = tuple(m for m in data if isinstance(m, dict)) if isinstance(data, list) else ()
        named: dict[str, dict[str, Any] | None] = {}
        refused: dict[str, str] = {}
        for name in dict.fromkeys(names):
            one = get_json(f"{url}/v1/models/{quote(name, safe='/')}", key, TIMEOUT)
            if one.status == 200 and isinstance(one.body, dict):
                named[name] = one.body
            elif one.status == 404:
                named[name] = None
            else:
                refused[name] = _refusal(f"GET /v1/models/{name}", one.status, one.body)
    except Unreachable as exc:
        return Survey(url, down=str(exc))
    local, note = read_local(health.body)
    return Survey(url, None, False, models, named, refused, local, note)


def _refusal(what: str, status: int, body: Any) -> str:
    """An error answer as one line: what was asked, the status, the error's message."""
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return f"{what} answered {status}" + (f": {message}" if isinstance(message, str) else "")


__all__ = ["Local", "Survey", "local_facts", "read_local", "take_survey", "weights_bytes"]
