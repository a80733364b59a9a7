"""The app in a real headless Chromium (Debian's chromium driven by Playwright): run, stop, step.

Screenshots go to test-artifacts/ and their paths are printed (pytest -s shows them)."""
import re
import shutil
from pathlib import Path

import pytest

from ui.app_server import DEFAULT_MODEL, ROOT, AppServer

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no Chromium installed (apt-get install chromium)"),
    pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").exists(), reason="the default model is not built"),
]


@pytest.fixture(scope="module")
def page():
    playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    srv = AppServer()
    srv.wait_ready()
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        pg = browser.new_page(viewport={"width": 1600, "height": 2200})
        pg.goto(srv.url)
        pg.wait_for_selector("#run-btn", timeout=60_000)
        yield pg
        browser.close()
    srv.close()


def shot(pg, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    pg.screenshot(path=str(path), full_page=True)
    print(f"\n[screenshot] {path}")
    return path


def set_max_new(pg, n: int) -> None:
    box = pg.locator("#max-new input")
    box.fill(str(n))
    box.press("Tab")


def status_text(pg) -> str:
    return pg.locator("#status").inner_text()


def test_run_fills_both_panes_and_all_four_plots(page):
    set_max_new(page, 500)
    page.click("#run-btn")
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('Done')", timeout=300_000)
    page.wait_for_timeout(1500)
    shot(page, "1-run-500-done")
    ar = page.locator("#ar-text").inner_text()
    fast = page.locator("#ts-text").inner_text()
    assert len(ar) > 500 and len(fast) > 500
    for plot in ("tree-plot", "accepted-plot", "kv-plot", "repetition-plot"):
        assert page.locator(f"#{plot} .js-plotly-plot").count() == 1, plot
    stats = page.locator("#ts-stats").inner_text()
    assert "500 / 500 tokens" in stats and "tok/s" in stats
    assert "Speedup" in page.locator("#summary").inner_text()


def window_listeners(pg, kind: str) -> int:
    """How many `kind` listeners the page's window holds (Chrome DevTools protocol)."""
    cdp = pg.context.new_cdp_session(pg)
    window = cdp.send("Runtime.evaluate", {"expression": "window"})["result"]["objectId"]
    listeners = cdp.send("DOMDebugger.getEventListeners", {"objectId": window})["listeners"]
    cdp.detach()
    count = sum(1 for item in listeners if item["type"] == kind)
    print(f"\n[window {kind} listeners] {count}")
    return count


def test_replaced_plots_are_released(page):
    """Gradio remounts a plot on every update; each plotly plot registers a window resize listener that
    holds it. Without ui/plotly_purge.js a 500-token run leaves one per plot update (hundreds)."""
    plots_on_page = page.evaluate("() => document.querySelectorAll('.js-plotly-plot').length")
    assert plots_on_page == 4
    assert window_listeners(page, "resize") <= 12


def test_stop_stops_a_long_run(page):
    set_max_new(page, 20000)
    page.click("#run-btn")
    page.wait_for_function("() => /Running… TokenSwift [1-9]/.test(document.querySelector('#status').innerText)",
                           timeout=120_000)
    page.wait_for_timeout(1500)
    page.click("#stop-btn")
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('Stopped')", timeout=30_000)
    shot(page, "2-stopped")
    produced = int(re.search(r"TokenSwift ([\d,]+)", status_text(page)).group(1).replace(",", ""))
    assert 0 < produced < 20000


def test_step_runs_one_iteration_at_a_time(page):
    page.click("#step-btn")
    page.wait_for_function("() => document.querySelector('#step-caption').innerText.includes('Iteration 0')",
                           timeout=60_000)
    page.click("#step-btn")
    page.wait_for_function("() => document.querySelector('#step-caption').innerText.includes('Iteration 1')",
                           timeout=60_000)
    shot(page, "3-step")
    table = page.locator("#step-table").inner_text()
    assert "root" in table and ("accepted" in table or "rejected" in table)
