"""Hardening II (issue 28) against a running `python app.py`, over raw HTTP as a hostile script would send it:
unattended runs stop, bodies are bounded before parsing, uploads are bounded on disk, non-finite numbers
and huge values get one sentence."""
import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from ui.app_server import DEFAULT_MODEL, AppServer

pytestmark = [pytest.mark.slow,  # a live server or engine process: the full suite only
              pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").exists(), reason="the default model is not built")]

UNWATCHED_S = 6
UPLOAD_DIR_MB = 12


@pytest.fixture(scope="module")
def server():
    uploads = Path(tempfile.mkdtemp(prefix="tokenswift-test-uploads-"))
    srv = AppServer(env={"TOKENSWIFT_UNWATCHED_S": str(UNWATCHED_S), "TOKENSWIFT_API_MAX_NEW_TOKENS": "4000",
                         "TOKENSWIFT_UPLOAD_DIR_MB": str(UPLOAD_DIR_MB), "GRADIO_TEMP_DIR": str(uploads),
                         "TOKENSWIFT_TRUSTED_PROXIES": "1"})  # X-Forwarded-For stands for other addresses
    srv.uploads = uploads
    srv.wait_ready()
    yield srv
    srv.close()
    shutil.rmtree(uploads, ignore_errors=True)


def client(server):
    from gradio_client import Client

    return Client(server.url, verbose=False)


def health(server) -> dict:
    return json.loads(client(server).predict(api_name="/health"))


def join(server, data: list, session: str, raw: str | None = None):
    """POST /queue/join for /generate as raw HTTP (`raw`: the body's text as is, e.g. with NaN)."""
    import httpx

    fn_index = client(server)._infer_fn_index("/generate", None)
    body = raw if raw is not None else json.dumps({"data": data, "fn_index": fn_index, "session_hash": session,
                                                   "event_data": None, "trigger_id": None})
    return httpx.post(server.url + "gradio_api/queue/join", content=body.replace("@FN@", str(fn_index)),
                      headers={"content-type": "application/json"}, timeout=30)


def outcome(server, session: str, timeout: float = 60) -> dict:
    """Read the session's event stream until its job completes; returns the process_completed message."""
    import httpx

    with httpx.stream("GET", server.url + "gradio_api/queue/data", params={"session_hash": session},
                      timeout=timeout) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("msg") == "process_completed":
                    return message
    raise AssertionError("the stream ended without a result")


def wait_idle(server, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if health(server)["pending"] == 0:
            return time.monotonic() - start
        time.sleep(0.5)
    raise AssertionError(f"the engine still had work after {timeout:.0f} s")


def test_a_run_whose_stream_nobody_reads_stops_and_frees_the_engine(server):
    assert join(server, ["It is a truth universally acknowledged", 4000, "tokenswift", "{}", 0, ""], "unread1").status_code == 200
    deadline = time.monotonic() + 30
    while health(server)["pending"] == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert health(server)["pending"] == 1
    took = wait_idle(server, UNWATCHED_S + 15)
    assert took < UNWATCHED_S + 15


def test_a_client_that_reads_its_stream_is_not_stopped(server):
    c = client(server)
    start = time.monotonic()
    out = json.loads(c.predict("Emma Woodhouse, handsome,", 400, "ar", "{}", 0, "", api_name="/generate"))
    assert out["done"] and out["new_tokens"] == 400 and not out["stopped"]
    assert time.monotonic() - start < 120


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_max_new_tokens_over_raw_http_gets_one_sentence(server, literal):
    session = f"nan{abs(hash(literal))}"
    raw = ('{"data": ["Hi", ' + literal + ', "tokenswift", "{}", 0, ""], "fn_index": @FN@, "session_hash": "'
           + session + '", "event_data": null, "trigger_id": null}')
    assert join(server, [], session, raw=raw).status_code == 200
    message = outcome(server, session)
    error = message["output"].get("error")
    assert error and "max_new_tokens" in error and "Traceback" not in error and len(error) < 300, message


def test_a_body_larger_than_a_prompt_at_the_limit_is_refused_before_parsing(server):
    before = health(server)["server_peak_mb"]
    response = join(server, ["x" * 20_000_000, 5, "tokenswift", "{}", 0, ""], "big")
    assert response.status_code == 413
    error = response.json()["error"]
    assert "larger than" in error and error.count(". ") == 0
    assert health(server)["server_peak_mb"] - before < 60  # 20 MB was never parsed into objects


def test_a_long_model_name_is_not_echoed(server):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as refused:
        client(server).predict("Hi", 5, "tokenswift", "{}", 0, "m" * 400_000, api_name="/generate")
    assert "unknown model" in str(refused.value) and len(str(refused.value)) < 1000


def test_uploads_are_bounded_on_disk(server):
    import httpx

    answers = []
    for k in range(8):
        files = {"files": (f"t{k}.json", b"{" + b" " * (3 * 2**20) + b"}", "application/json")}
        answers.append(httpx.post(server.url + "gradio_api/upload", files=files, timeout=60).status_code)
    used = sum(p.stat().st_size for p in server.uploads.rglob("*") if p.is_file())
    assert 503 in answers and used <= UPLOAD_DIR_MB * 2**20, (answers, used)
    assert health(server)["upload_dir_mb"] <= UPLOAD_DIR_MB


def test_one_address_cannot_fill_the_queue_and_gets_its_place_back_once_it_reads_its_results(server):
    """A script that joins faster than it reads (a replay every half second) is held to its share of gradio's queue;
    another address still gets in; once the script reads its stream, its completed events stop counting."""
    import httpx

    from tokenswift.serve.join_limit import per_address_limit

    fn_index = client(server)._infer_fn_index("/health", None)
    share = per_address_limit(4 * (4 + 2))  # the app's queue: 4 x (queue size + 2) events

    def join_as(address: str, session: str) -> httpx.Response:
        body = json.dumps({"data": [], "fn_index": fn_index, "session_hash": session, "event_data": None,
                           "trigger_id": None})
        return httpx.post(server.url + "gradio_api/queue/join", content=body, timeout=30,
                          headers={"content-type": "application/json", "x-forwarded-for": address})

    answers = [join_as("6.6.6.6", "hostile") for _ in range(share)]
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    refused = join_as("6.6.6.6", "hostile")
    assert refused.status_code == 429
    assert refused.json()["error"] == (f"Your address already has {share} requests waiting or running; please wait "
                                       f"for one to finish.")
    other = join_as("7.7.7.7", "ordinary")
    assert other.status_code == 200
    assert outcome(server, "ordinary")["success"]
    completed = 0
    with httpx.stream("GET", server.url + "gradio_api/queue/data", params={"session_hash": "hostile"},
                      timeout=60) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:") and json.loads(line[5:]).get("msg") == "process_completed":
                completed += 1
                if completed == share:
                    break
    assert join_as("6.6.6.6", "hostile2").status_code == 200  # its completed events no longer count

