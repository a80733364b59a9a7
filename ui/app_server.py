"""Start `python app.py` as a user would (the README's command) on a free port, for the app tests."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "assets" / "default-model"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppServer:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = (ROOT / "test-artifacts")
        self.log.mkdir(exist_ok=True)
        self._log_file = open(self.log / f"app-{self.port}.log", "w")
        full_env = {**os.environ, "GRADIO_SERVER_PORT": str(self.port), **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=full_env, stdout=self._log_file,
                                     stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app.py exited with {self.proc.returncode}: see {self._log_file.name}")
            try:
                with urllib.request.urlopen(self.url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError("app.py did not start in time")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log_file.close()
