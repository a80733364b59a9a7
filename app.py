"""TokenSwift Live: `python app.py` serves the app on the bundled default model (offline).

Imports stay inside main(): the engine process (tokenswift/serve/engine_process.py) is started with "spawn", which
imports this file again in the child, and the child needs none of the server's modules.
"""
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before gradio / transformers import the hub client
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def main() -> None:
    from tokenswift.serve.engine_process import EngineProcess
    from ui.layout import CSS, JS, build_demo
    from ui.live import LiveApp
    from tokenswift.serve.models import ModelCache

    # The server's threads hand the interpreter lock around quickly (step mode and /generate run torch here).
    sys.setswitchinterval(float(os.environ.get("TOKENSWIFT_SWITCH_INTERVAL", "0.0005")))
    models = ModelCache()
    # Runs execute in their own process unless TOKENSWIFT_ENGINE_PROCESS=0 (then on this process's torch thread).
    engine = None
    if os.environ.get("TOKENSWIFT_ENGINE_PROCESS", "1").strip() != "0":
        engine = EngineProcess(models.models, warm=models.names()[0]).start()
    app = LiveApp(models, engine)
    demo = build_demo(app)
    demo.queue(default_concurrency_limit=1)
    port = int(os.environ.get("GRADIO_SERVER_PORT", "7860"))
    try:
        demo.launch(server_name="0.0.0.0", server_port=port, css=CSS, js=JS, show_error=False)
    finally:
        if engine is not None:
            engine.close()


if __name__ == "__main__":
    main()
