"""Restart requests: the only channel from the router to the supervisor.

The router writes one JSON file per trip into ``SLM_WATCHDOG_REQUEST_DIR`` (temp file +
rename, so the supervisor never reads half a file); the supervisor takes each file
(deleting it first) and decides. A request that predates the target backend's start
plus the startup grace is stale: it was raised against an earlier process, by a
previous run, or while the backend was still loading.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class RestartRequest:
    """One trip, as the router saw it. ``requested_at`` is wall-clock seconds."""

    role: str
    model_id: str
    port: int
    reason: str
    requested_at: float
    detail: str | None = None


def write_request(directory: Path, request: RestartRequest) -> Path:
    """Atomically write ``request`` as ``<port>-<role>-<ns>.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    safe_role = "".join(c if c.isalnum() or c in "-_" else "_" for c in request.role)
    name = f"{request.port}-{safe_role}-{time.time_ns()}.json"
    fd, tmp = tempfile.mkstemp(prefix=".req-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(asdict(request), handle)
        final = directory / name
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return final


def take_requests(directory: Path) -> list[RestartRequest | str]:
    """Remove and return every pending request, oldest first; an unreadable file
    yields its name instead."""
    try:
        names = sorted(p for p in directory.iterdir() if p.suffix == ".json" and p.is_file())
    except (FileNotFoundError, NotADirectoryError):
        return []
    taken: list[RestartRequest | str] = []
    for path in names:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            request = RestartRequest(
                role=str(raw["role"]),
                model_id=str(raw["model_id"]),
                port=int(raw["port"]),
                reason=str(raw["reason"]),
                requested_at=float(raw["requested_at"]),
                detail=raw.get("detail"),
            )
            if not math.isfinite(request.requested_at):
                # NaN compares false both ways: it would pass the future and grace checks.
                raise ValueError("requested_at is not a finite number")
        except (OSError, ValueError, KeyError, TypeError):
            taken.append(path.name)
            request = None
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        if request is not None:
            taken.append(request)
    taken.sort(key=lambda r: r.requested_at if isinstance(r, RestartRequest) else 0.0)
    return taken


def is_stale(request: RestartRequest, started_wall: float, grace: float) -> bool:
    """True when the request predates the backend's start plus the startup grace."""
    return request.requested_at < started_wall + grace
