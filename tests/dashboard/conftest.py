"""Fixtures of the dashboard tests: a real server on loopback (the server tests' helpers) and, for the
browser tests, Debian's Chromium driven by Playwright through its executable path (Playwright's own
browser download is never used). Without Chromium the browser tests skip, except in CI (`CI` set), where
they must run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))  # server_helpers, fl_helpers

from server_helpers import LiveServer, config_for_tests, running_live_server  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-dev-shm-usage", "--disable-component-update", "--no-first-run"]


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[LiveServer]:
    with running_live_server(config_for_tests(tmp_path)) as server:
        yield server


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """Debian's Chromium under Playwright, once per session."""
    if not CHROMIUM.exists() and not os.environ.get("CI"):
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian's `chromium` package; .ci/run installs it); in CI these "
                    "tests run")
    from playwright.sync_api import sync_playwright  # the dev extra

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@dataclass
class WatchedPage:
    """A browser tab plus everything it requested and every console or page error it logged."""

    page: Any
    base_url: str
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def log_in(self, token: str) -> None:
        self.page.goto(f"{self.base_url}/ui/login")
        self.page.fill("input[name=token]", token)
        self.page.click("#login-form button[type=submit]")
        self.page.wait_for_load_state()

    def open(self, path: str) -> Any:
        response = self.page.goto(f"{self.base_url}{path}")
        self.page.wait_for_load_state("networkidle")
        return response

    def chart_data(self, chart_id: str) -> list[list[Any]]:
        """Every dataset's data as Chart.js holds it."""
        return self.page.evaluate(f"Chart.getChart('{chart_id}').data.datasets.map(d => d.data)")

    def column(self, selector: str) -> list[str]:
        return [text.strip() for text in self.page.locator(selector).all_inner_texts()]

    def assert_clean(self, expected_errors: tuple[str, ...] = ()) -> None:
        """Nothing was fetched from another origin and nothing but `expected_errors` went to the console."""
        origin = urlsplit(self.base_url).netloc
        foreign = [url for url in self.requests if not url.startswith("data:") and urlsplit(url).netloc != origin]
        assert foreign == [] and self.errors == list(expected_errors)


@pytest.fixture
def browser_page(chromium: Any, live_server: LiveServer) -> Iterator[WatchedPage]:
    context = chromium.new_context()
    page = context.new_page()
    watched = WatchedPage(page, live_server.base_url)
    page.on("request", lambda request: watched.requests.append(request.url))
    page.on("console", lambda message: watched.errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: watched.errors.append(str(error)))
    yield watched
    context.close()

