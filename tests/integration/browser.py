"""Headless chromium driven by selenium, for the dashboard's test and benchmark: Debian's
``chromium`` and ``chromium-driver`` (``scripts/setup.sh --for-tests`` installs them),
or the binaries ``SLM_CHROMIUM`` and ``SLM_CHROMEDRIVER`` name, or the ones on PATH."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

ARGUMENTS = (
    "--headless=new",
    "--no-sandbox",  # as root in a container there is no user namespace to use
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--window-size=1500,1100",
    "--no-first-run",
    "--disable-extensions",
)


class BrowserMissing(Exception):
    """chromium or chromedriver is not installed."""


def browser_paths() -> tuple[str, str]:
    """chromium and chromedriver, or :class:`BrowserMissing` saying which is missing."""
    found = []
    for variable, debian, names in (
        (
            "SLM_CHROMIUM",
            "/usr/bin/chromium",
            ("chromium", "chromium-browser", "google-chrome", "chrome"),
        ),
        ("SLM_CHROMEDRIVER", "/usr/bin/chromedriver", ("chromedriver",)),
    ):
        candidates = [os.environ.get(variable), debian, *map(shutil.which, names)]
        path = next((c for c in candidates if c and os.access(c, os.X_OK)), None)
        if path is None:
            raise BrowserMissing(
                f"{debian} not found (nor {variable}): scripts/setup.sh --for-tests installs it"
            )
        found.append(path)
    return found[0], found[1]


@contextmanager
def headless_chromium() -> Iterator[webdriver.Chrome]:
    """A headless chromium, quit afterwards."""
    binary, driver_path = browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ARGUMENTS:
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()


@contextmanager
def chromium_for_a_test() -> Iterator[webdriver.Chrome]:
    """:func:`headless_chromium` for a test: a failure on Linux when it is missing
    (scripts/setup.sh --for-tests installs it there), a skip elsewhere."""
    try:
        browser_paths()
    except BrowserMissing as missing:
        if sys.platform.startswith("linux"):
            pytest.fail(str(missing))
        pytest.skip(str(missing))
    with headless_chromium() as driver:
        yield driver


__all__ = ["BrowserMissing", "browser_paths", "chromium_for_a_test", "headless_chromium"]
