"""The app as a public Space meets it: hostile API inputs, many clients at once, clients that vanish, an
engine that dies. Everything goes through the running `python app.py` with gradio_client, as a visitor's
script would. The bad-input table (each answer, how long it took, memory of server and engine) is written
to test-artifacts/hardening-table.md."""
import json
import os
import signal
import threading
import time

import pytest

from ui.app_server import DEFAULT_MODEL, ROOT, AppServer

pytestmark = [pytest.mark.slow,  # a live server or engine process: the full suite only
              pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").exists(), reason="the default model is not built")]

QUEUE = 4
ENV = {"TOKENSWIFT_QUEUE_SIZE": str(QUEUE), "TOKENSWIFT_MAX_PROMPT_TOKENS": "2048",
       "TOKENSWIFT_API_MAX_NEW_TOKENS": "4000", "TOKENSWIFT_REQUEST_TIMEOUT_S": "120"}
PROMPTS = ["It is a truth universally acknowledged", "Emma Woodhouse, handsome, clever, and rich,",
           "In the beginning God created", "Mr. Knightley, a sensible man about seven or eight-and-thirty,"]
# greedy on the paper's tree (the library's default, which /generate took for "{}" before it drafted as the page
# does): about a quarter of AR's speed on a CPU, so that the runs these tests race still overlap on a fast host
GREEDY = '{"tree": "1x3x3x3"}'

# (label, prompt, max_new_tokens, method, settings_json, seed, model, a word the refusal must contain)
BAD_INPUTS = [
    ("tree of ~1e9 paths", "Hi", 5, "tokenswift", '{"tree": "64x64x64x64x64"}', 0, "", "tree"),
    ("tree asking for a huge mask", "Hi", 5, "tokenswift", '{"tree": "1x64x64x64"}', 0, "", "tree"),
    ("tree not a string", "Hi", 5, "tokenswift", '{"tree": 5}', 0, "", "tree"),
    ("ngram_topk 3e8", "Hi", 5, "tokenswift", '{"ngram_topk": 300000000}', 0, "", "ngram_topk"),
    ("kv_budget 1e12", "Hi", 5, "tokenswift", '{"kv_budget": 1000000000000}', 0, "", "kv_budget"),
    ("kv_sink 1e9", "Hi", 5, "tokenswift", '{"kv_sink": 1000000000}', 0, "", "kv_"),
    ("temperature NaN", "Hi", 5, "tokenswift", '{"temperature": NaN}', 0, "", "temperature"),
    ("temperature Infinity", "Hi", 5, "tokenswift", '{"temperature": Infinity}', 0, "", "temperature"),
    ("temperature 1e-320", "Hi", 5, "tokenswift", '{"temperature": 1e-320}', 0, "", "temperature"),
    ("temperature a string", "Hi", 5, "tokenswift", '{"temperature": "hot"}', 0, "", "temperature"),
    ("top_k 3.5", "Hi", 5, "tokenswift", '{"top_k": 3.5}', 0, "", "top_k"),
    ("top_p 0", "Hi", 5, "tokenswift", '{"top_p": 0}', 0, "", "top_p"),
    ("min_p 1.5", "Hi", 5, "tokenswift", '{"min_p": 1.5}', 0, "", "min_p"),
    ("penalty 0.5", "Hi", 5, "tokenswift", '{"penalty": 0.5}', 0, "", "penalty"),
    ("penalty_window -1", "Hi", 5, "tokenswift", '{"penalty_window": -1}', 0, "", "penalty_window"),
    ("kv_mode unknown", "Hi", 5, "tokenswift", '{"kv_mode": "bogus"}', 0, "", "kv_mode"),
    ("draft unknown", "Hi", 5, "tokenswift", '{"draft": "bogus"}', 0, "", "draft"),
    ("unknown setting", "Hi", 5, "tokenswift", '{"beam_width": 4}', 0, "", "unknown"),
    ("settings not JSON", "Hi", 5, "tokenswift", "{", 0, "", "settings"),
    ("settings a list", "Hi", 5, "tokenswift", "[1, 2]", 0, "", "object"),
    ("settings nested 4,000 deep", "Hi", 5, "tokenswift", "[" * 4000 + "]" * 4000, 0, "", "settings"),
    ("settings 20,000 characters", "Hi", 5, "tokenswift", '{"tree": "' + "1" * 20000 + '"}', 0, "", "settings"),
    ("max_new_tokens over the API limit", "Hi", 50_000, "tokenswift", GREEDY, 0, "", "max_new_tokens"),
    ("max_new_tokens 0", "Hi", 0, "tokenswift", GREEDY, 0, "", "max_new_tokens"),
    ("max_new_tokens 3.5", "Hi", 3.5, "tokenswift", GREEDY, 0, "", "max_new_tokens"),
    ("max_new_tokens a bool", "Hi", True, "tokenswift", GREEDY, 0, "", "max_new_tokens"),
    ("unknown method", "Hi", 5, "beam", GREEDY, 0, "", "method"),
    ("empty prompt", "   ", 5, "tokenswift", GREEDY, 0, "", "prompt"),
    ("200,000 emoji", "🙂" * 200_000, 5, "tokenswift", GREEDY, 0, "", "prompt"),
    ("prompt over the token limit", "Emma was happy. " * 800, 5, "tokenswift", GREEDY, 0, "", "prompt"),
    ("unknown model", "Hi", 5, "tokenswift", GREEDY, 0, "no such model", "unknown model"),
    ("a path as the model", "Hi", 5, "tokenswift", GREEDY, 0, "../../etc/passwd", "unknown model"),
    ("seed -1", "Hi", 5, "tokenswift", GREEDY, -1, "", "seed"),
    ("seed 1e30", "Hi", 5, "tokenswift", GREEDY, 1e30, "", "seed"),
]


@pytest.fixture(scope="module")
def server():
    srv = AppServer(env=ENV)
    srv.wait_ready()
    yield srv
    srv.close()


def client(server):
    from gradio_client import Client

    return Client(server.url, verbose=False)


def health(c) -> dict:
    return json.loads(c.predict(api_name="/health"))


def generate(c, prompt, n, method="tokenswift", settings=GREEDY, seed=0) -> dict:
    return json.loads(c.predict(prompt, n, method, settings, seed, "", api_name="/generate"))


def wait_idle(c, timeout=60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        h = health(c)
        if h["pending"] == 0 or time.monotonic() > deadline:
            return h
        time.sleep(0.2)


def test_bad_inputs_get_one_clear_sentence_and_the_server_keeps_serving(server):
    from gradio_client.exceptions import AppError

    c = client(server)
    generate(c, "Warm up", 5)
    before = health(c)
    rows = []
    for label, prompt, n, method, settings, seed, model, word in BAD_INPUTS:
        start = time.monotonic()
        with pytest.raises(AppError) as refused:
            c.predict(prompt, n, method, settings, seed, model, api_name="/generate")
        took = time.monotonic() - start
        message = str(refused.value)
        assert word.lower() in message.lower(), (label, message)
        assert "Traceback" not in message and len(message) < 400, (label, message)
        rows.append((label, message.replace("|", "/"), took))
    after = health(c)
    assert after["engine_pid"] == before["engine_pid"]  # no request reached, let alone killed, the engine
    assert after["engine_peak_mb"] - before["engine_peak_mb"] < 100  # nothing was allocated for them
    assert generate(c, "Emma", 5)["new_tokens"] == 5  # still serving
    lines = ["| input | answer | seconds |", "|---|---|---|"] + [f"| {a} | {m} | {t:.2f} |" for a, m, t in rows]
    lines.append(f"\nServer: {before['server_rss_mb']} MiB resident before, {after['server_rss_mb']} after, peak "
                 f"{after['server_peak_mb']}. Engine: {before['engine_rss_mb']} MiB before, {after['engine_rss_mb']} "
                 f"after, peak {after['engine_peak_mb']} (peak before the table: {before['engine_peak_mb']}).")
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    (ROOT / "test-artifacts" / "hardening-table.md").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))
    assert len(rows) >= 30


def test_four_simultaneous_clients_get_their_solo_output_and_a_fifth_is_told_busy(server):
    from gradio_client.exceptions import AppError

    solo = {p: generate(client(server), p, 300)["text"] for p in PROMPTS}
    clients = [client(server) for _ in PROMPTS]
    jobs = [c.submit(p, 300, "tokenswift", GREEDY, 0, "", api_name="/generate") for c, p in zip(clients, PROMPTS)]
    deadline = time.monotonic() + 60
    while any(not j.outputs() for j in jobs) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all(j.outputs() for j in jobs), "every client was admitted and told where it stands"
    assert health(clients[0])["pending"] == QUEUE  # all four are queued or running
    with pytest.raises(AppError, match="busy"):
        client(server).predict("One too many", 5, "tokenswift", GREEDY, 0, "", api_name="/generate")
    results = [[json.loads(u) for u in j] for j in jobs]
    for prompt, updates in zip(PROMPTS, results):
        final = updates[-1]
        assert final["done"] and final["text"] == solo[prompt]
        assert "".join(u.get("delta", "") for u in updates) == final["text"]  # only new text on each update
    positions = [u["queued"] for updates in results for u in updates if "queued" in u]
    assert sorted(set(positions)) and max(positions) == QUEUE - 1  # the last one in heard it had three ahead


def test_a_client_that_disconnects_mid_stream_frees_the_engine(server):
    c = client(server)
    job = c.submit("It is a truth universally acknowledged", 4000, "tokenswift", GREEDY, 0, "", api_name="/generate")
    deadline = time.monotonic() + 60
    while len(job.outputs()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    job.cancel()
    h = wait_idle(client(server))
    assert h["pending"] == 0, "the disconnected client's run still holds the engine"


def test_twenty_cancelled_runs_leave_no_thread_process_or_memory_behind(server):
    from gradio_client.exceptions import AppError

    c = client(server)
    generate(c, "Warm up", 50)
    start = health(c)
    helpers_before = set(_children(server.proc.pid)) - {start["engine_pid"]}  # e.g. multiprocessing's resource tracker
    kills = 0
    for i in range(20):
        job = client(server).submit(PROMPTS[i % 4], 4000, "tokenswift", GREEDY, 0, "", api_name="/generate")
        deadline = time.monotonic() + 60
        while len(job.outputs()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        if i % 5 == 4:  # every fifth: the engine process is killed mid-run
            os.kill(health(c)["engine_pid"], signal.SIGKILL)
            kills += 1
            with pytest.raises(AppError, match="engine process ended unexpectedly"):  # told why, in one sentence
                job.result()
        else:
            job.cancel()
        wait_idle(c)
    end = wait_idle(c)
    generate(c, "Warm up", 50)  # a new engine loads and serves
    end = health(c)
    children = _children(server.proc.pid)
    report = (f"20 cancelled runs ({kills} engine kills): server {start['server_rss_mb']} -> {end['server_rss_mb']} MiB, "
              f"threads {start['server_threads']} -> {end['server_threads']}, engine {start['engine_rss_mb']} -> "
              f"{end['engine_rss_mb']} MiB, child processes {children}")
    print("\n" + report)
    (ROOT / "test-artifacts" / "hardening-cancels.txt").write_text(report + "\n")
    assert end["pending"] == 0
    assert set(children) == helpers_before | {end["engine_pid"]}  # the killed engines are gone, not zombies
    assert end["engine_threads"] == 1  # one event dispatcher, for the live engine
    assert end["server_threads"] <= start["server_threads"] + 2
    assert end["server_rss_mb"] <= 1.10 * start["server_rss_mb"]


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(x) for x in f.read().split()]
    return out


def test_one_generation_at_a_time_per_client_session(server):
    from gradio_client.exceptions import AppError

    c = client(server)
    first = c.submit(PROMPTS[0], 2000, "tokenswift", GREEDY, 0, "", api_name="/generate")
    deadline = time.monotonic() + 60
    while not first.outputs() and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(AppError, match="already has a generation running"):
        c.predict(PROMPTS[1], 5, "tokenswift", GREEDY, 0, "", api_name="/generate")
    first.cancel()
    wait_idle(c)
    assert generate(c, PROMPTS[1], 5)["new_tokens"] == 5  # free again once the first has ended
