"""The running pulls: one per model, at most two at once, each in a thread that a
cancel ends and the router's close joins."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from slm_server.errors import Overloaded
from slm_server.pull.errors import PullError
from slm_server.pull.events import Progress, Report
from slm_server.pull.result import Pulled
from slm_server.router.apis.models_admin.pulls import PullInProgress, Pulls, model_key
from slm_server.settings import PullSettings


def until_cancelled(
    _reference: str, _settings: PullSettings, report: Report, cancel: threading.Event
) -> Pulled:
    """A pull that reports once, then waits for its cancel, as a chunked download does."""
    report(Progress("f.gguf", 1, 10, 0, None, None))
    cancel.wait(30)
    raise PullError("cancelled", "f.gguf: cancelled")


def at_once(
    reference: str, _settings: PullSettings, _report: Report, _cancel: threading.Event
) -> Pulled:
    return Pulled(reference, (Path("/m/f.gguf"),))


def test_the_same_model_is_one_key_whatever_the_file_or_tag() -> None:
    assert model_key("Owner/Repo:Q4_K_M") == model_key("hf:owner/repo/f.gguf")
    assert model_key("ollama:gemma3") == model_key("ollama:library/gemma3:270m")
    assert model_key("owner/repo") != model_key("owner/other")
    with pytest.raises(PullError):
        model_key("not a reference")


def test_a_second_pull_of_a_model_is_409_and_a_third_model_429(tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pulls = Pulls(PullSettings(models_dir=tmp_path), run=until_cancelled)
        first = pulls.reserve("a/b:Q4_K_M", loop)
        with pytest.raises(PullInProgress) as busy:
            pulls.reserve("a/b", loop)
        assert (busy.value.status, busy.value.code) == (409, "pull_in_progress")
        pulls.reserve("ollama:m", loop)
        with pytest.raises(Overloaded) as many:
            pulls.reserve("c/d", loop)
        assert (many.value.status, many.value.code) == (429, "too_many_pulls")
        first.abandon()  # never started: its model is free at once
        pulls.reserve("a/b", loop)
        await pulls.close()

    asyncio.run(main())


def test_a_cancelled_pull_ends_its_thread_and_frees_its_model(tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pulls = Pulls(PullSettings(models_dir=tmp_path), run=until_cancelled)
        job = pulls.reserve("a/b", loop)
        job.start()
        assert [type(i) for i in await job.handoff.take(timeout=10)] == [Progress]
        assert job.thread is not None and job.thread.is_alive()
        job.abandon()
        await asyncio.to_thread(job.thread.join, 10)
        assert not job.thread.is_alive()
        assert pulls.running() == [] and pulls.threads() == []

    asyncio.run(main())


def test_close_cancels_every_pull_and_joins_its_thread(tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pulls = Pulls(PullSettings(models_dir=tmp_path), run=until_cancelled)
        jobs = [pulls.reserve(ref, loop) for ref in ("a/b", "ollama:m")]
        for job in jobs:
            job.start()
            await job.handoff.take(timeout=10)
        await pulls.close(timeout=10)
        assert all(job.thread is not None and not job.thread.is_alive() for job in jobs)
        assert pulls.running() == []

    asyncio.run(main())


def test_a_finished_pull_hands_over_its_result_after_freeing_its_model(tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pulls = Pulls(PullSettings(models_dir=tmp_path), run=at_once)
        job = pulls.reserve("a/b", loop)
        job.start()
        assert await job.handoff.take(timeout=10) == [Pulled("a/b", (Path("/m/f.gguf"),))]
        assert pulls.running() == []
        assert job.thread is not None
        await asyncio.to_thread(job.thread.join, 10)

    asyncio.run(main())
