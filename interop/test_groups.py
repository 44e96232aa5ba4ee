"""Consumer groups with the real client: felix-client 0.6.2 against `felix-broker` on durable
storage. Poll and ack, nack and redelivery with attempts counted, dead letters after the
attempt bound (5 by default), redrive and discard, two independent groups, a position that
survives a restart, and a waiting poll woken by a publish. Each test runs once per broker
runtime (conftest.py).
"""

import pathlib
import tempfile
import threading
import time

import pytest

from test_durable import DurableBroker

T, NS = "t1", "default"
MAX_ATTEMPTS = 5


@pytest.fixture
def broker(runtime):
    with tempfile.TemporaryDirectory(prefix="felix-interop-groups-") as d:
        b = DurableBroker(pathlib.Path(d), runtime)
        yield b
        b.stop()


def poll(c, stream, group, wait=0.0, **kw):
    return c.group_poll(T, NS, stream, 0, group, wait=wait, **kw)


def test_poll_and_ack(broker):
    c = broker.client()
    for p in (b"a", b"b", b"c"):
        c.publish(T, NS, "jobs", p)
    got = poll(c, "jobs", "g", wait=1.0)
    assert [(r.offset, r.payload, r.attempts) for r in got] == [(0, b"a", 1), (1, b"b", 1), (2, b"c", 1)]
    # Claimed: another poll gets nothing.
    assert poll(c, "jobs", "g") == []
    for r in got:
        c.group_ack(T, NS, "jobs", 0, "g", r.offset)
    c.publish(T, NS, "jobs", b"d")
    assert [(r.offset, r.payload) for r in poll(c, "jobs", "g", wait=1.0)] == [(3, b"d")]


def test_nack_redelivers_then_dead_letters_then_redrive_and_discard(broker):
    c = broker.client()
    c.publish(T, NS, "retry", b"flaky")
    c.publish(T, NS, "retry", b"broken")
    for attempt in range(1, MAX_ATTEMPTS + 1):
        got = poll(c, "retry", "g", wait=1.0)
        assert [(r.offset, r.attempts) for r in got] == [(0, attempt), (1, attempt)]
        for r in got:
            c.group_nack(T, NS, "retry", 0, "g", r)
    # One more delivery would exceed the bound: both are dead letters instead.
    assert poll(c, "retry", "g") == []
    assert c.group_dead_letters(T, NS, "retry", 0, "g") == [0, 1]
    c.group_redrive(T, NS, "retry", 0, "g", 0)
    c.group_discard(T, NS, "retry", 0, "g", 1)
    assert c.group_dead_letters(T, NS, "retry", 0, "g") == []
    got = poll(c, "retry", "g", wait=1.0)
    assert [(r.offset, r.payload, r.attempts) for r in got] == [(0, b"flaky", 1)]
    c.group_ack(T, NS, "retry", 0, "g", 0)
    assert poll(c, "retry", "g") == []


def test_two_groups_are_independent(broker):
    c = broker.client()
    for i in range(4):
        c.publish(T, NS, "shared", bytes([i]))
    a = poll(c, "shared", "a", wait=1.0)
    for r in a:
        c.group_ack(T, NS, "shared", 0, "a", r.offset)
    b = poll(c, "shared", "b", wait=1.0)
    assert [r.offset for r in a] == [r.offset for r in b] == [0, 1, 2, 3]
    assert poll(c, "shared", "a") == []


def test_position_and_dead_letters_survive_a_restart(broker):
    c = broker.client()
    for i in range(5):
        c.publish(T, NS, "durable", f"r{i}".encode())
    got = poll(c, "durable", "g", wait=1.0)
    for r in got[:3]:
        c.group_ack(T, NS, "durable", 0, "g", r.offset)
    del c
    broker.restart()
    c = broker.client()
    # 3 and 4 were claimed, not settled: claims are not durable, so they come again.
    got = poll(c, "durable", "g", wait=1.0)
    assert [(r.offset, r.payload) for r in got] == [(3, b"r3"), (4, b"r4")]


def test_a_waiting_poll_returns_when_a_record_is_published(broker):
    c = broker.client()
    c.publish(T, NS, "idle", b"first")
    got = poll(c, "idle", "g", wait=1.0)
    c.group_ack(T, NS, "idle", 0, "g", got[0].offset)

    def later():
        time.sleep(0.3)
        c.publish(T, NS, "idle", b"wake")

    t = threading.Thread(target=later)
    started = time.monotonic()
    t.start()
    got = poll(c, "idle", "g", wait=10.0)
    waited = time.monotonic() - started
    t.join()
    assert [r.payload for r in got] == [b"wake"]
    assert 0.25 <= waited < 3.0, waited
