"""The rules by which ``/upstream/<model>/<path>`` reaches an engine's own paths: how one
is written (an entry's ``upstream_paths``, and the router's defaults), parsed and
matched. Pure.

A rule is a path, optionally after a method: ``/slots`` (any method), ``GET /slots``,
``POST /slots/*`` (``/*`` at the end: every path under it, not the path itself). A path
is written as the engine serves it: segments of letters, digits and ``-._~:@!$&'()+,;=``,
none of them ``.`` or ``..``, nothing percent-encoded, no query.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

METHODS: Final = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
# One path segment as an engine path may have it: what needs no percent-encoding.
SEGMENT: Final = re.compile(r"[A-Za-z0-9\-._~:@!$&'()+,;=]+")


@dataclass(frozen=True, slots=True)
class PathRule:
    """A parsed rule: the method it applies to (None: any), the path, and whether it
    covers every path under ``path`` (``/*``) instead of ``path`` itself."""

    method: str | None
    path: str
    under: bool = False

    def matches(self, method: str, path: str) -> bool:
        """Whether a request of ``method`` to the engine's ``path`` falls under it."""
        if self.method is not None and self.method != method:
            return False
        if self.under:
            return path.startswith(self.path + "/") if self.path != "/" else path != "/"
        return path == self.path

    def __str__(self) -> str:
        shown = (self.path.rstrip("/") + "/*") if self.under else self.path
        return shown if self.method is None else f"{self.method} {shown}"


def is_engine_path(path: str) -> bool:
    """Whether ``path`` is an engine path as rules and requests may name one: ``/``, or
    ``/`` and segments (:data:`SEGMENT`), none ``.`` or ``..``."""
    if path == "/":
        return True
    if not path.startswith("/"):
        return False
    segments = path[1:].split("/")
    return all(SEGMENT.fullmatch(s) and s not in (".", "..") for s in segments)


def parse_rule(text: str) -> PathRule:
    """The rule ``text`` writes; ``ValueError`` saying why it is not one."""
    method, _, path = text.strip().rpartition(" ")
    method = method.strip()
    if method and method not in METHODS:
        allowed = ", ".join(sorted(METHODS))
        raise ValueError(f"{method!r} is not a method ({allowed}, or none for any)")
    under = path.endswith("/*")
    if under:
        path = path[:-2] or "/"
    if not is_engine_path(path):
        raise ValueError(
            f"{text!r} is not a path rule: write '[METHOD ]/path' or '[METHOD ]/path/*', "
            "with no query, nothing percent-encoded and no '.' or '..' segment"
        )
    return PathRule(method or None, path, under)


__all__ = ["METHODS", "SEGMENT", "PathRule", "is_engine_path", "parse_rule"]
