"""Events one address may have waiting in gradio's queue at once.

Gradio's queue holds a fixed number of events for everyone (`demo.queue(max_size=...)`). Without a per-address
bound one script that joins faster than its events finish (a replay every half second) keeps it full, and every
other visitor reads "queue is full". A join counts against its address from the moment gradio accepts it (its
response names the event) until the event's stream reports it completed (`process_completed`); an event whose
completion nobody reads stops counting after `max_age_s`.
"""
from __future__ import annotations

import json
import threading
import time

PER_ADDRESS_SHARE = 2  # an address may hold at most 1/2 of the queue (a classroom behind one address shares it)
MIN_PER_ADDRESS = 4  # ... and never fewer than this many events (a page's Run, Step and Load at once)


def per_address_limit(queue_max_size: int) -> int:
    return max(MIN_PER_ADDRESS, queue_max_size // PER_ADDRESS_SHARE)


class JoinLimiter:
    def __init__(self, per_address: int, max_age_s: float) -> None:
        self.per_address, self.max_age_s = per_address, max_age_s
        self._events: dict[str, tuple[str, float]] = {}  # event id -> (address, joined at)
        self._count: dict[str, int] = {}  # address -> events it has waiting or running
        self._lock = threading.Lock()

    def waiting(self, address: str) -> int:
        with self._lock:
            self._expire()
            return self._count.get(address, 0)

    def admits(self, address: str) -> bool:
        return self.waiting(address) < self.per_address

    def joined(self, address: str, event_id: str) -> None:
        with self._lock:
            if event_id in self._events:
                return
            self._events[event_id] = (address, time.monotonic())
            self._count[address] = self._count.get(address, 0) + 1

    def completed(self, event_id: str) -> None:
        with self._lock:
            self._forget(event_id)

    def joined_from_response(self, address: str, body: bytes) -> None:
        """Gradio's answer to a join ({"event_id": ...}); anything else (a refusal) counts for nothing."""
        try:
            event_id = json.loads(body).get("event_id")
        except (ValueError, AttributeError):
            return
        if isinstance(event_id, str) and event_id:
            self.joined(address, event_id)

    def completed_in_stream(self, chunk: bytes) -> None:
        """A chunk of an event stream ("data: {...}" lines): the events it reports completed stop counting."""
        if b"process_completed" not in chunk:
            return
        for line in chunk.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            try:
                message = json.loads(line[5:])
            except ValueError:
                continue
            if isinstance(message, dict) and message.get("msg") == "process_completed":
                event_id = message.get("event_id")
                if isinstance(event_id, str):
                    self.completed(event_id)

    def _forget(self, event_id: str) -> None:
        found = self._events.pop(event_id, None)
        if found is not None:
            address = found[0]
            self._count[address] -= 1
            if self._count[address] <= 0:
                del self._count[address]

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.max_age_s
        for event_id in [e for e, (_, t) in self._events.items() if t < cutoff]:
            self._forget(event_id)
