"""The watchdog on the llama.cpp fallback (llama-cpp-python's server): a backend busy
with a long generation is not restarted, though every route that names its model waits
for that generation to end. Real launcher and router; the fallback is
``tests.fakes.fake_llama_cpp_server``, found as ``llama_cpp`` on ``PYTHONPATH``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests import one_shot
from tests.fakes.fake_llama_cpp_server import write_shim
from tests.integration.watched import fake_entry, watched
from tests.processes import ROOT

CONFIRM_SECONDS = 2.0
HELLO = [{"role": "user", "content": "hello"}]
TIMEOUT = 2  # the model's default_timeout: each long request is cut by the router


def path_without_llama_server() -> str:
    """``PATH`` with no directory that holds a ``llama-server``: the fallback is chosen."""
    kept = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    kept = [d for d in kept if shutil.which("llama-server", path=d) is None]
    return os.pathsep.join(kept)


def test_a_python_fallback_busy_with_a_long_generation_is_not_restarted(
    tmp_path: Path,
) -> None:
    """Two long generations reach the model's deadline (a timeout streak trips), and the
    backend keeps generating the first one, holding its model's lock: its /v1/models waits
    on it. Confirmation's health check must not be that route (it was: health_failed and a
    restart of a backend doing nothing wrong); on a route that answers, the canary waits
    behind the generation and the CPU shows it progressing."""
    site = write_shim(tmp_path / "site")
    models = {"standard": fake_entry(tmp_path, "standard", default_timeout=TIMEOUT)}
    with watched(
        tmp_path,
        models,
        llama_server="",  # no native llama-server: the fallback runs
        PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]),
        PATH=path_without_llama_server(),
        SLM_WATCHDOG_CONFIRM_SECONDS=str(CONFIRM_SECONDS),
    ) as stack:
        assert stack.state("standard")["kind"] == "llama_cpp.server", stack.state("standard")
        stack.past_startup_grace("standard")
        old_pid = stack.pid("standard")
        # ~30 s of generation each: far past the deadline, the confirmation and the test.
        body = {"model": stack.model_id("standard"), "messages": HELLO, "max_tokens": 300}
        url = f"{stack.url}/v1/chat/completions"
        statuses = [one_shot.post(url, json=body, timeout=30).status_code for _ in range(2)]
        assert statuses == [504, 504]
        stack.wait_event("restart_requested", reason="timeout")
        refused = stack.wait_event("restart_not_confirmed", timeout=CONFIRM_SECONDS + 10)
        assert refused["rule"] == "canary_unanswered_progressing", refused
        assert refused["evidence"]["health"]["reply"] == "ok", refused
        assert not stack.events("restart_confirmed")
        assert not stack.events("restart_started")
        assert stack.pid("standard") == old_pid
