"""The model registry: ``config/models.yaml`` parsed into frozen, validated entries.

The file maps role names to entries::

    models:
      standard:
        id: smollm2-135m-instruct
        backend: llamacpp
        port: 8501
        model_path: models/SmolLM2-135M-Instruct.Q4_1.gguf
        default_timeout: 120
        quantization: Q4_1

A list of entries is accepted too; each entry's role is then its id. Every problem is
reported as one :class:`Problem` line naming the file, the entry and the field, and
loading raises :class:`ConfigError` carrying all of them at once.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from slm_server.registry.presets import Alias, Preset, alias_items
from slm_server.registry.tools import DEFAULT_TOOLS, ToolPolicy, tools_items
from slm_server.registry.upstream_paths import parse_rule

Backend = Literal["llamacpp", "mlx", "mlx-rerank", "remote"]
ModelType = Literal[
    "lm", "multimodal", "image-generation", "image-edit", "embeddings", "rerank", "whisper"
]
CacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]

MLX_ONLY_FIELDS = frozenset(
    {"enable_auto_tool_choice", "tool_call_parser", "reasoning_parser", "config_name"}
)
LLAMACPP_ONLY_FIELDS = frozenset(
    {
        "chat_template_file",
        "temp",
        "top_p",
        "top_k",
        "min_p",
        "presence_penalty",
        "repetition_penalty",
        "n_predict",
        "ubatch_size",
        "cache_type_k",
        "cache_type_v",
        "cache_ram",
        "kv_offload",
        "flash_attn",
        "kv_unified",
        "swa_full",
        "fit",
        "cont_batching",
        "cache_prompt",
        "spec_type",
        "spec_draft_n_max",
        "spec_model_path",
        "verbose",
        "mmproj_path",
        "pooling",
        "slot_cache",
    }
)
NATIVE_ONLY_FIELDS = frozenset(
    {
        "chat_template_file",
        "cache_ram",
        "kv_offload",
        "kv_unified",
        "swa_full",
        "fit",
        "cont_batching",
        "cache_prompt",
        "spec_type",
        "spec_draft_n_max",
        "spec_model_path",
        "mmproj_path",
        "pooling",
    }
)
MODEL_TYPES_BY_BACKEND: dict[str, frozenset[str]] = {
    "llamacpp": frozenset({"lm", "multimodal", "embeddings", "rerank"}),
    "mlx": frozenset(
        {"lm", "multimodal", "image-generation", "image-edit", "embeddings", "whisper"}
    ),
    "mlx-rerank": frozenset({"rerank"}),
    "remote": frozenset({"lm", "multimodal", "embeddings", "rerank"}),
}
# The fields only a remote entry has, and the fields that describe a process this
# gateway starts, which a remote entry refuses (nothing is started for it).
REMOTE_ONLY_FIELDS = frozenset({"url", "api_key_env", "remote_model"})
LOCAL_ONLY_FIELDS = frozenset({"port", "host", "model_path", "quantization", "memory_mb"})
# Required of every entry that runs a local process.
LOCAL_REQUIRED_FIELDS = ("port", "model_path", "quantization")


MAX_REPLICAS = 16


class ModelEntry(BaseModel):
    """One model server: every field of the registry, with its default.

    Fields in ``MLX_ONLY_FIELDS`` apply to ``backend: mlx`` only and fields in
    ``LLAMACPP_ONLY_FIELDS`` to ``backend: llamacpp`` only; setting one on another
    backend is an error rather than silently ignored. ``backend: remote`` names a
    server elsewhere (``REMOTE_ONLY_FIELDS``) and refuses ``LOCAL_ONLY_FIELDS``::

        big:
          id: qwen3-32b
          backend: remote
          url: http://10.0.0.5:8000/v1
          api_key_env: GPU_BOX_KEY
          default_timeout: 300
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # Every backend (``port``, ``model_path`` and ``quantization`` are required of a
    # local one and refused on a remote one, whose ``port`` is its url's).
    id: str = Field(min_length=1)
    backend: Backend
    port: int = Field(default=0, ge=1, le=65535)
    model_path: str = Field(default="", min_length=1)
    default_timeout: float = Field(gt=0)
    quantization: str = Field(default="", min_length=1)
    model_type: ModelType = "lm"
    context_length: int | None = Field(default=None, ge=1)
    max_concurrency: int = Field(default=1, ge=1)
    max_queue: int = Field(default=16, ge=0)
    host: str = Field(default="127.0.0.1", min_length=1)
    enabled: bool = True
    supports_function_calling: bool = False
    # Request-side, every backend: how the tools a chat request offers reach the model,
    # and whether the calls it makes are checked and mended (:mod:`.tools`).
    tools: ToolPolicy = DEFAULT_TOOLS
    # Request-side, every backend: merged into chat requests that carry none.
    chat_template_kwargs: dict[str, Any] | None = None
    # Request-side, every backend: other names clients may send as ``model``, and what
    # the router imposes on text-generation requests (see :mod:`.preset_schema`).
    aliases: list[Alias] = Field(default_factory=list)
    preset: Preset | None = None
    # Loading, every backend: started at launch and kept (always), or started on the
    # first request naming it and unloaded when idle or for room (on_demand).
    load: Literal["always", "on_demand"] = "always"
    idle_ttl: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, ge=1)
    # Replicas and routing, every backend: ``replicas`` processes of this model on the
    # consecutive ports from ``port``, and how the router picks one for each request.
    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    routing: Literal["least_outstanding", "round_robin", "prefix_affinity"] = "least_outstanding"
    affinity_threshold: int = Field(default=2, ge=0)
    # One more replica of the entry with this YAML key (same id, same model_type): how
    # entries on other hosts, or of another backend, join one model's replicas.
    replica_of: str | None = Field(default=None, min_length=1)
    # Request-side: whether the model fills in the middle (llama-server's /infill and
    # completions' ``suffix``; null: as its GGUF vocabulary says, see
    # slm_server.memory.fill_in), whether /infill requests that name no model go to it,
    # and the engine paths /upstream/<model>/... reaches beyond the router's own
    # defaults (slm_server.registry.upstream_paths).
    infill: bool | None = None
    infill_default: bool = False
    upstream_paths: list[str] = Field(default_factory=list)

    # Remote only: an OpenAI-compatible server this gateway starts nothing for.
    url: str | None = Field(default=None, pattern=r"^https?://[^/?#\s]+(/[^?#\s]*)?/v1/?$")
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    remote_model: str | None = Field(default=None, min_length=1)

    # MLX only.
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    config_name: str | None = None

    # llama.cpp only.
    chat_template_file: str | None = None
    temp: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = None
    repetition_penalty: float | None = Field(default=None, gt=0)
    n_predict: int | None = Field(default=None, ge=-1)
    ubatch_size: int | None = Field(default=None, ge=1, le=2048)
    cache_type_k: CacheType | None = None
    cache_type_v: CacheType | None = None
    cache_ram: int | None = Field(default=None, ge=-1)
    # Keep the slots' prompt caches across an unload and a load (slm_server.slotcache);
    # null: yes, where the server's restored cache is reused.
    slot_cache: bool | None = None
    kv_offload: bool | None = None
    flash_attn: bool | Literal["auto"] | None = None
    kv_unified: bool | None = None
    swa_full: bool | None = None
    fit: bool | None = None
    cont_batching: bool | None = None
    cache_prompt: bool | None = None
    spec_type: str | None = None
    spec_draft_n_max: int | None = Field(default=None, ge=1)
    spec_model_path: str | None = None
    verbose: bool | None = None
    mmproj_path: str | None = None
    pooling: Literal["none", "mean", "cls", "last", "rank"] | None = None

    @field_validator("aliases", mode="before")
    @classmethod
    def _plain_aliases(cls, value: Any) -> Any:
        """An alias written as a plain string is an alias without a preset."""
        return alias_items(value)

    @field_validator("tools", mode="before")
    @classmethod
    def _plain_tools(cls, value: Any) -> Any:
        """``tools: render`` is ``tools: {mode: render}``."""
        return tools_items(value)

    def tool_policy(self, alias: str | None) -> ToolPolicy:
        """The tool-call policy for requests naming this entry by its id (``alias``
        None) or by one of its aliases (the alias's fields over the entry's)."""
        found = None if alias is None else self.alias_tools(alias)
        return self.tools if found is None else found.over(self.tools)

    def alias_tools(self, name: str) -> ToolPolicy | None:
        """The tool policy alias ``name`` writes over the entry's (None: none)."""
        return next((a.tools for a in self.aliases if a.name == name), None)

    @field_validator("upstream_paths")
    @classmethod
    def _path_rules(cls, rules: list[str]) -> list[str]:
        """Each rule must parse (``[METHOD ]/path[/*]``)."""
        for rule in rules:
            parse_rule(rule)
        return rules

    @field_validator("url")
    @classmethod
    def _url_port(cls, url: str | None) -> str | None:
        """A url's port must be a port (the pattern lets any digits through)."""
        if url is not None:
            try:
                port = urlsplit(url).port
            except ValueError:
                raise ValueError("the port must be 1-65535") from None
            if port == 0:
                raise ValueError("the port must be 1-65535")
        return url

    @model_validator(mode="after")
    def _remote_port(self) -> ModelEntry:
        """A remote entry's ``port`` is its url's (how requests and states name it).
        Set past the frozen model's guard so that it does not count as set in the file."""
        if self.url is not None and "port" not in self.model_fields_set:
            parts = urlsplit(self.url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            object.__setattr__(self, "port", port)
        return self

    @property
    def alias_names(self) -> tuple[str, ...]:
        """Every alias of this entry, in the order written."""
        return tuple(a.name for a in self.aliases)

    def alias_preset(self, name: str) -> Preset | None:
        """The preset of alias ``name`` (None when it has none or is no alias)."""
        return next((a.preset for a in self.aliases if a.name == name), None)

    @property
    def remote(self) -> bool:
        """Whether this entry is a remote server: nothing is started for it."""
        return self.backend == "remote"

    @property
    def origin(self) -> str:
        """``scheme://host:port`` of a remote's url (of the local base url otherwise)."""
        if self.url is None:
            return self.base_url
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"

    @property
    def path_prefix(self) -> str:
        """What goes before ``/v1/...`` on the remote: its url's path without ``/v1``."""
        if self.url is None:
            return ""
        return urlsplit(self.url).path.rstrip("/")[: -len("/v1")]

    @property
    def upstream_model(self) -> str:
        """The model name the backend knows: ``remote_model``, else the id."""
        return self.remote_model or self.id

    @property
    def base_url(self) -> str:
        """Where the router reaches this backend (a wildcard bind is reached on loopback;
        a remote at its url's origin)."""
        if self.url is not None:
            return self.origin
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def set_fields(self) -> frozenset[str]:
        """The fields the YAML entry set explicitly."""
        return frozenset(self.model_fields_set)


@dataclass(frozen=True)
class Problem:
    """One configuration problem, rendered as a single line."""

    source: str
    entry: str | None
    field: str | None
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        parts = [self.source]
        if self.entry is not None:
            parts.append(f"model {self.entry}")
        if self.field is not None:
            parts.append(f"field '{self.field}'")
        prefix = "warning: " if self.severity == "warning" else ""
        return f"{prefix}{': '.join(parts)}: {self.message}"


class ConfigError(Exception):
    """The registry cannot be used; ``problems`` lists every reason, one per line."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


@dataclass(frozen=True)
class ModelSpec:
    """A validated entry with its role (the YAML key) and position in the file; one
    per replica of an entry with ``replicas`` > 1 (see :func:`replica_specs`)."""

    role: str
    index: int
    entry: ModelEntry
    replica: int = 1  # 1..replicas; its port is the entry's port + replica - 1
    # The YAML key of the entry whose replicas this one joins (``replica_of``); its
    # ``index`` is then that entry's and ``replica`` numbers it after that entry's own.
    joins: str | None = None

    @property
    def base_role(self) -> str:
        """The YAML key of the entry this replica belongs to."""
        if self.joins is not None or self.replica == 1:
            return self.role
        return self.role.rsplit(".", 1)[0]

    @property
    def label(self) -> str:
        """How problems name this entry: its role (the YAML key) and id."""
        return f"'{self.base_role}' (id '{self.entry.id}')"


@dataclass(frozen=True)
class RegistryFile:
    """The loaded registry: every entry in file order, and the warnings found."""

    path: Path
    models: tuple[ModelSpec, ...]
    warnings: tuple[Problem, ...] = ()
    problems: tuple[Problem, ...] = ()

    @property
    def enabled(self) -> tuple[ModelSpec, ...]:
        return tuple(m for m in self.models if m.entry.enabled)


def replica_role(role: str, replica: int) -> str:
    """The role of replica ``replica`` of the entry ``role``: the first keeps the YAML
    key (an entry of one replica is unchanged), the others are ``<role>.<n>``."""
    return role if replica == 1 else f"{role}.{replica}"


def replica_specs(spec: ModelSpec) -> tuple[ModelSpec, ...]:
    """An entry's replicas, one spec each, on the consecutive ports from its own."""
    entry = spec.entry
    return tuple(
        ModelSpec(
            role=replica_role(spec.role, n),
            index=spec.index,
            entry=entry if n == 1 else entry.model_copy(update={"port": entry.port + n - 1}),
            replica=n,
        )
        for n in range(1, entry.replicas + 1)
    )


def _field_order(field: str | None) -> int:
    """Where ``field`` (or the field a nested path starts with) is declared in
    :class:`ModelEntry` (unknown fields first)."""
    names = list(ModelEntry.model_fields)
    root = field.split(".", 1)[0].split("[", 1)[0] if field is not None else None
    return names.index(root) if root in names else -1


# Fields whose values are structures: a problem inside one names its path in it.
_NESTED_FIELDS = frozenset({"aliases", "preset"})


def _field_path(loc: tuple[int | str, ...]) -> str:
    """``('aliases', 1, 'preset', 'set')`` as ``aliases[1].preset.set``."""
    path = str(loc[0])
    for part in loc[1:]:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _entry_label(role: str, raw: Any) -> str:
    if isinstance(raw, dict) and isinstance(raw.get("id"), str):
        return f"'{role}' (id '{raw['id']}')"
    return f"'{role}'"


def _validation_problems(source: str, label: str, exc: ValidationError) -> list[Problem]:
    """One problem per field: a union type's several complaints become one line."""
    by_field: dict[str | None, list[str]] = {}
    for err in exc.errors():
        loc = err["loc"]
        field = str(loc[0]) if loc else None
        nested = field in _NESTED_FIELDS
        if nested:
            field = _field_path(loc)
        if err["type"] == "extra_forbidden":
            message = "unknown field"
        elif nested and err["type"] == "value_error":
            message = str(err["ctx"]["error"])
        elif nested and err["type"] == "model_type" and loc[-1] == "preset":
            message = f"must be a mapping (got {err.get('input')!r})"
        elif nested and err["type"] == "model_type":
            message = f"must be a name, or a mapping of name and preset (got {err.get('input')!r})"
        elif err["type"] == "missing":
            message = "required field is missing"
        elif len(loc) > 1 and field in _UNION_FIELDS:
            message = f"must be {_UNION_FIELDS[field]} (got {err.get('input')!r})"
        else:
            message = f"{err['msg']} (got {err.get('input')!r})"
        messages = by_field.setdefault(field, [])
        if message not in messages:
            messages.append(message)
    return [
        Problem(source, label, field, "; ".join(messages)) for field, messages in by_field.items()
    ]


_UNION_FIELDS = {"flash_attn": "true, false or 'auto'"}


def _remote_problems(source: str, spec: ModelSpec) -> list[Problem]:
    """A remote entry names a server and a key; a local one a process to start."""
    entry, problems = spec.entry, []
    set_fields = entry.set_fields()
    if not entry.remote:
        for name in sorted(set_fields & REMOTE_ONLY_FIELDS):
            problems.append(Problem(source, spec.label, name, "applies to backend remote only"))
        return problems
    if entry.url is None:
        problems.append(
            Problem(
                source, spec.label, "url", "required for backend remote (e.g. http://host:8080/v1)"
            )
        )
    for name in sorted(set_fields & LOCAL_ONLY_FIELDS):
        problems.append(
            Problem(
                source,
                spec.label,
                name,
                "does not apply to backend remote (nothing is started for it; "
                "its host and port are the url's)",
            )
        )
    if entry.load != "always":
        problems.append(Problem(source, spec.label, "load", "a remote is never loaded or unloaded"))
    if entry.upstream_paths:
        problems.append(
            Problem(
                source,
                spec.label,
                "upstream_paths",
                "a remote is not reached through /upstream/ (only the engines the gateway runs)",
            )
        )
    if entry.replicas > 1:
        problems.append(
            Problem(
                source,
                spec.label,
                "replicas",
                "a remote is one server; list each other one as an entry with replica_of",
            )
        )
    return problems


def _applicability_problems(source: str, spec: ModelSpec) -> list[Problem]:
    entry = spec.entry
    problems = _remote_problems(source, spec)
    set_fields = entry.set_fields()
    if entry.backend != "mlx":
        for name in sorted(set_fields & MLX_ONLY_FIELDS):
            problems.append(Problem(source, spec.label, name, "applies to backend mlx only"))
    if entry.backend != "llamacpp":
        for name in sorted(set_fields & LLAMACPP_ONLY_FIELDS):
            problems.append(Problem(source, spec.label, name, "applies to backend llamacpp only"))
    if entry.model_type not in MODEL_TYPES_BY_BACKEND[entry.backend]:
        allowed = ", ".join(sorted(MODEL_TYPES_BY_BACKEND[entry.backend]))
        problems.append(
            Problem(
                source,
                spec.label,
                "model_type",
                f"backend {entry.backend} does not serve '{entry.model_type}' "
                f"(it serves {allowed})",
            )
        )
    if "config_name" in set_fields and entry.model_type not in ("image-generation", "image-edit"):
        problems.append(
            Problem(
                source,
                spec.label,
                "config_name",
                "applies to model_type image-generation or image-edit only",
            )
        )
    if "idle_ttl" in set_fields and entry.idle_ttl is not None and entry.load != "on_demand":
        problems.append(Problem(source, spec.label, "idle_ttl", "applies to load: on_demand only"))
    if entry.replicas > 1 and entry.load == "on_demand":
        problems.append(
            Problem(
                source,
                spec.label,
                "replicas",
                "an on_demand model runs one process; use load: always for replicas",
            )
        )
    if entry.replicas > 1 and entry.port + entry.replicas - 1 > 65535:
        problems.append(
            Problem(
                source,
                spec.label,
                "replicas",
                f"ports {entry.port}..{entry.port + entry.replicas - 1} pass 65535",
            )
        )
    if "affinity_threshold" in set_fields and entry.routing != "prefix_affinity":
        problems.append(
            Problem(
                source, spec.label, "affinity_threshold", "applies to routing: prefix_affinity only"
            )
        )
    problems.extend(_own_alias_problems(source, spec))
    if entry.infill_default and entry.model_type not in PRESET_MODEL_TYPES:
        problems.append(
            Problem(source, spec.label, "infill_default", "applies to model_type lm only")
        )
    if entry.model_type == "multimodal" and entry.backend == "llamacpp" and not entry.mmproj_path:
        problems.append(
            Problem(source, spec.label, "mmproj_path", "required when model_type is multimodal")
        )
    return problems


# The model types whose endpoints (chat, completions, Responses) presets apply to.
PRESET_MODEL_TYPES = frozenset({"lm", "multimodal"})


def _own_alias_problems(source: str, spec: ModelSpec) -> list[Problem]:
    """An entry's aliases among themselves: none is its id or listed twice; presets only
    where requests generate text."""
    entry, problems = spec.entry, []
    seen: set[str] = set()
    for position, alias in enumerate(entry.aliases):
        field = f"aliases[{position}]"
        if alias.name == entry.id:
            problems.append(Problem(source, spec.label, field, f"{alias.name!r} is the entry's id"))
        elif alias.name in seen:
            problems.append(Problem(source, spec.label, field, f"{alias.name!r} is listed twice"))
        seen.add(alias.name)
        if alias.preset is not None and entry.model_type not in PRESET_MODEL_TYPES:
            problems.append(
                Problem(
                    source,
                    spec.label,
                    f"{field}.preset",
                    "applies to model_type lm or multimodal only (chat, completions, Responses)",
                )
            )
    if entry.preset is not None and entry.model_type not in PRESET_MODEL_TYPES:
        problems.append(
            Problem(
                source,
                spec.label,
                "preset",
                "applies to model_type lm or multimodal only (chat, completions, Responses)",
            )
        )
    return problems


def _alias_clashes(source: str, firsts: list[ModelSpec]) -> list[Problem]:
    """An alias of an enabled entry that is also another enabled entry's id or alias:
    one line on the entry that lists it (the later one, for two aliases), naming the
    other. (Two entries with one id are ambiguous instead: a warning and 409.)"""
    owners: dict[str, tuple[ModelSpec, str]] = {}
    for spec in firsts:
        owners.setdefault(spec.entry.id, (spec, "id"))
    problems = []
    for spec in firsts:
        for position, name in enumerate(spec.entry.alias_names):
            owner = owners.get(name)
            if owner is None:
                owners[name] = (spec, "alias")
                continue
            other, kind = owner
            if other.index == spec.index:
                continue  # the entry's own id or a repeat: reported with the entry
            what = "the id" if kind == "id" else "an alias"
            problems.append(
                Problem(
                    source,
                    spec.label,
                    f"aliases[{position}]",
                    f"{name!r} is also {what} of model {other.label}; "
                    "a name may lead to one model only",
                )
            )
    return problems


def _infill_default_problems(source: str, firsts: list[ModelSpec]) -> list[Problem]:
    """At most one enabled entry is the default for /infill requests that name no
    model: one line on each after the first, naming it."""
    chosen = [spec for spec in firsts if spec.entry.infill_default]
    return [
        Problem(
            source,
            spec.label,
            "infill_default",
            f"model {chosen[0].label} is the default for /infill already; only one may be",
        )
        for spec in chosen[1:]
    ]


def _entries(source: str, data: Any) -> list[tuple[str, Any]]:
    if not isinstance(data, dict) or "models" not in data:
        raise ConfigError(
            [Problem(source, None, "models", "the file must have a top-level 'models' mapping")]
        )
    extra = sorted(str(k) for k in data if k != "models")
    if extra:
        raise ConfigError([Problem(source, None, key, "unknown top-level key") for key in extra])
    models = data["models"]
    if isinstance(models, dict):
        return [(str(role), raw) for role, raw in models.items()]
    if isinstance(models, list):
        return [
            (str(raw["id"]) if isinstance(raw, dict) and "id" in raw else f"#{i}", raw)
            for i, raw in enumerate(models)
        ]
    raise ConfigError([Problem(source, None, "models", "must map role names to model entries")])


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses a mapping with the same key twice (PyYAML would keep
    the last one silently, hiding a whole registry entry)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _role_problems(source: str, specs: list[ModelSpec]) -> list[Problem]:
    """A replica's role (``<role>.<n>``) that is also another entry's YAML key."""
    problems = []
    keys = {s.role: s for s in specs if s.replica == 1 or s.joins is not None}
    for spec in specs:
        other = keys.get(spec.role)
        if spec.replica > 1 and spec.joins is None and other is not None:
            problems.append(
                Problem(
                    source,
                    spec.label,
                    "replicas",
                    f"replica {spec.replica} would be named {spec.role!r}, "
                    f"which is the role of another entry",
                )
            )
    return problems


def _join_problems(source: str, spec: ModelSpec, target: ModelSpec | None) -> list[Problem]:
    entry, entry_key = spec.entry, spec.entry.replica_of

    def problem(field: str, message: str) -> Problem:
        return Problem(source, spec.label, field, message)

    if target is None:
        return [problem("replica_of", f"no entry has the key {entry_key!r}")]
    if target.entry.replica_of is not None:
        return [
            problem(
                "replica_of",
                f"{entry_key!r} itself joins {target.entry.replica_of!r}; "
                f"name {target.entry.replica_of!r}",
            )
        ]
    problems = []
    if entry.id != target.entry.id:
        problems.append(
            problem(
                "id",
                f"must be {target.entry.id!r}, the id of {entry_key!r}, whose replicas it joins",
            )
        )
    if entry.model_type != target.entry.model_type:
        problems.append(
            problem("model_type", f"must be that of {entry_key!r} ({target.entry.model_type!r})")
        )
    for field in ("routing", "affinity_threshold", "aliases", "preset"):
        if field in entry.set_fields():
            problems.append(problem(field, f"is set on {entry_key!r}, whose replicas it joins"))
    if entry.replicas > 1:
        problems.append(problem("replicas", "an entry joining another's replicas is one backend"))
    if entry.enabled and not target.entry.enabled:
        problems.append(problem("replica_of", f"{entry_key!r} is disabled"))
    return problems


def _join_replicas(source: str, specs: list[ModelSpec]) -> tuple[list[ModelSpec], list[Problem]]:
    """Entries with ``replica_of`` made replicas of the entry they name (numbered after
    its own, placed after them); a joiner that cannot join stays an entry of its own
    and a problem says why. Only an explicit ``replica_of`` joins: two entries that
    merely share an id stay ambiguous (409)."""
    keys = {s.role: s for s in specs if s.replica == 1 and s.joins is None}
    problems: list[Problem] = []
    kept = [s for s in specs if s.entry.replica_of is None]
    for spec in specs:
        entry = spec.entry
        if entry.replica_of is None:
            continue
        target = keys.get(entry.replica_of)
        found = _join_problems(source, spec, target)
        problems.extend(found)
        if found or target is None or not entry.enabled:
            kept.append(spec)
            continue
        group = [i for i, s in enumerate(kept) if s.index == target.index and s.entry.enabled]
        joined = ModelSpec(
            role=spec.role,
            index=target.index,
            entry=entry,
            replica=len(group) + 1,
            joins=target.role,
        )
        kept.insert(group[-1] + 1, joined)
    return kept, problems


class _Sketch(BaseModel):
    """What the cross-entry checks (ports, aliases) read of an entry that failed
    validation: each field kept only when it is valid on its own, so an entry with one
    bad field still has its port clash and its alias clashes reported in the same run."""

    model_config = ConfigDict(extra="ignore", strict=True)

    id: str | None = Field(default=None, min_length=1)
    backend: Backend | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    enabled: bool = True
    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    aliases: list[Alias] = Field(default_factory=list)

    @field_validator("aliases", mode="before")
    @classmethod
    def _plain_aliases(cls, value: Any) -> Any:
        return alias_items(value)


def _sketch(role: str, index: int, raw: dict[str, Any]) -> tuple[ModelSpec, ...]:
    """The replicas of an entry that failed validation as far as the cross-entry checks
    need them (see :class:`_Sketch`); none without a valid id and port."""
    kept: dict[str, Any] = {}
    for name in _Sketch.model_fields:
        if name in raw:
            try:
                _Sketch.model_validate({name: raw[name]})
            except ValidationError:
                continue
            kept[name] = raw[name]
    sketch = _Sketch.model_validate(kept)
    if sketch.id is None or sketch.port is None:
        return ()
    entry = ModelEntry.model_construct(
        id=sketch.id,
        backend=sketch.backend or "llamacpp",
        port=sketch.port,
        enabled=sketch.enabled,
        replicas=sketch.replicas,
        aliases=sketch.aliases,
        default_timeout=0.0,  # never read: the sketch only takes part in the cross-checks
    )
    return replica_specs(ModelSpec(role=role, index=index, entry=entry))


def _port_problems(source: str, enabled: list[ModelSpec]) -> list[Problem]:
    """Every port used twice among enabled entries, replicas' ports included; one line
    per entry. A remote's port is on another host and collides with nothing here."""
    problems: list[Problem] = []
    by_port: dict[int, list[ModelSpec]] = {}
    enabled = [s for s in enabled if not s.entry.remote]
    for spec in enabled:
        by_port.setdefault(spec.entry.port, []).append(spec)
    seen: set[tuple[int, str]] = set()
    for spec in enabled:
        others = [o for o in by_port[spec.entry.port] if o is not spec]
        if not others or (spec.index, spec.base_role) in seen:
            continue
        seen.add((spec.index, spec.base_role))
        names = ", ".join(repr(o.role) for o in others)
        what = f"port {spec.entry.port}"
        if spec.replica > 1:
            what += f" (replica {spec.replica} of {spec.entry.replicas})"
        problems.append(Problem(source, spec.label, "port", f"{what} is also used by {names}"))
    return problems


def inspect_registry(text: str, path: Path) -> RegistryFile:
    """Validate registry YAML text, keeping every entry that is valid on its own and
    listing every problem in ``problems``. Raises :class:`ConfigError` only when the
    file as a whole cannot be read as a registry."""
    source = str(path)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except RecursionError:
        raise ConfigError(
            [Problem(source, None, None, "not a registry: nested too deeply")]
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        detail = getattr(exc, "problem", None)
        reason = f": {detail}" if detail else ""
        raise ConfigError([Problem(source, None, None, f"not valid YAML{where}{reason}")]) from None
    problems: list[Problem] = []
    specs: list[ModelSpec] = []
    sketches: list[ModelSpec] = []  # entries that failed validation, for the cross-checks
    for index, (role, raw) in enumerate(_entries(source, data)):
        label = _entry_label(role, raw)
        if not isinstance(raw, dict):
            problems.append(Problem(source, label, None, "an entry must be a mapping of fields"))
            continue
        missing = [
            Problem(source, label, name, "required field is missing")
            for name in LOCAL_REQUIRED_FIELDS
            if raw.get("backend") != "remote" and name not in raw
        ]
        try:
            entry = ModelEntry.model_validate(raw)
        except ValidationError as exc:
            found = _validation_problems(source, label, exc)
            problems.extend(sorted([*found, *missing], key=lambda p: _field_order(p.field)))
            sketches.extend(_sketch(role, index, raw))
            continue
        if missing:
            problems.extend(missing)
            sketches.extend(_sketch(role, index, raw))
            continue
        spec = ModelSpec(role=role, index=index, entry=entry)
        entry_problems = _applicability_problems(source, spec)
        problems.extend(entry_problems)
        if any(p.field == "replicas" for p in entry_problems):
            specs.append(spec)
        else:
            specs.extend(replica_specs(spec))

    specs, join_problems = _join_replicas(source, specs)
    problems.extend(join_problems)
    problems.extend(_role_problems(source, specs))
    enabled = [s for s in specs if s.entry.enabled]
    sketched = [s for s in sketches if s.entry.enabled]
    cross = sorted([*enabled, *sketched], key=lambda s: (s.index, s.replica))
    problems.extend(_port_problems(source, cross))
    warnings: list[Problem] = []
    firsts = [s for s in enabled if s.replica == 1]
    problems.extend(_alias_clashes(source, [s for s in cross if s.replica == 1]))
    problems.extend(_infill_default_problems(source, firsts))
    id_counts = Counter(s.entry.id for s in firsts)
    for spec in firsts:
        if id_counts[spec.entry.id] > 1:
            warnings.append(
                Problem(
                    source,
                    spec.label,
                    "id",
                    "id is used by more than one enabled entry; requests for it get 409",
                    severity="warning",
                )
            )
    return RegistryFile(
        path=path, models=tuple(specs), warnings=tuple(warnings), problems=tuple(problems)
    )


def parse_registry(text: str, path: Path) -> RegistryFile:
    """Validate registry YAML text; raises :class:`ConfigError` with every problem."""
    registry = inspect_registry(text, path)
    if registry.problems:
        raise ConfigError(list(registry.problems))
    return registry


# A registry is a few kilobytes; a file larger than this is refused unread.
MAX_REGISTRY_BYTES = 4 * 1024 * 1024


def _read_regular_file(path: Path) -> bytes:
    """The bytes of the regular file at ``path``, opened without blocking (a FIFO or a
    device put in its place is refused, never waited on)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, "not a regular file")
        chunks = []
        size = 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_REGISTRY_BYTES:
                raise OSError(errno.EFBIG, f"larger than {MAX_REGISTRY_BYTES // 1024 // 1024} MiB")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_registry_text(path: Path) -> str:
    """The registry file's text; :class:`ConfigError` when it cannot be read (missing,
    not a regular file, larger than :data:`MAX_REGISTRY_BYTES`, not UTF-8)."""
    try:
        raw = _read_regular_file(path)
    except FileNotFoundError:
        hint = ""
        example = path.with_name(path.name + ".example")
        if example.exists():
            hint = f" (copy {example.name} to {path.name} to start from the defaults)"
        raise ConfigError([Problem(str(path), None, None, f"file not found{hint}")]) from None
    except OSError as exc:
        raise ConfigError(
            [Problem(str(path), None, None, f"cannot read: {exc.strerror}")]
        ) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = f"byte {exc.start}"
        raise ConfigError([Problem(str(path), None, None, f"not UTF-8 text at {where}")]) from None


def load_registry(path: Path) -> RegistryFile:
    """Read and validate the registry file at ``path``; raises :class:`ConfigError`."""
    return parse_registry(read_registry_text(path), path)
