"""Remote engines (``backend: remote``): how both the router and the supervisor reach
one, and nothing else. Pure.

A remote entry names an OpenAI-compatible base URL (``url``, ending in ``/v1``) and,
optionally, the *name* of an environment variable holding its key (``api_key_env``).
The key is read from the environment when a process starts, sent as
``Authorization: Bearer``, and never written anywhere: not to the registry, the state
file, the watchdog log, nor any log line.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from slm_server.registry.schema import ModelEntry

# Where a remote is probed: OpenAI's model list, which every compatible server has.
PROBE_PATH = "/v1/models"


def auth_headers(entry: ModelEntry, env: Mapping[str, str]) -> dict[str, str]:
    """The headers that carry the remote's key; none when it has no ``api_key_env`` or
    the variable is unset or empty (see :func:`missing_key`)."""
    name = entry.api_key_env
    key = env.get(name, "") if name is not None else ""
    return {"authorization": f"Bearer {key}"} if key else {}


def missing_key(entry: ModelEntry, env: Mapping[str, str]) -> str | None:
    """The name of the environment variable ``entry`` needs and does not have."""
    name = entry.api_key_env
    return name if name is not None and not env.get(name) else None


def probe_path(entry: ModelEntry) -> str:
    """The path of the remote's model list, under its url's prefix."""
    return entry.path_prefix + PROBE_PATH


def shown_url(entry: ModelEntry) -> str | None:
    """The url as status and logs show it: without any user or password in it."""
    if entry.url is None:
        return None
    parts = urlsplit(entry.url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}{parts.path}"
