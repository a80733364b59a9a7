"""Engine time shared between clients (issue 28): the next job is the least-served client's, and a job that
has had its fair share while another client waits is stopped, saying so."""
import time

import pytest

import tokenswift as ts
from tokenswift.serve.engine_process import EngineProcess
from tokenswift.serve.models import DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAME
from tokenswift.serve.runner import RunRequest

pytestmark = [pytest.mark.slow,  # a live server or engine process: the full suite only
              pytest.mark.skipif(not (DEFAULT_MODEL_DIR / "config.json").exists(), reason="the default model is not built")]

PROMPT = list(range(40, 80))
SHARE_S = 3.0


@pytest.fixture(scope="module")
def engine():
    eng = EngineProcess({DEFAULT_MODEL_NAME: str(DEFAULT_MODEL_DIR)}, warm=DEFAULT_MODEL_NAME, fair_share_s=SHARE_S).start()
    yield eng
    eng.close()


def long_run(engine, client):
    return engine.runner(DEFAULT_MODEL_NAME, RunRequest(PROMPT, ts.Settings(), 20_000), 600, client=client)


def test_one_client_cannot_hold_the_engine_while_another_waits(engine):
    hog = [long_run(engine, "hog").start() for _ in range(3)]
    deadline = time.monotonic() + 60
    while hog[0].events.empty() and time.monotonic() < deadline:
        time.sleep(0.05)
    visitor = engine.runner(DEFAULT_MODEL_NAME, RunRequest(PROMPT, ts.Settings(), 10), 600, client="visitor").start()
    assert visitor.ahead >= 1 and engine.pending_for("hog") == 3
    assert hog[0].join(SHARE_S + 30), "the hog's run went on past its fair share while another client waited"
    finished = hog[0].drain()[-1]
    assert finished.preempted and finished.error is None
    assert visitor.join(60)
    assert visitor.drain()[-1].error is None
    # the visitor ran before the hog's next jobs, although they were submitted first
    assert visitor.started_at < min(h.started_at or float("inf") for h in hog[1:])
    for h in hog:
        h.stop()
    for h in hog:
        assert h.join(30)
    assert engine.pending == 0


def test_alone_a_job_is_not_stopped_at_its_share(engine):
    runner = engine.runner(DEFAULT_MODEL_NAME, RunRequest(PROMPT, ts.Settings(), 20_000), 600, client="alone").start()
    time.sleep(SHARE_S + 3)
    assert runner.alive
    runner.stop()
    assert runner.join(30) and not runner.drain()[-1].preempted


def test_a_waiting_job_that_is_stopped_ends_at_once(engine):
    first = long_run(engine, "a").start()
    second = long_run(engine, "a").start()
    second.stop()
    assert second.join(1) and second.drain()[-1].stopped
    first.stop()
    assert first.join(30)


def test_a_full_queue_gives_a_newcomer_the_place_of_the_client_holding_most(engine):
    hog = [long_run(engine, "hog").start() for _ in range(4)]
    assert not engine.make_room("hog")  # nobody holds two more than the hog itself
    assert engine.make_room("newcomer")
    assert hog[3].join(1)  # the hog's newest waiting job gave its place up, saying why
    finished = hog[3].drain()[-1]
    assert "place in the queue went to a visitor" in finished.error
    assert engine.pending == 3
    for h in hog[:3]:
        h.stop()
    for h in hog[:3]:
        assert h.join(30)
