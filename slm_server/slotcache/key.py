"""The key a saved slot is valid under: what makes a restored KV cache the one this
launch would have computed.

A saved slot holds the KV cache of its tokens. It is only valid for the same weights
(the model file, and a draft model or projector, by path, size and modification time),
the same cache layout (context, slots, unified or not, cache types, flash attention,
micro-batch, every other flag the server is started with) and the same server build
(the program by path, size and modification time: its state format may change between
releases). So the key is a digest of the launch's command line and of every file it
names, leaving out only what cannot change a cache: where it listens, its name, its
metrics, the sampling defaults, the prompt cache's and the saved slots' own settings.
The role is part of it too: two backends of one launch (replicas, or roles that differ
only in their port or name) hold different conversations, each its own set.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Final

# Flags that take a value and cannot change what a cache holds.
IGNORED_WITH_VALUE: Final = frozenset(
    {
        "--host",
        "--port",
        "--alias",
        "--slot-save-path",
        "--cache-ram",
        "--temp",
        "--top-p",
        "--top-k",
        "--min-p",
        "--presence-penalty",
        "--repeat-penalty",
        "--n-predict",
    }
)
IGNORED_ALONE: Final = frozenset({"--metrics", "--verbose"})
KEY_LENGTH: Final = 24  # hex digits of the SHA-256


def _file(path: str) -> list[object] | None:
    try:
        stat = os.stat(path)
    except (OSError, ValueError):
        return None
    if not os.path.isfile(path):
        return None
    return [path, stat.st_size, stat.st_mtime_ns]


def components(argv: Sequence[str], role: str = "") -> dict[str, object]:
    """What the key is a digest of: the role, the program, the flags that matter, and
    every file the command line names (by path, size and modification time)."""
    flags: list[str] = []
    index = 1
    while index < len(argv):
        arg = argv[index]
        if arg in IGNORED_WITH_VALUE:
            index += 2
            continue
        if arg not in IGNORED_ALONE:
            flags.append(arg)
        index += 1
    files = [found for arg in flags if (found := _file(arg)) is not None]
    server = _file(argv[0]) or [argv[0]]
    return {"role": role, "server": server, "flags": flags, "files": files}


def cache_key(argv: Sequence[str], role: str = "") -> str:
    """The key of the saved slots of ``role``'s launch (hex, safe as a file name)."""
    text = json.dumps(components(argv, role), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


__all__ = ["cache_key", "components"]
