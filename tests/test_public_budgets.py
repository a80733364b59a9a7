"""Hardening II (issue 28): one anonymous visitor must not exhaust a public Space. Budgets in bytes and
engine-seconds, limits before parsing, and one sentence for every refusal; checked here without a server
(tests/test_hardening_live.py drives a running one, tests/soak.py runs the 10-minute soak). The modules
added for the issue are imported inside the tests that use them, so that on the code before it each test
fails on its own."""
from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import tokenswift as ts
from tokenswift.kinds import Method
from tokenswift.serve.export import TraceFileError, load_trace_file, trace_to_json
from tokenswift.serve.limits import Limits
from tokenswift.serve.runner import RunRequest, interleave
from tokenswift.serve.trace import RunTrace

from conftest import random_heads, tiny_model

ROOT = Path(__file__).resolve().parents[1]
VOCAB, POSITIONS = 256, 8192  # tiny_model's
PROMPT = list(range(5, 40))


def one_sentence(message: str) -> None:
    assert "\n" not in message and "Traceback" not in message and len(message) < 400, message
    assert message.rstrip(".").count(". ") == 0, message


# ---- 4. bad environment values: one sentence at start, no traceback, no overflow later ---------------------
@pytest.mark.parametrize("variable,value", [("TOKENSWIFT_REQUEST_TIMEOUT_S", "1e300"),
                                            ("TOKENSWIFT_MAX_UPLOAD_MB", "1e300"),
                                            ("TOKENSWIFT_MAX_UPLOAD_MB", "0.0000001"),
                                            ("TOKENSWIFT_QUEUE_SIZE", "1e12")])
def test_an_absurd_limit_is_refused_by_name(variable, value):
    with pytest.raises(ValueError, match=variable):
        Limits.from_env({variable: value})


@pytest.mark.parametrize("value", ["fast", "nan", "-1", "1e300"])
def test_a_malformed_plot_period_is_refused_by_name(value):
    from tokenswift.serve.limits import PLOT_PERIOD, env_number
    with pytest.raises(ValueError, match="TOKENSWIFT_PLOT_PERIOD"):
        env_number(PLOT_PERIOD, {"TOKENSWIFT_PLOT_PERIOD": value})
    assert env_number(PLOT_PERIOD, {}) == 1.5


@pytest.mark.slow  # starts app.py
@pytest.mark.parametrize("variable,value", [("TOKENSWIFT_PLOT_PERIOD", "fast"), ("TOKENSWIFT_MAX_UPLOAD_MB", "5MB"),
                                            ("TOKENSWIFT_REQUEST_TIMEOUT_S", "1e300")])
def test_the_server_stops_at_start_with_one_sentence_for_a_bad_variable(variable, value):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(ROOT), variable: value,
           "GRADIO_SERVER_PORT": "1"}  # were it to start, it could not bind: the run ends either way
    try:
        out = subprocess.run([sys.executable, "app.py"], cwd=ROOT, capture_output=True, text=True, timeout=90, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"app.py started with {variable}={value!r}")
    assert out.returncode != 0 and variable in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]


# ---- 1. session ids and the session store, in bytes -------------------------------------------------------
class _Request:
    def __init__(self, session_hash: str, host: str = "127.0.0.1", headers: dict | None = None) -> None:
        self.session_hash = session_hash
        self.headers = headers or {}
        self.client = type("Peer", (), {"host": host})()


def _live_app(limits: Limits, engine=None, **kwargs):
    from tokenswift.serve.models import Codecs
    from ui.live import LiveApp

    return LiveApp(Codecs(), engine, limits, **kwargs)


def test_session_ids_are_bounded_in_length():
    from ui.live import LiveApp

    keys = {LiveApp.key(_Request(c * 10_000_000)) for c in "abcdefghij"}
    assert len(keys) == 10 and max(map(len, keys)) <= 80  # ten 10 MB ids: ten short keys
    assert LiveApp.key(_Request("abc123")) == "abc123"  # gradio's own ids are kept as they are


def test_the_client_is_the_address_the_proxy_appended():
    spoofed = {"x-forwarded-for": "1.2.3.4, 5.6.7.8"}  # the visitor wrote 1.2.3.4; the proxy appended 5.6.7.8
    behind_proxy = _live_app(Limits(), proxies=1)
    assert behind_proxy.client(_Request("s", host="10.0.0.1")) == "10.0.0.1"
    assert behind_proxy.client(_Request("s", host="10.0.0.1", headers=spoofed)) == "5.6.7.8"
    direct = _live_app(Limits())  # no proxy in front: the header is the visitor's own text, never read
    assert direct.client(_Request("s", host="10.0.0.1", headers=spoofed)) == "10.0.0.1"
    from starlette.datastructures import Headers

    two_lines = Headers(raw=[(b"x-forwarded-for", b"1.2.3.4"), (b"x-forwarded-for", b"5.6.7.8")])  # one per proxy
    assert behind_proxy.client(_Request("s", host="10.0.0.1", headers=two_lines)) == "5.6.7.8"


def test_trusted_proxies_are_read_from_the_environment_with_a_sentence_for_bad_values():
    from tokenswift.serve.client_address import client_address, trusted_proxies

    assert trusted_proxies({}) == 0 and trusted_proxies({"SPACE_ID": "user/space"}) == 1  # a Space has one proxy
    assert trusted_proxies({"TOKENSWIFT_TRUSTED_PROXIES": "2", "SPACE_ID": "x"}) == 2
    for bad in ("-1", "one", "1.5", "99"):
        with pytest.raises(ValueError, match="TOKENSWIFT_TRUSTED_PROXIES must be a whole number from 0 to 8"):
            trusted_proxies({"TOKENSWIFT_TRUSTED_PROXIES": bad})
    chain = "6.6.6.6, 1.1.1.1, 2.2.2.2"  # the visitor's own entry, then what two proxies appended
    assert client_address(chain, "9.9.9.9", 2) == "1.1.1.1"
    assert client_address(chain, "9.9.9.9", 1) == "2.2.2.2"
    assert client_address(chain, "9.9.9.9", 0) == "9.9.9.9"
    assert client_address("3.3.3.3", "9.9.9.9", 2) == "3.3.3.3"  # fewer entries than proxies: the outermost there
    assert client_address("", None, 1) == "local"
    assert len(client_address("x" * 10_000, None, 1)) <= 64


@pytest.fixture(scope="module")
def paper_run():
    """A real run of a tiny model (held positions, trees): its trace and the file exported from it."""
    model = tiny_model("llama-gqa", seed=3)
    gen = ts.Generator(model, heads=random_heads(model))
    settings = ts.Settings(kv_budget=32, kv_sink=4)
    trace = RunTrace(PROMPT, settings.to_dict(), 60)
    for step in interleave(gen, RunRequest(PROMPT, settings, 60, seed=1), threading.Event()):
        trace.add(step)
    return trace, json.loads(json.dumps(trace_to_json(trace, gen.decode, "tiny")))


def test_the_session_store_is_bounded_in_bytes(paper_run):
    trace, _ = paper_run
    size = trace.approx_bytes()
    limits = Limits(sessions_mb=3 * size / 2**20, max_sessions=1000)
    app = _live_app(limits)
    for k in range(20):
        app.session(_Request(f"s{k}")).trace = trace
        app.session(_Request(f"s{k}"))  # the next request of that session: the store is trimmed
    assert len(app.sessions) <= 4 and app.kept_bytes() <= limits.sessions_bytes + size


def test_the_memory_estimate_covers_what_a_replayed_trace_keeps(paper_run, tmp_path):
    import tracemalloc

    _, data = paper_run
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    trace, data = load_trace_file(path, vocab_size=VOCAB)
    del data
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert kept <= trace.approx_bytes()


# ---- 1. replay bounded by what a real run could produce; 4. timings checked --------------------------------
def _case(data, edit):
    data = copy.deepcopy(data)
    edit(data)
    return data


def _ts(d):
    return d["methods"]["tokenswift"]


def _many_held_runs(d):
    _ts(d)["held"][1] = [[2 * k, 2 * k + 1] for k in range(100_000)]


def _ends_beyond_positions(d):
    _ts(d)["held"][1] = [[0, 4], [10, 2**32 - 1]]


def _zero_compute(d):
    for m in Method:
        d["methods"][m]["per_iteration"]["elapsed_s"] = [0.0] * len(d["methods"][m]["per_iteration"]["elapsed_s"])


def _implausible_speedup(d):
    column = _ts(d)["per_iteration"]["elapsed_s"]
    _ts(d)["per_iteration"]["elapsed_s"] = [v / 1_333_333 for v in column]


def _more_iterations_than_tokens(d):
    log = _ts(d)
    for name, column in log["per_iteration"].items():
        column.extend([0 if name == "accepted" else column[-1]] * 500)


def _prompt_past_the_positions(d):
    d["prompt_ids"] = [5] * POSITIONS


REPLAY_CASES = {
    "100,000 held runs": (_many_held_runs, "held runs has 100,000 entries"),
    "held ends up to 2^32": (_ends_beyond_positions, "run 1 end must be a whole number from"),
    "zero compute time": (_zero_compute, "timings are not plausible"),
    "a 1,333,333x speedup": (_implausible_speedup, "timings are not plausible"),
    "500 empty iterations": (_more_iterations_than_tokens, "at least one token per iteration"),
    "a prompt filling the positions": (_prompt_past_the_positions, "no run of it could have produced"),
}


@pytest.mark.parametrize("case", list(REPLAY_CASES))
def test_replay_is_bounded_by_what_a_real_run_produces(paper_run, tmp_path, case):
    edit, message = REPLAY_CASES[case]
    path = tmp_path / "crafted.json"
    path.write_text(json.dumps(_case(paper_run[1], edit)))
    start = time.process_time()
    with pytest.raises(TraceFileError, match=message) as refused:
        load_trace_file(path, vocab_size=VOCAB, positions=POSITIONS)
    one_sentence(str(refused.value))
    assert time.process_time() - start < 2.0


def test_a_replay_that_would_keep_too_much_memory_is_refused(paper_run, tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(paper_run[1]))
    with pytest.raises(TraceFileError, match="MiB of the server's memory") as refused:
        load_trace_file(path, vocab_size=VOCAB, positions=POSITIONS, max_kept_bytes=2**20)
    one_sentence(str(refused.value))
    trace, _ = load_trace_file(path, vocab_size=VOCAB, positions=POSITIONS, max_kept_bytes=24 * 2**20)
    assert trace.tokenswift.generated == 60  # the real run itself replays


# ---- 1. a request's expected engine cost, checked at admission ---------------------------------------------
def test_a_costly_request_is_refused_at_admission_and_the_defaults_are_not():
    from tokenswift.serve.cost import engine_seconds
    import gradio as gr

    app = _live_app(Limits(), engine=type("IdleEngine", (), {"pending": 0})())
    codec = app.codec(app.codecs.names()[0])
    costly = ts.Settings(tree="16x15", ngram_topk=20, kv_mode="full")
    with pytest.raises(gr.Error, match="minutes of the engine") as refused:
        app.admit(cost=(codec, 7_000, 20_000, costly, tuple(Method)))
    one_sentence(str(refused.value.message))
    assert engine_seconds(7_000, 20_000, costly, tuple(Method), codec.parameters) > 5 * engine_seconds(
        7_000, 20_000, ts.Settings(), tuple(Method), codec.parameters)
    page_default = engine_seconds(808, 1_000, ts.Settings(tree="auto", temperature=1.0, min_p=0.1, penalty=1.2), tuple(Method),
                                  codec.parameters)
    assert page_default < 120  # the page's first Run is admitted, and so is its longest run at the defaults:
    app.admit(cost=(codec, 808, 20_000, ts.Settings(tree="auto", temperature=1.0, min_p=0.1, penalty=1.2), tuple(Method)))


# ---- 4. non-finite numbers and echoed values over the API --------------------------------------------------
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "NaN", 1e308, [5]])
def test_non_finite_max_new_tokens_gets_one_sentence(value):
    import gradio as gr
    from ui.api import _checked

    app = _live_app(Limits(), engine=object())
    with pytest.raises(gr.Error, match="max_new_tokens must be a (whole )?number") as refused:
        _checked(app, "Hi", value, "tokenswift", "{}", 0, "")
    one_sentence(str(refused.value.message))


def test_a_megabyte_model_name_is_not_echoed():
    import gradio as gr

    app = _live_app(Limits(), engine=object())
    with pytest.raises(gr.Error, match="unknown model") as refused:
        app.codec("x" * 2**20)
    assert len(str(refused.value.message)) < 1000


# ---- 3. limits before parsing: request bodies and the upload folder ----------------------------------------
def test_the_body_limit_fits_a_prompt_at_the_token_limit_and_nothing_like_100_mb():
    from tokenswift.serve.http_guard import max_body_bytes
    from ui.live import CHARS_PER_TOKEN

    limits = Limits()
    limit = max_body_bytes(limits.max_prompt_tokens * CHARS_PER_TOKEN)
    prompt = "Emma was happy. " * (limits.max_prompt_tokens * CHARS_PER_TOKEN // 16)
    body = json.dumps({"data": [prompt, 2000, "tokenswift", json.dumps({"tree": "1x3x3x3"}), 0, ""],
                       "fn_index": 3, "session_hash": "x" * 20}, ensure_ascii=False)
    assert len(body.encode()) < limit < 2 * 2**20


def _asgi(guard, method: str, path: str, body: bytes, declared: bool = True, query: bytes = b""):
    """Send one request through the middleware; returns (status, body, the bytes the app read)."""
    sent, read = [], []
    headers = [(b"content-length", str(len(body)).encode())] if declared else []
    scope = {"type": "http", "method": method, "path": path, "headers": headers, "query_string": query}
    chunks = [body[i:i + 65536] for i in range(0, len(body), 65536)] or [b""]

    async def receive():
        chunk = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message):
        sent.append(message)

    async def app(scope, receive, send):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ConnectionError("client gone")
            read.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guard.app = app
    try:
        asyncio.run(guard(scope, receive, send))
    except ConnectionError:
        return None, b"", sum(map(len, read))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"), sum(map(len, read))


def test_a_large_body_is_refused_before_it_is_read(tmp_path):
    from tokenswift.serve.http_guard import HttpGuard
    guard = HttpGuard(None, max_body=1_000_000, max_upload_body=5_000_000)
    status, body, read = _asgi(guard, "POST", "/gradio_api/queue/join", b"x" * 3_000_000)
    assert status == 413 and read == 0
    one_sentence(json.loads(body)["error"])
    status, _, read = _asgi(guard, "POST", "/gradio_api/queue/join", b"x" * 3_000_000, declared=False)
    assert status == 413 and read == 0  # chunked: read by the guard up to the limit, then refused
    status, _, read = _asgi(guard, "POST", "/gradio_api/call/generate", b"x" * 3_000_000, declared=False)
    assert status is None and read <= 1_000_000 + 65536  # elsewhere: the handler's body ends at the limit
    assert _asgi(guard, "POST", "/gradio_api/queue/join", b"{}")[0] == 200


def test_uploads_are_refused_when_the_folder_is_full_and_old_ones_go(tmp_path):
    from tokenswift.serve.http_guard import HttpGuard, UploadFolder
    folder = UploadFolder(tmp_path, budget=3_000_000, max_age_s=600)
    guard = HttpGuard(None, max_body=1_000_000, max_upload_body=2_000_000, uploads=folder)
    for k in range(3):
        (tmp_path / f"old{k}").mkdir()
        (tmp_path / f"old{k}" / "t.json").write_bytes(b"x" * 1_000_000)
    status, body, _ = _asgi(guard, "POST", "/gradio_api/upload", b"y" * 1_500_000)
    assert status == 503 and "upload space is full" in json.loads(body)["error"]
    for k in range(3):
        os.utime(tmp_path / f"old{k}" / "t.json", (time.time() - 3600, time.time() - 3600))
    assert folder.prune(force=True) == 0 and not any(tmp_path.iterdir())  # old uploads and their folders go
    assert _asgi(guard, "POST", "/gradio_api/upload", b"y" * 1_500_000)[0] == 200


def test_a_replayed_upload_is_deleted(paper_run, tmp_path):
    from tokenswift.serve.http_guard import UploadFolder
    upload = tmp_path / "uploads" / "abc" / "run.json"
    upload.parent.mkdir(parents=True)
    upload.write_text(json.dumps(paper_run[1]))
    app = _live_app(Limits(), engine=None, uploads=UploadFolder(tmp_path / "uploads", 10**8))
    with pytest.raises(Exception):
        app.replay(str(upload), _Request("s"))  # the tiny model's file names no model of this server: refused
    assert not upload.exists()


# ---- 2. work nobody watches: the stream's activity ---------------------------------------------------------
def test_the_watch_sees_a_stream_that_delivers_and_one_that_does_not():
    from tokenswift.serve.http_guard import HttpGuard, StreamWatch
    watch = StreamWatch()
    guard = HttpGuard(None, max_body=1000, max_upload_body=1000, watch=watch)
    start = time.monotonic()
    time.sleep(0.2)
    assert watch.idle_s("reader", start) >= 0.2
    _asgi(guard, "GET", "/gradio_api/queue/data", b"", query=b"session_hash=reader")
    assert watch.idle_s("reader", start) < 0.1 and watch.idle_s("nobody", start) >= 0.2
    watch.activity("z" * 10_000)  # an absurd id is not remembered
    assert "z" * 10_000 not in watch._last


def test_a_queue_join_with_a_huge_session_id_is_refused_before_gradio_keeps_it():
    from tokenswift.serve.http_guard import HttpGuard
    guard = HttpGuard(None, max_body=2_000_000, max_upload_body=1000)
    body = json.dumps({"data": ["Hi"], "fn_index": 0, "session_hash": "z" * 500_000}).encode()
    status, answer, read = _asgi(guard, "POST", "/gradio_api/queue/join", body)
    assert status == 400 and read == 0
    one_sentence(json.loads(answer)["error"])
    fine = json.dumps({"data": ["Hi"], "fn_index": 0, "session_hash": "abc123"}).encode()
    status, _, read = _asgi(guard, "POST", "/gradio_api/queue/join", fine)
    assert status == 200 and read == len(fine)  # the body read by the guard reaches the app whole
