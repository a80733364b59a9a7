"""TokenSwift Live: `python app.py` serves the app on the bundled default model (offline).

The web server holds tokenizers only; every torch call runs in the engine process
(tokenswift/serve/engine_process.py), started with "spawn": that child imports this file again and needs
none of the server's modules, so imports stay inside main().
"""
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before gradio / transformers import the hub client
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def main() -> None:
    from tokenswift.serve.engine_process import EngineProcess
    from tokenswift.serve.limits import Limits
    from tokenswift.serve.models import Codecs
    from ui.layout import CSS, JS, build_demo
    from ui.live import LiveApp

    try:
        limits = Limits.from_env()
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    codecs = Codecs()
    engine = EngineProcess(codecs.models, warm=codecs.names()[0], step_sessions=limits.step_sessions).start()
    app = LiveApp(codecs, engine, limits)
    codecs.get(codecs.names()[0])  # the default tokenizer, before the first visitor
    demo = build_demo(app)
    # Events waiting for a handler slot; engine jobs beyond the limit are refused by the handlers themselves.
    demo.queue(default_concurrency_limit=1, max_size=4 * app.handler_slots)
    port = int(os.environ.get("GRADIO_SERVER_PORT", "7860"))
    try:
        demo.launch(server_name="0.0.0.0", server_port=port, css=CSS, js=JS, show_error=False,
                    max_file_size=limits.max_upload_bytes)
    finally:
        engine.close()


if __name__ == "__main__":
    main()
