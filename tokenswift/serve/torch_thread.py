"""One long-lived thread for all of the engine process's torch work (and of headless measurements).

PyTorch's CPU kernels run on an OpenMP team that belongs to the thread calling them. When a second
thread has ever run a parallel torch op (the server thread loading a model, a handler stepping the
engine), the process holds more OpenMP threads than there are cores and libgomp stops spin-waiting
between parallel regions. A small model issues thousands of short ops per second, so every op then
pays a wake-up: measured here (2 cores, default model, 1,000 tokens), TokenSwift fell from 70 to 46
tok/s and AR from 186 to 103 tok/s. Running every load, step and generation on this one thread keeps a
single team, so the app generates as fast as a headless script.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")


class TorchThread:
    def __init__(self, name: str = "torch", threads: int | None = None) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._ident: int | None = None
        self._executor.submit(self._setup, threads).result()

    def _setup(self, threads: int | None) -> None:
        self._ident = threading.get_ident()
        if threads:
            import torch

            torch.set_num_threads(threads)

    @property
    def is_current(self) -> bool:
        return threading.get_ident() == self._ident

    def submit(self, fn: Callable[..., T], *args, **kwargs) -> Future:
        """Queue `fn` on the thread (jobs run one at a time, in order)."""
        return self._executor.submit(fn, *args, **kwargs)

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """Run `fn` on the thread and return its result (exceptions propagate to the caller)."""
        if self.is_current:
            return fn(*args, **kwargs)
        return self.submit(fn, *args, **kwargs).result()


def engine_threads(strict: bool = False) -> int:
    """TOKENSWIFT_TORCH_THREADS if set, else all cores but one (at least 1).

    The spare core serves the web server and, when the page is opened on the same machine, the browser:
    measured on 2 cores with Chromium on the same machine, a 2-thread engine ran at 0.56-0.65 of its
    headless speed (its OpenMP team stalls whenever another process takes a core) and a 1-thread engine
    at 0.86-0.88. On a server whose visitors browse from elsewhere (a Space), set it to the core count."""
    value = os.environ.get("TOKENSWIFT_TORCH_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    if value and strict:  # the server checks before it starts; this module's own thread takes the default
        raise ValueError(f"TOKENSWIFT_TORCH_THREADS must be a whole number of threads, 1 or more; got {value!r}")
    return max(1, (os.cpu_count() or 1) - 1)


TORCH = TorchThread(threads=engine_threads())
