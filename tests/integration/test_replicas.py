"""Replicas on real processes: the launcher supervises two or three fake llama-servers
(or real ones) for one registry entry, each on its own port, and the router spreads
the traffic over the ready ones, keeps it off one that was killed, keeps a
conversation on one replica under prefix affinity and bypasses that replica when it is
overloaded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import one_shot
from tests.fakes.control import free_ports
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.integration.watched import Watched, fake_entry, watched
from tests.processes import poll

MODEL = "fake-chat"
SYSTEM = "You are assistant number {0} and you follow the house rules to the letter. " * 8


def roles(count: int, role: str = "chat") -> list[str]:
    return [role, *(f"{role}.{n}" for n in range(2, count + 1))]


def replicated(tmp_path: Path, count: int, **fields: Any) -> dict[str, dict[str, Any]]:
    entry = fake_entry(tmp_path, "chat", port=free_ports(count), replicas=count, **fields)
    return {"chat": entry}


def port_of(stack: Watched, role: str) -> int:
    number = int(role.rsplit(".", 1)[1]) if "." in role else 1
    return stack.port("chat") + number - 1


def wait_all_ready(stack: Watched, count: int) -> None:
    for role in roles(count):
        stack.wait_ready(role)


def control(stack: Watched, role: str, **script: Any) -> None:
    url = f"http://127.0.0.1:{port_of(stack, role)}/_control"
    one_shot.post(url, json=script, timeout=5).raise_for_status()


def received(stack: Watched, role: str) -> list[dict[str, Any]]:
    """The chat requests one replica's fake backend was sent."""
    url = f"http://127.0.0.1:{port_of(stack, role)}/_requests"
    records: list[dict[str, Any]] = one_shot.get(url, timeout=5).json()
    return [r for r in records if r["path"] == "/v1/chat/completions"]


def chat(stack: Watched, content: str = "hello", system: str | None = None) -> httpx.Response:
    messages = [{"role": "user", "content": content}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    body = {"model": MODEL, "messages": messages, "max_tokens": 4}
    return one_shot.post(f"{stack.url}/v1/chat/completions", json=body, timeout=15)


def outstanding(stack: Watched) -> dict[str, int]:
    health = one_shot.get(f"{stack.url}/v1/backends/health", timeout=5).json()
    return {role: item.get("in_flight", 0) + item.get("queued", 0) for role, item in health.items()}


def admitted(stack: Watched, count: int) -> bool:
    """Whether the router holds ``count`` requests in flight or queued."""
    return sum(outstanding(stack).values()) >= count


def test_replicas_run_as_their_own_backends_and_share_the_traffic(tmp_path: Path) -> None:
    with watched(tmp_path, replicated(tmp_path, 3, max_concurrency=2)) as stack:
        wait_all_ready(stack, 3)
        pids = {stack.pid(role) for role in roles(3)}
        assert len(pids) == 3
        assert {stack.state(r)["port"] for r in roles(3)} == {port_of(stack, r) for r in roles(3)}
        logs = {stack.state(role)["log_path"] for role in roles(3)}
        assert len(logs) == 3
        # Held answers: six at once, two slots per replica, each replica gets two (held
        # long enough for the sixth to arrive while the first five are still held).
        for role in roles(3):
            control(stack, role, delay_seconds=3.0)
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _n: chat(stack), range(6)))
        assert [a.status_code for a in answers] == [200] * 6
        assert [len(received(stack, role)) for role in roles(3)] == [2, 2, 2]
        # One at a time, the replicas take turns.
        for role in roles(3):
            control(stack, role)
        for _ in range(6):
            assert chat(stack).status_code == 200
        assert [len(received(stack, role)) for role in roles(3)] == [4, 4, 4]
        listed = one_shot.get(f"{stack.url}/v1/models", timeout=5).json()["data"]
        assert [m["id"] for m in listed] == [MODEL]
        assert [r["state"] for r in listed[0]["status"]["replicas"]] == ["ready"] * 3
        assert one_shot.get(f"{stack.url}/health", timeout=5).json()["models"] == 1
        table = subprocess.run(
            [sys.executable, "-m", "slm_server", "status"],
            env={**os.environ, **stack.env},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert table.returncode == 0, table.stdout + table.stderr
        rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()}
        for role in roles(3):
            assert rows[role][1:5] == [
                MODEL,
                str(port_of(stack, role)),
                "ready",
                str(stack.pid(role)),
            ]
        scrape = one_shot.get(f"{stack.url}/metrics", timeout=5).text
        for number in (1, 2, 3):
            assert (
                f'slm_backend_state{{model="{MODEL}",replica="{number}",'
                f'role="{roles(3)[number - 1]}",state="ready"}} 1.0' in scrape
            )


def test_a_killed_replica_loses_only_its_own_requests_and_comes_back(tmp_path: Path) -> None:
    models = replicated(tmp_path, 3, max_concurrency=1, max_queue=8)
    with watched(tmp_path, models) as stack:
        wait_all_ready(stack, 3)
        for role in roles(3):
            control(stack, role, delay_seconds=0.1)
        victim = stack.pid("chat.2")
        statuses: list[int] = []
        stop = threading.Event()
        lock = threading.Lock()

        def client() -> None:
            while not stop.is_set():
                status = chat(stack).status_code
                with lock:
                    statuses.append(status)

        threads = [threading.Thread(target=client) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            poll(lambda: len(received(stack, "chat.2")) >= 3, 10, "traffic on replica 2")
            os.kill(victim, signal.SIGKILL)
            with lock:
                at_kill = len(statuses)
            stack.wait_event("backend_exited", pid=victim)
            done = stack.wait_event("restart_succeeded", old_pid=victim, role="chat.2")
            assert done["reason"] == "exited"
            poll(lambda: len(statuses) >= at_kill + 20, 10, "requests after the kill")
            # Traffic comes back to the restarted replica.
            poll(lambda: len(received(stack, "chat.2")) >= 2, 10, "traffic on the new replica 2")
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        failed = [s for s in statuses if s != 200]
        # Only what was in flight on replica 2 (one slot) could fail.
        assert len(failed) <= 1, Counter(statuses)
        assert stack.pid("chat") and stack.pid("chat.3")
        # The other replicas were never restarted.
        assert {e["role"] for e in stack.events("restart_started")} == {"chat.2"}


def test_the_same_conversation_lands_on_the_same_replica(tmp_path: Path) -> None:
    models = replicated(tmp_path, 3, routing="prefix_affinity", max_concurrency=2)
    with watched(tmp_path, models) as stack:
        wait_all_ready(stack, 3)
        for turn in range(3):
            for conversation in range(6):
                answer = chat(stack, f"turn {turn}", system=SYSTEM.format(conversation))
                assert answer.status_code == 200
        homes: dict[str, set[str]] = {}
        for role in roles(3):
            for record in received(stack, role):
                system = record["body"]["messages"][0]["content"]
                homes.setdefault(system, set()).add(role)
        assert len(homes) == 6
        assert all(len(where) == 1 for where in homes.values()), homes
        # New conversations went to the least loaded: all three replicas have some.
        assert {next(iter(where)) for where in homes.values()} == set(roles(3))


def test_an_overloaded_favourite_replica_is_bypassed(tmp_path: Path) -> None:
    models = replicated(
        tmp_path,
        2,
        routing="prefix_affinity",
        affinity_threshold=1,
        max_concurrency=1,
        max_queue=8,
        default_timeout=15,
    )
    with watched(tmp_path, models) as stack:
        wait_all_ready(stack, 2)
        system = SYSTEM.format("busy")
        assert chat(stack, "first", system=system).status_code == 200
        [home] = [role for role in roles(2) if received(stack, role)]
        [other] = [role for role in roles(2) if role != home]
        for role in roles(2):
            control(stack, role, delay_seconds=2.0)
        with ThreadPoolExecutor(3) as pool:
            futures = []
            for n in range(3):
                futures.append(pool.submit(chat, stack, f"again {n}", system))
                poll(partial(admitted, stack, n + 1), 5, f"request {n} to be admitted")
            # 1 in flight at home, 1 queued there (2 over the other's 0 would pass the
            # threshold of 1), so the third went to the idle replica.
            assert outstanding(stack) == {home: 2, other: 1}
            assert [f.result().status_code for f in futures] == [200] * 3
        assert len(received(stack, home)) == 3
        assert [r["body"]["messages"][0]["content"] for r in received(stack, other)] == [system]


def test_with_every_replica_down_the_client_gets_503(tmp_path: Path) -> None:
    models = replicated(tmp_path, 2)
    with watched(tmp_path, models, SLM_WATCHDOG_RESTART_COOLDOWN_SECONDS="30") as stack:
        wait_all_ready(stack, 2)
        assert chat(stack).status_code == 200
        first = {role: stack.pid(role) for role in roles(2)}
        # The first exit restarts at once; a second within the cooldown holds the
        # replica in restarting, long enough to see the 503.
        for role in roles(2):
            os.kill(first[role], signal.SIGKILL)
            stack.wait_event("restart_succeeded", old_pid=first[role])
        for role in roles(2):
            os.kill(stack.pid(role), signal.SIGKILL)
        for role in roles(2):  # as the supervisor publishes it and the router sees it
            stack.wait_state(role, "restarting", 10)
        answer = chat(stack)
        assert answer.status_code == 503
        assert answer.json()["error"]["code"] == "backend_restarting"
        assert answer.headers["retry-after"]


@pytest.mark.real_model
def test_two_real_llama_server_replicas_serve_and_survive_a_kill(tmp_path: Path) -> None:
    registry = example_registry({"standard": 0, "gemma": 0, "embeddings": 0}, roles=("standard",))
    entry = registry["models"]["standard"]
    entry.update(port=free_ports(2), replicas=2, max_concurrency=1, default_timeout=60)
    models = {"standard": entry}
    body = {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
    }

    def ask(stack: Watched) -> int:
        url = f"{stack.url}/v1/chat/completions"
        return one_shot.post(url, json=body, timeout=30).status_code

    with watched(tmp_path, models, llama_server=llama_server_bin()) as stack:
        stack.wait_ready("standard.2", timeout=60)
        # A fresh llama-server's first answer can be slow on a loaded machine: each
        # replica is asked once directly, so that no test request waits on that.
        for port in (entry["port"], entry["port"] + 1):
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            assert one_shot.post(url, json=body, timeout=60).status_code == 200
        with ThreadPoolExecutor(2) as pool:
            assert list(pool.map(lambda _n: ask(stack), range(6))) == [200] * 6
        health = one_shot.get(f"{stack.url}/v1/backends/health", timeout=5).json()
        assert {role: item["state"] for role, item in health.items()} == {
            "standard": "ready",
            "standard.2": "ready",
        }
        scrape = one_shot.get(f"{stack.url}/metrics", timeout=5).text
        served = [
            line
            for line in scrape.splitlines()
            if line.startswith("slm_routed_requests_total{") and not line.endswith(" 0.0")
        ]
        assert {'replica="1"' in line for line in served} == {True, False}, served
        victim = stack.pid("standard.2")
        os.kill(victim, signal.SIGKILL)
        stack.wait_event("backend_exited", pid=victim)
        # While it restarts, the other replica answers every request.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            assert ask(stack) == 200
        stack.wait_event("restart_succeeded", old_pid=victim, timeout=60)
        poll(lambda: ask(stack) == 200, 30, "an answer after the restart")
