"""Whose request is this: the visitor's address, as fairness and per-address limits count it.

Each proxy in front of the server appends the address it took the connection from to X-Forwarded-For, so behind
n proxies the visitor's address is the n-th entry from the right; what a visitor writes into the header
themselves sits to the left of it and is never read. With no proxy in front, the header is the visitor's own
text and is ignored: the socket's peer is the address. `TOKENSWIFT_TRUSTED_PROXIES` says how many proxies there
are: 1 by default on a Hugging Face Space (which sets SPACE_ID), else 0.
"""
from __future__ import annotations

import os
from typing import Mapping

TRUSTED_PROXIES_ENV = "TOKENSWIFT_TRUSTED_PROXIES"
MAX_TRUSTED_PROXIES = 8
ADDRESS_CHARS = 64  # an address longer than this is cut (a key, never echoed)


def trusted_proxies(env: Mapping[str, str] | None = None) -> int:
    """The number of proxies in front of the server; a malformed value is a ValueError naming the variable."""
    env = os.environ if env is None else env
    raw = env.get(TRUSTED_PROXIES_ENV, "").strip()
    if not raw:
        return 1 if env.get("SPACE_ID") else 0
    if not raw.isdigit() or int(raw) > MAX_TRUSTED_PROXIES:
        raise ValueError(f"{TRUSTED_PROXIES_ENV} must be a whole number from 0 to {MAX_TRUSTED_PROXIES} (the proxies "
                         f"in front of the server); got {raw[:40]!r}")
    return int(raw)


def client_address(forwarded: str | None, peer: str | None, proxies: int) -> str:
    """forwarded: the X-Forwarded-For header ('' or None when absent); peer: the socket's peer address."""
    if proxies > 0 and forwarded:
        entries = [e.strip() for e in forwarded.split(",") if e.strip()]
        if entries:  # fewer entries than proxies: the outermost one there is
            return entries[-min(proxies, len(entries))][:ADDRESS_CHARS]
    return (peer or "local")[:ADDRESS_CHARS]


def scope_address(scope: Mapping, proxies: int) -> str:
    """The address of an ASGI request (its scope)."""
    forwarded = ",".join(value.decode("latin-1") for name, value in scope.get("headers", ())
                         if name == b"x-forwarded-for")
    peer = scope.get("client")
    return client_address(forwarded, peer[0] if peer else None, proxies)
