"""The dashboard in a real headless browser (Debian's chromium and chromedriver, driven
by selenium): the real launcher and router, with fake llama-servers and with the real
one. The page must show every model with its state and each recent request (one sent
by an alias as such) with its detail, a wrong key must be said to be refused, every
chart must draw points after traffic, a ``kill -9`` must appear in the events, on the
watchdog's timeline and as a mark on the charts, and change the row without a reload,
the load and unload buttons must work, and the playground must stream an answer on each
API shape and stop one upstream (the engine's slot is freed). Everything waits on
conditions in the page (WebDriverWait), never on fixed sleeps.

docs/dashboard*.png are made by tests/integration/dashboard_screens.py."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from slm_server.contracts.applied_registry import version_of
from tests import one_shot
from tests.integration import dashboard_views as views
from tests.integration.browser import chromium_for_a_test
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.integration.watched import Watched, fake_entry, watched
from tests.processes import free_port

KEY = "dashboard-key"
WAIT_SECONDS = 30.0
NONE = "\N{EN DASH}"  # what the page shows for no value
# The header's memory: the machine's free memory, its floor, what the models hold and
# the budget (GET /health's ``memory``).
MEMORY_SHOWN = r"free \d+ MiB \(floor \d+\) \N{MIDDLE DOT} held \d+ / budget \d+ MiB"
# A floor the machine is always above (the tests run with none unless they set one), so
# that the header shows it whatever memory the machine has free.
FLOOR_MB = "1"
# The history is sampled this often in these tests (5 s by default).
HISTORY: dict[str, Any] = {"SLM_HISTORY_INTERVAL_SECONDS": "0.25"}


class Page:
    """The dashboard as the browser shows it."""

    def __init__(self, driver: WebDriver, url: str) -> None:
        self.driver = driver
        self.url = url

    def until(self, condition: Callable[[], Any], what: str, seconds: float = WAIT_SECONDS) -> Any:
        def check(_driver: WebDriver) -> Any:
            try:
                return condition()
            except Exception:  # the page is mid-update: an element replaced, not yet there
                return False

        return WebDriverWait(self.driver, seconds, poll_frequency=0.1).until(
            check, message=f"never: {what}"
        )

    def row(self, role: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, f'#models tr[data-role="{role}"]')

    def cell(self, role: str, name: str) -> str:
        text: str = self.row(role).find_element(By.CSS_SELECTOR, f"td.{name}").text
        return text

    def button(self, role: str, action: str) -> WebElement:
        return self.row(role).find_element(By.CSS_SELECTOR, f'button[data-action="{action}"]')

    def events(self, name: str, model: str | None = None) -> list[WebElement]:
        selector = f'#timeline li[data-event="{name}"]'
        if model is not None:
            selector += f'[data-model="{model}"]'
        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def open_with_key(self) -> None:
        """Open the page, give it a wrong key (which it must say is refused), then the
        right one."""
        self.driver.get(f"{self.url}/ui")
        status = self.driver.find_element(By.ID, "status")
        self.until(lambda: "API key needed" in status.text, "the page to ask for a key")
        self.enter_key("not-" + KEY)
        self.until(lambda: "refused" in status.text, "a wrong key said to be refused")
        self.enter_key(KEY)
        self.until(lambda: "refused" not in status.text, "the right key taken")

    def enter_key(self, key: str) -> None:
        field = self.driver.find_element(By.ID, "key")
        field.clear()
        field.send_keys(key)
        self.driver.find_element(By.ID, "key-save").click()

    def mark(self) -> None:
        """A mark that a reload would wipe."""
        self.driver.execute_script("window.slmNotReloaded = true;")

    def not_reloaded(self) -> bool:
        return self.driver.execute_script("return window.slmNotReloaded === true;") is True


def chat(stack: Watched, model: str, **fields: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"authorization": f"Bearer {KEY}"}
    url = f"{stack.url}/v1/chat/completions"
    return one_shot.post(url, json={**body, **fields}, headers=headers, timeout=60)


def traffic(stack: Watched, model: str) -> str:
    """Some of each kind of request the charts draw: whole and streamed answers and a
    client's error; the id of the last streamed one."""
    for _ in range(3):
        assert chat(stack, model).status_code == 200
    for _ in range(3):
        streamed = chat(stack, model, stream=True, stream_options={"include_usage": True})
        assert streamed.status_code == 200
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}]
    picture = [{"role": "user", "content": image}]  # for a model without vision: 400
    assert chat(stack, model, messages=picture).status_code == 400
    return streamed.headers["x-request-id"]


def charts_drawn(page: Page, model: str) -> None:
    """Every chart has drawn points of ``model``'s traffic (the memory chart: also the
    machine's free memory)."""
    driver = page.driver
    for name in views.CHARTS:
        page.until(partial(views.points, driver, name, model=model), f"{name} drawn")
    page.until(lambda: views.points(driver, "requests", "requests_ok", model) > 0, "ok requests")
    page.until(
        lambda: views.points(driver, "requests", "requests_client_error", model) > 0,
        "the client's error drawn",
    )
    page.until(lambda: views.points(driver, "memory", "free_mb") > 0, "the free memory drawn")


def detail_shown(page: Page, request_id: str, role: str) -> None:
    """The streamed request's detail: its stages' times, status and backend."""
    page.until(
        lambda: page.driver.find_elements(
            By.CSS_SELECTOR, f'#requests tr[data-request-id="{request_id}"]'
        ),
        "the streamed request listed",
    )
    detail = views.request_detail(page.driver, request_id)
    assert detail["status"].startswith("200"), detail
    assert detail["backend"] == role, detail
    for stage in ("queued", "first_byte", "streamed", "total"):
        assert re.search(r"\d", detail[stage]), (stage, detail)


def exercise(
    stack: Watched,
    always: str,
    lazy: str,
    alias: str | None = None,
    playground: Callable[[Page, Watched], None] | None = None,
) -> None:
    """Every acceptance line of the dashboard against a running stack (``alias``: one
    of ``always``'s aliases; ``playground``: what to try in the playground once both
    models are up)."""
    always_id, lazy_id = stack.model_id(always), stack.model_id(lazy)
    with chromium_for_a_test() as driver:
        page = Page(driver, stack.url)
        page.open_with_key()
        version = version_of((stack.tmp / "models.yaml").read_text(encoding="utf-8"))
        shown = driver.find_element(By.ID, "registry")
        page.until(lambda: shown.text.startswith(f"registry {version}"), "the registry shown")
        memory = driver.find_element(By.ID, "memory")
        page.until(
            lambda: re.fullmatch(MEMORY_SHOWN, memory.text) is not None,
            "the machine's free memory beside the budget",
        )
        page.until(lambda: page.cell(always, "state") == "ready", f"{always} shown ready")
        page.until(lambda: page.cell(lazy, "state") == "unloaded", f"{lazy} shown unloaded")
        assert page.cell(always, "model") == always_id + (f" ({alias})" if alias else "")
        assert page.cell(always, "pid") == str(stack.pid(always))
        assert page.cell(always, "restarts").startswith("0 /")
        page.until(lambda: page.events("supervisor_started"), "the timeline's first events")

        assert chat(stack, always_id).status_code == 200
        page.until(
            lambda: always_id in driver.find_element(By.ID, "requests").text,
            "the request among the recent ones",
        )
        detail_shown(page, traffic(stack, always_id), always)
        charts_drawn(page, always_id)
        if alias is not None:
            assert chat(stack, alias).status_code == 200
            page.until(
                lambda: (
                    f"{alias} \N{RIGHTWARDS ARROW} {always_id}"
                    in driver.find_element(By.ID, "requests").text
                ),
                "the request by an alias among the recent ones, with its alias",
            )

        page.mark()
        old_pid = stack.pid(always)
        os.kill(old_pid, signal.SIGKILL)
        page.until(lambda: page.events("backend_exited", always_id), "the kill in the timeline")
        page.until(
            lambda: "restarting" in views.lane_states(driver, always),
            "the restart on the watchdog's timeline",
            10,
        )
        assert any(
            "killed by SIGKILL" in t for t in views.lane_titles(driver, always, "restarting")
        )
        restarted = stack.wait_event("restart_succeeded", old_pid=old_pid, timeout=60)
        page.until(lambda: views.lane_states(driver, always)[-1] == "ready", "ready again", 10)
        page.until(lambda: views.marks(driver, "restart", always_id), "the restart marked", 10)
        left, limit = views.budget_left(driver, always)
        assert left == limit - 1, (left, limit)
        page.until(
            lambda: (
                page.cell(always, "pid") == str(restarted["new_pid"])
                and page.cell(always, "state") == "ready"
            ),
            "the row to show the new process",
            60,
        )
        page.until(lambda: page.cell(always, "restarts").startswith("1 /"), "a restart used")
        assert page.cell(always, "frees") != NONE
        assert "SIGKILL" in page.cell(always, "exit")
        assert page.not_reloaded()

        page.button(lazy, "load").click()
        page.until(lambda: page.cell(lazy, "state") == "ready", f"{lazy} loaded by its button", 60)
        page.until(lambda: page.events("backend_loaded", lazy_id), "the load in the timeline")
        page.until(lambda: page.cell(lazy, "pid") not in ("", NONE), "the loaded pid shown")
        page.until(lambda: views.marks(driver, "load", lazy_id), "the load marked on the charts")
        if playground is not None:
            playground(page, stack)
        assert chat(stack, lazy_id).status_code == 200  # something for its slot to keep
        page.button(lazy, "unload").click()
        page.until(lambda: page.cell(lazy, "state") == "unloaded", f"{lazy} unloaded", 60)
        page.until(
            lambda: page.cell(lazy, "saved").isdigit() and int(page.cell(lazy, "saved")) > 0,
            "the prompt cache saved for its next load",
        )

        Select(driver.find_element(By.ID, "filter")).select_by_value(lazy_id)
        [exited] = page.events("backend_exited", always_id)
        page.until(lambda: not exited.is_displayed(), "another model's events filtered out")
        page.until(
            lambda: page.events("backend_unloaded", lazy_id)[0].is_displayed(),
            "the unload in the filtered timeline",
        )

        page.button(always, "log").click()
        log = driver.find_element(By.ID, "log")
        page.until(lambda: log.text and "(no log yet)" not in log.text, "the backend's log")
        assert page.not_reloaded()


def test_the_dashboard_with_fake_backends(tmp_path: Path) -> None:
    models = {
        "chat": fake_entry(tmp_path, "chat", aliases=["gpt-4o-mini"]),
        "lazy": fake_entry(tmp_path, "lazy", load="on_demand", memory_mb=64),
    }
    with watched(
        tmp_path, models, SLM_API_KEYS=KEY, SLM_MEMORY_FLOOR_MB=FLOOR_MB, **HISTORY
    ) as stack:
        exercise(stack, "chat", "lazy", alias="gpt-4o-mini")


@pytest.mark.real_model
def test_the_dashboard_with_the_real_llama_server(tmp_path: Path) -> None:
    registry = example_registry(
        {"standard": free_port(), "gemma": 0, "embeddings": 0}, roles=("standard",)
    )
    models: dict[str, dict[str, Any]] = registry["models"]
    lazy = {**models["standard"], "id": "smollm2-on-demand", "port": free_port()}
    models["lazy"] = {**lazy, "load": "on_demand"}
    with watched(
        tmp_path,
        models,
        llama_server=llama_server_bin(),
        SLM_API_KEYS=KEY,
        SLM_MEMORY_FLOOR_MB=FLOOR_MB,
        **HISTORY,
    ) as stack:
        exercise(stack, "standard", "lazy", playground=try_the_playground)


def slots_busy(stack: Watched, role: str) -> bool:
    """Whether the engine is generating: its own ``/slots``."""
    slots = one_shot.get(f"http://127.0.0.1:{stack.port(role)}/slots", timeout=10).json()
    return any(slot.get("is_processing") for slot in slots)


def try_the_playground(page: Page, stack: Watched) -> None:
    """An answer streamed on each API shape from the default model, then a long one
    stopped: the engine's slot is freed at once and the router counts it cancelled."""
    driver, model = page.driver, stack.model_id("standard")
    playground = views.Playground(driver)
    for shape in ("chat", "responses", "messages"):
        playground.send(model, shape, "Say hello to the user.", max_tokens=24)
        page.until(lambda: playground.state() == "done", f"the {shape} answer ended", 60)
        assert playground.text("answer").strip(), shape
        assert re.search(r"\d", playground.text("ttft")), shape
        assert re.search(r"\d", playground.text("tps")), shape
        sent, answered = playground.bodies()
        assert f'"{model}"' in sent and "stream" in sent, sent
        assert "data:" in answered or "event:" in answered, answered
    playground.send(model, "chat", "Write a very long story about a dragon.", max_tokens=4000)
    page.until(lambda: len(playground.text("answer")) > 40, "the long answer streaming")
    assert slots_busy(stack, "standard")
    playground.stop()
    page.until(lambda: playground.state() == "stopped", "the answer stopped")
    page.until(lambda: not slots_busy(stack, "standard"), "the engine's slot freed", 5)
    rows = one_shot.get(
        f"{stack.url}/v1/ui/requests", headers={"authorization": f"Bearer {KEY}"}, timeout=10
    ).json()["data"]
    assert rows[0]["outcome"] == "cancelled", rows[0]
