"""Consumer groups with the real client: felix-client 0.6.2 against `felix-broker` on durable
storage. Poll and ack, nack and redelivery with attempts counted, dead letters after the
attempt bound (5 by default), redrive and discard, two independent groups, a position and a
dead letter that survive a restart, and a waiting poll woken by a publish. Each test runs
once per broker runtime (conftest.py).
"""

import pathlib
import socket
import tempfile
import threading
import time
import urllib.request

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
    assert [r.offset for r in got] == [0, 1, 2, 3, 4]
    for r in got[:3]:
        c.group_ack(T, NS, "durable", 0, "g", r.offset)
    # Make 3 a dead letter the documented way (docs/groups.md): nack it until the next
    # delivery would pass the attempt bound, so the broker dead-letters it instead.
    record = got[3]
    for attempt in range(2, MAX_ATTEMPTS + 1):
        c.group_nack(T, NS, "durable", 0, "g", record)
        (record,) = poll(c, "durable", "g", wait=1.0)
        assert (record.offset, record.attempts) == (3, attempt)
    c.group_nack(T, NS, "durable", 0, "g", record)
    assert poll(c, "durable", "g") == [], "4 is still claimed, 3 is past its bound"
    assert c.group_dead_letters(T, NS, "durable", 0, "g") == [3]
    del c
    broker.restart()
    c = broker.client()
    # The dead letter is durable; the position (past 0..2) too; claims are not, so 4 (claimed,
    # never settled) comes again, and 3 does not: it is dead, not owed.
    assert c.group_dead_letters(T, NS, "durable", 0, "g") == [3]
    got = poll(c, "durable", "g", wait=1.0)
    assert [(r.offset, r.payload) for r in got] == [(4, b"r4")]
    # Redriven after the restart, the dead letter is delivered again with its attempts reset.
    c.group_redrive(T, NS, "durable", 0, "g", 3)
    assert c.group_dead_letters(T, NS, "durable", 0, "g") == []
    got = poll(c, "durable", "g", wait=1.0)
    assert [(r.offset, r.payload, r.attempts) for r in got] == [(3, b"r3", 1)]


def group_polls_handled(broker):
    """How many `group_poll` requests have reached the broker's handler (from /metrics). A
    poll is counted once the broker holds it, so a count that moved means it is waiting."""
    with urllib.request.urlopen(f"http://{broker.metrics_addr}/metrics", timeout=10) as r:
        body = r.read().decode()
    for line in body.splitlines():
        if line.startswith('felix_broker_group_operations_total{op="poll"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def free_tcp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_waiting_poll_returns_when_a_record_is_published(runtime):
    # The poll may wait an hour (the broker's cap raised to match): only the publish can end
    # it within the join's deadline, which only fails a hung test. How soon the wake comes is
    # not a pass/fail line; the engine's virtual-clock tests (felix-engine/tests/groups.rs)
    # pin the deadlines.
    metrics_addr = f"127.0.0.1:{free_tcp_port()}"
    with tempfile.TemporaryDirectory(prefix="felix-interop-groups-") as d:
        broker = DurableBroker(
            pathlib.Path(d), runtime, FELIX_METRICS_BIND=metrics_addr, FELIX_GROUP_MAX_WAIT_MS="3600000"
        )
        broker.metrics_addr = metrics_addr
        try:
            c = broker.client()
            c.publish(T, NS, "idle", b"first")
            got = poll(c, "idle", "g", wait=1.0)
            c.group_ack(T, NS, "idle", 0, "g", got[0].offset)
            before = group_polls_handled(broker)

            result = {}

            def waiting():
                result["got"] = poll(c, "idle", "g", wait=3600.0)

            t = threading.Thread(target=waiting, daemon=True)
            t.start()
            # Publish once the broker holds the poll, not after a guessed sleep.
            deadline = time.monotonic() + 60
            while group_polls_handled(broker) == before:
                assert time.monotonic() < deadline, "the poll never reached the broker"
                time.sleep(0.01)
            assert t.is_alive(), "an empty shard's poll waits"
            c.publish(T, NS, "idle", b"wake")
            t.join(timeout=60)
            assert not t.is_alive(), "the publish did not wake the waiting poll"
            assert [r.payload for r in result["got"]] == [b"wake"]
        finally:
            broker.stop()
