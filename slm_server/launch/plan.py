"""From registry entries to launch plans: the argv, log file and health URL of each
backend, or the problems that stop it from starting. Pure apart from looking at files.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slm_server.launch.footprint import prompt_cache_mb
from slm_server.launch.llama_argv import (
    ModelFiles,
    native_argv,
    python_argv,
    python_request_defaults,
)
from slm_server.launch.mlx_argv import mlx_argv, mlx_rerank_argv, unsupported_choices
from slm_server.launch.mlx_options import read_mlx_options
from slm_server.launch.runtime import LlamaRuntime, RuntimeNotFound, find_llama_runtime
from slm_server.registry.model_path import ModelPathError, resolve_file_field, resolve_model_path
from slm_server.registry.schema import (
    NATIVE_ONLY_FIELDS,
    ModelEntry,
    ModelSpec,
    Problem,
    RegistryFile,
)
from slm_server.slotcache import eligible
from slm_server.slotcache.key import cache_key

LOG_KINDS = {"llamacpp": "llama", "mlx": "mlx", "mlx-rerank": "mlx-rerank"}
# llama-cpp-python's server has no /health; it loads the model before it listens, so
# any answer means ready. Not /v1/models: like every route that names the model, it
# waits for the model's lock, which a generation holds to its end, so a backend busy
# with a long answer would look dead to the watchdog's confirmation (and with
# interrupt_requests on, would cut a running stream). /docs is FastAPI's own page and
# answers from the event loop, which a generation leaves free.
PYTHON_LLAMA_HEALTH_PATH = "/docs"


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start, watch and name one backend process."""

    role: str
    model_id: str
    backend: str
    model_type: str
    host: str
    port: int
    argv: tuple[str, ...]
    log_path: Path
    base_url: str
    health_path: str = "/health"
    # Published in the state file for the router: which server this is, and the
    # request fields the router fills in for it (the Python fallback's sampling
    # defaults, which it cannot take as flags).
    kind: str = ""
    request_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # The most its prompt cache may hold (MiB; None: unbounded), counted in its
    # footprint (see slm_server.memory.prompt_cache).
    prompt_cache_mb: int | None = 0
    # Its slots' prompt caches kept across an unload and a load: the key a saved set
    # is valid under, or why they are not kept (slm_server.slotcache).
    slot_cache_key: str | None = None
    slot_cache_skip: str | None = None

    @property
    def health_url(self) -> str:
        return f"{self.base_url}{self.health_path}"


class PlanError(Exception):
    """One entry cannot be launched; ``missing`` marks a model path that is absent."""

    def __init__(self, problems: list[Problem], *, missing: bool = False) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems
        self.missing = missing


def log_path(log_dir: Path, spec: ModelSpec) -> Path:
    """``<log_dir>/<llama|mlx|mlx-rerank>-<id>-<port>.log``, the id made file-safe."""
    safe_id = re.sub(r"[^A-Za-z0-9._-]+", "_", spec.entry.id)
    return log_dir / f"{LOG_KINDS[spec.entry.backend]}-{safe_id}-{spec.entry.port}.log"


@dataclass(frozen=True)
class Toolchain:
    """The programs found on this machine for each backend kind."""

    llama: LlamaRuntime | None
    llama_error: str | None
    mlx_server: str | None

    @classmethod
    def discover(cls, llama_server_bin: str | None) -> Toolchain:
        try:
            llama, error = find_llama_runtime(llama_server_bin), None
        except RuntimeNotFound as exc:
            llama, error = None, str(exc)
        venv_bin = Path(sys.executable).parent / "mlx-openai-server"
        mlx = str(venv_bin) if venv_bin.exists() else shutil.which("mlx-openai-server")
        return cls(llama=llama, llama_error=error, mlx_server=mlx)


def _llama_files(spec: ModelSpec, model: str, source: str) -> ModelFiles:
    entry, problems = spec.entry, []
    missing = False
    resolved: dict[str, str | None] = {}
    for field, raw in (
        ("chat_template_file", entry.chat_template_file),
        ("mmproj_path", entry.mmproj_path),
        ("spec_model_path", entry.spec_model_path),
    ):
        resolved[field] = None
        if raw is not None:
            try:
                resolved[field] = resolve_file_field(field, raw)
            except ModelPathError as exc:
                missing = missing or exc.missing
                problems.append(Problem(source, spec.label, exc.field, exc.message))
    if problems:
        raise PlanError(problems, missing=missing)
    return ModelFiles(
        model=model,
        chat_template_file=resolved["chat_template_file"],
        mmproj=resolved["mmproj_path"],
        draft_model=resolved["spec_model_path"],
    )


def _sized_cache(entry: ModelEntry, cache_mb: int | None) -> ModelEntry:
    """``entry`` with its prompt cache's size filled in (``--cache-ram``), when the
    registry leaves it to us."""
    if entry.cache_ram is not None:
        return entry
    return entry.model_copy(update={"cache_ram": cache_mb})


def _llama_argv(
    spec: ModelSpec, model: str, tools: Toolchain, source: str, cache_mb: int | None
) -> list[str]:
    entry = spec.entry
    if tools.llama is None:
        raise PlanError([Problem(source, spec.label, "backend", tools.llama_error or "")])
    if not tools.llama.is_native:
        native_only = sorted(entry.set_fields() & NATIVE_ONLY_FIELDS)
        if entry.model_type == "rerank":
            native_only.insert(0, "model_type")
        if native_only:
            raise PlanError(
                [
                    Problem(
                        source,
                        spec.label,
                        name,
                        "needs the native llama-server, but only the Python fallback "
                        "(llama_cpp.server) is available; run scripts/build_llama.sh",
                    )
                    for name in native_only
                ]
            )
    files = _llama_files(spec, model, source)
    if tools.llama.is_native:
        return native_argv(tools.llama.program, _sized_cache(entry, cache_mb), files)
    return python_argv(tools.llama.program, entry, files)


def health_path(spec: ModelSpec, tools: Toolchain) -> str:
    """The path that answers 200 once the entry's backend is ready."""
    python = tools.llama is not None and not tools.llama.is_native
    if spec.entry.backend == "llamacpp" and python:
        return PYTHON_LLAMA_HEALTH_PATH
    return "/health"


def plan_launch(
    spec: ModelSpec,
    tools: Toolchain,
    log_dir: Path,
    source: str,
    *,
    budget_mb: int,
    slot_dir: Path | None = None,
) -> LaunchPlan:
    """The launch plan for one entry under a memory budget of ``budget_mb`` (which
    sizes its prompt cache), its slots saved in ``slot_dir`` (None: not kept); raises
    :class:`PlanError` naming every problem."""
    entry = spec.entry
    try:
        model = resolve_model_path(entry)
    except ModelPathError as exc:
        problem = Problem(source, spec.label, exc.field, exc.message)
        raise PlanError([problem], missing=exc.missing) from None
    defaults: dict[str, Any] = {}
    native = tools.llama is not None and tools.llama.is_native
    cache_mb = prompt_cache_mb(entry, native, budget_mb)  # 0 but for llama.cpp
    key: str | None = None
    skip = eligible.why_not(entry, native, slot_dir is not None)
    if entry.backend == "llamacpp":
        argv = _llama_argv(spec, model, tools, source, cache_mb)
        if skip is None and slot_dir is not None:
            key = cache_key(argv, spec.role)
            argv += ["--slot-save-path", str(slot_dir)]
        kind = "llama-server" if native else "llama_cpp.server"
        defaults = {} if native else python_request_defaults(entry)
    elif entry.backend == "mlx":
        kind = "mlx-openai-server"
        if tools.mlx_server is None:
            raise PlanError(
                [
                    Problem(
                        source,
                        spec.label,
                        "backend",
                        "mlx-openai-server is not installed (uv sync --extra mlx)",
                    )
                ]
            )
        options = read_mlx_options(tools.mlx_server)
        if options is not None:
            refused = unsupported_choices(entry, options)
            if refused:
                raise PlanError([Problem(source, spec.label, f, m) for f, m in refused])
        argv = mlx_argv(tools.mlx_server, entry, model, options)
    else:
        kind = "mlx-rerank"
        argv = mlx_rerank_argv(sys.executable, entry, model)
    return LaunchPlan(
        role=spec.role,
        model_id=entry.id,
        backend=entry.backend,
        model_type=entry.model_type,
        host=entry.host,
        port=entry.port,
        argv=tuple(argv),
        log_path=log_path(log_dir, spec),
        base_url=entry.base_url,
        health_path=health_path(spec, tools),
        kind=kind,
        request_defaults=defaults,
        prompt_cache_mb=cache_mb,
        slot_cache_key=key,
        slot_cache_skip=skip,
    )


def plan_registry(
    registry: RegistryFile,
    tools: Toolchain,
    log_dir: Path,
    *,
    budget_mb: int,
    slot_dir: Path | None = None,
) -> tuple[list[LaunchPlan], list[tuple[ModelSpec, PlanError]]]:
    """Plans for every enabled entry but the remotes (nothing is started for one), and
    the entries that cannot be planned."""
    plans: list[LaunchPlan] = []
    failures: list[tuple[ModelSpec, PlanError]] = []
    for spec in registry.enabled:
        if spec.entry.remote:
            continue
        try:
            source = str(registry.path)
            plans.append(
                plan_launch(spec, tools, log_dir, source, budget_mb=budget_mb, slot_dir=slot_dir)
            )
        except PlanError as exc:
            failures.append((spec, exc))
    return plans, failures
