"""What the installed ``mlx-openai-server launch`` accepts, read from its ``--help``.

Its flags change between releases (``--max-concurrency`` gave way to
``--decode-concurrency``; parser names come and go), so the launcher asks the installed
program instead of guessing. Reading the help imports the whole server (seconds), so
the answer is cached on disk, keyed by the program's path, size and modification time.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

HELP_TIMEOUT_SECONDS = 120.0
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
_CHOICES = re.compile(r"(--[a-z][a-z0-9-]*)\s+\[([^\]]*)\]")


@dataclass(frozen=True)
class MlxOptions:
    """The long options of ``mlx-openai-server launch`` and the choices some of them take."""

    flags: frozenset[str]
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def parse(cls, help_text: str) -> MlxOptions:
        text = " ".join(help_text.split())
        choices: dict[str, tuple[str, ...]] = {}
        for flag, listed in _CHOICES.findall(text):
            values = tuple(v.strip() for v in listed.split("|") if v.strip())
            if len(values) > 1:
                choices[flag] = values
        return cls(frozenset(_FLAG.findall(text)), choices)

    def supports(self, flag: str) -> bool:
        return flag in self.flags

    def refuses(self, flag: str, value: str) -> tuple[str, ...] | None:
        """The accepted values when ``value`` is not one of ``flag``'s choices, else None."""
        allowed = self.choices.get(flag)
        if allowed is None or value in allowed:
            return None
        return allowed


def _cache_file(program: str, cache_dir: Path) -> Path | None:
    try:
        stat = Path(program).resolve().stat()
    except OSError:
        return None
    key = f"{Path(program).resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return cache_dir / f"mlx-launch-help-{hashlib.sha256(key.encode()).hexdigest()[:16]}.txt"


def default_cache_dir() -> Path:
    return Path(os.environ.get("SLM_CACHE_DIR") or Path.home() / ".cache" / "slm_server")


def read_mlx_options(program: str, cache_dir: Path | None = None) -> MlxOptions | None:
    """The options of ``program launch``, or None when its help cannot be read."""
    cache = _cache_file(program, cache_dir or default_cache_dir())
    if cache is not None and cache.is_file():
        return MlxOptions.parse(cache.read_text(encoding="utf-8"))
    try:
        done = subprocess.run(  # noqa: S603 - the program found for the mlx backend
            [program, "launch", "--help"],
            capture_output=True,
            text=True,
            timeout=HELP_TIMEOUT_SECONDS,
            check=False,
            env={**os.environ, "COLUMNS": "200"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or "--model-path" not in done.stdout:
        return None
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(done.stdout, encoding="utf-8")
            tmp.replace(cache)
        except OSError:
            pass
    return MlxOptions.parse(done.stdout)
