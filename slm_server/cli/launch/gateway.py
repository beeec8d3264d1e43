"""How the command line reaches the running router: its base URL from the settings, the
key to send, and one JSON ``GET``. ``launch`` asks it everything through here, and
``status`` its model list.

httpx is imported inside :func:`get_json` only: the launcher and the commands that never
talk to the router start 0.2 s sooner without it (docs/development.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slm_server.settings import Settings

WILDCARDS = ("0.0.0.0", "::", "")


def router_url(settings: Settings) -> str:
    """``http://host:port`` of the router the settings describe; a wildcard bind is
    reached on loopback."""
    host = settings.router_host if settings.router_host not in WILDCARDS else "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.router_port}"


def settings_key(settings: Settings) -> str | None:
    """The first of the router's API keys (``SLM_API_KEYS``, ``SLM_API_KEYS_FILE``);
    None when it checks none."""
    keys = settings.serving.api_keys
    return keys[0] if keys else None


class Unreachable(Exception):
    """The router did not answer (refused, timed out, not HTTP, not JSON); the message
    says how."""


@dataclass(frozen=True)
class Answer:
    """One answer: its status and its body read as JSON (None when it was not JSON)."""

    status: int
    body: Any


def get_json(url: str, key: str | None, timeout: float) -> Answer:
    """``GET url`` with ``key`` as a Bearer token; raises :class:`Unreachable`."""
    import httpx  # only here: see the module's docstring

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with httpx.Client(timeout=timeout) as client:
            answer = client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise Unreachable(detail) from None
    try:
        body = answer.json()
    except ValueError:
        body = None
    return Answer(answer.status_code, body)


__all__ = ["Answer", "Unreachable", "get_json", "router_url", "settings_key"]
