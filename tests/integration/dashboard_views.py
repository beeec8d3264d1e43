"""What the dashboard's charts, timeline, playground and request detail show, read from
the page's DOM in the browser (docs/dashboard.md names each hook): the drawn paths and
their vertices, the lanes' segments, the playground's answer and figures."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

WAIT_SECONDS = 30.0
CHARTS = ("requests", "ttft", "tokens_per_second", "queue", "memory", "prompt_cache")
# A vertex of an SVG path: a command letter then its two coordinates.
VERTEX = re.compile(r"[ML]\s*-?[\d.]+[ ,]+-?[\d.]+")


def until(
    driver: WebDriver, condition: Callable[[], Any], what: str, seconds: float = WAIT_SECONDS
) -> Any:
    """Poll ``condition`` in the page until it is true (an element replaced or not yet
    there while the page redraws counts as not yet)."""

    def check(_driver: WebDriver) -> Any:
        try:
            return condition()
        except Exception:
            return False

    return WebDriverWait(driver, seconds, poll_frequency=0.1).until(check, message=f"never: {what}")


def drawn(path: WebElement) -> int:
    """The vertices a series' path draws, counted from its ``d``, which must agree with
    what it says it draws (``data-points``)."""
    vertices = len(VERTEX.findall(path.get_attribute("d") or ""))
    assert vertices == int(path.get_attribute("data-points") or -1), path.get_attribute("d")
    return vertices


def series(driver: WebDriver, chart: str, name: str | None = None) -> list[WebElement]:
    selector = f'svg.chart[data-chart="{chart}"] path.series'
    if name is not None:
        selector += f'[data-series="{name}"]'
    return driver.find_elements(By.CSS_SELECTOR, selector)


def points(driver: WebDriver, chart: str, name: str | None = None, model: str | None = None) -> int:
    """The data points drawn on ``chart`` (of one series, of one model)."""
    paths = series(driver, chart, name)
    if model is not None:
        paths = [p for p in paths if p.get_attribute("data-model") == model]
    return sum(drawn(p) for p in paths)


def marks(driver: WebDriver, kind: str, model: str) -> list[WebElement]:
    selector = f'svg.chart line.mark[data-mark="{kind}"][data-model="{model}"]'
    return driver.find_elements(By.CSS_SELECTOR, selector)


def lane_states(driver: WebDriver, role: str) -> list[str]:
    """The states a backend's lane shows, left to right."""
    lane = f'#lanes .lane[data-role="{role}"] rect.segment'
    return [
        s.get_attribute("data-state") or "" for s in driver.find_elements(By.CSS_SELECTOR, lane)
    ]


def lane_titles(driver: WebDriver, role: str, state: str) -> list[str]:
    """What hovering each of a lane's ``state`` segments shows."""
    selector = f'#lanes .lane[data-role="{role}"] rect.segment[data-state="{state}"] title'
    return [
        t.get_attribute("textContent") or ""
        for t in driver.find_elements(By.CSS_SELECTOR, selector)
    ]


def budget_left(driver: WebDriver, role: str) -> tuple[int, int]:
    budget = driver.find_element(By.CSS_SELECTOR, f'#lanes .lane[data-role="{role}"] .budget')
    return int(budget.get_attribute("data-left") or -1), int(
        budget.get_attribute("data-limit") or -1
    )


class Playground:
    """The playground's controls and what it shows."""

    def __init__(self, driver: WebDriver) -> None:
        self.driver = driver

    def text(self, name: str) -> str:
        shown: str = (
            self.driver.find_element(By.ID, f"pg-{name}").get_attribute("textContent") or ""
        )
        return shown

    def send(self, model: str, shape: str, message: str, max_tokens: int | None = None) -> None:
        driver = self.driver
        until(
            driver,
            lambda: (
                model in [o.get_attribute("value") for o in Select(self._field("model")).options]
            ),
            f"{model} offered in the playground",
        )
        Select(self._field("model")).select_by_value(model)
        Select(self._field("shape")).select_by_value(shape)
        if max_tokens is not None:
            limit = self._field("max-tokens")
            limit.clear()
            limit.send_keys(str(max_tokens))
        box = self._field("input")
        box.clear()
        box.send_keys(message)
        self._field("send").click()

    def _field(self, name: str) -> WebElement:
        return self.driver.find_element(By.ID, f"pg-{name}")

    def stop(self) -> None:
        self._field("stop").click()

    def state(self) -> str:
        return self.text("state").strip()

    def bodies(self) -> tuple[str, str]:
        """The exact request and answer bodies, as the page shows them one click away."""
        self._field("bodies").click()
        return self.text("request"), self.text("response")


def request_detail(driver: WebDriver, request_id: str) -> dict[str, str]:
    """Open a recent request's detail; its fields as shown."""
    row = driver.find_element(By.CSS_SELECTOR, f'#requests tr[data-request-id="{request_id}"]')
    row.click()
    panel = driver.find_element(By.ID, "request-detail")
    until(driver, panel.is_displayed, "the request's detail shown")
    fields = panel.find_elements(By.CSS_SELECTOR, "[data-field]")
    return {f.get_attribute("data-field") or "": f.text for f in fields}
