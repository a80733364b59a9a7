"""The serving layer: everything between the engine and a user interface, without Gradio.

`engine_process` runs every torch call of a server in one child process (Run, Step, /generate);
`runner` interleaves AR and TokenSwift; `trace` folds Step events into what panes and plots show;
`export` writes and reads a trace file; `models` is the allowlist of loadable models; `fetches` fetches a
built-in model on its first use, beside the server and the engine.
"""
