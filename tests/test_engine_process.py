"""The engine process: runs stream back, stop ends a run within an iteration, a crash is reported and
survived, bad model names become messages."""
import os
import signal
import time

import pytest

import tokenswift as ts
from tokenswift.serve.engine_process import EngineProcess
from tokenswift.serve.models import DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAME
from tokenswift.serve.runner import Finished, RunRequest

pytestmark = pytest.mark.slow  # starts, kills and restarts the engine process on the default model

PROMPT = list(range(40, 80))


@pytest.fixture(scope="module")
def engine():
    eng = EngineProcess({DEFAULT_MODEL_NAME: str(DEFAULT_MODEL_DIR)}, warm=DEFAULT_MODEL_NAME).start()
    yield eng
    eng.close()


def collect(runner, timeout=120):
    assert runner.join(timeout), "the run did not end in time"
    events = runner.drain()
    assert isinstance(events[-1], Finished)
    return events[:-1], events[-1]


def test_a_run_streams_both_methods_to_the_end(engine):
    runner = engine.runner(DEFAULT_MODEL_NAME, RunRequest(PROMPT, ts.Settings(), 60)).start()
    steps, finished = collect(runner)
    assert finished.error is None and not finished.stopped
    last = {s.method: s for s in steps}
    assert last["ar"].generated == last["tokenswift"].generated == 60
    assert last["tokenswift"].done and last["tokenswift"].tree  # full events, trees included, crossed the pipe


def test_stop_ends_the_run_within_an_iteration(engine):
    runner = engine.runner(DEFAULT_MODEL_NAME, RunRequest(PROMPT, ts.Settings(), 20_000)).start()
    deadline = time.monotonic() + 60
    while runner.events.empty() and time.monotonic() < deadline:
        time.sleep(0.01)
    runner.stop()
    steps, finished = collect(runner, timeout=30)
    assert finished.stopped and finished.error is None
    assert max(s.generated for s in steps) < 2_000
    # the engine is free again: the next run completes
    steps, finished = collect(engine.runner(DEFAULT_MODEL_NAME, RunRequest(PROMPT, ts.Settings(), 10)).start())
    assert finished.error is None and max(s.generated for s in steps) == 10


def test_an_unknown_model_is_a_message(engine):
    steps, finished = collect(engine.runner("no such model", RunRequest(PROMPT, ts.Settings(), 10)).start())
    assert steps == [] and "unknown model" in finished.error


def test_a_dead_engine_ends_its_run_with_a_message_and_a_new_one_starts(engine):
    runner = engine.runner(DEFAULT_MODEL_NAME, RunRequest(PROMPT, ts.Settings(), 20_000)).start()
    deadline = time.monotonic() + 60
    while runner.events.empty() and time.monotonic() < deadline:
        time.sleep(0.01)
    first_pid = engine.pid
    os.kill(first_pid, signal.SIGKILL)
    _, finished = collect(runner, timeout=30)
    assert "ended unexpectedly" in finished.error
    steps, finished = collect(engine.runner(DEFAULT_MODEL_NAME, RunRequest(PROMPT, ts.Settings(), 10)).start())
    assert finished.error is None and max(s.generated for s in steps) == 10
    assert engine.pid not in (None, first_pid)
