"""The app's session runner: alternation, fairness of timing, and cancellation within one iteration."""
import threading
import time

import tokenswift as ts
from tokenswift.serve.runner import Finished, Runner, RunRequest, interleave
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


def test_runner_streams_events_and_finishes():
    gen = tiny_generator()
    runner = Runner(gen, RunRequest(list(range(5, 30)), ts.Settings(), 80)).start()
    assert runner.join(timeout=120)
    events = runner.drain()
    assert isinstance(events[-1], Finished) and events[-1].error is None and not events[-1].stopped
    trace = RunTrace(list(range(5, 30)), {}, 80)
    for e in events[:-1]:
        trace.add(e)
    assert trace.ar.generated == trace.tokenswift.generated == 80
    assert trace.identical_prefix() == 80  # greedy: TokenSwift == AR


def test_stop_ends_the_worker_within_one_iteration():
    gen = tiny_generator()
    runner = Runner(gen, RunRequest(list(range(5, 30)), ts.Settings(), 8_000)).start()
    deadline = time.monotonic() + 60
    while runner.events.qsize() < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    runner.stop()
    t0 = time.monotonic()
    assert runner.join(timeout=30), "the worker did not stop"
    events = runner.drain()
    assert isinstance(events[-1], Finished) and events[-1].stopped
    steps = events[:-1]
    assert 0 < max(s.generated for s in steps) < 8_000
    print(f"\n[runner] stopped {time.monotonic() - t0:.3f}s after stop()")


def test_runner_reports_errors_instead_of_dying():
    gen = tiny_generator()
    runner = Runner(gen, RunRequest([10_000], ts.Settings(), 10)).start()  # token id outside the vocabulary
    assert runner.join(timeout=30)
    events = runner.drain()
    assert isinstance(events[-1], Finished) and "ValueError" in events[-1].error


def test_series_memory_is_bounded_and_keeps_the_whole_range():
    s = Series(cap=64)
    for i in range(100_000):
        s.append(i, 1.0 if i % 2 else 3.0)
    x, y = s.points()
    assert len(x) <= 65 and x[-1] == 99_999 and x[0] < 3_000
    assert all(abs(v - 2.0) < 1e-9 for v in y[:-1])


def test_the_torch_thread_runs_every_job_on_one_thread_and_runs_stoppable_runners():
    from tokenswift.serve.torch_thread import TorchThread

    worker = TorchThread(name="test-torch")
    idents = {worker.call(threading.get_ident) for _ in range(5)}
    assert len(idents) == 1 and threading.get_ident() not in idents
    assert worker.call(lambda: worker.call(lambda: 7)) == 7  # re-entrant calls run inline, no deadlock
    assert list(worker.iterate(iter([1, 2, 3]))) == [1, 2, 3]

    gen = tiny_generator()
    runner = Runner(gen, RunRequest(list(range(5, 30)), ts.Settings(), 8_000), executor=worker).start()
    deadline = time.monotonic() + 60
    while runner.events.qsize() < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runner.alive
    runner.stop()
    assert runner.join(timeout=30), "the runner did not stop"
    events = runner.drain()
    assert isinstance(events[-1], Finished) and events[-1].stopped
    assert worker.call(lambda: 1 + 1) == 2  # the thread is free for the next job
