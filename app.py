"""TokenSwift Live: `python app.py` serves the app on the bundled default model (offline)."""
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before gradio / transformers import the hub client
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from ui.layout import CSS, build_demo
from ui.live import LiveApp
from ui.models import ModelCache


def main() -> None:
    # The engine thread releases the interpreter lock on every torch op and must win it back each time;
    # a short switch interval bounds how long the server's other threads can hold it meanwhile.
    sys.setswitchinterval(float(os.environ.get("TOKENSWIFT_SWITCH_INTERVAL", "0.0005")))
    app = LiveApp(ModelCache())
    demo = build_demo(app)
    demo.queue(default_concurrency_limit=1)
    port = int(os.environ.get("GRADIO_SERVER_PORT", "7860"))
    demo.launch(server_name="0.0.0.0", server_port=port, css=CSS, show_error=False)


if __name__ == "__main__":
    main()
