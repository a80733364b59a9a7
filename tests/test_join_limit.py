"""Per-address queue joins (tokenswift/serve/join_limit.py): counted from gradio's answer to the join until the event
stream reports the event completed, or until it is too old."""
import json
import time

from tokenswift.serve.join_limit import MIN_PER_ADDRESS, JoinLimiter, per_address_limit


def sse(*messages: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(m).encode() + b"\n\n" for m in messages)


def test_an_address_is_admitted_until_it_holds_its_share():
    joins = JoinLimiter(per_address=2, max_age_s=60)
    assert joins.admits("a")
    joins.joined_from_response("a", b'{"event_id": "e1"}')
    joins.joined_from_response("a", b'{"event_id": "e2"}')
    assert not joins.admits("a") and joins.waiting("a") == 2
    assert joins.admits("b")  # another address is not affected
    joins.joined_from_response("a", b'{"event_id": "e2"}')  # the same event twice counts once
    assert joins.waiting("a") == 2


def test_completed_events_in_the_stream_stop_counting():
    joins = JoinLimiter(per_address=2, max_age_s=60)
    for e in ("e1", "e2"):
        joins.joined("a", e)
    joins.completed_in_stream(sse({"msg": "process_generating", "event_id": "e1"}))
    assert joins.waiting("a") == 2  # still running
    joins.completed_in_stream(sse({"msg": "heartbeat"}, {"msg": "process_completed", "event_id": "e1", "success": True}))
    assert joins.waiting("a") == 1 and joins.admits("a")
    joins.completed_in_stream(b"data: {not json}\n\n" + sse({"msg": "process_completed", "event_id": 7}))
    assert joins.waiting("a") == 1  # malformed chunks change nothing


def test_refusals_count_for_nothing_and_old_events_expire():
    joins = JoinLimiter(per_address=1, max_age_s=0.05)
    for body in (b'{"detail": "Queue is full"}', b"not json", b"[1, 2]", b'{"event_id": 5}'):
        joins.joined_from_response("a", body)
    assert joins.waiting("a") == 0
    joins.joined("a", "e1")
    assert not joins.admits("a")
    time.sleep(0.1)
    assert joins.admits("a")  # nobody read its completion: it stops counting after max_age_s


def test_an_address_may_hold_half_the_queue_and_at_least_a_few_events():
    assert per_address_limit(24) == 12
    assert per_address_limit(2) == MIN_PER_ADDRESS
