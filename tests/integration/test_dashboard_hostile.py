"""The dashboard's history under attack, against the real launcher and router with a
fake llama-server, in headless chromium: a model id and forged watchdog events carrying
markup are shown as text wherever the page shows them (the models table, the filter,
the charts' legend and marks, the timeline, the lanes' titles), with no element made
and no script run from them; a forged event far in the future does not crush the
page's time axes; and many clients polling ``GET /v1/ui/history`` over HTTP while
traffic flows get consistent answers. One stack and one browser for the module; every
wait polls a condition in the page or the router, never a fixed sleep."""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from slm_server.contracts.events import utc_timestamp
from tests import one_shot
from tests.integration import dashboard_views as views
from tests.integration.browser import chromium_for_a_test
from tests.integration.watched import Watched, fake_entry, watched
from tests.processes import poll

KEY = "hostile-key"
AUTH = {"authorization": f"Bearer {KEY}"}
ROLE = "chat"
WAIT_SECONDS = 20.0
# A model id (the registry's) and an event's model and reason (a forged log line's) that
# would each set window.slmInjected, or make an element, if the page took them as markup.
MARKUP_ID = '<img src=x onerror="window.slmInjected=1"><script>window.slmInjected=2</script>'
MARKUP_MODEL = "<svg onload=\"window.slmInjected=3\"></svg><b id='injected'>bold</b>"
MARKUP_REASON = '</title><img src=x onerror="window.slmInjected=4"><iframe src="javascript:1">'
# Anything the page made from the markup above.
INJECTED = """
const found = [];
for (const node of document.querySelectorAll('*')) {
  for (const attribute of node.attributes) {
    if (attribute.name.startsWith('on')) found.push(node.tagName + '[' + attribute.name + ']');
  }
}
for (const selector of ['img', 'iframe', '#injected', 'b#injected', 'svg[onload]']) {
  for (const node of document.querySelectorAll(selector)) found.push(node.outerHTML.slice(0, 80));
}
const scripts = Array.from(document.scripts).filter((s) => !s.src);
if (scripts.length) found.push('inline scripts: ' + scripts.length);
if (window.slmInjected !== undefined) found.push('window.slmInjected=' + window.slmInjected);
return found;
"""

pytestmark = pytest.mark.xdist_group("dashboard_hostile")


def forge(stack: Watched, **fields: Any) -> None:
    """Append one event to the watchdog's log, as the supervisor writes them."""
    line = json.dumps({"ts": utc_timestamp(time.time()), **fields}) + "\n"
    with (stack.log_dir / "watchdog.jsonl").open("a", encoding="utf-8") as handle:
        handle.write(line)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    tmp = tmp_path_factory.mktemp("dashboard_hostile")
    models = {ROLE: fake_entry(tmp, ROLE, id=MARKUP_ID)}
    with watched(tmp, models, SLM_API_KEYS=KEY, SLM_HISTORY_INTERVAL_SECONDS="0.25") as running:
        yield running


@pytest.fixture(scope="module")
def driver(stack: Watched) -> Iterator[WebDriver]:
    """The page open with the key given (a failure on Linux when chromium is missing)."""
    with chromium_for_a_test() as chromium:
        chromium.set_script_timeout(10)
        chromium.get(f"{stack.url}/ui")
        field = chromium.find_element(By.ID, "key")
        field.send_keys(KEY)
        chromium.find_element(By.ID, "key-save").click()
        yield chromium


def until(driver: WebDriver, condition: Callable[[], Any], what: str) -> Any:
    return views.until(driver, condition, what, WAIT_SECONDS)


def text_of(driver: WebDriver, selector: str) -> list[str]:
    """The text content of every element ``selector`` finds (hidden ones too)."""
    found: list[str] = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), (n) => n.textContent);",
        selector,
    )
    return found


def chat(stack: Watched) -> None:
    body = {"model": MARKUP_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    answer = one_shot.post(f"{stack.url}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert answer.status_code == 200, answer.text


def test_markup_in_a_model_id_and_in_forged_events_is_shown_as_text(
    stack: Watched, driver: WebDriver
) -> None:
    chat(stack)
    until(driver, lambda: MARKUP_ID in text_of(driver, "#models td.model"), "the id in the table")
    forge(stack, event="backend_failure", role=ROLE, model_id=MARKUP_MODEL, reason=MARKUP_REASON)
    forge(stack, event="backend_loaded", role=ROLE, model_id=MARKUP_MODEL, reason=MARKUP_REASON)
    chat(stack)

    until(
        driver,
        lambda: any(
            MARKUP_REASON in t
            for t in text_of(driver, '#timeline li[data-event="backend_failure"]')
        ),
        "the forged event's reason in the timeline, as text",
    )
    until(
        driver,
        lambda: any(MARKUP_REASON in t for t in views.lane_titles(driver, ROLE, "suspected")),
        "the forged event's reason in its lane's title, as text",
    )
    until(
        driver,
        lambda: any(
            MARKUP_REASON in t and MARKUP_MODEL in t
            for t in text_of(driver, 'svg.chart line.mark[data-mark="load"] title')
        ),
        "the forged load's mark on the charts, its model and reason in its title",
    )
    until(
        driver,
        lambda: MARKUP_ID in text_of(driver, "#chart-models .legend-item span"),
        "the model id in the charts' legend, as text",
    )
    until(driver, lambda: views.points(driver, "requests", model=MARKUP_ID) > 0, "requests drawn")
    marks = driver.find_elements(By.CSS_SELECTOR, 'svg.chart line.mark[data-mark="load"]')
    assert MARKUP_MODEL in {m.get_attribute("data-model") for m in marks}
    options = text_of(driver, "#filter option")
    assert MARKUP_ID in options, options
    injected = driver.execute_script(INJECTED)
    assert injected == [], injected


def test_a_forged_event_far_in_the_future_leaves_the_time_axes_readable(
    stack: Watched, driver: WebDriver
) -> None:
    """An event stamped four months ahead (a forged or mis-stamped line): the page must
    not stretch its charts and lanes to it, which would crush every sample into the left
    edge and draw a tick every two hours of the four months (about 1,400 per axis). The
    history answers it at the time of the sample it goes with (no event is later than
    its sample); the page's own bounds are the next test's."""
    ahead = time.time() + 1e7
    line = {"ts": utc_timestamp(ahead), "event": "backend_loaded", "role": ROLE, "reason": "ahead"}
    with (stack.log_dir / "watchdog.jsonl").open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")
    until(
        driver,
        lambda: driver.execute_script(
            "return HistoryFeed.kept.events.some((e) => e.reason === 'ahead');"
        ),
        "the event ahead taken in by the page",
    )
    # The page draws in the same turn as it takes an answer in: drawn with it by now.
    lane_ticks = len(text_of(driver, "#lane-axis .lane-tick"))
    chart_ticks = len(text_of(driver, 'svg.chart[data-chart="requests"] text.tick'))
    [path] = views.series(driver, "requests", "requests_ok")
    vertices = views.VERTEX.findall(path.get_attribute("d") or "")
    last_x = float(re.split(r"[ ,]+", vertices[-1][1:].strip())[0])
    wrong = []
    if lane_ticks > 20:
        wrong.append(f"{lane_ticks} tick labels on the lanes' axis (about 8 asked)")
    if chart_ticks > 20:  # the y axis' labels and about 5 on the x axis
        wrong.append(f"{chart_ticks} tick labels on the requests chart")
    if last_x <= 460 / 2:  # the newest sample belongs at the right, not crushed at the left
        wrong.append(f"the newest sample drawn at x={last_x} of 460")
    assert wrong == []


# In the page: an event a day ahead of the newest sample (the router clamps them, but
# the page must not trust it to), what the page spans with it, and how many ticks its
# time axes would draw over four months and over everything up to ts 1e308 (asked only
# when the first is bounded: unbounded, that loop never ends and the page hangs).
BOUNDS = """
const kept = HistoryFeed.kept;
const newest = kept.times[kept.times.length - 1];
const event = {ts: newest + 86400, event: "backend_loaded", role: "page-only", model: null,
  lane: "ready", mark: "load", reason: "ahead, in the page"};
kept.events.push(event);
try {
  const span = HistoryFeed.span();
  const ahead = Plot.timeTicks(newest, newest + 1e7, 8).values.length;
  const far = ahead <= 50 ? Plot.timeTicks(0, 1e308, 5).values.length : null;
  return {newest, end: span.end, t1: span.t1, ahead, far};
} finally {
  kept.events.splice(kept.events.indexOf(event), 1);
}
"""


def test_the_page_bounds_its_time_axes_whatever_the_events_say(
    stack: Watched, driver: WebDriver
) -> None:
    """The page's span ends at most a minute after its newest sample, whatever the
    latest event's time, and a time axis draws at most 50 ticks whatever the span."""
    until(driver, lambda: driver.execute_script("return HistoryFeed.kept.times.length"), "samples")
    found = driver.execute_script(BOUNDS)
    assert found["end"] <= found["newest"] + 60, found
    assert found["t1"] <= found["newest"] + 60, found
    assert found["ahead"] <= 50, found
    assert found["far"] is not None and found["far"] <= 50, found


def test_many_clients_polling_the_history_while_traffic_flows(stack: Watched) -> None:
    """Twelve clients poll as the page does (everything, then ``?since=`` the last time
    they hold) over real connections while requests flow: every answer is strict JSON
    whose columns have one value per time, and each client holds every sample once."""
    url = f"{stack.url}/v1/ui/history"
    stop = threading.Event()

    def strict(text: str) -> Any:
        def refuse(constant: str) -> Any:
            raise AssertionError(f"{constant} in the answer")

        return json.loads(text, parse_constant=refuse)

    def checked(query: str, since: float | None) -> dict[str, Any]:
        got = one_shot.get(url + query, headers=AUTH, timeout=30)
        assert got.status_code == 200, got.text[:300]
        answer: dict[str, Any] = strict(got.text)
        times = answer["times"]
        assert all(a < b for a, b in itertools.pairwise(times)), times
        if since is not None:
            assert all(t > since for t in times)
        columns = [*answer["machine"].values()]
        columns += [v for m in answer["models"] for v in m["series"].values()]
        columns += [b["states"] for b in answer["backends"]]
        assert all(len(c) == len(times) for c in columns)
        return answer

    def client() -> list[float]:
        held: list[float] = []
        while not stop.is_set():
            since = held[-1] if held else None
            held += checked("" if since is None else f"?since={since!r}", since)["times"]
        since = held[-1] if held else None
        held += checked("" if since is None else f"?since={since!r}", since)["times"]
        return held

    def traffic() -> int:
        sent = 0
        while not stop.is_set():
            chat(stack)
            sent += 1
        return sent

    start = len(checked("", None)["times"])
    with ThreadPoolExecutor(max_workers=14) as pool:
        clients = [pool.submit(client) for _ in range(12)]
        flows = [pool.submit(traffic) for _ in range(2)]
        try:
            poll(lambda: len(checked("", None)["times"]) >= start + 12, 30, "twelve more samples")
        finally:
            stop.set()
        held = [c.result() for c in clients]
        assert sum(f.result() for f in flows) > 0
    full = checked("", None)["times"]
    for times in held:
        assert times == sorted(set(times)), "a sample twice or out of order"
        first = full.index(times[0])
        assert times == full[first : first + len(times)], "a sample missed"
