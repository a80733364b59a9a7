"""`bench speed`'s report, made from its results alone: the markdown table, the headline ratios and the chart
(speed.html, and its screenshot speed.png where a Chromium is found). Nothing here runs a model."""
from __future__ import annotations

import shutil
from pathlib import Path

from .speed import NEAR_TIE, OURS, PAIRED, PENALTY_NOTE, PLD, RATIO_KEYS, ratio

BROWSERS = ("chromium", "chromium-browser", "google-chrome")  # looked up on PATH in this order


def _fmt(x: float | None, digits: int = 1) -> str:
    return "–" if x is None or x != x else f"{x:.{digits}f}"


def _lossless_cell(row: dict) -> str:
    parts = []
    for m, short in (("tokenswift-auto", "auto"), ("tokenswift-paper", "paper")):
        if m not in row["lossless"]:
            continue
        c = row["lossless"][m]
        if c["identical"]:
            parts.append(f"{short} =")
        else:
            tie = ""
            if "gaps" in c:
                gaps = ", ".join(f"{g['gap']:.3f} {g['dtype']}" for g in c["gaps"])
                tie = f", {'near-tie' if c['near_tie'] else 'NOT a near-tie'}: gap {gaps}"
            parts.append(f"{short} ≠ @{c['first_diff']}{tie}")
    return "; ".join(parts)


def markdown_table(results: dict) -> str:
    head = ["context", "sampling", "ours-ar", "tokenswift-auto", "tokenswift-paper", "hf-bf16", "hf-fp32",
            "hf-prompt-lookup", "ar / hf-peer (wall)", "auto / ar", "auto / ar (paired)", "paper / ar",
            "auto / PLD (wall)", "ids vs ours-ar"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * 11 + ["---"]) + "|"]
    for row in results["rows"]:
        med = row["medians"]
        cells = [f"{row['context']:,}", row["sampling"]]
        for m in OURS:
            x = med.get(m)
            cell = f"{_fmt(x['tok_s'])} / {_fmt(x['wall_tok_s'])}" if x else "–"
            if x and m != "ours-ar":
                cell += f" ({x['mean_accepted']:.2f}/it)"
            cells.append(cell)
        for m in ("hf-bf16", "hf-fp32"):
            x = med.get(m)
            peer = row["hf_peer"] and row["hf_peer"]["method"] == m
            cells.append(("**" + _fmt(x["wall_tok_s"]) + "**" if peer else _fmt(x["wall_tok_s"])) if x else "–")
        x = med.get(PLD)
        if x is None:
            cells.append("–")
        elif "skipped" in x:
            cells.append("skipped (sampled)")
        else:
            cells.append(f"{_fmt(x['wall_tok_s'])} ({x['dtype'].replace('bfloat16', 'bf16').replace('float32', 'fp32')})")
        r = row["ratios"]
        cells += [_fmt(r[k], 2) for k in ("ours-ar/hf-peer (wall)", "tokenswift-auto/ours-ar",
                                          "tokenswift-auto/ours-ar (paired)", "tokenswift-paper/ours-ar",
                                          "tokenswift-auto/hf-prompt-lookup (wall)")]
        ids = _lossless_cell(row)
        if PAIRED in med and not med[PAIRED]["identical"]:
            ids += "; paired ≠"
        cells.append(ids)
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "tok/s, medians over repeats. Our methods: compute-only tok/s (engine's own compute, prefill excluded) / "
        "wall tok/s (prefill included); TokenSwift adds tokens per iteration. HF columns: wall tok/s including "
        "prefill (bold: hf-peer, the faster dtype). `ar / hf-peer` and `auto / PLD` compare wall times "
        "(both sides include prefill); `auto / ar` and `paper / ar` compare compute-only tok/s. `auto / ar (paired)`: "
        "the median over repeats of auto / AR with both advanced in turn in one run (the host's drift hits both alike).",
        f"Penalty rows: {PENALTY_NOTE}. Ids: `=` identical to ours-ar in every repeat, `≠ @i` first differing "
        f"position, with the top-2 logit gap of AR's logits there after the penalty (near-tie below {NEAR_TIE}).",
    ]
    return "\n".join(lines)


def speed_figure(results: dict):
    import plotly.graph_objects as go

    labels = [f"{r['context']:,} · {r['sampling']}" for r in results["rows"]]
    series = [("tokenswift-auto (compute)", "tokenswift-auto/ours-ar"),
              ("tokenswift-auto (paired)", "tokenswift-auto/ours-ar (paired)"),
              ("tokenswift-paper (compute)", "tokenswift-paper/ours-ar"),
              ("hf-peer (wall)", "ours-ar/hf-peer (wall)"),
              ("hf-prompt-lookup (wall)", None)]
    fig = go.Figure()
    for name, key in series:
        ys = []
        for r in results["rows"]:
            if key == "ours-ar/hf-peer (wall)":
                v = r["ratios"][key]
                ys.append(1 / v if v else None)
            elif key is None:  # PLD vs ours-ar, wall
                pld = r["medians"].get(PLD, {}).get("wall_tok_s")
                ys.append(ratio(pld, r["medians"]["ours-ar"]["wall_tok_s"]))
            else:
                ys.append(r["ratios"][key])
        fig.add_bar(name=name, x=labels, y=ys, text=[_fmt(y, 2) if y is not None else "" for y in ys],
                    textposition="outside")
    c = results.get("conditions", {})
    fig.add_hline(y=1.0, line_dash="dash", line_color="gray", annotation_text="ours-ar = 1")
    fig.update_layout(
        title=(f"Speed vs ours-ar ({c.get('new_tokens', '?')} new tokens, {c.get('threads', '?')} thread(s), "
               f"{c.get('model', '')}): TokenSwift over compute-only time, HF over wall time incl. prefill"),
        barmode="group", yaxis_title="speedup vs ours-ar (x)", xaxis_title="context tokens · sampling",
        width=1200, height=600, template="plotly_white", legend=dict(orientation="h", y=-0.2))
    return fig


def find_browser(given: str | None = None) -> tuple[str | None, str]:
    """The Chromium to screenshot the chart with: `given` (a path or a name on PATH), else the first of BROWSERS
    on PATH. Returns (its path, "") or (None, why none was found)."""
    if given is not None:
        found = shutil.which(given)
        return (found, "") if found else (None, f"--browser {given!r} is not an executable file or a program on PATH")
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found, ""
    return None, (f"no Chromium on PATH (looked for {', '.join(BROWSERS)}); install one (apt-get install -y chromium) "
                  f"or give its path with --browser")


def write_png(fig, out_dir: Path, browser: str | None = None) -> str:
    """speed.html (plotly, offline) and its screenshot speed.png, taken by Playwright in `browser` (see
    `find_browser`). Returns a line saying what happened."""
    html = out_dir / "speed.html"
    fig.write_html(str(html), include_plotlyjs=True, full_html=True)
    chromium, why = find_browser(browser)
    if chromium is None:
        return f"speed.png skipped: {why}; the chart is in {html}"
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 700})
                page.goto(html.resolve().as_uri())
                page.wait_for_selector(".plotly-graph-div .main-svg", timeout=30_000)
                page.locator(".plotly-graph-div").first.screenshot(path=str(out_dir / "speed.png"))
            finally:
                browser.close()
    except Exception as e:  # noqa: BLE001 - a chart must not cost the numbers
        return f"speed.png skipped: {type(e).__name__}: {e}; the chart is in {html}"
    return f"wrote {out_dir / 'speed.png'}"


def headline(results: dict) -> list[str]:
    out = []
    for row in results["rows"]:
        r = row["ratios"]
        parts = [f"{k} {_fmt(r[k], 2)}x" for k in RATIO_KEYS[:5] if r[k] is not None]
        out.append(f"{row['context']:,} {row['sampling']}: " + ", ".join(parts))
        for note in row["notes"]:
            if note != PENALTY_NOTE:
                out.append(f"    note: {note}")
    return out
