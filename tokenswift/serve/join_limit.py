"""Events one address may have waiting in gradio's queue at once.

Gradio's queue holds a fixed number of events for everyone (`demo.queue(max_size=...)`). Without a per-address
bound one script that joins faster than its events finish (a replay every half second) keeps it full, and every
other visitor reads "queue is full". A join takes a place for its address when it is admitted (`reserve`, under
the lock, so joins sent at once cannot all pass one check); gradio's answer names the event the place is held for
(`confirm`; no event: the place is given back), and the event's stream reporting it completed gives it back
(`completed`). An event whose completion nobody reads stops counting after `max_age_s`.
"""
from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections import OrderedDict

PER_ADDRESS_SHARE = 2  # an address may hold at most 1/2 of the queue (a classroom behind one address shares it)
MIN_PER_ADDRESS = 4  # ... and never fewer than this many events (a page's Run, Step and Load at once)
RECENTLY_COMPLETED = 4096  # completed event ids remembered, for an answer parsed after its completion
_COMPLETED = re.compile(rb'"msg":\s*"process_completed"')
_EVENT_ID = re.compile(rb'"event_id":\s*"([^"\\]{1,128})"')


def per_address_limit(queue_max_size: int) -> int:
    return max(MIN_PER_ADDRESS, queue_max_size // PER_ADDRESS_SHARE)


class JoinLimiter:
    def __init__(self, per_address: int, max_age_s: float) -> None:
        self.per_address, self.max_age_s = per_address, max_age_s
        self._held: dict[str, tuple[str, float]] = {}  # place (a reservation, then its event id) -> (address, since)
        self._count: dict[str, int] = {}  # address -> places it holds
        self._done: OrderedDict[str, None] = OrderedDict()  # recently completed event ids
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def waiting(self, address: str) -> int:
        with self._lock:
            self._expire()
            return self._count.get(address, 0)

    def reserve(self, address: str) -> str | None:
        """A place for a join from `address` (its key), or None when the address holds its share already."""
        with self._lock:
            self._expire()
            if self._count.get(address, 0) >= self.per_address:
                return None
            place = f"reserved:{next(self._ids)}"
            self._hold(place, address)
            return place

    def confirm(self, place: str, answer: bytes) -> None:
        """Gradio's answer to the join the place was reserved for: {"event_id": ...} keeps the place for that event;
        anything else (a refusal), or an event already reported completed, gives it back."""
        try:
            event_id = json.loads(answer).get("event_id")
        except (ValueError, AttributeError):
            event_id = None
        with self._lock:
            held = self._held.pop(place, None)
            if held is None:
                return
            address, since = held
            if isinstance(event_id, str) and event_id and event_id not in self._done and event_id not in self._held:
                self._held[event_id] = (address, since)
            else:
                self._release(address)

    def release(self, place: str) -> None:
        """Give a reserved place back (the join ended without an answer)."""
        with self._lock:
            self._forget(place)

    def completed(self, event_id: str) -> None:
        with self._lock:
            if not self._forget(event_id):
                self._done[event_id] = None  # its answer may still be on its way
                while len(self._done) > RECENTLY_COMPLETED:
                    self._done.popitem(last=False)

    def completed_in_lines(self, heads: list[bytes]) -> None:
        """The heads of an event stream's lines (`StreamLines`): the events reported completed give their places
        back. Only a line's head is read: gradio writes the message kind and the event id before its output."""
        for head in heads:
            if not head.startswith(b"data:") or _COMPLETED.search(head) is None:
                continue
            found = _EVENT_ID.search(head)
            if found is not None:
                self.completed(found.group(1).decode("latin-1"))

    def _hold(self, place: str, address: str) -> None:
        self._held[place] = (address, time.monotonic())
        self._count[address] = self._count.get(address, 0) + 1

    def _forget(self, place: str) -> bool:
        held = self._held.pop(place, None)
        if held is None:
            return False
        self._release(held[0])
        return True

    def _release(self, address: str) -> None:
        self._count[address] -= 1
        if self._count[address] <= 0:
            del self._count[address]

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.max_age_s
        for place in [p for p, (_, since) in self._held.items() if since < cutoff]:
            self._forget(place)


class StreamLines:
    """Splits an event stream's body chunks into lines and keeps the first HEAD_BYTES of each (a line may arrive in
    several chunks; a completed event's line carries its whole output, which is never held)."""

    HEAD_BYTES = 512

    def __init__(self) -> None:
        self._head = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The heads of the lines this chunk completes."""
        parts = chunk.split(b"\n")
        done = []
        for part in parts[:-1]:
            done.append((self._head + part[: self.HEAD_BYTES])[: self.HEAD_BYTES])
            self._head = b""
        if len(self._head) < self.HEAD_BYTES:
            self._head = (self._head + parts[-1][: self.HEAD_BYTES])[: self.HEAD_BYTES]
        return done
