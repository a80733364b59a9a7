"""The 10-minute soak of issue 28 (tests/soak.py), as a test that runs only when asked for:

    python -m pytest tests/test_soak.py -m soak -s            # TOKENSWIFT_SOAK_MINUTES=10 by default

A plain `python -m pytest` (or `-m "not slow"`) skips it: it needs 10+ minutes and both cores."""
import json
import os

import pytest

from ui.app_server import DEFAULT_MODEL

pytestmark = [pytest.mark.soak, pytest.mark.slow,
              pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").exists(), reason="the default model is not built")]


@pytest.fixture(autouse=True)
def only_when_asked(request):
    expression = request.config.getoption("markexpr") or ""
    if "soak" not in expression or "not soak" in expression:
        pytest.skip("the soak runs only with -m soak")


def test_one_hostile_client_does_not_exhaust_the_space():
    from soak import acceptance, soak

    report = soak(float(os.environ.get("TOKENSWIFT_SOAK_MINUTES", "10")))
    print("\n" + json.dumps({k: v for k, v in report.items() if k != "final_health"}, indent=2))
    assert not acceptance(report), acceptance(report)
