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
    pytest.mark.slow,
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


# The status line's text without a progress overlay's timer ("0.4s", "processing | 1.2s", "queue: 1/1 | 0.1s") that
# Gradio may lay over it while an event that writes to it is pending or queued (seen: the queue's, read by the
# clean-clone CI between a lesson's wait for "Done" and its check).
STATUS_JS = """() => document.querySelector('#status').innerText.split('\\n')
    .filter(l => !/^\\s*(processing\\s*\\||queue:\\s*[\\d/]+\\s*\\|)?\\s*[\\d./]+s\\s*$/i.test(l)).join('\\n').trim()"""


def status_text(pg) -> str:
    return pg.evaluate(STATUS_JS)


def element_shot(pg, selector: str, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    pg.locator(selector).screenshot(path=str(path))
    print(f"\n[screenshot] {path}")
    return path


# Walks a pane's text character by character (Range.getBoundingClientRect) and reports each place where a
# line box ends: the text just before and after it (collapsed spaces included), whether a paragraph element
# lies between, and how far the ended line reached across the pane. A word is broken where a line ends
# between two letters or digits of one paragraph.
LINE_BREAKS_JS = """(selector) => {
  const root = document.querySelector(selector + ' .prose');
  const box = root.getBoundingClientRect();
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT | NodeFilter.SHOW_ELEMENT);
  const breaks = [];
  let bottom = null, para = false, lineRight = 0, lines = 1, chars = 0, before = '', node;
  while ((node = walker.nextNode())) {
    if (node.nodeType === 1) { if (node.classList.contains('para')) para = true; continue; }
    const text = node.textContent;
    for (let i = 0; i < text.length; i++) {
      const range = document.createRange();
      range.setStart(node, i); range.setEnd(node, i + 1);
      const rect = range.getBoundingClientRect();
      if (rect.width || rect.height) {  // not a collapsed space
        chars++;
        if (bottom !== null && rect.top >= bottom - 1) {
          lines++;
          breaks.push({before: before.slice(-12), after: text.slice(i, i + 12), para,
                       fill: (lineRight - box.left) / box.width});
          lineRight = 0;
        }
        lineRight = Math.max(lineRight, rect.right);
        bottom = rect.bottom;
        para = false;
      }
      before += text[i];
    }
  }
  return {lines, chars, breaks, text: root.textContent,
          style: getComputedStyle(root).wordBreak + ' ' + getComputedStyle(root).overflowWrap};
}"""


def broken_words(layout: dict) -> list[str]:
    word = re.compile(r"\w")
    return [b["before"] + "|" + b["after"] for b in layout["breaks"]
            if not b["para"] and word.match(b["before"][-1:]) and word.match(b["after"][:1])]


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


def test_panes_read_as_paragraphs_with_no_word_broken(page):
    """After the 500-token run: the model's hard line breaks are gone (the text reflows to the pane's width),
    and no line box ends inside a word, in either pane."""
    for pane in ("ar-text", "ts-text"):
        element_shot(page, f"#{pane}", f"1-{pane}")
        layout = page.evaluate(LINE_BREAKS_JS, f"#{pane}")
        inner = [b["fill"] for b in layout["breaks"] if not b["para"]]  # lines that end inside a paragraph
        fill = sorted(inner)[len(inner) // 2]
        print(f"\n[{pane}] {layout['chars']} characters, {layout['lines']} lines, median fill {fill:.2f}, "
              f"{layout['style']}")
        assert layout["lines"] > 15 and "\n" not in layout["text"]
        assert layout["style"].split()[0] == "normal"
        assert broken_words(layout) == []
        assert fill > 0.85  # reflowed: lines fill the pane instead of stopping at the model's ~70 characters
    assert page.locator("#ts-text .src-bonus").count() > 0 and page.locator("#legend .src-ngram").count() == 1
    # Negative control: the same measurement finds the breaks that `word-break: break-all` makes.
    page.evaluate("""() => { const style = document.createElement('style'); style.id = 'control';
        style.textContent = '#ts-text .prose, #ts-text .prose * {word-break: break-all !important;}';
        document.head.appendChild(style); }""")
    assert len(broken_words(page.evaluate(LINE_BREAKS_JS, "#ts-text"))) > 3
    page.evaluate("() => document.getElementById('control').remove()")


def test_heatmap_and_speed_panel_after_500_tokens(page):
    element_shot(page, "#repetition-plot", "1-repetition")
    sides = page.evaluate("""() => document.querySelector('#repetition-plot .js-plotly-plot').data
                             .filter(t => t.type === 'heatmap').map(t => [t.z.length, t.z[0].length])""")
    assert len(sides) == 2 and all(rows >= 8 and cols >= 8 for rows, cols in sides), sides
    element_shot(page, "#speed", "1-speed")
    panel = page.locator("#speed").inner_text()
    assert "The ratio" in panel and "AR-step costs per iteration" in panel and "drafted nodes" in panel
    assert re.search(r"= \d+\.\d\dx", panel)


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


def wait_status(pg, pattern: str, timeout: int = 120_000) -> str:
    """Wait until the status line matches the regular expression `pattern` (or says an error); returns it."""
    pg.wait_for_function("(p) => { const s = (" + STATUS_JS + ")(); "
                         "return new RegExp(p).test(s) || /rror/.test(s); }", arg=pattern, timeout=timeout)
    text = status_text(pg)
    assert re.search(pattern, text), text
    return text


def step_once(pg, iteration: int | None = None) -> int:
    """Press Step and wait for its answer; returns the iteration it ran (checked against `iteration` if given)."""
    was = re.search(r"iteration (\d+) done", status_text(pg))  # the status may still show the previous Step's
    pg.click("#step-btn")
    pg.wait_for_function("(old) => { const s = (" + STATUS_JS + ")(); const m = s.match(/iteration (\\d+) done/); "
                         "return (m && m[1] !== old) || /rror/.test(s); }", arg=was.group(1) if was else "",
                         timeout=120_000)
    found = re.search(r"iteration (\d+) done", status_text(pg))
    assert found is not None, status_text(pg)
    done = int(found.group(1))
    assert iteration is None or done == iteration, status_text(pg)
    pg.wait_for_function(f"() => (document.querySelector('#step-caption') || {{innerText: ''}}).innerText"
                         f".includes('Iteration {done} ')", timeout=30_000)
    return done


def test_step_runs_one_iteration_at_a_time(page):
    step_once(page, 0)
    step_once(page, 1)
    shot(page, "3-step")
    table = page.locator("#step-table").inner_text()
    assert "start" in table and ("accepted" in table or "rejected" in table)


def open_accordion(pg, name: str) -> None:
    """Open (or close) the accordion `name`: its header is a button named `name` and an arrow."""
    pg.get_by_role("button", name=re.compile("^" + re.escape(name) + " ")).click()


def choose_tree(pg, name: str) -> None:
    tree = pg.get_by_label("Draft tree preset")
    tree.click()
    tree.fill(name)
    pg.get_by_role("option", name=name, exact=True).click()


def test_step_under_fused_drafting_says_so(page):
    open_accordion(page, "Drafting")
    choose_tree(page, "paper")
    page.get_by_label("fused").check()  # editable once the tree is not auto (auto decides the drafting itself)
    for it in (0, 1):
        step_once(page, it)
    caption = page.locator("#step-caption").inner_text()
    element_shot(page, "#step-caption", "3-step-fused-caption")
    assert "no draft forward (fused drafting)" in caption and "partial KV cache (" not in caption
    open_accordion(page, "Drafting")  # closed again


def test_case_study_presets_set_the_controls(page):
    expect = pytest.importorskip("playwright.sync_api").expect
    open_accordion(page, "Case studies")
    page.get_by_text("Contextual penalty", exact=True).click()  # the accordion
    penalty = page.get_by_label("Penalise tokens of the last W tokens")
    page.get_by_role("button", name="Repetition: penalty off").click()
    expect(penalty).not_to_be_checked()
    expect(page.locator("#max-new input")).to_have_value("1500")
    assert page.locator("#prompt textarea").input_value().startswith("And it came to pass")
    page.get_by_role("button", name="Repetition: penalty on (θ 1.2, W 1024)").click()
    expect(penalty).to_be_checked()


# ---- Classroom II: a page that tells the truth about what produced it ----------------------------------------
# For each word of each step-table header cell: whether its characters lie on more than one line (a word broken).
BROKEN_HEADER_WORDS_JS = """() => {
  const broken = [];
  for (const th of document.querySelectorAll('#step-table th')) {
    const node = th.firstChild;
    if (!node) continue;
    const text = node.textContent;
    for (const m of text.matchAll(/\\S+/g)) {
      const range = document.createRange();
      range.setStart(node, m.index); range.setEnd(node, m.index + m[0].length);
      const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
      if (tops.size > 1) broken.push(m[0]);
    }
  }
  return broken;
}"""
TABLE_ROWS_JS = """() => [...document.querySelectorAll('#step-table tbody tr')].map(
    tr => [...tr.querySelectorAll('td')].map(td => td.textContent))"""


def control_value(pg, elem_id: str) -> str:
    return pg.locator(f"#{elem_id} input").first.input_value()


def test_a_step_explains_itself_beside_the_step_button_in_a_table_that_reads_right(page):
    """At 1500x1100, the explanation is on screen together with the Step button (no scrolling); no header word is
    broken; in every row the verdict agrees with the draw in the same row."""
    page.set_viewport_size({"width": 1500, "height": 1100})
    try:
        page.evaluate("() => window.scrollTo(0, 0)")
        step_once(page)
        page.locator("#step-btn").scroll_into_view_if_needed()
        path = ARTIFACTS / "4-step-1500x1100.png"
        page.screenshot(path=str(path))  # the viewport only: what the student sees after pressing Step
        print(f"\n[screenshot] {path}")
        button, caption = page.locator("#step-btn").bounding_box(), page.locator("#step-caption").bounding_box()
        assert 0 <= button["y"] and button["y"] + button["height"] <= 1100
        assert 0 <= caption["y"] and caption["y"] + 120 <= 1100  # its first lines are on screen beside the button
        assert page.evaluate(BROKEN_HEADER_WORDS_JS) == []
        rows = page.evaluate(TABLE_ROWS_JS)
        header = page.evaluate("() => [...document.querySelectorAll('#step-table th')].map(th => th.textContent)")
        col = {name: k for k, name in enumerate(header)}
        judged = [r for r in rows if r[col["verdict"]] in ("✓ accepted", "✗ rejected")]
        assert judged, rows
        for r in judged:
            agree = r[col["the target drew there"]] == r[col["token"]]
            assert agree == (r[col["verdict"]] == "✓ accepted"), r
            assert "«" + r[col["the target drew there"]] + "»" in r[col["why"]], r
        element_shot(page, "#step-view", "4-step-view")
    finally:
        page.set_viewport_size({"width": 1600, "height": 2200})


def test_a_run_after_a_step_clears_the_step_view_and_says_what_produced_the_page(page):
    assert page.locator("#step-caption").is_visible()
    set_max_new(page, 150)
    page.click("#run-btn")
    wait_status(page, r"^Done: 150 tokens each", timeout=300_000)
    assert not page.locator("#step-view").is_visible() and page.locator("#step-caption").count() == 0
    provenance = page.locator("#provenance").inner_text()
    assert "a Run started by this page" in provenance and "150 new tokens" in provenance
    assert "tree paper" in provenance  # Step had turned auto into the paper's tree, and the control says so
    assert "step mode" not in page.locator("#ar-stats").inner_text() + page.locator("#ts-stats").inner_text()
    shot(page, "5-run-after-step")


def test_load_restores_every_control_and_says_it_is_a_replay(page, tmp_path):
    expect = pytest.importorskip("playwright.sync_api").expect
    page.get_by_label("Greedy (temperature 0)").uncheck()
    for elem_id, value in (("temperature", "0.7"), ("seed", "5")):
        box = page.locator(f"#{elem_id} input").first
        box.fill(value)
        box.press("Tab")
    set_max_new(page, 120)
    page.click("#run-btn")
    wait_status(page, r"^Done: 120 tokens each", timeout=300_000)
    prompt = page.locator("#prompt textarea").input_value()
    with page.expect_download() as download:
        page.click("#export-btn")
        page.locator("#export-file a").first.click(timeout=60_000)
    saved = tmp_path / "run.json"
    download.value.save_as(saved)
    preset = page.get_by_role("button", name="Repetition: penalty off")
    if not preset.is_visible():
        open_accordion(page, "Case studies")
    preset.click()  # other controls, and the views cleared
    expect(page.locator("#max-new input")).to_have_value("1500")
    assert "nothing yet" in page.locator("#provenance").inner_text()
    with page.expect_file_chooser() as chooser:
        page.click("#replay-btn")
    chooser.value.set_files(str(saved))
    wait_status(page, r"^Replay of a saved run", timeout=120_000)
    shot(page, "6-after-load")
    expect(page.locator("#max-new input")).to_have_value("120")
    assert page.locator("#prompt textarea").input_value() == prompt
    expect(page.get_by_label("Greedy (temperature 0)")).not_to_be_checked()
    assert float(control_value(page, "temperature")) == pytest.approx(0.7)
    assert control_value(page, "seed") == "5"
    page.wait_for_timeout(1000)
    for elem_id in ("temperature", "seed"):  # sampled: neither is ignored (a stale note once said so)
        assert "ignored" not in page.locator(f"#{elem_id}").inner_text(), elem_id
        assert page.locator(f"#{elem_id} input").first.is_enabled(), elem_id
    assert "a replay of a saved run" in page.locator("#provenance").inner_text()
    assert "120 / 120 tokens" in page.locator("#ts-stats").inner_text()


def test_each_lesson_runs_from_one_click(page):
    from ui.lessons import LESSONS, RUN

    expect = pytest.importorskip("playwright.sync_api").expect
    for k, (title, lesson) in enumerate(LESSONS.items(), start=1):
        page.get_by_role("button", name=title).click()
        if lesson.action == RUN:
            status = wait_status(page, r"^(Running|Done|TokenSwift finished|AR finished)", timeout=120_000)
            page.wait_for_timeout(1500)
            shot(page, f"7-lesson-{k}-running")
            if not status_text(page).startswith("Done"):
                page.click("#stop-btn")
            # a run that ended between the check and the click leaves Stop nothing to stop (seen on a fast host)
            status = wait_status(page, r"^(Done|Stopped|Nothing is running)", timeout=120_000)
            assert "a Run started by this page" in page.locator("#provenance").inner_text()
        else:
            status = wait_status(page, "iteration 0 done")
            expect(page.locator("#step-caption")).to_contain_text("Iteration 0")
            assert page.locator("#step-table tbody tr").count() >= 2
            shot(page, f"7-lesson-{k}-step")
        assert page.locator("#lesson").inner_text().startswith(f"Lesson {k}"), status
        expect(page.locator("#max-new input")).to_have_value(str(lesson.values()["max_new"]))
        greedy = page.get_by_label("Greedy (temperature 0)")
        (expect(greedy).to_be_checked if lesson.values()["greedy"] else expect(greedy).not_to_be_checked)()
        assert page.locator("#prompt textarea").input_value() == lesson.values()["prompt"]


def test_auto_greys_out_the_controls_it_decides(page):
    if not page.locator("#kv-mode").is_visible():
        open_accordion(page, "Drafting")
    choose_tree(page, "auto")
    page.wait_for_timeout(500)
    for elem_id in ("draft", "kv-mode"):
        assert page.locator(f"#{elem_id} input").first.is_disabled(), elem_id
    assert "decided by tree=auto" in page.locator("#kv-mode").inner_text()
    element_shot(page, "#kv-mode", "8-auto-greys-kv-mode")
    choose_tree(page, "paper")
    page.wait_for_timeout(500)
    assert page.locator("#draft input").first.is_enabled()
