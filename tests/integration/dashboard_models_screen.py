"""The screenshot of the dashboard's "Add a model" view in docs/: the real launcher and
router (a fake llama-server behind them) with ``SLM_PULL_API=true``, the hub stand-in
serving the default repositories (the project's own Gemma 3 file), SmolLM2's file in the
models folder; Gemma pulled from the page with "add to the registry" ticked, then the
view once the list shows it served.

    uv run python -m tests.integration.dashboard_models_screen docs/

Not a test: it writes ``dashboard-models.png`` into the folder given (a few seconds)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from selenium.webdriver.common.by import By

from tests.fakes.hub_control import DEFAULT_HF_REPOS, SMOLLM2_GGUF, HubStandin
from tests.integration import dashboard_views as views
from tests.integration.browser import headless_chromium
from tests.integration.watched import fake_entry, watched

REFERENCE = "ggml-org/gemma-3-270m-GGUF:Q4_K_M"


def shoot(folder: Path, tmp: Path) -> Path:
    models_dir = tmp / "models"
    (models_dir / "HuggingFaceTB").mkdir(parents=True)
    (models_dir / "HuggingFaceTB" / SMOLLM2_GGUF.name).symlink_to(SMOLLM2_GGUF)
    home = tmp / "home"  # nothing of this machine's own stores
    chat = fake_entry(tmp, "chat", id="smollm2-135m-instruct")
    with (
        HubStandin.start(tmp / "hub", hf=DEFAULT_HF_REPOS) as hub,
        watched(
            tmp,
            {"chat": chat},
            SLM_PULL_API="true",
            SLM_MODELS_DIR=str(models_dir),
            HF_ENDPOINT=hub.hf_endpoint,
            HOME=str(home),
            HF_HOME=str(home / "hf"),
            HF_TOKEN="",
            OLLAMA_MODELS=str(home / "ollama"),
            LLAMA_CACHE=str(home / "llama.cpp"),
            XDG_CACHE_HOME=str(home / "cache"),
        ) as stack,
        headless_chromium() as driver,
    ):
        driver.set_window_size(1400, 1000)
        driver.get(f"{stack.url}/ui")
        rows = "#am-local tbody tr[data-name]"
        views.until(driver, lambda: driver.find_elements(By.CSS_SELECTOR, rows), "the list")
        driver.find_element(By.ID, "am-reference").send_keys(REFERENCE)
        driver.find_element(By.ID, "am-add").click()
        driver.find_element(By.ID, "am-pull").click()
        state = driver.find_element(By.ID, "am-state")
        views.until(driver, lambda: state.text == "done", "the pull done", 120)
        views.until(
            driver,
            lambda: any(
                r.get_attribute("data-served") for r in driver.find_elements(By.CSS_SELECTOR, rows)
            ),
            "the pulled model listed as served",
        )
        path = folder / "dashboard-models.png"
        driver.find_element(By.ID, "add-model").screenshot(str(path))
    return path


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "docs")
    with tempfile.TemporaryDirectory(prefix="slm-models-screen-") as tmp:
        print(shoot(folder, Path(tmp)))


if __name__ == "__main__":
    main()
