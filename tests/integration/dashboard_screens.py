"""The dashboard's screenshots in docs/ after a realistic run: the real launcher, router
and llama-server with the default models (SmolLM2 kept loaded, Gemma loaded on demand),
about three minutes of agent-like traffic on the three API shapes (a long system prompt
repeated, so that the engines read most prompts from their cache), a client's errors,
a ``kill -9`` of SmolLM2's llama-server and Gemma unloaded by the API; then the page,
with an answer streaming in the playground.

    uv run python -m tests.integration.dashboard_screens docs/

Not a test: it writes ``dashboard.png`` (the whole page), ``dashboard-charts.png``,
``dashboard-lanes.png`` and ``dashboard-playground.png`` into the folder given."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from selenium.webdriver.common.by import By

from tests import one_shot
from tests.integration import dashboard_views as views
from tests.integration.browser import headless_chromium
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.integration.watched import Watched, watched
from tests.processes import free_port

KEY = "screenshots"
HEADERS = {"authorization": f"Bearer {KEY}"}
TRAFFIC_SECONDS = 180.0
# The run's script, in seconds from its start: Gemma asked (and so loaded) in between,
# SmolLM2's llama-server killed before, Gemma unloaded after.
KILL_AT, GEMMA_FROM, GEMMA_UNTIL, UNLOAD_AT = 45.0, 80.0, 125.0, 140.0
SYSTEM = "You are a careful coding assistant. " * 120  # ~1,000 tokens, the same each turn
# The shipped watchdog's timings, not the tests' quick ones (docs/watchdog.md).
SHIPPED_WATCHDOG: dict[str, Any] = {
    "SLM_WATCHDOG_STALL_SECONDS": "300",
    "SLM_WATCHDOG_SILENCE_SECONDS": "30",
    "SLM_WATCHDOG_STARTUP_GRACE_SECONDS": "180",
}
QUESTIONS = (
    "Name three sorting algorithms.",
    "What does a hash map do?",
    "Write a haiku about compilers.",
    "Explain recursion in one sentence.",
)


def ask(stack: Watched, model: str, shape: str, turn: int) -> None:
    """One agent-like turn on ``shape``, streamed, its answer read to the end."""
    question = QUESTIONS[turn % len(QUESTIONS)]
    body: dict[str, Any]
    if shape == "chat":
        path = "/v1/chat/completions"
        body = {
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": question},
            ],
            "max_tokens": 48 + 16 * (turn % 5),
            "stream_options": {"include_usage": True},
        }
    elif shape == "responses":
        path = "/v1/responses"
        body = {"instructions": SYSTEM, "input": question, "max_output_tokens": 48}
    else:
        path = "/v1/messages"
        body = {
            "system": SYSTEM,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 48,
        }
    body.update(model=model, stream=True)
    with one_shot.stream(
        "POST", f"{stack.url}{path}", json=body, headers=HEADERS, timeout=120
    ) as got:
        for _ in got.iter_bytes():
            pass


def role_at(elapsed: float) -> str:
    """The model the traffic asks at this point of the run: one at a time, since two
    llama-servers generating at once on a 2-CPU machine starve each other's threads."""
    return "gemma" if GEMMA_FROM <= elapsed < GEMMA_UNTIL else "standard"


def traffic(
    stack: Watched, stop: threading.Event, client: int, failed: list[str], began: float
) -> None:
    turn = client
    while not stop.is_set():
        model = stack.model_id(role_at(time.monotonic() - began))
        shape = ("chat", "responses", "messages")[turn % 3]
        try:
            ask(stack, model, shape, turn)
        except httpx.HTTPError as error:  # said at the end: the run is not realistic
            failed.append(f"{time.strftime('%X')} {model} {shape}: {error!r}")
        if turn % 7 == 0:  # a client's mistake now and then
            one_shot.post(
                f"{stack.url}/v1/chat/completions", json={"model": model}, headers=HEADERS
            )
        turn += 2


def run(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    registry = example_registry(
        {"standard": free_port(), "gemma": free_port(), "embeddings": 0},
        roles=("standard", "gemma"),
    )
    models: dict[str, dict[str, Any]] = registry["models"]
    models["gemma"]["load"] = "on_demand"
    work = Path(tempfile.mkdtemp(prefix="dashboard-screens-"))
    print(f"logs in {work}", flush=True)
    with (
        watched(
            work,
            models,
            llama_server=llama_server_bin(),
            SLM_API_KEYS=KEY,
            SLM_HISTORY_INTERVAL_SECONDS="1",
            **SHIPPED_WATCHDOG,
        ) as stack,
    ):
        stop = threading.Event()
        failed: list[str] = []
        began = time.monotonic()
        clients = [
            threading.Thread(target=traffic, args=(stack, stop, n, failed, began)) for n in range(2)
        ]
        for client in clients:
            client.start()
        killed = unloaded = False
        while time.monotonic() - began < TRAFFIC_SECONDS:
            elapsed = time.monotonic() - began
            if elapsed > KILL_AT and not killed:
                os.kill(stack.pid("standard"), signal.SIGKILL)
                killed = True
            if elapsed > UNLOAD_AT and not unloaded:
                body = {"model": stack.model_id("gemma")}
                url = f"{stack.url}/v1/models/unload"
                one_shot.post(url, json=body, headers=HEADERS, timeout=60).raise_for_status()
                unloaded = True
            stop.wait(1.0)
        stop.set()
        for client in clients:
            client.join()
        if failed:
            raise SystemExit("requests failed:\n" + "\n".join(failed))
        with headless_chromium() as driver:
            driver.get(f"{stack.url}/ui")
            driver.find_element(By.ID, "key").send_keys(KEY)
            driver.find_element(By.ID, "key-save").click()
            model = stack.model_id("standard")
            views.until(
                driver, lambda: views.points(driver, "requests", model=model) > 60, "charts"
            )
            playground = views.Playground(driver)
            playground.send(model, "chat", "Tell me a long story about a lighthouse.", 1000)
            views.until(driver, lambda: len(playground.text("answer")) > 300, "an answer streaming")
            height = driver.execute_script("return document.documentElement.scrollHeight")
            driver.set_window_size(1500, int(height) + 40)  # every part in view
            for part, name in (("charts", "charts"), ("timeline-panel", "lanes")):
                driver.find_element(By.ID, part).screenshot(str(folder / f"dashboard-{name}.png"))
            panel = driver.find_element(By.ID, "playground")
            panel.screenshot(str(folder / "dashboard-playground.png"))
            driver.save_screenshot(str(folder / "dashboard.png"))
            playground.stop()


if __name__ == "__main__":
    run(Path(sys.argv[1] if len(sys.argv) > 1 else "docs"))
