"""Limits at the HTTP layer, before any handler parses a request: an ASGI middleware (no gradio import).

- Request bodies: a request whose body is larger than its route allows is refused with 413 and one
  sentence, from its Content-Length before a byte is read, or as soon as a chunked body passes the limit.
  Uploads may carry one trace file; every other request a prompt at the token limit and its settings.
- The upload folder: uploads are refused with 503 while the folder (with the uploads in flight) would pass
  its disk budget; files are deleted once replayed (`UploadFolder.discard`), after `UPLOAD_MAX_AGE_S`,
  and the oldest first when the folder is over its budget.
- Session ids: a request that joins the queue with a session id longer than `SESSION_ID_CHARS` is refused
  (gradio keeps each id as a key for as long as its session lives).
- Queue joins per address: an address with `JoinLimiter.per_address` events waiting or running is refused (429)
  until one completes (tokenswift/serve/join_limit.py; addresses as tokenswift/serve/client_address.py reads them).
- Who is watching: `StreamWatch` notes, per session, when its event stream (`/queue/data`) last took a
  message. A run or API call whose client reads none of its stream for a while is stopped by its handler.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs

from .client_address import scope_address
from .join_limit import JoinLimiter, StreamLines

UPLOAD_MAX_AGE_S = 600.0  # an upload not replayed within this long is deleted
UPLOAD_GRACE_S = 60.0  # a fresh upload is kept this long even when the folder is over budget (its replay reads it)
PRUNE_PERIOD_S = 2.0  # how often the folder is walked (at most; on upload requests)
SESSION_ID_CHARS = 128  # longer session ids are not tracked (the server keeps no key of arbitrary length)
WATCHED_SESSIONS = 8192  # sessions whose stream activity is remembered (the oldest are forgotten)
MULTIPART_ROOM = 64 * 1024  # multipart headers and boundaries around an uploaded file
SETTINGS_ROOM = 64 * 1024  # the settings JSON (10,000 characters), the other controls and the envelope
JSON_BYTES_PER_CHAR = 6  # the most one character of a prompt takes in a JSON body ("\u00e9")
MIN_BODY = 2**20  # below a low prompt limit, a body this large still reaches the validator (and its sentence)


def max_body_bytes(max_prompt_chars: int) -> int:
    """The largest request body (other than an upload) worth parsing: a prompt of `max_prompt_chars`
    characters written as JSON at its widest, plus room for the settings (at least MIN_BODY)."""
    return max(max_prompt_chars * JSON_BYTES_PER_CHAR + SETTINGS_ROOM, MIN_BODY)


class UploadFolder:
    """The folder gradio writes uploads (and its file cache) to, kept within `budget` bytes on disk."""

    def __init__(self, path: str | Path, budget: int, max_age_s: float = UPLOAD_MAX_AGE_S) -> None:
        self.path = Path(path)
        self.budget = budget
        self.max_age_s = max_age_s
        self.in_flight = 0  # bytes declared by uploads being received
        self._used = 0
        self._pruned_at = 0.0
        self._lock = threading.Lock()

    def used(self) -> int:
        """Bytes on disk in the folder (as of the last walk, at most PRUNE_PERIOD_S old)."""
        self.prune()
        return self._used

    def prune(self, force: bool = False) -> int:
        """Delete files older than max_age_s, then the oldest beyond the budget (sparing fresh ones)."""
        now = time.time()
        with self._lock:
            if not force and now - self._pruned_at < PRUNE_PERIOD_S:
                return self._used
            self._pruned_at = now
            files = []
            for path in self.path.rglob("*") if self.path.is_dir() else ():
                try:
                    if path.is_file() and not path.is_symlink():
                        st = path.stat()
                        files.append((st.st_mtime, st.st_size, path))
                except OSError:
                    continue  # removed meanwhile
            files.sort()
            used = sum(size for _, size, _ in files)
            for mtime, size, path in files:
                old = now - mtime > self.max_age_s
                over = used > self.budget and now - mtime > UPLOAD_GRACE_S
                if old or over:
                    path.unlink(missing_ok=True)
                    used -= size
            for folder in sorted((p for p in self.path.rglob("*") if p.is_dir()), reverse=True):
                try:
                    folder.rmdir()  # empty per-upload folders
                except OSError:
                    pass
            self._used = used
            return used

    def added(self, size: int) -> None:
        """An upload of `size` bytes was received (counted until the next walk measures it)."""
        with self._lock:
            self._used += size

    def has_room(self, size: int) -> bool:
        return self.used() + self.in_flight + size <= self.budget

    def discard(self, path: str | Path) -> None:
        """Delete a replayed upload (only files inside the folder)."""
        try:
            target = Path(path).resolve()
            if self.path.resolve() in target.parents and target.is_file():
                size = target.stat().st_size
                target.unlink()
                with self._lock:
                    self._used = max(0, self._used - size)
        except OSError:
            pass


class StreamWatch:
    """Per session: when its event stream last delivered a message (or opened)."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def activity(self, session: str, opened: int = 0) -> None:
        if len(session) > SESSION_ID_CHARS:
            return
        with self._lock:
            self._last.pop(session, None)
            self._last[session] = time.monotonic()  # most recent last
            if opened:
                self._open[session] = self._open.get(session, 0) + opened
                if self._open[session] <= 0:
                    del self._open[session]
            while len(self._last) > WATCHED_SESSIONS:
                oldest = next(iter(self._last))
                del self._last[oldest]
                self._open.pop(oldest, None)

    def idle_s(self, session: str, since: float) -> float:
        """Seconds since the session's stream last delivered anything, counted from `since` at the latest
        (a job's start: the client may open its stream just after)."""
        with self._lock:
            last = max(self._last.get(session, since), since)
        return time.monotonic() - last


class HttpGuard:
    """ASGI middleware: body limits, the upload folder's budget, stream activity."""

    def __init__(self, app, max_body: int, max_upload_body: int, uploads: UploadFolder | None = None,
                 watch: StreamWatch | None = None, joins: JoinLimiter | None = None, proxies: int = 0) -> None:
        self.app = app
        self.max_body = max_body
        self.max_upload_body = max_upload_body
        self.uploads = uploads
        self.watch = watch
        self.joins, self.proxies = joins, proxies

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope.get("path", ""), scope.get("method", "GET")
        if method == "GET" and path.endswith("/queue/data") and self.watch is not None:
            return await self._watched_stream(scope, receive, send)
        if method not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        upload = path.endswith("/upload")
        limit = self.max_upload_body if upload else self.max_body
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            what = "An upload" if upload else "A request"
            return await _refuse(send, 413, f"{what} of {declared:,} bytes is larger than the {limit:,} bytes "
                                            f"this server accepts.")
        reserved = 0
        if upload and self.uploads is not None:
            reserved = declared if declared is not None else limit
            if not self.uploads.has_room(reserved):
                return await _refuse(send, 503, "The server's upload space is full; please try again in a few "
                                                "minutes.")
            self.uploads.in_flight += reserved
        received = 0
        if path.endswith("/queue/join"):
            body = await _read_body(receive, limit)
            if body is None:
                return await _refuse(send, 413, f"A request larger than the {limit:,} bytes this server accepts.")
            session = _session_of(body)
            if session is None:
                return await _refuse(send, 400, f"A request must name a session id of at most {SESSION_ID_CHARS} "
                                                f"characters.")
            receive = _replay(body, receive)
            if self.joins is not None:
                place = self.joins.reserve(scope_address(scope, self.proxies))
                if place is None:
                    return await _refuse(send, 429, f"Your address already has {self.joins.per_address} requests "
                                                    f"waiting or running; please wait for one to finish.")
                try:
                    return await self.app(scope, receive, _joined(send, self.joins, place))
                finally:
                    self.joins.release(place)  # no answer was read (a no-op once confirmed)

        async def counted():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:  # a chunked body past the limit: the handler sees a disconnected client
                    return {"type": "http.disconnect"}
            return message

        try:
            await self.app(scope, counted, send)
        finally:
            if reserved:
                self.uploads.in_flight -= reserved
                self.uploads.added(received)

    async def _watched_stream(self, scope, receive, send):
        session = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_hash", [""])[0]
        self.watch.activity(session, opened=1)

        lines = StreamLines()

        async def noted(message):
            if self.joins is not None and message["type"] == "http.response.body" and message.get("body"):
                self.joins.completed_in_lines(lines.feed(message["body"]))  # before sending: a client may leave
            await send(message)  # returns once the transport took it: a client that reads nothing stalls here
            if message["type"] == "http.response.body" and message.get("body"):
                self.watch.activity(session)

        try:
            await self.app(scope, receive, noted)
        finally:
            self.watch.activity(session, opened=-1)


async def _read_body(receive, limit: int) -> bytes | None:
    """The whole body, or None once it passes `limit` (or the client leaves)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def _session_of(body: bytes) -> str | None:
    """The session id a queue/join body names, if it is text of at most SESSION_ID_CHARS (else None). A body
    that is not a JSON object passes through: gradio refuses it with its own message."""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(data, dict):
        return ""
    session = data.get("session_hash", "")
    return session if isinstance(session, str) and len(session) <= SESSION_ID_CHARS else None


def _joined(send, joins: JoinLimiter, place: str):
    """A `send` that reads gradio's answer to a join (the event's id) and keeps the reserved place for that event."""
    chunks: list[bytes] = []

    async def noted(message):
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                joins.confirm(place, b"".join(chunks))
        await send(message)
    return noted


def _replay(body: bytes, receive):
    """A `receive` that hands the app a body already read, then passes on what the client sends next."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replayed


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send, status: int, sentence: str) -> None:
    body = json.dumps({"error": sentence}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
