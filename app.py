"""TokenSwift Live: `python app.py` serves the app on the bundled default model (offline).

The web server holds tokenizers only; every torch call runs in the engine process
(tokenswift/serve/engine_process.py), started with "spawn": that child imports this file again and needs
none of the server's modules, so imports stay inside main().
"""
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before gradio / transformers import the hub client
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# Uploads (and gradio's file cache) in a folder of their own, kept within TOKENSWIFT_UPLOAD_DIR_MB.
# Uploads go to a folder of our own (pruned at start and while running), inside the operator's GRADIO_TEMP_DIR if set.
os.environ["GRADIO_TEMP_DIR"] = os.path.join(os.environ.get("GRADIO_TEMP_DIR") or tempfile.gettempdir(), "tokenswift-uploads")


def main() -> None:
    from tokenswift.serve.limits import PLOT_PERIOD, Limits, env_number

    from tokenswift.native import build
    from tokenswift.serve.client_address import trusted_proxies

    from tokenswift.serve.models import check_allowlist
    from tokenswift.serve.torch_thread import engine_threads
    from ui.controls import check_page_model

    try:
        limits = Limits.from_env()
        plot_period_s = env_number(PLOT_PERIOD)
        proxies = trusted_proxies()
        build.variant()  # a malformed TOKENSWIFT_ISA stops the server here, not the engine at every start
        engine_threads(strict=True)
        check_page_model(check_allowlist())  # a missing model folder stops the server here, not its first visitor
    except ValueError as exc:
        sys.exit(f"error: {exc}")

    from starlette.middleware import Middleware

    from tokenswift.serve.engine_process import EngineProcess
    from tokenswift.serve.http_guard import MULTIPART_ROOM, HttpGuard, StreamWatch, UploadFolder, max_body_bytes
    from tokenswift.serve.join_limit import JoinLimiter, per_address_limit
    from tokenswift.serve.models import Codecs
    from ui.controls import page_model
    from ui.layout import CSS, JS, build_demo
    from ui.live import CHARS_PER_TOKEN, LiveApp

    codecs = Codecs()
    engine = EngineProcess(codecs.models, warm=page_model(codecs.models), step_sessions=limits.step_sessions,
                           fair_share_s=limits.fair_share_s).start()
    uploads = UploadFolder(os.environ["GRADIO_TEMP_DIR"], limits.upload_dir_bytes)
    uploads.prune(force=True)  # what an earlier server left behind
    watch = StreamWatch()
    app = LiveApp(codecs, engine, limits, watch=watch, uploads=uploads, plot_period_s=plot_period_s, proxies=proxies)
    codecs.get(page_model(codecs.models))  # the default tokenizer, before the first visitor
    demo = build_demo(app)
    # Events waiting for a handler slot; engine jobs beyond the limit are refused by the handlers themselves.
    queue_size = 4 * app.handler_slots
    demo.queue(default_concurrency_limit=1, max_size=queue_size)
    # One address holds at most half of that queue (a script replaying every half second cannot fill it).
    joins = JoinLimiter(per_address_limit(queue_size), max_age_s=limits.request_timeout_s + 60)
    port = int(os.environ.get("GRADIO_SERVER_PORT", "7860"))
    # Bodies are bounded before gradio parses them: a prompt at the token limit (as characters) and its settings.
    guard = Middleware(HttpGuard, max_body=max_body_bytes(limits.max_prompt_tokens * CHARS_PER_TOKEN),
                       max_upload_body=limits.max_upload_bytes + MULTIPART_ROOM, uploads=uploads, watch=watch,
                       joins=joins, proxies=proxies)
    try:
        demo.launch(server_name="0.0.0.0", server_port=port, css=CSS, js=JS, show_error=False,
                    max_file_size=limits.max_upload_bytes, app_kwargs={"middleware": [guard]})
    finally:
        engine.close()


if __name__ == "__main__":
    main()
