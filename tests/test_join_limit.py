"""Per-address queue joins (tokenswift/serve/join_limit.py, applied in http_guard.py): a place is taken at admission,
kept for the event gradio's answer names, and given back when the event's stream reports it completed."""
import asyncio
import json
import time

from tokenswift.serve.http_guard import HttpGuard, StreamWatch
from tokenswift.serve.join_limit import MIN_PER_ADDRESS, JoinLimiter, StreamLines, per_address_limit


def sse(*messages: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(m).encode() + b"\n\n" for m in messages)


def completed_in(joins: JoinLimiter, chunk: bytes) -> None:
    joins.completed_in_lines(StreamLines().feed(chunk))


def test_an_address_is_admitted_until_it_holds_its_share():
    joins = JoinLimiter(per_address=2, max_age_s=60)
    first, second = joins.reserve("a"), joins.reserve("a")
    assert first and second and joins.reserve("a") is None  # reserved places count before any answer
    assert joins.reserve("b") is not None  # another address is not affected
    joins.confirm(first, b'{"event_id": "e1"}')
    joins.confirm(second, b'{"event_id": "e1"}')  # an event already held: the second place is given back
    assert joins.waiting("a") == 1


def test_completed_events_in_the_stream_give_their_places_back():
    joins = JoinLimiter(per_address=2, max_age_s=60)
    for e in ("e1", "e2"):
        joins.confirm(joins.reserve("a"), json.dumps({"event_id": e}).encode())
    completed_in(joins, sse({"msg": "process_generating", "event_id": "e1"}))
    assert joins.waiting("a") == 2  # still running
    completed_in(joins, sse({"msg": "heartbeat"}, {"msg": "process_completed", "event_id": "e1", "success": True,
                                                   "output": {"data": ["x" * 100_000]}}))
    assert joins.waiting("a") == 1
    completed_in(joins, b"data: {not json}\n\n" + sse({"msg": "process_completed", "event_id": 7}))
    assert joins.waiting("a") == 1  # malformed lines change nothing


def test_a_completion_read_before_its_answer_still_frees_the_place():
    joins = JoinLimiter(per_address=1, max_age_s=60)
    place = joins.reserve("a")
    completed_in(joins, sse({"msg": "process_completed", "event_id": "fast"}))
    joins.confirm(place, b'{"event_id": "fast"}')
    assert joins.waiting("a") == 0


def test_a_line_split_across_chunks_is_read_whole():
    lines = StreamLines()
    message = sse({"msg": "process_completed", "event_id": "e9", "output": {"data": ["y" * 5000]}})
    heads = [h for i in range(0, len(message), 7) for h in lines.feed(message[i : i + 7])]
    assert heads[0].startswith(b'data: {"msg": "process_completed", "event_id": "e9"')
    assert all(len(h) <= StreamLines.HEAD_BYTES for h in heads)


def test_refusals_and_lost_answers_give_places_back_and_old_events_expire():
    joins = JoinLimiter(per_address=1, max_age_s=0.05)
    for answer in (b'{"detail": "Queue is full"}', b"not json", b"[1, 2]", b'{"event_id": 5}'):
        joins.confirm(joins.reserve("a"), answer)
    assert joins.waiting("a") == 0
    joins.release(joins.reserve("a"))  # the join ended without an answer
    assert joins.waiting("a") == 0
    joins.confirm(joins.reserve("a"), b'{"event_id": "e1"}')
    assert joins.reserve("a") is None
    time.sleep(0.1)
    assert joins.reserve("a") is not None  # nobody read its completion: it stops counting after max_age_s


def test_joins_sent_at_once_cannot_all_pass_one_check():
    """Thirty joins from one address at the same moment, gradio answering each after 50 ms: only the address's
    share is admitted, the rest get 429 and one sentence."""
    answered = iter(range(10_000))

    async def gradio(scope, receive, send):
        await receive()
        await asyncio.sleep(0.05)
        body = json.dumps({"event_id": f"e{next(answered)}"}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    guard = HttpGuard(gradio, max_body=2**20, max_upload_body=2**20, watch=StreamWatch(),
                      joins=JoinLimiter(per_address=6, max_age_s=60), proxies=1)

    async def join(address: str) -> int:
        scope = {"type": "http", "path": "/gradio_api/queue/join", "method": "POST",
                 "headers": [(b"x-forwarded-for", address.encode())], "client": ("127.0.0.1", 1)}
        body = json.dumps({"data": [], "fn_index": 0, "session_hash": "s"}).encode()
        sent = []

        async def receive():
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message):
            sent.append(message)
        await guard(scope, receive, send)
        return sent[0]["status"]

    async def flood():
        return await asyncio.gather(*(join("6.6.6.6") for _ in range(30)), join("7.7.7.7"))

    statuses = asyncio.run(flood())
    assert statuses[:30].count(200) == 6 and statuses[:30].count(429) == 24
    assert statuses[30] == 200  # another address still gets in


def test_an_address_may_hold_half_the_queue_and_at_least_a_few_events():
    assert per_address_limit(24) == 12
    assert per_address_limit(2) == MIN_PER_ADDRESS
