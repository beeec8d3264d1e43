"""Why a pull stopped: one exception whose ``kind`` the command line prints and the API
sends as its error ``code``."""

from __future__ import annotations

from typing import Final, Literal

Kind = Literal[
    "bad_reference",
    "not_found",
    "unauthorized",
    "rate_limited",
    "ambiguous",
    "unsafe_name",
    "no_space",
    "checksum",
    "stalled",
    "cancelled",
    "in_progress",
    "hub_error",
    "io_error",
]

# What each kind is in HTTP terms, for the API's answer before a stream has begun.
STATUS: Final[dict[str, int]] = {
    "bad_reference": 400,
    "not_found": 404,
    "unauthorized": 401,
    "rate_limited": 429,
    "ambiguous": 400,
    "unsafe_name": 502,
    "no_space": 507,
    "checksum": 502,
    "stalled": 504,
    "cancelled": 499,
    "in_progress": 409,
    "hub_error": 502,
    "io_error": 500,
}


class PullError(Exception):
    """A pull that cannot go on; ``str()`` is the message for a person."""

    def __init__(self, kind: Kind, message: str) -> None:
        super().__init__(message)
        self.kind: Kind = kind


class Cut(PullError):
    """The connection broke mid-file: worth another try, which resumes."""

    def __init__(self, message: str) -> None:
        super().__init__("hub_error", message)


# How many times one file's download is tried again after a cut connection, each time
# from where it stopped, before the pull gives up (and a later pull resumes).
CUT_RETRIES: Final = 3

__all__ = ["CUT_RETRIES", "STATUS", "Cut", "Kind", "PullError"]
