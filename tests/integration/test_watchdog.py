"""Chaos tests of the watchdog on real processes: the launcher supervises fake
llama-servers (real processes on real ports), the router judges real traffic, and every
decision must appear in ``logs/watchdog.jsonl``. Thresholds are seconds, not minutes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from slm_server.contracts.restart_requests import RestartRequest, write_request
from tests import one_shot
from tests.integration.watched import Watched, fake_entry, seconds_between, watched
from tests.processes import ROOT, pid_alive, poll

HELLO = [{"role": "user", "content": "hello"}]


def chat(stack: Watched, role: str, timeout: float = 10.0, **extra: Any) -> httpx.Response:
    body = {"model": stack.model_id(role), "messages": HELLO, **extra}
    return one_shot.post(f"{stack.url}/v1/chat/completions", json=body, timeout=timeout)


def wait_past_grace(stack: Watched, role: str, grace: float = 0.5) -> None:
    """A trip is only accepted once the backend has been up for the startup grace."""
    started = stack.state(role)["started_at"]
    poll(lambda: time.time() > started + grace + 0.05, 5, "the startup grace to pass")


def test_kill_9_is_noticed_without_traffic_and_requests_never_hang(tmp_path: Path) -> None:
    models = {"standard": fake_entry(tmp_path, "standard")}
    with watched(tmp_path, models) as stack:
        old_pid = stack.pid("standard")
        os.kill(old_pid, signal.SIGKILL)
        exited = stack.wait_event("backend_exited", pid=old_pid)
        assert exited["signal"] == "SIGKILL"
        outage: list[tuple[int, float, str | None]] = []
        deadline = time.monotonic() + 20
        while True:
            started = time.monotonic()
            response = chat(stack, "standard")
            outage.append(
                (
                    response.status_code,
                    time.monotonic() - started,
                    response.headers.get("retry-after"),
                )
            )
            if response.status_code == 200:
                break
            assert time.monotonic() < deadline, outage
        for status, seconds, retry_after in outage[:-1]:
            assert status == 503
            assert retry_after is not None
            assert seconds < 3, "a request during the outage must not hang"
        done = stack.wait_event("restart_succeeded", old_pid=old_pid)
        assert done["reason"] == "exited"
        assert done["attempt"] == 1
        assert done["new_pid"] == stack.pid("standard") != old_pid
        table = subprocess.run(
            [sys.executable, "-m", "slm_server", "status"],
            env={**os.environ, **stack.env},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert table.returncode == 0, table.stdout + table.stderr
        [row] = [line for line in table.stdout.splitlines() if line.startswith("standard ")]
        assert row.split()[2:5] == [str(stack.port("standard")), "ready", str(done["new_pid"])]
        # ... UPTIME, MEMORY (measured + prompt cache), RESIDENT, SAVED (tokens of prompt
        # cache kept for its next load), LOAD, TTL LEFT, RESTARTS, BUDGET, FREES IN, LAST EXIT
        cells = row.split()
        assert cells[6].endswith("M") and cells[7].endswith("M")
        assert int(cells[7][:-1]) < int(cells[6].lstrip("~")[:-1])  # resident within it
        assert cells[8] == "0"  # nothing saved: a crash saves nothing
        assert cells[9:13] == ["always", "-", "1", "4/5"]
        assert cells[13].endswith(("s", "m"))  # the restart leaves the 600 s window
        assert cells[14:] == ["killed", "by", "SIGKILL"]
        assert "memory: " in table.stdout and "MiB held (SLM_MEMORY_BUDGET_MB)" in table.stdout
        assert "(last restart: exited)" in table.stdout
        timeline = subprocess.run(
            ["bash", "scripts/slm-logs.sh", "watchdog"],
            env={**os.environ, **stack.env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert timeline.returncode == 0, timeline.stderr
        rendered = [line for line in timeline.stdout.splitlines() if "restart_succeeded" in line]
        assert len(rendered) == 1
        assert f"standard (fake-standard) :{stack.port('standard')}" in rendered[0]
        assert f"old_pid={old_pid}" in rendered[0]


def test_a_wedged_backend_trips_on_silence_and_what_it_stranded_is_answered(
    tmp_path: Path,
) -> None:
    """Frozen (alive, holding its port, never answering): a request that does not stream
    (streamed from llama-server and gathered) trips the silence rule within a second,
    the backend is killed and relaunched, and the request is sent again and answered;
    then the same for a stream, on the new process frozen in turn."""
    models = {"standard": fake_entry(tmp_path, "standard", default_timeout=20)}
    with watched(tmp_path, models) as stack:
        for round, streamed in enumerate((False, True), start=1):
            wait_past_grace(stack, "standard")
            old_pid = stack.pid("standard")
            os.kill(old_pid, signal.SIGSTOP)
            started = time.monotonic()
            body = {"model": stack.model_id("standard"), "messages": HELLO, "stream": streamed}
            response = one_shot.post(f"{stack.url}/v1/chat/completions", json=body, timeout=30)
            assert response.status_code == 200, response.text
            if streamed:
                assert response.text.rstrip().endswith("data: [DONE]"), response.text[-200:]
            else:
                assert response.json()["object"] == "chat.completion"
            assert time.monotonic() - started < 15
            requested = stack.wait_event("restart_requested", reason="stall", streak=1)
            assert requested["role"] == "standard"
            done = stack.wait_event("restart_succeeded", old_pid=old_pid)
            assert done["reason"] == "stall"
            assert not pid_alive(old_pid)
            # Killed at once, not after SLM_STOP_TIMEOUT_SECONDS (2 s) of ignored SIGTERM.
            [begun] = [e for e in stack.events("restart_started") if e["old_pid"] == old_pid]
            stopping = seconds_between(begun["ts"], done["ts"]) - done["seconds"]
            assert stopping < 1.9, stopping  # a SIGTERM waited on would take 2 s
            assert len(stack.events("request_retried")) == round
        assert chat(stack, "standard").status_code == 200


def test_a_trip_the_canary_disproves_is_not_a_restart(tmp_path: Path) -> None:
    """Two 500s for one kind of request trip the streak, but the backend answers the
    supervisor's one-token canary: restart_not_confirmed, the same process serves on."""
    models = {"standard": fake_entry(tmp_path, "standard")}
    with watched(tmp_path, models) as stack:
        wait_past_grace(stack, "standard")
        old_pid = stack.pid("standard")
        stack.control("standard", status=500, body_contains="poison")
        for _ in range(2):
            body = {"model": stack.model_id("standard"), "prompt": "poison", "max_tokens": 4}
            assert (
                one_shot.post(f"{stack.url}/v1/completions", json=body, timeout=10).status_code
                == 500
            )
        stack.wait_event("restart_requested")
        refused = stack.wait_event("restart_not_confirmed")
        assert refused["rule"] == "canary_ok"
        assert refused["evidence"]["canary"]
        assert not stack.events("restart_started")
        assert stack.pid("standard") == old_pid
        assert chat(stack, "standard").status_code == 200


@pytest.mark.parametrize(
    ("statuses", "restarts"),
    [
        pytest.param([500, 500], True, id="500-500-restarts"),
        pytest.param([500, 200, 500], False, id="500-200-500-does-not"),
        pytest.param([429, 429], True, id="429s-count"),
        pytest.param([500, 418, 500], True, id="418-does-not-reset"),
        pytest.param([418, 418, 418], False, id="418-does-not-count"),
    ],
)
def test_status_streaks(tmp_path: Path, statuses: list[int], restarts: bool) -> None:
    models = {"standard": fake_entry(tmp_path, "standard")}
    with watched(tmp_path, models) as stack:
        wait_past_grace(stack, "standard")
        old_pid = stack.pid("standard")
        # When it should restart, the backend keeps failing after the streak, so the
        # supervisor's confirmation canary fails too.
        after = {"status": statuses[-1]} if restarts else {}
        stack.control("standard", statuses=statuses, **after)
        for expected in statuses:
            assert chat(stack, "standard").status_code == expected
        failures = [e for e in stack.events("backend_failure")]
        assert [e["status"] for e in failures] == [s for s in statuses if s in (429, 500)]
        ignored = stack.events("unclassified_status")
        assert [e["status"] for e in ignored] == [s for s in statuses if s == 418]
        health = one_shot.get(f"{stack.url}/v1/backends/health", timeout=5).json()["standard"]
        if statuses[-1] == 500 and not restarts:
            assert health["state"] == "degraded"
            assert health["failure_streak"] == 1
        if restarts:
            confirmed = stack.wait_event("restart_confirmed")
            assert confirmed["rule"] in ("canary_5xx", "saturated_idle")
            done = stack.wait_event("restart_succeeded", old_pid=old_pid)
            assert done["reason"] in ("5xx", "saturated")
        else:
            # The supervisor sweeps every 0.1 s: give it a few sweeps to (not) act.
            marker = write_request(
                stack.log_dir / "watchdog-requests",
                RestartRequest("nobody", "none", 1, "marker", time.time()),
            )
            poll(lambda: not marker.exists(), 5, "a sweep after the requests")
            assert not stack.events("restart_requested")
            assert not stack.events("restart_started")
            assert stack.pid("standard") == old_pid


def test_a_request_older_than_start_plus_grace_is_discarded(tmp_path: Path) -> None:
    models = {"standard": fake_entry(tmp_path, "standard")}
    with watched(tmp_path, models, router=False, SLM_WATCHDOG_STARTUP_GRACE_SECONDS="60") as stack:
        pid = stack.pid("standard")
        for age in (3600.0, 0.0):  # a previous run's leftover, and one raised while loading
            request = RestartRequest(
                "standard", "fake-standard", stack.port("standard"), "5xx", time.time() - age
            )
            write_request(stack.log_dir / "watchdog-requests", request)
            stack.wait_event("stale_request_discarded", requested_at=request.requested_at)
        assert not stack.events("restart_started")
        assert stack.pid("standard") == pid


def test_a_backend_that_crashes_on_every_start_is_abandoned(tmp_path: Path) -> None:
    models = {
        "good": fake_entry(tmp_path, "good"),
        "broken": fake_entry(tmp_path, "broken", {"exit_at_start": 3}),
    }
    with watched(tmp_path, models, wait_ready=False) as stack:
        stack.wait_ready("good")
        abandoned = stack.wait_event("backend_abandoned", role="broken")
        assert "5 restarts within 600s" in abandoned["reason"]
        assert len([e for e in stack.events("restart_started") if e["role"] == "broken"]) == 5
        exits = [e for e in stack.events("backend_exited") if e["role"] == "broken"]
        assert len(exits) == 6
        assert all(e["exit_code"] == 3 for e in exits)
        # The router reads the state file at most every STAT_EVERY_SECONDS: a look it
        # took just before the supervisor wrote "abandoned" may answer for a moment.
        replies: list[httpx.Response] = []

        def refused_as_abandoned() -> bool:
            replies.append(chat(stack, "broken"))
            return bool(replies[-1].json()["error"]["code"] == "backend_abandoned")

        poll(refused_as_abandoned, 2, "the router to see the backend abandoned")
        response = replies[-1]
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["code"] == "backend_abandoned"
        assert "abandoned by the watchdog: 5 restarts within 600s" in error["message"]
        assert chat(stack, "good").status_code == 200
        health = one_shot.get(f"{stack.url}/v1/backends/health", timeout=5).json()
        assert health["broken"]["state"] == "abandoned"
        assert health["good"]["state"] == "ready"
        request = RestartRequest("broken", "fake-broken", stack.port("broken"), "5xx", time.time())
        write_request(stack.log_dir / "watchdog-requests", request)
        stack.wait_event("backend_not_running", role="broken")


def test_the_launcher_exits_non_zero_when_every_backend_is_abandoned(tmp_path: Path) -> None:
    models = {"broken": fake_entry(tmp_path, "broken", {"exit_at_start": 3})}
    with watched(tmp_path, models, router=False, wait_ready=False) as stack:
        assert stack.launcher.popen.wait(timeout=30) == 1
        assert [e["event"] for e in stack.events()][-2:] == [
            "backend_abandoned",
            "supervisor_stopped",
        ]


def test_a_healthy_backend_under_steady_load_is_never_restarted(tmp_path: Path) -> None:
    models = {
        "standard": fake_entry(
            tmp_path,
            "standard",
            {"script": {"chunks": 4, "chunk_interval_seconds": 0.05}},
            max_concurrency=8,
        )
    }
    with watched(tmp_path, models) as stack:
        pid = stack.pid("standard")
        stop = threading.Event()
        statuses: list[int] = []

        def client(index: int) -> None:
            with httpx.Client(base_url=stack.url, timeout=10) as http:
                while not stop.is_set():
                    body = {
                        "model": stack.model_id("standard"),
                        "messages": HELLO,
                        "stream": index % 2 == 0,
                    }
                    with http.stream("POST", "/v1/chat/completions", json=body) as response:
                        response.read()
                        statuses.append(response.status_code)

        with ThreadPoolExecutor(max_workers=6) as pool:
            futures = [pool.submit(client, i) for i in range(6)]
            # Load for well past the stall threshold (1 s) and many sweeps (0.1 s).
            poll(lambda: len(statuses) >= 300, 60, "300 requests under load")
            stop.set()
            for future in futures:
                future.result()
        assert set(statuses) == {200}
        assert stack.pid("standard") == pid
        for name in ("backend_failure", "restart_requested", "restart_started"):
            assert not stack.events(name), name


def test_watchdog_disabled_starts_and_never_supervises(tmp_path: Path) -> None:
    models = {"standard": fake_entry(tmp_path, "standard")}
    with watched(tmp_path, models, router=False, SLM_WATCHDOG_ENABLED="false") as stack:
        os.kill(stack.pid("standard"), signal.SIGKILL)
        assert stack.launcher.popen.wait(timeout=15) == 1
        assert not stack.events("restart_started")
        started = stack.events("supervisor_started")
        assert started[0]["enabled"] is False


def test_an_oversized_backend_log_is_trimmed(tmp_path: Path) -> None:
    models = {"standard": fake_entry(tmp_path, "standard")}
    with watched(tmp_path, models, router=False, SLM_BACKEND_LOG_MAX_MB="0.01") as stack:
        log = Path(stack.state("standard")["log_path"])
        first_lines = log.read_text()
        with log.open("a") as handle:
            handle.write("x" * 20_000 + "\n")
        trimmed = stack.wait_event("backend_log_trimmed", role="standard")
        assert trimmed["bytes"] > 20_000
        prev = log.with_name(log.name + ".prev").read_text()
        assert prev.startswith(first_lines)
        assert log.stat().st_size < 10_000
        assert stack.state("standard")["state"] == "ready"


# --- progress is not failure: which deadlines are backend timeouts ------------------------

STALL_SECONDS = "1.5"  # above the 0.4 s token interval, below the 2 s deadline
# (the stall and the silence limit both: the fake is asked as llama-server is)


def cut_stream(stack: Watched, role: str, path: str = "/v1/chat/completions") -> list[str]:
    """Stream one answer to its end; the ``data:`` lines the client got."""
    key = "messages" if path == "/v1/chat/completions" else "input"
    body = {"model": stack.model_id(role), key: HELLO, "stream": True}
    with one_shot.stream("POST", f"{stack.url}{path}", json=body, timeout=30) as response:
        assert response.status_code == 200
        return [line for line in response.iter_lines() if line.startswith("data:")]


def deadline_error(lines: list[str]) -> dict[str, Any]:
    """The in-band error that ended a chat stream: its last line, with no ``[DONE]``."""
    assert "data: [DONE]" not in lines
    error: dict[str, Any] = json.loads(lines[-1][5:])["error"]
    return error


def no_restart_after_a_sweep(stack: Watched, role: str, pid: int) -> None:
    marker = write_request(
        stack.log_dir / "watchdog-requests",
        RestartRequest("nobody", "none", 1, "marker", time.time()),
    )
    poll(lambda: not marker.exists(), 5, "a sweep after the requests")
    assert not stack.events("restart_requested")
    assert not stack.events("restart_started")
    assert stack.pid(role) == pid


def test_streams_cut_by_the_deadline_while_tokens_flow_never_count(tmp_path: Path) -> None:
    tokens = {"script": {"chunks": 200, "chunk_interval_seconds": 0.4}}
    models = {
        "standard": fake_entry(tmp_path, "standard", tokens, default_timeout=2, max_concurrency=4)
    }
    with watched(
        tmp_path,
        models,
        SLM_WATCHDOG_STALL_SECONDS=STALL_SECONDS,
        SLM_WATCHDOG_SILENCE_SECONDS=STALL_SECONDS,
    ) as stack:
        wait_past_grace(stack, "standard")
        pid = stack.pid("standard")
        for round_ in range(2):  # overlapping streams, twice the failure threshold each round
            with ThreadPoolExecutor(max_workers=4) as pool:
                chats = [pool.submit(cut_stream, stack, "standard") for _ in range(3)]
                responses = pool.submit(cut_stream, stack, "standard", "/v1/responses")
                for future in chats:
                    lines = future.result()
                    assert len(lines) > 3, "tokens flowed before the cut"
                    error = deadline_error(lines)
                    assert error["code"] == "deadline_exceeded"
                    assert error["type"] == "timeout_error"
                translated = [json.loads(line[5:]) for line in responses.result()]
                assert "response.output_text.delta" in {e["type"] for e in translated}
                assert translated[-1]["type"] == "response.failed"
                assert "reached its deadline" in translated[-1]["response"]["error"]["message"]
            cuts = 4 * (round_ + 1)

            def judged(count: int = cuts) -> bool:
                return len(stack.events("deadline_not_counted")) >= count

            poll(judged, 5, f"{cuts} cuts judged")
        cut = stack.events("deadline_not_counted")
        assert len(cut) == 8
        assert all(e["role"] == "standard" and e["stall_seconds"] == 1.5 for e in cut)
        assert all(0 <= e["silent_seconds"] < 1.5 for e in cut)
        assert not stack.events("backend_failure")
        no_restart_after_a_sweep(stack, "standard", pid)


def test_streams_silent_past_the_stall_threshold_at_the_deadline_count(tmp_path: Path) -> None:
    # A first token at once, then nothing for 30 s: the deadline (2 s) finds the backend
    # silent for longer than the stall threshold (1.5 s).
    silent = {"script": {"chunks": 2, "chunk_interval_seconds": 30}}
    models = {
        "standard": fake_entry(tmp_path, "standard", silent, default_timeout=2, max_concurrency=4)
    }
    with watched(
        tmp_path,
        models,
        SLM_WATCHDOG_STALL_SECONDS=STALL_SECONDS,
        SLM_WATCHDOG_SILENCE_SECONDS=STALL_SECONDS,
    ) as stack:
        wait_past_grace(stack, "standard")
        old_pid = stack.pid("standard")
        with ThreadPoolExecutor(max_workers=2) as pool:
            streams = [pool.submit(cut_stream, stack, "standard") for _ in range(2)]
            for future in streams:
                assert deadline_error(future.result())["code"] == "deadline_exceeded"
        requested = stack.wait_event("restart_requested", reason="timeout")
        failures = [e for e in stack.events("backend_failure") if e["reason"] == "timeout"]
        assert [e["streak"] for e in failures] == [1, 2]
        assert all("nothing from the backend for" in e["detail"] for e in failures)
        assert requested["streak"] == 2
        assert not stack.events("deadline_not_counted")
        # The trip counts, but this backend still answers a one-token canary at once
        # (only its streams go quiet): the supervisor does not restart it.
        refused = stack.wait_event("restart_not_confirmed", reason="timeout")
        assert refused["rule"] == "canary_ok"
        assert stack.pid("standard") == old_pid


def test_a_non_streaming_request_cut_by_the_deadline_counts(tmp_path: Path) -> None:
    # llama-server sends a non-streamed answer's head only at the end: nothing arrives
    # before it, so a deadline there is no evidence of progress. (A chat completion is
    # streamed from llama-server and gathered; a completions request is not.)
    models = {
        "standard": fake_entry(tmp_path, "standard", {"script": {"stall": True}}, default_timeout=2)
    }
    with watched(
        tmp_path,
        models,
        SLM_WATCHDOG_STALL_SECONDS=STALL_SECONDS,
        SLM_WATCHDOG_SILENCE_SECONDS=STALL_SECONDS,
    ) as stack:
        wait_past_grace(stack, "standard")
        old_pid = stack.pid("standard")
        body = {"model": stack.model_id("standard"), "prompt": "hi", "max_tokens": 4}
        for _ in range(2):
            response = one_shot.post(f"{stack.url}/v1/completions", json=body, timeout=10)
            assert response.status_code == 504
            assert response.json()["error"]["code"] == "deadline_exceeded"
        requested = stack.wait_event("restart_requested", reason="timeout")
        assert requested["streak"] == 2
        assert not stack.events("deadline_not_counted")
        stack.wait_event("restart_succeeded", old_pid=old_pid)


def test_a_deadline_the_queue_used_up_never_counts(tmp_path: Path) -> None:
    """One slot, held by a long stream that the deadline cuts while tokens flow; a short
    request queued behind it reaches the backend with little of its deadline left and is
    cut before the backend could answer. Twice: still no streak, no trip."""
    tokens = {
        "script": {
            "chunks": 200,
            "chunk_interval_seconds": 0.2,
            "stall": True,
            "body_lacks": "long",
        }
    }
    models = {
        "standard": fake_entry(tmp_path, "standard", tokens, default_timeout=3, max_concurrency=1)
    }
    with watched(
        tmp_path,
        models,
        SLM_WATCHDOG_STALL_SECONDS=STALL_SECONDS,
        SLM_WATCHDOG_SILENCE_SECONDS=STALL_SECONDS,
    ) as stack:
        wait_past_grace(stack, "standard")
        pid = stack.pid("standard")
        for _ in range(2):
            in_flight = threading.Event()
            lines: list[str] = []

            def long_stream(
                lines: list[str] = lines, in_flight: threading.Event = in_flight
            ) -> None:
                long = [{"role": "user", "content": "a long answer"}]
                body = {"model": stack.model_id("standard"), "messages": long, "stream": True}
                url = f"{stack.url}/v1/chat/completions"
                with one_shot.stream("POST", url, json=body, timeout=30) as response:
                    for line in response.iter_lines():
                        lines.append(line)
                        if len(lines) >= 10:  # about 1 s in: 5 chunks, 0.2 s apart
                            in_flight.set()

            with ThreadPoolExecutor(max_workers=1) as pool:
                streaming = pool.submit(long_stream)
                assert in_flight.wait(10)
                # Queued for the 2 s left of the stream's deadline, then at the backend
                # (which would never answer it) for the 1 s left of its own: under 1.5 s.
                queued = chat(stack, "standard")
                streaming.result()
            assert queued.status_code == 504
            assert queued.json()["error"]["code"] == "deadline_exceeded"
            assert deadline_error([x for x in lines if x.startswith("data:")])
        cut = stack.events("deadline_not_counted")
        behind = [e for e in cut if e["delivered"] is False]
        assert len(behind) == 2, cut
        assert all(e["silent_seconds"] < e["needed_seconds"] == 1.5 for e in behind)
        assert not stack.events("backend_failure")
        no_restart_after_a_sweep(stack, "standard", pid)
