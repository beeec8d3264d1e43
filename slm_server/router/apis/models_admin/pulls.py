"""The pulls running in this router: each in a worker thread of its own, at most
:data:`MAX_PULLS` at once and one per model, every one cancelled and its thread
joined when the router stops."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from slm_server.errors import ModelConflict, Overloaded
from slm_server.pull.errors import PullError
from slm_server.pull.events import Report
from slm_server.pull.reference import HfReference, parse_reference
from slm_server.pull.result import Pulled
from slm_server.router.apis.models_admin.handoff import Handoff
from slm_server.settings import PullSettings

log = logging.getLogger("slm_server.router")

MAX_PULLS = 2
# How long the router's shutdown waits for a cancelled pull's thread: one at its next
# chunk ends at once; one waiting on the hub ends when its read times out.
JOIN_SECONDS = 15.0

Run = Callable[[str, PullSettings, Report, threading.Event], Pulled]


def _run(reference: str, settings: PullSettings, report: Report, cancel: threading.Event) -> Pulled:
    # Imported on the first pull: the hub clients are not the router's to load at start.
    from slm_server.pull.run import pull

    return pull(reference, settings, report, cancel)


class PullInProgress(ModelConflict):
    """This model is being pulled already (409)."""

    default_code = "pull_in_progress"


def model_key(reference: str) -> str:
    """What two pulls may not share: the Hugging Face repository or the Ollama model
    (whatever the quantization, file or tag: their downloads may share a file). Raises
    :class:`PullError` for a reference that does not parse."""
    ref = parse_reference(reference)
    if isinstance(ref, HfReference):
        return f"hf:{ref.repo_id.lower()}"
    return f"ollama:{ref.namespace}/{ref.model}"


class PullJob:
    """One pull: its reference, cancel flag, hand-off and worker thread."""

    def __init__(self, pulls: Pulls, key: str, reference: str, handoff: Handoff) -> None:
        self.pulls = pulls
        self.key = key
        self.reference = reference
        self.handoff = handoff
        self.cancel = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the worker thread (once)."""
        if self.thread is not None:
            return
        if self.cancel.is_set():  # abandoned before it began
            self.pulls.release(self)
            return
        self.thread = threading.Thread(
            target=self._work, name=f"pull {self.reference}", daemon=True
        )
        self.pulls.started(self.thread)
        self.thread.start()

    def _work(self) -> None:
        final: Pulled | PullError
        try:
            try:
                final = self.pulls.run(
                    self.reference, self.pulls.settings, self.handoff.put, self.cancel
                )
            except PullError as exc:
                final = exc
            except Exception as exc:  # told to the client, never a dead thread's secret
                log.exception("pull %s failed", self.reference)
                final = PullError("io_error", f"the pull failed: {exc}")
            finally:
                self.pulls.release(self)  # before the end is told: a new pull may begin
            self.handoff.end(final)
        finally:
            self.pulls.ended(threading.current_thread())

    def abandon(self) -> None:
        """The client has gone (or the router stops): the worker stops at its next
        chunk, what arrived is kept for a later pull to resume."""
        self.cancel.set()
        self.handoff.close()
        if self.thread is None:
            self.pulls.release(self)


class Pulls:
    """Every running pull, by :func:`model_key`."""

    def __init__(self, settings: PullSettings, limit: int = MAX_PULLS, run: Run = _run) -> None:
        self.settings = settings
        self.limit = limit
        self.run = run
        self._lock = threading.Lock()
        self._jobs: dict[str, PullJob] = {}
        self._threads: set[threading.Thread] = set()

    def reserve(self, reference: str, loop: asyncio.AbstractEventLoop) -> PullJob:
        """A job for ``reference`` (not started); 409 when its model is being pulled,
        429 when :attr:`limit` pulls run; :class:`PullError` for a bad reference."""
        key = model_key(reference)
        with self._lock:
            if key in self._jobs:
                raise PullInProgress(
                    f"{self._jobs[key].reference} is being pulled already: wait for it to "
                    "end (or end it), then pull again",
                    param="model",
                )
            if len(self._jobs) >= self.limit:
                raise Overloaded(
                    f"At most {self.limit} pulls run at once; wait for one to end",
                    code="too_many_pulls",
                    retry_after=5.0,
                )
            job = PullJob(self, key, reference, Handoff(loop))
            self._jobs[key] = job
        return job

    def release(self, job: PullJob) -> None:
        """``job`` no longer holds its model."""
        with self._lock:
            if self._jobs.get(job.key) is job:
                del self._jobs[job.key]

    def started(self, thread: threading.Thread) -> None:
        with self._lock:
            self._threads.add(thread)

    def ended(self, thread: threading.Thread) -> None:
        with self._lock:
            self._threads.discard(thread)

    def threads(self) -> list[threading.Thread]:
        """The worker threads still running."""
        with self._lock:
            return list(self._threads)

    def running(self) -> list[str]:
        with self._lock:
            return [job.reference for job in self._jobs.values()]

    def cancel_all(self) -> None:
        """Cancel every running pull (the router drains or stops)."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.abandon()

    async def close(self, timeout: float = JOIN_SECONDS) -> None:
        """Cancel every pull and wait for their threads to end."""
        self.cancel_all()
        threads = self.threads()

        def join() -> None:
            deadline = time.monotonic() + timeout
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
                if thread.is_alive():
                    log.warning("the pull thread %r did not end within %gs", thread.name, timeout)

        if threads:
            await asyncio.to_thread(join)


__all__ = ["MAX_PULLS", "PullInProgress", "PullJob", "Pulls", "model_key"]
