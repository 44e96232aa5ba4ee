"""The stream features of issue 9 with the real client: felix-client 0.6.2 against
`felix-broker` on durable storage (FELIX_DURABLE_FSYNC_MODE=on_commit).

What the 0.6.2 Python API can reach is exercised directly: `commit` / `state_get`
(FEATURE_ATOMIC_COMMIT), `stream_shards`, and the routing requests the client makes by itself
once the broker advertises FEATURE_TOPOLOGY and FEATURE_SHARD_OWNERS (a `topology` stream at
connect, `shard_owners` and `stream_shards` before the first publish). The 0.6.2 API has no
call for `producer_init` / `publish_idempotent`, `publish_if`, `stream_read` or
`offset_for_time`; for those the tests check that advertising their bits (and the 0x0100
frame flag) leaves every path the client does use unchanged. Our Rust client covers the
calls themselves (integration/tests/{idempotent_producer,publish_if,stream_read}.rs).
Each test runs once per broker runtime (conftest.py).
"""

import felix
import pytest

from test_durable import DurableBroker, collect

@pytest.fixture
def broker(storage, runtime):
    b = DurableBroker(storage, runtime)
    yield b
    b.stop()


@pytest.fixture
def storage(tmp_path):
    return tmp_path


def test_commit_then_state_get_reads_the_commit_offset_as_version(broker):
    c = broker.client()
    sub = c.subscribe("t1", "default", "matches", start="earliest")
    first = c.commit(
        "t1",
        "default",
        b"match-1",
        [
            felix.CommitOp.publish("matches", b"kickoff"),
            felix.CommitOp.put("matches", "score", b"0-0"),
            felix.CommitOp.put("matches", "half", b"1"),
        ],
    )
    assert first.offset == 0
    second = c.commit(
        "t1",
        "default",
        b"match-1",
        [
            felix.CommitOp.publish("matches", b"goal"),
            felix.CommitOp.put("matches", "score", b"1-0"),
            felix.CommitOp.delete("matches", "half"),
        ],
    )
    assert second.offset == 1
    score = c.state_get("t1", "default", "matches", b"match-1", "score")
    assert (score.value, score.version, score.as_of) == (b"1-0", 1, 1)
    half = c.state_get("t1", "default", "matches", b"match-1", "half")
    assert half.value is None
    never = c.state_get("t1", "default", "matches", b"match-1", "never-written")
    assert never.value is None and never.version is None
    # Subscribers see each commit's event once, at the commit's offset.
    got = collect(sub, 2)
    assert [(e.offset, e.payload) for e in got] == [(0, b"kickoff"), (1, b"goal")]


def test_committed_state_survives_a_restart(broker):
    c = broker.client()
    receipt = c.commit(
        "t1",
        "default",
        b"cart-9",
        [felix.CommitOp.publish("carts", b"added"), felix.CommitOp.put("carts", "items", b"3")],
    )
    del c
    broker.restart()
    c = broker.client()
    items = c.state_get("t1", "default", "carts", b"cart-9", "items")
    assert (items.value, items.version) == (b"3", receipt.offset)
    # The next commit lands after the one the restarted broker read back.
    later = c.commit(
        "t1",
        "default",
        b"cart-9",
        [felix.CommitOp.publish("carts", b"removed"), felix.CommitOp.put("carts", "items", b"2")],
    )
    assert later.offset == receipt.offset + 1


def test_a_commit_with_two_events_is_refused_before_it_is_sent(broker):
    c = broker.client()
    with pytest.raises(felix.EventCountError):
        c.commit(
            "t1",
            "default",
            b"e",
            [felix.CommitOp.publish("s", b"a"), felix.CommitOp.publish("s", b"b")],
        )


def test_routing_answers_and_publishes_with_every_new_bit_advertised(broker):
    # Connecting sends `topology` (FEATURE_TOPOLOGY), the first publish `shard_owners` and
    # `stream_shards`; each must be answered for these calls to return.
    c = broker.client()
    assert c.stream_shards("t1", "default", "routed") == 1
    offsets = [c.publish("t1", "default", "routed", f"r{i}".encode()) for i in range(5)]
    assert offsets == list(range(5))
    assert c.publish("t1", "default", "routed", b"keyed", key=b"k1") == 5
    assert c.publish("t1", "default", "routed", b"batch", ack="per_batch") == 6
    sub = c.subscribe("t1", "default", "routed", start=3)
    got = collect(sub, 4)
    assert [e.offset for e in got] == [3, 4, 5, 6]

