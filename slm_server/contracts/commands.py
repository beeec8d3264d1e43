"""Commands to the supervisor: load or unload an on-demand model, reload the registry,
and retire a drained backend.

The supervisor listens on a Unix socket (:func:`socket_path`, mode 0600), the router
(or ``python -m slm_server reload``) connects for each command. One JSON object per
line each way::

    -> {"op": "load", "role": "coder"}
    -> {"op": "unload", "role": "coder", "reason": "evicted", "for_model": "qwen3-32b"}
    <- {"ok": true, "state": "loading"}
    <- {"ok": false, "state": "ready", "error": "load: always models are never unloaded"}
    -> {"op": "reload"}
    <- {"ok": true, "version": "…", "generation": 2, "added": ["b"], "removed": [],
        "replaced": ["a"], "unchanged": ["c"]}
    <- {"ok": false, "error": "…", "problems": ["models.yaml: 'a' (id 'x'): port: …"]}
    -> {"op": "retired", "role": "a", "pid": 4242}
    <- {"ok": true}

``retired`` is the router saying that nothing is in flight any more on the backend a
reload retires (:class:`~slm_server.contracts.applied_registry.Retiring`), so it may
stop now rather than at its deadline.

A reply says the command was taken (and the backend's state right after), not that it
is done: the router watches the state file for ``ready`` or ``unloaded``. A socket, not
files like the restart requests: a load or an unload acts at once and stops a process,
so it is not left to anything that can write a file under ``logs/``. Restart requests
keep their file channel and its confirmation.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

SOCKET_NAME = "supervisor.sock"
# sun_path holds 104 bytes on macOS, 108 on Linux (with the terminating NUL).
MAX_SOCKET_PATH = 100
MAX_LINE_BYTES = 4096
# A reload's reply names every problem of a registry: it may be long.
MAX_REPLY_BYTES = 1024 * 1024
COMMAND_TIMEOUT_SECONDS = 2.0
# A reload reads, validates and plans a whole registry before it answers.
RELOAD_TIMEOUT_SECONDS = 30.0
Op = Literal["load", "unload", "reload", "retired"]
OPS = ("load", "unload", "reload", "retired")
UNLOAD_REASONS = frozenset({"idle_ttl", "evicted", "api", "no_waiter", "pressure"})


class CommandError(Exception):
    """A command could not be delivered or understood."""


@dataclass(frozen=True)
class Command:
    """Load or unload the backend of ``role``; an unload says why (``reason`` one of
    ``UNLOAD_REASONS``) and, when it makes room, for which model. ``reload`` names no
    role; ``retired`` names the retiring backend's role and ``pid``."""

    op: Op
    role: str = ""
    reason: str | None = None
    for_model: str | None = None
    pid: int | None = None

    def encode(self) -> bytes:
        fields = {k: v for k, v in asdict(self).items() if v is not None}
        return json.dumps(fields, separators=(",", ":")).encode() + b"\n"


@dataclass(frozen=True)
class Reply:
    """Whether the command was taken, and the backend's state right after. A reload's
    reply also carries the registry's ``version`` and ``generation`` and the roles
    ``added``, ``removed``, ``replaced`` and ``unchanged``; a refused one, every
    ``problems`` found (and ``refused``: ``invalid`` for a registry that does not
    validate, ``conflict`` for one that does not fit the machine as it runs,
    ``stopping`` during shutdown)."""

    ok: bool
    state: str | None = None
    error: str | None = None
    problems: tuple[str, ...] | None = None
    refused: str | None = None
    version: str | None = None
    generation: int | None = None
    added: tuple[str, ...] | None = None
    removed: tuple[str, ...] | None = None
    replaced: tuple[str, ...] | None = None
    unchanged: tuple[str, ...] | None = None

    def encode(self) -> bytes:
        fields = {k: v for k, v in asdict(self).items() if v is not None}
        return json.dumps(fields, separators=(",", ":")).encode() + b"\n"

    def to_json(self) -> dict[str, Any]:
        """The fields that are set, as a JSON object."""
        return {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in asdict(self).items()
            if v is not None
        }


def socket_path(log_dir: Path) -> Path:
    """Where the supervisor of ``log_dir`` listens: in it, or (a path too long for a
    Unix socket) in the temporary directory under a name derived from it."""
    path = log_dir / SOCKET_NAME
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(os.fsencode(log_dir.resolve())).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"slm-{digest}.sock"


def _text(raw: dict[str, Any], key: str, required: bool = False) -> str | None:
    value = raw.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > 256:
        raise CommandError(f"'{key}' must be a non-empty string")
    return value


def parse_command(line: bytes) -> Command:
    """One command line; :class:`CommandError` when it is not a valid command."""
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError):
        raise CommandError("not a JSON object") from None
    if not isinstance(raw, dict):
        raise CommandError("not a JSON object")
    op = raw.get("op")
    if op not in OPS:
        raise CommandError(f"'op' must be one of {', '.join(OPS)}")
    if op == "reload":
        return Command("reload")
    role = _text(raw, "role", required=True)
    assert role is not None
    if op == "retired":
        pid = raw.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            raise CommandError("'pid' must be a positive integer")
        return Command("retired", role, pid=pid)
    reason = _text(raw, "reason")
    if op == "unload" and reason not in UNLOAD_REASONS:
        raise CommandError(f"an unload's 'reason' must be one of {sorted(UNLOAD_REASONS)}")
    return Command(op, role, reason, _text(raw, "for_model"))


def _texts(raw: dict[str, Any], key: str) -> tuple[str, ...] | None:
    value = raw.get(key)
    if not isinstance(value, list):
        return None
    return tuple(str(v) for v in value if isinstance(v, str))


def parse_reply(line: bytes) -> Reply:
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError):
        raise CommandError("the supervisor's reply is not JSON") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("ok"), bool):
        raise CommandError("the supervisor's reply is not a reply")
    state, error = raw.get("state"), raw.get("error")
    refused, version, generation = raw.get("refused"), raw.get("version"), raw.get("generation")
    return Reply(
        raw["ok"],
        state if isinstance(state, str) else None,
        error if isinstance(error, str) else None,
        problems=_texts(raw, "problems"),
        refused=refused if isinstance(refused, str) else None,
        version=version if isinstance(version, str) else None,
        generation=generation if isinstance(generation, int) else None,
        added=_texts(raw, "added"),
        removed=_texts(raw, "removed"),
        replaced=_texts(raw, "replaced"),
        unchanged=_texts(raw, "unchanged"),
    )


async def send(path: Path, command: Command, timeout: float | None = None) -> Reply:
    """Deliver one command and read its reply; :class:`CommandError` when the
    supervisor cannot be reached or answers nothing sensible within ``timeout`` (by
    default :data:`COMMAND_TIMEOUT_SECONDS`, :data:`RELOAD_TIMEOUT_SECONDS` for a
    reload)."""
    if timeout is None:
        reload = command.op == "reload"
        timeout = RELOAD_TIMEOUT_SECONDS if reload else COMMAND_TIMEOUT_SECONDS

    async def exchange() -> Reply:
        reader, writer = await asyncio.open_unix_connection(path, limit=MAX_REPLY_BYTES)
        try:
            writer.write(command.encode())
            await writer.drain()
            line = await reader.readline()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        if not line.endswith(b"\n"):
            raise CommandError("the supervisor closed the connection without a reply")
        return parse_reply(line)

    try:
        return await asyncio.wait_for(exchange(), timeout)
    except TimeoutError:
        raise CommandError(f"the supervisor did not answer within {timeout:g}s") from None
    except (OSError, ValueError) as exc:
        raise CommandError(f"the supervisor cannot be reached at {path}: {exc}") from None


async def serve(path: Path, handle: Callable[[Command], Reply]) -> asyncio.AbstractServer:
    """Listen on ``path`` (replacing a stale socket file, mode 0600) and answer each
    command line with ``handle``'s reply; a line that is no command gets an error
    reply, an overlong one closes the connection."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), 30.0)
                except (ValueError, TimeoutError):  # overlong line, idle connection
                    return
                if not line:
                    return
                try:
                    reply = handle(parse_command(line))
                except CommandError as exc:
                    reply = Reply(False, error=str(exc))
                writer.write(reply.encode())
                await writer.drain()
        except OSError:
            return
        finally:
            writer.close()

    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    old_umask = os.umask(0o177)  # the socket is created 0600, never briefly wider
    try:
        server = await asyncio.start_unix_server(connection, path, limit=MAX_LINE_BYTES)
    finally:
        os.umask(old_umask)
    return server


__all__ = [
    "Command",
    "CommandError",
    "Reply",
    "parse_command",
    "send",
    "serve",
    "socket_path",
]
