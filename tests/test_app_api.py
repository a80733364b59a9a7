"""Drive the running app through gradio_client, as an API user would."""
import json

import pytest

from ui.app_server import DEFAULT_MODEL, AppServer

pytestmark = [pytest.mark.slow,  # a live server or engine process: the full suite only
              pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").exists(), reason="the default model is not built")]


@pytest.fixture(scope="module")
def server():
    srv = AppServer()
    srv.wait_ready()
    yield srv
    srv.close()


def test_generate_endpoint_streams_and_matches_ar(server):
    from gradio_client import Client

    client = Client(server.url, verbose=False)
    job = client.submit("It is a truth universally acknowledged", 60, "tokenswift", "{}", 0, "", api_name="/generate")
    updates = [json.loads(u) for u in job]
    final = json.loads(job.result())
    assert final["done"] and final["new_tokens"] == 60
    assert len(updates) >= 2 and updates[0]["new_tokens"] < 60  # it streamed
    ar = json.loads(client.predict("It is a truth universally acknowledged", 60, "ar", "{}", 0, "", api_name="/generate"))
    assert ar["text"] == final["text"]  # greedy: identical
    assert final["stats"]["mean_accepted"] > 1.0


def test_generate_endpoint_rejects_bad_settings_with_a_message(server):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    client = Client(server.url, verbose=False)
    with pytest.raises(AppError, match="top_p"):
        client.predict("Hello", 10, "tokenswift", '{"top_p": 3}', 0, "", api_name="/generate")
    with pytest.raises(AppError, match="prompt"):
        client.predict("   ", 10, "tokenswift", "{}", 0, "", api_name="/generate")
    # the server is still alive and serving
    assert json.loads(client.predict("Emma", 5, "ar", "{}", 0, "", api_name="/generate"))["new_tokens"] == 5
