"""One pull, whichever hub: parse the reference, fetch, report."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from slm_server.pull.events import Report
from slm_server.pull.hf import pull_hf
from slm_server.pull.ollama import pull_ollama
from slm_server.pull.reference import OllamaReference, parse_reference
from slm_server.pull.result import Pulled
from slm_server.settings import PullSettings


def pull(
    reference: str,
    settings: PullSettings,
    report: Report,
    cancel: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Pulled:
    """Fetch what ``reference`` names into ``settings.models_dir``; raises
    :class:`~slm_server.pull.errors.PullError`."""
    ref = parse_reference(reference)
    if isinstance(ref, OllamaReference):
        return pull_ollama(ref, settings, report, cancel, clock)
    return pull_hf(ref, settings, report, cancel, clock)


__all__ = ["pull"]
