"""A run's interleaving of AR and TokenSwift: alternation, both complete, stop within one iteration; the torch thread."""
import threading
import time

import tokenswift as ts
from tokenswift.serve.runner import RunRequest, interleave
from tokenswift.serve.trace import RunTrace, Series

from conftest import random_heads, tiny_model


def tiny_generator():
    model = tiny_model("llama-gqa", seed=3)
    return ts.Generator(model, heads=random_heads(model))


def test_interleave_keeps_the_panes_level_and_both_complete():
    gen = tiny_generator()
    req = RunRequest(list(range(5, 30)), ts.Settings(), 120)
    produced = {"ar": 0, "tokenswift": 0}
    for step in interleave(gen, req, threading.Event()):
        produced[step.method] = step.generated
        if step.method == "tokenswift":  # AR is never ahead when TokenSwift takes its next step
            assert produced["ar"] <= produced["tokenswift"] or produced["ar"] == 120
    assert produced == {"ar": 120, "tokenswift": 120}


def test_a_run_fills_both_panes_identically_under_greedy():
    gen = tiny_generator()
    trace = RunTrace(list(range(5, 30)), {}, 80)
    for step in interleave(gen, RunRequest(list(range(5, 30)), ts.Settings(), 80), threading.Event()):
        trace.add(step)
    assert trace.ar.generated == trace.tokenswift.generated == 80
    assert trace.identical_prefix() == 80  # greedy: TokenSwift == AR


def test_stop_ends_the_run_within_one_iteration():
    gen = tiny_generator()
    stop = threading.Event()
    steps = []
    for step in interleave(gen, RunRequest(list(range(5, 30)), ts.Settings(), 8_000), stop):
        steps.append(step)
        if len(steps) == 10:
            stop.set()
    assert len(steps) == 10  # nothing after the stop


def test_series_memory_is_bounded_and_keeps_the_whole_range():
    s = Series(cap=64)
    for i in range(100_000):
        s.append(i, 1.0 if i % 2 else 3.0)
    x, y = s.points()
    assert len(x) <= 65 and x[-1] == 99_999 and x[0] < 3_000
    assert all(abs(v - 2.0) < 1e-9 for v in y[:-1])


def test_the_torch_thread_runs_every_job_on_one_thread():
    from tokenswift.serve.torch_thread import TorchThread

    worker = TorchThread(name="test-torch")
    idents = {worker.call(threading.get_ident) for _ in range(5)}
    assert len(idents) == 1 and threading.get_ident() not in idents
    assert worker.call(lambda: worker.call(lambda: 7)) == 7  # re-entrant calls run inline, no deadlock
    assert worker.call(lambda: 1 + 1) == 2  # the thread is free for the next job
