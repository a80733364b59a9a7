"""The Gradio Blocks layout: controls, the two panes, four plots, step view, export/replay, the API."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import gradio as gr

from .controls import CONTROL_NAMES, EXAMPLE_PROMPTS, MAX_NEW_TOKENS, TREE_CHOICES, page_model
from .controls import UI_DEFAULTS as D
from .api import api_generate, api_health
from .live import LiveApp
from .plots import REPEAT_MIN_TOKENS
from .presets import PAPER_SAMPLING_NOTE, PRESETS
from .render import SPEED_NOTE
from .text import legend_html, palette_css, placeholder_html

INTRO = """# TokenSwift Live
Lossless acceleration of long generation ([TokenSwift, ICML 2025](https://arxiv.org/abs/2502.18890)), running for
real: **AR** and **TokenSwift** side by side on the same model. TokenSwift drafts several tokens per step with
multi-token heads and reused n-grams, verifies the whole draft tree in one forward pass, and keeps exactly the
tokens the model itself would have produced."""

# Run on page load (launch(js=...)): purge each plotly plot that Gradio drops, see the file.
JS = (Path(__file__).with_name("plotly_purge.js")).read_text()

CSS = (Path(__file__).with_name("style.css")).read_text() + palette_css()
# The text panes: boxed, 420 px high, scrolling to follow the text as it streams (the legend names them).
PANE = dict(show_label=False, container=True, padding=True, max_height=420, autoscroll=True, elem_classes=["pane"])


def build_demo(app: LiveApp) -> gr.Blocks:
    c: dict[str, gr.components.Component] = {}
    with gr.Blocks(title="TokenSwift Live") as demo:
        gr.Markdown(INTRO)
        with gr.Row():
            with gr.Column(scale=1, min_width=320):
                c["prompt"] = gr.Textbox(label="Prompt", lines=4, value=next(iter(EXAMPLE_PROMPTS.values())), elem_id="prompt")
                gr.Examples(examples=[[p] for p in EXAMPLE_PROMPTS.values()], inputs=[c["prompt"]],
                            example_labels=list(EXAMPLE_PROMPTS), label="Examples")
                c["max_new"] = gr.Number(label="Max new tokens", value=D["max_new"], minimum=1, maximum=MAX_NEW_TOKENS, precision=0,
                                         elem_id="max-new")
                with gr.Row():
                    c["run"] = gr.Button("Run", variant="primary", elem_id="run-btn")
                    c["stop"] = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                    c["step"] = gr.Button("Step", elem_id="step-btn")
                c["status"] = gr.Markdown("Ready.", elem_id="status")
                with gr.Accordion("Sampling", open=True):
                    c["greedy"] = gr.Checkbox(label="Greedy (temperature 0)", value=D["greedy"], elem_id="greedy")
                    c["temperature"] = gr.Slider(0.05, 2.0, value=D["temperature"], step=0.05, label="Temperature")
                    c["top_p"] = gr.Slider(0.05, 1.0, value=D["top_p"], step=0.01, label="Top-p")
                    c["min_p"] = gr.Slider(0.0, 0.5, value=D["min_p"], step=0.01, label="Min-p")
                    c["seed"] = gr.Number(label="Seed", value=D["seed"], precision=0, minimum=0, maximum=2**32 - 1)
                with gr.Accordion("Contextual penalty", open=False):
                    c["penalty_on"] = gr.Checkbox(label="Penalise tokens of the last W tokens", value=D["penalty_on"])
                    c["theta"] = gr.Slider(1.0, 2.0, value=D["theta"], step=0.05, label="Theta")
                    c["window"] = gr.Number(label="Window W", value=D["window"], precision=0)
                with gr.Accordion("Drafting", open=False):
                    c["reuse_on"] = gr.Checkbox(label="Token reuse (4-gram table)", value=D["reuse_on"])
                    c["ngram_topk"] = gr.Slider(1, 40, value=D["ngram_topk"], step=1, label="Reused n-grams per candidate (top-k)")
                    c["tree"] = gr.Dropdown(TREE_CHOICES, value=D["tree"], label="Draft tree preset",
                                            info="auto = the tree that pays on this machine (measured cost x measured acceptance); "
                                                 "paper = 1x3x3x3 (40 nodes)")
                    c["kv_mode"] = gr.Radio(["dynamic", "once", "full"], value=D["kv_mode"], label="Partial KV cache for drafting",
                                            info="dynamic: re-select when the recent tail is full; once: select at prefill; full: no partial cache")
                    c["kv_budget"] = gr.Number(label="Partial KV budget (positions)", value=D["kv_budget"], precision=0)
                    c["draft"] = gr.Radio(["paper", "fused"], value=D["draft"], label="Drafting",
                                          info="paper: a draft forward over the partial cache (the paper); fused: the heads read the verification pass (no draft forward; faster on a CPU)")
                c["model"] = gr.Dropdown(app.codecs.names(), value=page_model(app.codecs.models), label="Model")
                with gr.Accordion("Case studies", open=True):
                    gr.Markdown("Set the controls for a comparison, then press **Run**. The two repetition cases: "
                                "same prompt, seed and sampling, only the contextual penalty differs. "
                                + PAPER_SAMPLING_NOTE)
                    preset_buttons = {name: gr.Button(name, size="sm", elem_classes=["preset"]) for name in PRESETS}
            with gr.Column(scale=3):
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
                gr.Markdown(SPEED_NOTE)
                c["speed"] = gr.Markdown("", elem_id="speed")
                with gr.Row():
                    c["tree_plot"] = gr.Plot(label="Draft tree", elem_id="tree-plot", show_label=False)
                    c["accepted_plot"] = gr.Plot(label="Accepted tokens per iteration", elem_id="accepted-plot", show_label=False)
                with gr.Row():
                    c["kv_plot"] = gr.Plot(label="KV cache", elem_id="kv-plot", show_label=False)
                    c["repetition_plot"] = gr.Plot(label="Repetition", elem_id="repetition-plot", show_label=False)
                c["distinct"] = gr.Markdown("", elem_id="distinct")
                with gr.Row():
                    c["tree_pick"] = gr.Number(label="Show the draft tree of iteration (-1: latest)", value=-1, precision=0,
                                               elem_id="tree-pick")
                    c["tree_show"] = gr.Button("Show tree")
                with gr.Accordion("Classroom step view", open=True):
                    c["step_caption"] = gr.Markdown("Press **Step** to run exactly one TokenSwift iteration.",
                                                    elem_id="step-caption")
                    c["step_table"] = gr.Dataframe(
                        headers=["node", "depth", "token", "source", "proposer score", "target p (full chain)",
                                 "target drew", "why"],
                        label="Draft nodes: candidates, target samples and verdicts", interactive=False, wrap=True,
                        column_widths=["5%", "5%", "10%", "7%", "9%", "9%", "10%", "45%"], elem_id="step-table")
                with gr.Row():
                    c["export"] = gr.Button("Export run (JSON)", elem_id="export-btn")
                    c["export_file"] = gr.File(label="Exported run", interactive=False, elem_id="export-file")
                    c["replay_file"] = gr.UploadButton("Load a trace to replay", file_types=[".json"], type="filepath",
                                                       elem_id="replay-btn")

        inputs = {c[n] for n in CONTROL_NAMES}  # a set: the handler receives {component: value}, passed on by name
        view_names = ["ar_text", "ts_text", "ar_stats", "ts_stats", "summary", "status", "tree_plot", "accepted_plot",
                      "kv_plot", "repetition_plot", "distinct", "speed", "step_caption", "step_table"]
        views = [c[n] for n in view_names]

        # No per-output progress overlays: their animations and timers keep the browser busy (measured),
        # and the status line already reports progress.
        run_event = c["run"].click(_by_name(app.run, c, streaming=True), inputs, views, concurrency_limit=app.handler_slots,
                                   concurrency_id="engine", api_visibility="private", show_progress="hidden")
        c["stop"].click(app.stop, None, c["status"], api_visibility="private")
        c["step"].click(_by_name(app.step, c), inputs, views, concurrency_limit=app.handler_slots, concurrency_id="engine",
                        api_visibility="private")
        c["export"].click(app.export, None, c["export_file"], api_visibility="private")
        c["replay_file"].upload(_by_name(app.replay, c), c["replay_file"], views, api_visibility="private")
        c["tree_show"].click(app.pick_tree, c["tree_pick"], c["tree_plot"], api_visibility="private")
        for name, button in preset_buttons.items():
            button.click(_setter(PRESETS[name], c), None, [c[k] for k in PRESETS[name]], api_visibility="private")
        demo.unload(app.close_session)
        _ = run_event
        gr.api(api_generate(app), api_name="generate", concurrency_limit=app.handler_slots, concurrency_id="engine")
        gr.api(api_health(app), api_name="health", concurrency_limit=None)
    return demo


def _by_name(fn: Callable, components: dict, streaming: bool = False) -> Callable:
    """Adapt a handler that takes and returns/yields {name: value} to Gradio's {component: value} (inputs
    given as a set arrive as one {component: value} dict; other inputs are passed on as they come)."""
    names = {id(component): name for name, component in components.items()}

    def named(args: tuple) -> tuple:
        if len(args) == 1 and isinstance(args[0], dict):
            return ({names[id(k)]: v for k, v in args[0].items()},)
        return args

    def convert(update: dict) -> dict:
        return {components[k]: v for k, v in update.items()}

    if streaming:
        def stream(request: gr.Request, *args):
            for update in fn(*named(args), request=request):
                yield convert(update)
        return stream

    def call(request: gr.Request, *args):
        return convert(fn(*named(args), request=request))
    return call


def _setter(values: dict, components: dict) -> Callable:
    """A handler that sets the named controls to `values`."""
    def apply() -> dict:
        return {components[k]: v for k, v in values.items()}
    return apply
