"""The dashboard's "Add a model" view in headless chromium, against the real launcher
and router (a fake llama-server behind it) with ``SLM_PULL_API=true``, pulling from the
hub stand-in (tests/fakes/hub_standin.py: Hugging Face through ``HF_ENDPOINT``, Ollama's
registry through ``SLM_OLLAMA_REGISTRY``) small synthetic GGUF files:

* a pull shows its file's bar reaching 100%, the model's path, the entry it added and
  the reload's outcome, and the list of local models then shows the file served; the
  same pull again shows the file already here;
* a hub's 404 and a download that fails its checksum are shown with their codes;
  Cancel ends a pull under way (the router stops reading from the hub) and the next
  pull resumes where it stopped, saying so;
* the local list shows a file put in the models folder, and its Add adds it;
* a wrong key is said to be refused; with the switch off, the view says how to turn it
  on and hides its controls;
* a reference and a model's file name carrying markup are shown as text.

One stack, one hub and one browser for the module; every wait polls a condition in the
page, the router or the hub, never a fixed sleep."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

from tests.fakes.hub_control import (
    MEDIA_MODEL,
    HfFile,
    HfRepo,
    HubStandin,
    OllamaLayer,
    OllamaModel,
)
from tests.integration import dashboard_views as views
from tests.integration.browser import chromium_for_a_test
from tests.integration.test_dashboard_hostile import INJECTED
from tests.integration.watched import Watched, fake_entry, watched
from tests.processes import running_router
from tests.unit.discover.stores import tiny_gguf

KEY = "models-key"
WAIT_SECONDS = 30.0
REPO = "acme/tiny-GGUF"
MODEL_FILE = "tiny-Q4_K_M.gguf"
CORRUPT_REPO = "acme/other-GGUF"
OLLAMA_MODEL = "library/tiny:1b"
OLLAMA_REFERENCE = "ollama:tiny:1b"
# Six of the Ollama download's 1 MiB chunks (a cancel is seen after each), sent by the
# stand-in 32 KiB every 50 ms: a chunk every 1.6 s, some 10 s in all unless cancelled.
OLLAMA_BYTES = 6 << 20
LOCAL_FILE = "Local-Q8_0.gguf"
# A reference and a model file's name that would set window.slmInjected, or make an
# element, if the page took them as markup.
MARKUP_REFERENCE = 'acme/<img src=x onerror="window.slmInjected=5">'
MARKUP_FILE = "<img src=x onerror=\"window.slmInjected=6\"><b id='injected'>b</b>-Q4_0.gguf"

pytestmark = pytest.mark.xdist_group("dashboard_models")


@dataclass
class Setup:
    stack: Watched
    hub: HubStandin
    models_dir: Path
    driver: WebDriver

    @property
    def registry(self) -> Path:
        return Path(self.stack.env["SLM_CONFIG"])

    def registry_ids(self) -> list[str]:
        models = yaml.safe_load(self.registry.read_text(encoding="utf-8"))["models"]
        return [str(entry["id"]) for entry in models.values()]


def ollama_file(tmp: Path) -> Path:
    """A GGUF a little over :data:`OLLAMA_BYTES`, padded after its header."""
    path = tiny_gguf(tmp / "ollama-src.gguf", file_type=2)
    with path.open("ab") as handle:
        handle.write(bytes(OLLAMA_BYTES))
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("dashboard_models")
    source = tiny_gguf(tmp / "src" / MODEL_FILE, file_type=15)
    repo = HfRepo(files=(HfFile(MODEL_FILE, source=source),))
    hf = {REPO: repo, CORRUPT_REPO: repo}
    ollama = {
        OLLAMA_MODEL: OllamaModel(layers=(OllamaLayer(MEDIA_MODEL, source=ollama_file(tmp)),))
    }
    models_dir = tmp / "models"
    tiny_gguf(models_dir / "local" / LOCAL_FILE, file_type=7)
    tiny_gguf(models_dir / "local" / MARKUP_FILE, file_type=2)
    with HubStandin.start(tmp / "hub", hf=hf, ollama=ollama) as hub:
        home = tmp / "home"  # nothing of this machine's own stores or tokens
        models = {"chat": fake_entry(tmp, "chat")}
        with (
            watched(
                tmp,
                models,
                SLM_API_KEYS=KEY,
                SLM_PULL_API="true",
                SLM_MODELS_DIR=str(models_dir),
                HF_ENDPOINT=hub.hf_endpoint,
                SLM_OLLAMA_REGISTRY=hub.ollama_registry,
                HOME=str(home),
                HF_HOME=str(home / "hf"),
                HF_TOKEN="",
                OLLAMA_MODELS=str(home / "ollama"),
                LLAMA_CACHE=str(home / "llama.cpp"),
                XDG_CACHE_HOME=str(home / "cache"),
                SLM_DRAIN_TIMEOUT_SECONDS="1",
            ) as stack,
            chromium_for_a_test() as driver,
        ):
            driver.set_script_timeout(10)
            yield Setup(stack, hub, models_dir, driver)


def until(driver: WebDriver, condition: Callable[[], Any], what: str) -> Any:
    return views.until(driver, condition, what, WAIT_SECONDS)


def by_id(driver: WebDriver, name: str) -> WebElement:
    return driver.find_element(By.ID, name)


def text(driver: WebDriver, name: str) -> str:
    """An element's text content (hidden or not)."""
    shown: str = by_id(driver, name).get_attribute("textContent") or ""
    return shown.strip()


def open_page(driver: WebDriver, url: str, key: str = KEY) -> None:
    driver.get(f"{url}/ui")
    field = by_id(driver, "key")
    field.clear()
    field.send_keys(key)
    by_id(driver, "key-save").click()


def local_rows(driver: WebDriver) -> dict[str, dict[str, str]]:
    """The local models listed, by path: each cell's text and whether it has an Add."""
    found: dict[str, dict[str, str]] = driver.execute_script(
        """
        const rows = {};
        for (const row of document.querySelectorAll('#am-local tbody tr[data-name]')) {
          const cells = {served: row.dataset.served};
          for (const td of row.cells) cells[td.className] = td.textContent;
          cells.add = row.querySelector('button[data-action="add"]') ? 'yes' : 'no';
          rows[cells.path] = cells;
        }
        return rows;
        """
    )
    return found


def add_button(driver: WebDriver, path: str) -> WebElement:
    """The Add button of the local model at ``path``."""
    for row in driver.find_elements(By.CSS_SELECTOR, "#am-local tbody tr[data-name]"):
        if row.find_element(By.CSS_SELECTOR, "td.path").get_attribute("textContent") == path:
            return row.find_element(By.CSS_SELECTOR, 'button[data-action="add"]')
    raise AssertionError(f"{path} not listed")


def click(find: Callable[[WebDriver, str], WebElement], driver: WebDriver, what: str) -> bool:
    """Click what ``find`` finds; an element redrawn under the click (stale: the click
    never landed) raises, and the caller's wait tries again."""
    find(driver, what).click()
    return True


def file_row(driver: WebDriver, name: str) -> dict[str, str]:
    """One file of the pull as shown: its state, percent, bar and texts."""
    found: dict[str, str] = driver.execute_script(
        """
        for (const row of document.querySelectorAll('#am-files .am-file')) {
          if (row.dataset.name !== arguments[0]) continue;
          const bar = row.querySelector('progress');
          const got = {state: row.dataset.state, percent: row.dataset.percent || '',
            value: String(bar.value), max: String(bar.max)};
          for (const part of row.children) {
            if (part.className.startsWith('am-') && part.tagName !== 'PROGRESS') {
              got[part.className.slice(3)] = part.textContent;
            }
          }
          return got;
        }
        return null;
        """,
        name,
    )
    return found


def pull(driver: WebDriver, reference: str, add_as: str | None = None) -> None:
    """Start a pull from the view (``add_as``: add it to the registry with that id)."""
    until(driver, lambda: by_id(driver, "am-pull").is_enabled(), "the Pull button ready")
    field = by_id(driver, "am-reference")
    field.clear()
    field.send_keys(reference)
    adding = by_id(driver, "am-add")
    if adding.is_selected() != (add_as is not None):
        adding.click()
    if add_as is not None:
        identity = by_id(driver, "am-id")
        identity.clear()
        identity.send_keys(add_as)
    by_id(driver, "am-pull").click()


def ended(driver: WebDriver) -> str:
    """The pull's state once it has ended."""
    state: str = until(
        driver,
        lambda: (lambda s: s if s not in ("asking", "fetching", "idle") else "")(
            text(driver, "am-state")
        ),
        "the pull to end",
    )
    return state


def test_a_wrong_key_is_refused_then_a_pull_shows_its_file_to_the_end_and_adds_it(
    setup: Setup,
) -> None:
    driver, stack = setup.driver, setup.stack
    open_page(driver, stack.url, key="not-" + KEY)
    until(driver, lambda: "refused" in text(driver, "status"), "the wrong key said refused")
    until(driver, lambda: "API key" in text(driver, "am-local-state"), "the list needs the key")
    open_page(driver, stack.url)
    local = str(setup.models_dir / "local" / LOCAL_FILE)
    until(driver, lambda: local in local_rows(driver), "the local models listed")

    pull(driver, f"{REPO}:Q4_K_M", add_as="tiny-pulled")
    assert ended(driver) == "done", text(driver, "am-error")
    name = f"{REPO}/{MODEL_FILE}"
    row = file_row(driver, name)
    final = setup.models_dir / REPO / MODEL_FILE
    listed = str(final)
    assert row["state"] == "done" and row["percent"] == "100", row
    assert row["value"] == row["max"] and float(row["max"]) > 1, row
    assert row["path"] == str(final), row
    assert text(driver, "am-model-path") == str(final)
    assert final.is_file()
    assert text(driver, "am-added-id").startswith("tiny-pulled")
    reload = text(driver, "am-reload")
    assert reload.startswith("reloaded: registry "), reload
    assert "tiny-pulled" in setup.registry_ids()
    until(
        driver,
        lambda: local_rows(driver)[listed]["served"] == "tiny-pulled",
        "the pulled file listed as served by its new entry",
    )
    assert local_rows(driver)[listed]["add"] == "no"

    pull(driver, f"{REPO}:Q4_K_M")
    assert ended(driver) == "done", text(driver, "am-error")
    again = file_row(driver, name)
    assert again["state"] == "present" and "already here" in again["bytes"], again
    assert by_id(driver, "am-added-box").get_attribute("hidden") is not None


def test_a_hub_404_is_shown_with_its_code(setup: Setup) -> None:
    driver = setup.driver
    open_page(driver, setup.stack.url)
    pull(driver, "acme/missing-GGUF")
    assert ended(driver) == "error: not_found"
    error = by_id(driver, "am-error")
    assert error.is_displayed() and error.get_attribute("data-code") == "not_found"
    assert text(driver, "am-error-message"), "the hub's message shown"
    assert by_id(driver, "am-result").get_attribute("hidden") is not None


def test_a_download_that_does_not_match_its_checksum_is_shown_as_such(setup: Setup) -> None:
    driver, hub = setup.driver, setup.hub
    open_page(driver, setup.stack.url)
    hub.reset()
    hub.fault("corrupt", "/cdn/repos/*", method="GET", times=1, offset=100)
    pull(driver, f"{CORRUPT_REPO}:Q4_K_M")
    assert ended(driver) == "error: checksum"
    assert by_id(driver, "am-error").get_attribute("data-code") == "checksum"
    assert text(driver, "am-error-message"), "the pull's message shown"
    assert not (setup.models_dir / CORRUPT_REPO / MODEL_FILE).exists()


def test_cancel_ends_a_pull_under_way_and_the_next_one_resumes(setup: Setup) -> None:
    driver, hub = setup.driver, setup.hub
    open_page(driver, setup.stack.url)
    hub.reset()
    hub.fault("trickle", "/cdn/ollama/*", method="GET", times=1, chunk=32768, interval=0.05)
    pull(driver, OLLAMA_REFERENCE)
    name: str = until(
        driver,
        lambda: driver.execute_script(
            """
            for (const row of document.querySelectorAll('#am-files .am-file')) {
              if (row.dataset.state === 'fetching' && Number(row.dataset.percent) > 0) {
                return row.dataset.name;
              }
            }
            return null;
            """
        ),
        "the Ollama blob coming in",
    )
    shown = file_row(driver, name)
    assert shown["rate"].endswith("/s") and shown["left"].endswith("left"), shown
    by_id(driver, "am-cancel").click()
    assert ended(driver) == "cancelled"
    hub.wait_for(
        lambda requests: any(
            r["path"].startswith("/cdn/ollama/") and r.get("closed") and not r.get("completed")
            for r in requests
        ),
        timeout=WAIT_SECONDS,
    )

    def pulled_again() -> bool:
        pull(driver, OLLAMA_REFERENCE)
        return ended(driver) != "error: pull_in_progress"  # the cancelled one still ending

    until(driver, pulled_again, "the pull again, once the cancelled one has ended")
    assert text(driver, "am-state") == "done", text(driver, "am-error")
    resumed = file_row(driver, name)
    assert resumed["percent"] == "100", resumed
    assert resumed["resumed"].startswith("resumed at "), resumed
    ranged = [r for r in hub.requests() if r["path"].startswith("/cdn/ollama/") and r["range"]]
    assert ranged, "the second pull asked for the rest only"


def test_the_local_list_adds_a_file_found_in_the_models_folder(setup: Setup) -> None:
    driver = setup.driver
    open_page(driver, setup.stack.url)
    path = str(setup.models_dir / "local" / LOCAL_FILE)
    until(driver, lambda: local_rows(driver)[path]["add"] == "yes", "the file listed, addable")
    listed = local_rows(driver)[path]
    assert listed["quantization"] == "Q8_0" and listed["type"] == "chat", listed
    assert listed["context_length"] == "2048" and listed["served"] == "", listed
    assert listed["size"] == "512 B", listed
    name = listed["name"]
    assert name.endswith(f"local/{LOCAL_FILE}"), listed
    until(driver, partial(click, add_button, driver, path), "the Add clicked")
    outcome = by_id(driver, "am-add-outcome")
    until(driver, lambda: outcome.get_attribute("data-state") != "busy", "the add's outcome")
    said = outcome.text
    assert outcome.get_attribute("data-state") == "done", said
    assert said.startswith(f"{name} added as ") and "reloaded: registry" in said, said
    until(driver, lambda: local_rows(driver)[path]["served"] != "", "the list refreshed")
    served = local_rows(driver)[path]["served"]
    assert served in setup.registry_ids() and served in said, (served, said)
    assert local_rows(driver)[path]["add"] == "no"


def test_markup_in_a_reference_and_a_model_file_name_is_shown_as_text(setup: Setup) -> None:
    driver = setup.driver
    open_page(driver, setup.stack.url)
    path = str(setup.models_dir / "local" / MARKUP_FILE)
    until(driver, lambda: path in local_rows(driver), "the file with markup listed")
    assert local_rows(driver)[path]["name"].endswith(f"local/{MARKUP_FILE}")
    pull(driver, MARKUP_REFERENCE)
    assert ended(driver).startswith("error: ")
    message = text(driver, "am-error-message")
    assert "<img" in message or "<img" in text(driver, "am-plan"), message
    injected = driver.execute_script(INJECTED)
    assert injected == [], injected


def test_with_the_switch_off_the_view_says_how_to_turn_it_on(setup: Setup) -> None:
    driver, stack = setup.driver, setup.stack
    env = {**stack.env, "SLM_PULL_API": "false"}
    workdir = stack.tmp / "switched-off"
    workdir.mkdir()
    with running_router(env, workdir) as (_router, url):
        open_page(driver, url)
        off = by_id(driver, "am-off")
        until(driver, off.is_displayed, "the view saying model management is off")
        assert "SLM_PULL_API=true" in off.text
        assert not by_id(driver, "am-controls").is_displayed()
