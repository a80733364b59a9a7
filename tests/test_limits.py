"""Limits for a public Space: read from the environment, refused when malformed, documented in the README."""
import subprocess
import sys
from pathlib import Path

import pytest

from tokenswift.serve.limits import LIMITS, Limits, table

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_and_overrides():
    assert Limits.from_env({}) == Limits()
    got = Limits.from_env({"TOKENSWIFT_QUEUE_SIZE": "2", "TOKENSWIFT_MAX_UPLOAD_MB": "0.5",
                           "TOKENSWIFT_REQUEST_TIMEOUT_S": "30"})
    assert (got.queue_size, got.max_upload_bytes, got.request_timeout_s) == (2, 2**19, 30.0)


@pytest.mark.parametrize("variable,value", [("TOKENSWIFT_QUEUE_SIZE", "many"), ("TOKENSWIFT_QUEUE_SIZE", "2.5"),
                                            ("TOKENSWIFT_MAX_NEW_TOKENS", "-1"), ("TOKENSWIFT_MAX_UPLOAD_MB", "nan"),
                                            ("TOKENSWIFT_REQUEST_TIMEOUT_S", "0"), ("TOKENSWIFT_MAX_SESSIONS", "inf")])
def test_a_malformed_limit_is_refused_by_name(variable, value):
    with pytest.raises(ValueError, match=variable):
        Limits.from_env({variable: value})


@pytest.mark.slow  # starts app.py
def test_the_server_refuses_to_start_with_a_malformed_limit():
    out = subprocess.run([sys.executable, "app.py"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "TOKENSWIFT_QUEUE_SIZE": "lots", "HOME": str(ROOT)})
    assert out.returncode != 0 and "TOKENSWIFT_QUEUE_SIZE" in out.stderr and "Traceback" not in out.stderr


def test_every_limit_is_in_the_readme_with_its_default():
    readme = (ROOT / "README.md").read_text()
    assert table() in readme
    assert {limit.field for limit in LIMITS} == set(Limits.__dataclass_fields__)
