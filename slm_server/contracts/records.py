"""Files the launcher keeps beside its logs: the pidfile and the state file.

Both are JSON, replaced atomically (temp file + rename) so a reader never sees half a
file. The pidfile lists every process this launcher started, with its create time, so
a later start can stop leftovers that are verifiably ours. The state file publishes
each backend's state for ``python -m slm_server status``, ``start.sh`` and the router.
This module is the contract between the launcher, which writes them, and their
readers: it belongs to neither side.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from slm_server.contracts.applied_registry import RegistryStamp, Retiring

# Create times of one process read twice may differ by rounding.
CREATE_TIME_TOLERANCE = 0.01


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` via a temp file in the same directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or ``None`` when it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: a forged deep file
        return None


@dataclass(frozen=True)
class PidRecord:
    """One process we started: enough to recognise it later."""

    pid: int
    create_time: float
    port: int
    role: str
    model_id: str
    argv: list[str]


def read_pidfile(path: Path) -> list[PidRecord]:
    data = read_json(path)
    records: list[PidRecord] = []
    if not isinstance(data, dict) or not isinstance(data.get("processes"), list):
        return records
    for raw in data["processes"]:
        try:
            records.append(
                PidRecord(
                    pid=int(raw["pid"]),
                    create_time=float(raw["create_time"]),
                    port=int(raw["port"]),
                    role=str(raw["role"]),
                    model_id=str(raw["model_id"]),
                    argv=[str(a) for a in raw["argv"]],
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return records


def write_pidfile(path: Path, launcher_pid: int, records: list[PidRecord]) -> None:
    write_json_atomic(
        path, {"launcher_pid": launcher_pid, "processes": [asdict(r) for r in records]}
    )


# Published states in which a backend holds memory (or is about to, or still does).
HOLDING_STATES = frozenset({"loading", "starting", "ready", "restarting", "unloading"})


@dataclass(frozen=True)
class BackendState:
    """What ``status`` shows for one backend."""

    role: str
    model_id: str
    backend: str
    port: int
    state: str
    pid: int | None
    since: float
    started_at: float | None
    exit_status: int | None
    restarts: int
    reason: str | None
    log_path: str
    last_exit: str | None = None
    last_restart_reason: str | None = None
    restarts_by_reason: dict[str, int] = field(default_factory=dict)
    # What the launcher planned, for the router: the server it runs ("llama-server",
    # "llama_cpp.server", "mlx-openai-server", "mlx-rerank"), the path that answers
    # once it is ready, and the request fields the router fills in when absent.
    kind: str | None = None
    health_path: str = "/health"
    request_defaults: dict[str, Any] = field(default_factory=dict)
    # Loading on demand: the entry's ``load``, the footprint estimated before a load
    # and measured once ready (MiB), the one the router admits by (``memory_mb`` from
    # the registry, else the measured, else the estimate), and when it became ready.
    # The restart budget: the most restarts its sliding window allows, the window, and
    # when (wall clock) each restart the window held at publication was spent.
    budget_max: int = 0
    budget_window_seconds: float = 0.0
    budget_spent_at: list[float] = field(default_factory=list)
    load: str = "always"
    memory_estimate_mb: int | None = None
    memory_measured_mb: int | None = None
    footprint_mb: int | None = None
    loaded_at: float | None = None
    # What its prompt cache may hold (MiB, in ``footprint_mb``; None: unbounded), and
    # the resident memory of its process tree at the last sweep while ready.
    prompt_cache_mb: int | None = 0
    memory_resident_mb: int | None = None
    # Its slots' prompt caches kept across an unload and a load: the tokens saved for
    # its launch (None: not kept, ``slot_cache_skip`` says why).
    slot_cache_tokens: int | None = None
    slot_cache_skip: str | None = None
    # A remote (backend ``remote``): its url (no credentials), and while it is
    # ``ejected`` until when (wall clock) and how many ejections in a row it is on.
    url: str | None = None
    ejected_until: float | None = None
    ejections: int = 0
    # Added or replaced by a reload and not ready since: requests for it wait (within
    # their deadlines) for it to be ready, as for a load, instead of a 503.
    reloaded: bool = False


def write_state(
    path: Path,
    launcher_pid: int,
    backends: list[BackendState],
    launcher_create_time: float | None = None,
    registry: RegistryStamp | None = None,
    retiring: list[Retiring] | None = None,
) -> None:
    """Publish the backends' states, naming the launcher by pid *and* create time, the
    registry in force and the backends a reload retires
    (:mod:`~slm_server.contracts.applied_registry`)."""
    data: dict[str, Any] = {
        "launcher_pid": launcher_pid,
        "launcher_create_time": launcher_create_time,
        "backends": [asdict(b) for b in backends],
    }
    if registry is not None:
        data["registry"] = registry.to_json()
    if retiring:
        data["retiring"] = [r.to_json() for r in retiring]
    write_json_atomic(path, data)


def process_create_time(pid: int) -> float | None:
    """When the process ``pid`` was created, ``None`` when it does not exist."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def pid_alive(pid: int | None) -> bool:
    """Whether a process ``pid`` exists (signal 0; one we may not signal exists too)."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def launcher_running(pid: int | None, create_time: float | None) -> bool:
    """Whether the launcher that published a state file still runs: its pid is alive
    *and* was created at ``create_time`` (a pid reused by another process is not it).
    A file without a create time (from an older launcher) is judged by its pid alone."""
    if pid is None:
        return False
    try:
        created = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # alive, but not ours to inspect
    return create_time is None or abs(created - create_time) <= CREATE_TIME_TOLERANCE


@dataclass(frozen=True)
class BudgetView:
    """A backend's restart budget at one moment, from its published state."""

    used: int
    remaining: int
    max_restarts: int
    window_seconds: float
    frees_at: float | None  # wall clock when the oldest restart leaves the window
    abandoned: bool


def budget_view(state: BackendState, wall: float) -> BudgetView:
    """The budget of ``state`` at wall-clock ``wall``: restarts older than the window
    have left it, whenever the file was written."""
    window = state.budget_window_seconds
    held = sorted(t for t in state.budget_spent_at if wall - t < window)
    return BudgetView(
        used=len(held),
        remaining=max(0, state.budget_max - len(held)),
        max_restarts=state.budget_max,
        window_seconds=window,
        frees_at=round(held[0] + window, 3) if held else None,
        abandoned=state.state == "abandoned",
    )


@dataclass(frozen=True)
class StateFile:
    """A state file as read: the launcher that wrote it and the backends it published."""

    launcher_pid: int | None = None
    launcher_create_time: float | None = None
    backends: list[BackendState] = field(default_factory=list)
    registry: RegistryStamp | None = None  # the registry in force (older files: None)
    retiring: list[Retiring] = field(default_factory=list)

    def launcher_running(self) -> bool:
        return launcher_running(self.launcher_pid, self.launcher_create_time)


def read_state_file(path: Path) -> StateFile:
    """The state file at ``path`` (empty when missing or unreadable), read once."""
    return parse_state(read_json(path))


def parse_state(data: Any) -> StateFile:
    """A state file's decoded JSON as a :class:`StateFile` (empty when it is none)."""
    if not isinstance(data, dict):
        return StateFile()
    backends: list[BackendState] = []
    raw_backends = data.get("backends")
    for raw in raw_backends if isinstance(raw_backends, list) else []:
        try:
            backends.append(BackendState(**raw))
        except TypeError:
            continue
    pid, created = data.get("launcher_pid"), data.get("launcher_create_time")
    raw_retiring = data.get("retiring")
    retiring = [
        r
        for r in (
            Retiring.from_json(x) for x in (raw_retiring if isinstance(raw_retiring, list) else [])
        )
        if r is not None
    ]
    return StateFile(
        launcher_pid=pid if isinstance(pid, int) else None,
        launcher_create_time=float(created) if isinstance(created, int | float) else None,
        backends=backends,
        registry=RegistryStamp.from_json(data.get("registry")),
        retiring=retiring,
    )


def read_state(path: Path) -> tuple[int | None, list[BackendState]]:
    """The launcher's pid and the backends it published (empty when none)."""
    state = read_state_file(path)
    return state.launcher_pid, state.backends
