"""The Gradio Blocks layout: lessons, controls, the step view, the two panes, four plots, export/replay, the API."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import gradio as gr

from tokenswift.serve.trace import TREES_KEPT

from . import render
from .api import api_generate, api_health
from .controls import CONTROL_NAMES, EXAMPLE_PROMPTS, MAX_NEW_TOKENS, TREE_CHOICES, ignored_controls, page_model
from .controls import UI_DEFAULTS as D
from .lessons import LESSONS, RUN
from .live import LiveApp
from .plots import REPEAT_MIN_TOKENS
from .presets import PAPER_SAMPLING_NOTE, PRESETS
from .render import SPEED_NOTE
from .text import legend_html, palette_css, placeholder_html

INTRO = """# TokenSwift Live
Lossless acceleration of long generation ([TokenSwift, ICML 2025](https://arxiv.org/abs/2502.18890)), running for
real: **AR** and **TokenSwift** race on the same model. TokenSwift drafts several tokens per step, verifies the
whole draft tree in one forward pass, and keeps exactly the tokens the model itself would have produced."""

# Run on page load (launch(js=...)): purge each plotly plot that Gradio drops, see the file.
JS = (Path(__file__).with_name("plotly_purge.js")).read_text()

CSS = (Path(__file__).with_name("style.css")).read_text() + palette_css()
# The text panes: boxed, 420 px high, scrolling to follow the text as it streams (the legend names them).
PANE = dict(show_label=False, container=True, padding=True, max_height=420, autoscroll=True, elem_classes=["pane"])
# Every view a Run, Step, replay, lesson or case study sets (each sets all of them: nothing stale stays).
VIEW_NAMES = ["ar_text", "ts_text", "ar_stats", "ts_stats", "summary", "status", "provenance", "tree_plot",
              "accepted_plot", "kv_plot", "repetition_plot", "distinct", "speed", "step_view", "step_caption",
              "step_table", "step_tree"]
SETTABLE = [n for n in CONTROL_NAMES]  # controls a replay, a Step, a lesson or a case study may set
# Controls that a mode can ignore, with the note they show when it does not (ui/controls.ignored_controls).
NOTES = {"temperature": None, "top_p": None, "min_p": None, "seed": None, "theta": None, "window": None,
         "ngram_topk": None,
         "draft": "paper: a draft forward over the partial cache (the paper); fused: the heads read the "
                  "verification pass (no draft forward; faster on a CPU)",
         "kv_mode": "dynamic: re-select when the recent tail is full; once: select at prefill; full: no partial cache",
         "kv_budget": None}
MODE_CONTROLS = ("greedy", "penalty_on", "reuse_on", "tree", "draft", "kv_mode")  # their changes grey others out


def build_demo(app: LiveApp) -> gr.Blocks:
    c: dict[str, gr.components.Component] = {}
    with gr.Blocks(title="TokenSwift Live") as demo:
        gr.Markdown(INTRO)
        with gr.Row(elem_id="lessons", equal_height=True):
            lesson_buttons = {title: gr.Button(title, size="sm", variant="secondary", elem_classes=["lesson"])
                              for title in LESSONS}
        with gr.Row():
            with gr.Column(scale=1, min_width=320):
                c["prompt"] = gr.Textbox(label="Prompt", lines=3, value=next(iter(EXAMPLE_PROMPTS.values())), elem_id="prompt")
                with gr.Row():
                    c["run"] = gr.Button("Run", variant="primary", elem_id="run-btn")
                    c["stop"] = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                    c["step"] = gr.Button("Step", elem_id="step-btn")
                c["status"] = gr.Markdown("Ready: press **Run** to race AR and TokenSwift, or **Step** for one "
                                          "iteration explained.", elem_id="status")
                c["max_new"] = gr.Number(label="Max new tokens", value=D["max_new"], minimum=1, maximum=MAX_NEW_TOKENS, precision=0,
                                         elem_id="max-new")
                gr.Examples(examples=[[p] for p in EXAMPLE_PROMPTS.values()], inputs=[c["prompt"]],
                            example_labels=list(EXAMPLE_PROMPTS), label="Example prompts")
                with gr.Accordion("Sampling", open=True):
                    c["greedy"] = gr.Checkbox(label="Greedy (temperature 0)", value=D["greedy"], elem_id="greedy")
                    c["temperature"] = gr.Slider(0.05, 2.0, value=D["temperature"], step=0.05, label="Temperature",
                                                 elem_id="temperature")
                    c["top_p"] = gr.Slider(0.05, 1.0, value=D["top_p"], step=0.01, label="Top-p", elem_id="top-p")
                    c["min_p"] = gr.Slider(0.0, 0.5, value=D["min_p"], step=0.01, label="Min-p", elem_id="min-p")
                    c["seed"] = gr.Number(label="Seed", value=D["seed"], precision=0, minimum=0, maximum=2**32 - 1,
                                          elem_id="seed")
                with gr.Accordion("Contextual penalty", open=False):
                    c["penalty_on"] = gr.Checkbox(label="Penalise tokens of the last W tokens", value=D["penalty_on"],
                                                  elem_id="penalty-on")
                    c["theta"] = gr.Slider(1.0, 2.0, value=D["theta"], step=0.05, label="Theta", elem_id="theta")
                    c["window"] = gr.Number(label="Window W", value=D["window"], precision=0, elem_id="window")
                with gr.Accordion("Drafting", open=False):
                    c["reuse_on"] = gr.Checkbox(label="Token reuse: 4-grams (with tree=auto also suffix matches and the "
                                                      "datastore)", value=D["reuse_on"], elem_id="reuse-on")
                    c["ngram_topk"] = gr.Slider(1, 40, value=D["ngram_topk"], step=1, label="Reused 4-grams per candidate (top-k)",
                                                elem_id="ngram-topk")
                    c["tree"] = gr.Dropdown(TREE_CHOICES, value=D["tree"], label="Draft tree preset", allow_custom_value=True,
                                            info="auto = the tree that pays on this machine (measured cost x measured acceptance); "
                                                 "paper = 1x3x3x3 (40 nodes)", elem_id="tree")
                    c["kv_mode"] = gr.Radio(["dynamic", "once", "full"], value=D["kv_mode"], label="Partial KV cache for drafting",
                                            info=NOTES["kv_mode"], elem_id="kv-mode")
                    c["kv_budget"] = gr.Number(label="Partial KV budget (positions)", value=D["kv_budget"], precision=0,
                                               elem_id="kv-budget")
                    c["draft"] = gr.Radio(["paper", "fused"], value=D["draft"], label="Drafting", info=NOTES["draft"],
                                          elem_id="draft")
                c["model"] = gr.Dropdown(app.codecs.names(), value=page_model(app.codecs.models), label="Model",
                                         elem_id="model")
                with gr.Accordion("Case studies", open=False):
                    gr.Markdown("Set the controls for a comparison, then press **Run**. The two repetition cases: "
                                "same prompt, seed and sampling, only the contextual penalty differs. "
                                + PAPER_SAMPLING_NOTE)
                    preset_buttons = {name: gr.Button(name, size="sm", elem_classes=["preset"]) for name in PRESETS}
            with gr.Column(scale=3):
                c["lesson"] = gr.Markdown("", elem_id="lesson")
                c["provenance"] = gr.Markdown("**What you see**: nothing yet.", elem_id="provenance")
                with gr.Column(visible=False, elem_id="step-view") as step_view:
                    with gr.Row():
                        with gr.Column(scale=1, min_width=360):
                            c["step_caption"] = gr.Markdown("", elem_id="step-caption")
                        with gr.Column(scale=1, min_width=360):
                            c["step_tree"] = gr.Plot(label="Draft tree of this iteration", elem_id="step-tree",
                                                     show_label=False)
                    c["step_table"] = gr.HTML("", elem_id="step-table")
                c["step_view"] = step_view
                c["summary"] = gr.Markdown("", elem_id="summary")
                gr.HTML(legend_html(REPEAT_MIN_TOKENS), elem_id="legend")
                with gr.Row(equal_height=True):
                    with gr.Column():
                        c["ar_stats"] = gr.Markdown("**AR**", elem_classes=["pane-stats"], elem_id="ar-stats")
                        c["ar_text"] = gr.HTML(placeholder_html("no tokens yet"), label="AR", elem_id="ar-text", **PANE)
                    with gr.Column():
                        c["ts_stats"] = gr.Markdown("**TokenSwift**", elem_classes=["pane-stats"], elem_id="ts-stats")
                        c["ts_text"] = gr.HTML(placeholder_html("no tokens yet"), label="TokenSwift", elem_id="ts-text",
                                               **PANE)
                empty = render.empty_update()
                c["tree_plot"] = gr.Plot(empty["tree_plot"], label="Draft tree", elem_id="tree-plot", show_label=False)
                with gr.Row():
                    c["tree_pick"] = gr.Number(label=f"Show the draft tree of iteration (the last {TREES_KEPT} "
                                                     "iterations are kept; -1: the latest)", value=-1, precision=0,
                                               elem_id="tree-pick")
                    c["tree_show"] = gr.Button("Show tree", elem_id="tree-show")
                c["accepted_plot"] = gr.Plot(empty["accepted_plot"], label="Accepted tokens per iteration",
                                             elem_id="accepted-plot", show_label=False)
                c["kv_plot"] = gr.Plot(empty["kv_plot"], label="KV cache", elem_id="kv-plot", show_label=False)
                c["repetition_plot"] = gr.Plot(empty["repetition_plot"], label="Repetition", elem_id="repetition-plot",
                                               show_label=False)
                c["distinct"] = gr.Markdown("", elem_id="distinct")
                with gr.Accordion("Why this speed", open=True):
                    gr.Markdown(SPEED_NOTE)
                    c["speed"] = gr.Markdown("", elem_id="speed")
                with gr.Row():
                    c["export"] = gr.Button("Export run (JSON)", elem_id="export-btn")
                    c["export_file"] = gr.File(label="Exported run", interactive=False, elem_id="export-file")
                    c["replay_file"] = gr.UploadButton("Load a trace to replay", file_types=[".json"], type="filepath",
                                                       elem_id="replay-btn")

        inputs = {c[n] for n in CONTROL_NAMES}  # a set: the handler receives {component: value}, passed on by name
        views = [c[n] for n in VIEW_NAMES]
        settable = [c[n] for n in SETTABLE]

        # No per-output progress overlays: their animations and timers keep the browser busy (measured),
        # and the status line already reports progress.
        run = _by_name(app.run, c, streaming=True)
        step = _by_name(app.step_stream, c, streaming=True)
        c["run"].click(run, inputs, views, concurrency_limit=app.handler_slots, concurrency_id="engine",
                       api_visibility="private", show_progress="hidden")
        c["stop"].click(app.stop, None, c["status"], api_visibility="private", show_progress="hidden")
        c["step"].click(step, inputs, views + [c["tree"]], concurrency_limit=app.handler_slots,
                        concurrency_id="engine", api_visibility="private", show_progress="hidden")
        c["export"].click(app.export, None, c["export_file"], api_visibility="private")
        c["replay_file"].upload(_by_name(app.replay_stream, c, streaming=True), c["replay_file"], views + settable,
                                api_visibility="private", show_progress="hidden")
        c["tree_show"].click(app.pick_tree, c["tree_pick"], c["tree_plot"], api_visibility="private")
        for name, button in preset_buttons.items():
            values = PRESETS[name]
            button.click(_by_name(_prepare(app, values, f"Case study set: **{name}**. Press **Run**."), c), None,
                         views + [c[k] for k in values] + [c["lesson"]], api_visibility="private", show_progress="hidden")
        for title, button in lesson_buttons.items():
            lesson = LESSONS[title]
            prepared = button.click(
                _by_name(_prepare(app, lesson.values(), f"Lesson: **{title}**.", lesson.text), c), None,
                views + settable + [c["lesson"]], api_visibility="private", show_progress="hidden")
            if lesson.action == RUN:
                prepared.then(run, inputs, views, concurrency_limit=app.handler_slots, concurrency_id="engine",
                              api_visibility="private", show_progress="hidden")
            else:
                prepared.then(step, inputs, views + [c["tree"]], concurrency_limit=app.handler_slots,
                              concurrency_id="engine", api_visibility="private", show_progress="hidden")
        modes = [c[n] for n in MODE_CONTROLS]
        greyed = [c[n] for n in NOTES]
        for control in modes:
            control.change(_grey_out(c), modes, greyed, api_visibility="private", show_progress="hidden", queue=False)
        demo.load(_grey_out(c), modes, greyed, api_visibility="private", show_progress="hidden", queue=False)
        demo.unload(app.close_session)
        gr.api(api_generate(app), api_name="generate", concurrency_limit=app.handler_slots, concurrency_id="engine")
        gr.api(api_health(app), api_name="health", concurrency_limit=None)
    return demo


def _prepare(app: LiveApp, values: dict, message: str, lesson: str = "") -> Callable:
    """A lesson's or case study's handler: controls set, views emptied, the lesson's text shown."""
    def prepare(request: gr.Request = None) -> dict:
        return {**app.prepare(values, message, request=request), "lesson": lesson}
    return prepare


def _grey_out(c: dict) -> Callable:
    """A handler of the mode controls' values (MODE_CONTROLS order): each control of NOTES becomes read-only with
    a note where the mode ignores it, and editable again (with its own note) where it does not."""
    def update(*modes):
        ignored = ignored_controls(dict(zip(MODE_CONTROLS, modes)))
        out = []
        for name, note in NOTES.items():
            why = ignored.get(name)
            out.append(gr.update(interactive=why is None, info=why or note or "",  # "" clears a note (None keeps it)
                                 elem_classes=["ignored"] if why else []))
        return out
    return update


def _by_name(fn: Callable, components: dict, streaming: bool = False) -> Callable:
    """Adapt a handler that takes and returns/yields {name: value} to Gradio's {component: value} (inputs
    given as a set arrive as one {component: value} dict; other inputs are passed on as they come)."""
    names = {id(component): name for name, component in components.items()}

    def named(args: tuple) -> tuple:
        if len(args) == 1 and isinstance(args[0], dict):
            return ({names[id(k)]: v for k, v in args[0].items()},)
        return args

    def convert(update: dict) -> dict:
        out = {components[k]: v for k, v in update.items() if k != "step_view"}
        if "step_view" in update:  # a layout block: only its visibility changes
            out[components["step_view"]] = gr.update(visible=update["step_view"] == render.STEP_VIEW_SHOWN)
        return out

    if streaming:
        def stream(request: gr.Request, *args):
            for update in fn(*named(args), request=request):
                yield convert(update)
        return stream

    def call(request: gr.Request, *args):
        return convert(fn(*named(args), request=request))
    return call
