"""The fake backend standing in for ``llama-server``: its argv and start-up behaviour.

    tests/fakes/fake-llama-server --model FILE [--host H] [--port P] [--alias ID] [...]
    python -m tests.fakes.fake_backend --llama-server-args --model FILE ...   (the same)

Only ``--model`` (required), ``--host``, ``--port`` and ``--alias`` (the model id; default
the model file's stem) are used; every other llama-server flag, with or without a
value, is ignored. The model file decides how the start goes. When it holds a JSON
object, these optional keys apply (any other key is an error, exit 2):

    exit_at_start: int         exit with this code at once, before binding the port
    exit_after_seconds: float  exit with code 1 this long after the first GET /health
                               answered 200 (i.e. after a watcher saw it ready)
    health_status: int         the initial /health status (e.g. 503: "still loading");
                               overrides the script's health_status
    script: object             the initial script, same fields as POST /_control
    ignore_sigterm: bool       once serving, ignore SIGTERM (only SIGKILL ends it)
    start_delay_seconds: float sleep this long before anything else (exit_at_start
                               included): a model that takes time to load
    footprint_mb: int          allocate and touch this many MiB at start and hold them
                               while serving, so the process's resident set is real

Anything else (empty, not JSON, a real .gguf) starts normally. A missing or
unreadable model file exits 1, like llama-server failing to load its model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAG = "--llama-server-args"
MAX_BEHAVIOUR_BYTES = 1 << 20  # a bigger file is a real model, not a behaviour file


def say(message: str) -> None:
    """One log line on stderr, flushed at once (the launcher sends it to a log file)."""
    print(message, file=sys.stderr, flush=True)


class StartupExit(Exception):
    """Leave before serving, with ``code`` (after printing ``message``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Behaviour:
    """What the model file asks for (see the module docstring)."""

    exit_at_start: int | None = None
    exit_after_seconds: float | None = None
    script: dict[str, Any] = field(default_factory=dict)  # health_status merged in
    ignore_sigterm: bool = False
    start_delay_seconds: float = 0.0
    footprint_mb: int = 0

    @classmethod
    def parse(cls, data: dict[str, Any], source: Path) -> Behaviour:
        def bad(key: str, expected: str) -> StartupExit:
            return StartupExit(2, f"fake: {source}: {key!r} must be {expected}, not {data[key]!r}")

        known = {"exit_at_start", "exit_after_seconds", "health_status", "script"}
        known |= {"ignore_sigterm", "start_delay_seconds", "footprint_mb"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise StartupExit(2, f"fake: {source}: unknown key(s) {', '.join(unknown)}")
        for key in ("exit_at_start", "health_status"):
            if key in data and (type(data[key]) is not int):
                raise bad(key, "an integer")
        after = data.get("exit_after_seconds")
        if after is not None and (type(after) not in (int, float) or after < 0):
            raise bad("exit_after_seconds", "a number >= 0")
        delay = data.get("start_delay_seconds", 0.0)
        if type(delay) not in (int, float) or delay < 0:
            raise bad("start_delay_seconds", "a number >= 0")
        footprint = data.get("footprint_mb", 0)
        if type(footprint) is not int or not 0 <= footprint <= 4096:
            raise bad("footprint_mb", "an integer from 0 to 4096")
        if not isinstance(data.get("script", {}), dict):
            raise bad("script", "an object")
        script = dict(data.get("script", {}))
        if "health_status" in data:
            script["health_status"] = data["health_status"]
        if type(data.get("ignore_sigterm", False)) is not bool:
            raise bad("ignore_sigterm", "true or false")
        return cls(
            ignore_sigterm=data.get("ignore_sigterm", False),
            exit_at_start=data.get("exit_at_start"),
            exit_after_seconds=None if after is None else float(after),
            script=script,
            start_delay_seconds=float(delay),
            footprint_mb=footprint,
        )


def read_behaviour(model: Path) -> Behaviour:
    """The behaviour ``model`` asks for; StartupExit(1) when it cannot be read."""
    try:
        with model.open("rb") as handle:
            raw = handle.read(MAX_BEHAVIOUR_BYTES + 1)
    except OSError as exc:
        raise StartupExit(1, f"fake: failed to load model '{model}': {exc.strerror}") from None
    if len(raw) > MAX_BEHAVIOUR_BYTES:
        return Behaviour()
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:  # also UnicodeDecodeError: a binary model file
        return Behaviour()
    return Behaviour.parse(data, model) if isinstance(data, dict) else Behaviour()


@dataclass(frozen=True)
class LlamaServerStart:
    """The parsed command line and the model file's behaviour."""

    model: Path
    host: str
    port: int
    alias: str
    ignored: list[str]
    behaviour: Behaviour
    slot_save_path: str | None = None
    parallel: int = 1

    def describe(self) -> str:
        ignored = " ".join(self.ignored) or "nothing"
        return f"fake llama-server {self.alias}: model {self.model}, ignoring {ignored}"

    def listening(self) -> str:
        return (
            f"fake llama-server {self.alias} listening on {self.host}:{self.port} pid {os.getpid()}"
        )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own exit code 2, via StartupExit
        raise StartupExit(2, f"fake llama-server: {message}\n{self.format_usage().rstrip()}")


def prepare(argv: list[str]) -> LlamaServerStart:
    """Parse llama-server's argv and read the model file; StartupExit to leave early,
    including for ``exit_at_start``."""
    parser = _Parser(prog="fake-llama-server", allow_abbrev=False, add_help=False)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--alias")
    parser.add_argument("--slot-save-path")
    parser.add_argument("--parallel", type=int, default=1)
    args, ignored = parser.parse_known_args(argv)
    model: Path = args.model
    behaviour = read_behaviour(model)
    if behaviour.start_delay_seconds:
        time.sleep(behaviour.start_delay_seconds)
    if behaviour.exit_at_start is not None:
        code = behaviour.exit_at_start
        raise StartupExit(code, f"fake: exiting at start with code {code}")
    return LlamaServerStart(
        model=model,
        host=args.host,
        port=args.port,
        alias=args.alias or model.stem,
        ignored=ignored,
        behaviour=behaviour,
        slot_save_path=args.slot_save_path,
        parallel=args.parallel,
    )


def hold_memory(mb: int) -> bytes:
    """``mb`` MiB written to (every page touched, so resident), for the caller to keep."""
    return b"\x01" * (mb << 20)


def exit_later(seconds: float) -> None:
    """Exit the whole process with code 1 after ``seconds`` (from a daemon timer)."""

    def leave() -> None:
        say(f"fake: exiting {seconds:g}s after becoming healthy with code 1")
        sys.stdout.flush()
        os._exit(1)

    timer = threading.Timer(seconds, leave)
    timer.daemon = True
    timer.start()
