"""Measure the app as a user runs it: generation speed with the UI streaming vs headless, page
responsiveness during a long run, and the server's memory.

    python -m ui.measure --tokens 2000            # speed: UI vs headless, same settings, same alternation
    python -m ui.measure --tokens 20000 --probe --no-headless   # click round-trips and memory during a long run
    python -m ui.measure --tokens 2000 --client stream   # the server's streaming cost without a local browser
    python -m ui.measure --tokens 500 --breakdown 0 1 2 3   # headless, per seed: where TokenSwift's time goes

Needs Debian's chromium and playwright. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from ui.app_server import AppServer  # noqa: E402

from tokenswift import Generator  # noqa: E402
from tokenswift.kinds import Method  # noqa: E402
from tokenswift.memory import child_pids, proportional_mb, resident_mb  # noqa: E402
from ui.controls import EXAMPLE_PROMPTS, default_controls, page_model  # noqa: E402
from tokenswift.serve.models import ModelCache  # noqa: E402
from tokenswift.serve.runner import RunRequest, interleave  # noqa: E402
from tokenswift.serve.torch_thread import TORCH  # noqa: E402

JS_HEAP = "() => performance.memory.usedJSHeapSize"
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def engine_mb(server_pid: int) -> float:
    """Resident memory of the server's engine process (0 when the engine runs in the server's process)."""
    return sum(resident_mb(c) for c in child_pids(server_pid))


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = child_pids(todo.pop())
        out += kids
        todo += kids
    return out


def browser_mb() -> dict[str, float]:
    """Memory of this process's Chromium processes: their summed proportional set size (what they take
    together) and the largest single process's."""
    sizes = []
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if "chrom" in f.read():
                    sizes.append(proportional_mb(pid))
        except OSError:
            pass
    return {"total": round(sum(sizes), 1), "largest": round(max(sizes or [0]), 1)}


def ui_defaults(tokens: int):
    """The controls as the page starts (the layout's defaults), with the given token count."""
    return default_controls(next(iter(EXAMPLE_PROMPTS.values())), page_model(ModelCache().models), max_new=tokens)


def headless(tokens: int) -> dict:
    """The same run without any UI: the runner's alternation on the process's single torch thread."""
    controls = ui_defaults(tokens)
    gen: Generator = ModelCache().get(controls.model)

    def run() -> dict:
        last = {}
        t = time.perf_counter()
        for step in interleave(gen, RunRequest(controls.prompt, controls.settings, tokens, controls.seed),
                               threading.Event()):
            last[step.method] = step
        return {"wall_s": round(time.perf_counter() - t, 1),
                **{f"{m}_tok_s": round(s.generated / s.elapsed_s, 1) for m, s in last.items()}}

    return TORCH.call(run)


def iteration_breakdown(steps: list, ar_step_s: float) -> dict:
    """TokenSwift's iterations split into plain ones (nothing drafted: an AR-cost step) and drafted ones: for each,
    its share of the iterations, the mean drafted nodes and tokens, and the mean draft / verify / bookkeeping time
    in AR steps of `ar_step_s` seconds, with the tokens per AR step that kind of iteration yields."""
    kinds = {"plain": [s for s in steps if s.draft_nodes == 0], "drafted": [s for s in steps if s.draft_nodes > 0]}
    out = {}
    for name, group in kinds.items():
        if not group:
            continue
        n = len(group)
        part = {f"{f}_steps": sum(getattr(s.timings, f"{f}_s") for s in group) / n / ar_step_s
                for f in ("draft", "verify", "bookkeeping")}
        total = sum(part.values())
        tokens = sum(len(s.tokens) for s in group) / n
        out[name] = {"share": round(n / len(steps), 3), "nodes": round(sum(s.draft_nodes for s in group) / n, 2),
                     "tokens": round(tokens, 3), **{k: round(v, 3) for k, v in part.items()},
                     "total_steps": round(total, 3), "tokens_per_step": round(tokens / total, 3)}
    return out


def breakdown(tokens: int, seeds: list[int]) -> dict:
    """The page's default Run without a UI (the runner's alternation, per-node detail on as the app asks), per seed:
    auto / AR and `iteration_breakdown` against AR's median step."""
    controls = ui_defaults(tokens)
    gen: Generator = ModelCache().get(controls.model)

    def run(seed: int) -> dict:
        last, ts_steps, ar_s = {}, [], []
        for step in interleave(gen, RunRequest(controls.prompt, controls.settings, tokens, seed), threading.Event()):
            last[step.method] = step
            if step.method == Method.AR:
                ar_s.append(step.timings.total_s)
            else:
                ts_steps.append(step)
        ts, ar = last[Method.TOKENSWIFT], last[Method.AR]
        ratio = (ts.generated / ts.elapsed_s) / (ar.generated / ar.elapsed_s)
        return {"seed": seed, "auto_over_ar": round(ratio, 3), "ar_step_ms": round(statistics.median(ar_s) * 1e3, 3),
                **iteration_breakdown(ts_steps, statistics.median(ar_s))}

    return {"tokens": tokens, "runs": [TORCH.call(run, seed) for seed in seeds]}


def through_ui(tokens: int, probe: bool) -> dict:
    from playwright.sync_api import sync_playwright

    srv = AppServer()
    srv.wait_ready()
    out: dict = {"rss_mb_idle": round(resident_mb(srv.proc.pid), 1)}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=LAUNCH_ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 2000})
            page.goto(srv.url)
            page.wait_for_selector("#run-btn", timeout=60_000)
            box = page.locator("#max-new input")
            box.fill(str(tokens))
            box.press("Tab")
            t = time.perf_counter()
            page.click("#run-btn")
            clicks, rss, engine_rss = [], [], []
            progress_path = ROOT / "test-artifacts" / f"measure-{tokens}-progress.jsonl"  # survives an aborted run
            progress = progress_path.open("w")
            while "Done" not in page.locator("#status").inner_text():
                if time.perf_counter() - t > 3 * 3600:
                    raise TimeoutError("the run did not finish in three hours")
                time.sleep(2.0)
                rss.append(resident_mb(srv.proc.pid))
                engine_rss.append(engine_mb(srv.proc.pid))
                if probe:  # a user click during the run: how long until the page answers?
                    c = time.perf_counter()
                    page.locator("#tree-pick input").fill("-1")
                    page.evaluate("() => document.querySelector('#summary').innerText.length")
                    clicks.append(time.perf_counter() - c)
                progress.write(json.dumps({"s": round(time.perf_counter() - t, 1), "server_rss_mb": round(rss[-1], 1),
                                           "engine_rss_mb": round(engine_rss[-1], 1),
                                           "browser_pss_mb": browser_mb(),
                                           "page_js_heap_mb": round(page.evaluate(JS_HEAP) / 2**20, 1),
                                           "click_ms": round(1000 * clicks[-1], 1) if clicks else None,
                                           "status": page.locator("#status").inner_text()[:120]}) + "\n")
                progress.flush()
            progress.close()
            out["wall_s"] = round(time.perf_counter() - t, 1)
            for method, sel in ((Method.AR, "#ar-stats"), (Method.TOKENSWIFT, "#ts-stats")):
                text = page.locator(sel).inner_text()
                out[f"{method}_tok_s"] = float(re.search(r"([\d,.]+) tok/s", text).group(1).replace(",", ""))
            out["rss_mb_peak"] = round(max(rss or [0]), 1)
            out["rss_mb_end"] = round(resident_mb(srv.proc.pid), 1)
            out["engine_rss_mb_peak"] = round(max(engine_rss or [0]), 1)
            out["engine_rss_mb_end"] = round(engine_mb(srv.proc.pid), 1)
            out["page_js_heap_mb"] = round(page.evaluate(JS_HEAP) / 2**20, 1)
            out["browser_pss_mb_end"] = browser_mb()
            out["page_dom_nodes"] = page.evaluate("() => document.getElementsByTagName('*').length")
            if clicks:
                out["page_probe_ms_median"] = round(1000 * sorted(clicks)[len(clicks) // 2], 1)
                out["page_probe_ms_max"] = round(1000 * max(clicks), 1)
            page.screenshot(path=str(ROOT / "test-artifacts" / f"measure-{tokens}.png"), full_page=True)
            browser.close()
    finally:
        srv.close()
    return out


def through_server(tokens: int) -> dict:
    """The Run button's event driven over Gradio's own queue protocol (what the page sends), with a client
    that reads the stream and renders nothing: the server's whole streaming cost, without a browser
    competing for the same cores (as when the page is opened from another machine)."""
    import httpx

    srv = AppServer()
    srv.wait_ready()
    out: dict = {"rss_mb_idle": round(resident_mb(srv.proc.pid), 1)}
    try:
        config = httpx.get(srv.url + "config", timeout=30).json()
        by_elem = {c.get("props", {}).get("elem_id"): c for c in config["components"]}
        run_id, max_new_id = by_elem["run-btn"]["id"], by_elem["max-new"]["id"]
        index, dep = next((i, d) for i, d in enumerate(config["dependencies"]) if [run_id, "click"] in d["targets"])
        values = {c["id"]: c.get("props", {}).get("value") for c in config["components"]}
        data = [tokens if cid == max_new_id else values[cid] for cid in dep["inputs"]]
        session = f"measure{int(time.time())}"
        api = srv.url + "gradio_api/queue/"
        t = time.perf_counter()
        httpx.post(api + "join", json={"data": data, "fn_index": index, "session_hash": session,
                                       "event_data": None, "trigger_id": run_id}, timeout=30).raise_for_status()
        messages, received, rss = 0, 0, []
        with httpx.stream("GET", api + "data", params={"session_hash": session}, timeout=None) as stream:
            for line in stream.iter_lines():
                received += len(line)
                if line.startswith("data:"):
                    messages += 1
                    if messages % 20 == 0:
                        rss.append(resident_mb(srv.proc.pid))
                    if '"process_completed"' in line[:200]:
                        final = line
                        break
        out["wall_s"] = round(time.perf_counter() - t, 1)
        out["messages"], out["mb_received"] = messages, round(received / 2**20, 1)
        for method, label in ((Method.AR, "AR"), (Method.TOKENSWIFT, "TokenSwift")):
            found = re.search(r"\*\*" + label + r"\*\* · [\d,]+ / [\d,]+ tokens · \*\*([\d,.]+) tok/s", final)
            out[f"{method}_tok_s"] = float(found.group(1).replace(",", "")) if found else None
        out["rss_mb_peak"] = round(max(rss or [0]), 1)
        out["rss_mb_end"] = round(resident_mb(srv.proc.pid), 1)
        out["engine_rss_mb_end"] = round(engine_mb(srv.proc.pid), 1)
    finally:
        srv.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ui.measure")
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--probe", action="store_true")
    p.add_argument("--no-headless", action="store_true", help="skip the headless reference run (long runs)")
    p.add_argument("--client", choices=["browser", "stream"], default="browser",
                   help="browser: headless Chromium on this machine; stream: a non-rendering client of the same event")
    p.add_argument("--breakdown", type=int, nargs="+", metavar="SEED",
                   help="only the headless run of these seeds, with TokenSwift's time split by iteration kind")
    args = p.parse_args(argv)
    if args.breakdown:
        print(json.dumps(breakdown(args.tokens, args.breakdown), indent=2))
        return 0
    ui = through_ui(args.tokens, args.probe) if args.client == "browser" else through_server(args.tokens)
    report = {"tokens": args.tokens, "ui": ui}
    if not args.no_headless:
        head = report["headless"] = headless(args.tokens)
        report["ui_over_headless"] = {m: round(ui[f"{m}_tok_s"] / head[f"{m}_tok_s"], 3) for m in Method}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
