"""Interop: felix-client 0.6.2 against three `felix-broker` processes forming one cluster.

The cluster is started the way a user starts one, with `felix cluster up` (one CA, a leaf per
node, a JWKS and a token, peer mTLS), once per broker runtime. The client is given ONE seed and
finds the rest through `topology`; it routes keyed publishes and cache calls to the owners
`shard_owners` names, and `subscribe_sharded` follows each shard's `not_leader` to its owner.
Set FELIX_CLI_BIN / FELIX_BROKER_BIN to test other builds.
"""

import os
import signal
import time

import pytest

from cluster_up import LocalCluster

EVENT_TIMEOUT_S = 10
SHARDS = 6


@pytest.fixture(scope="module")
def cluster(runtime):
    c = LocalCluster(
        runtime, ["--stream", f"t1/default/orders:{SHARDS}", "--cache", "t1/default/sessions"])
    yield c
    assert c.stop() == 0, "felix cluster up must stop its nodes and exit 0 on SIGINT"


def test_one_seed_finds_every_node(cluster):
    assert len(cluster.seeds) == 3 and len(cluster.pids) == 3
    # Seeded with the middle node only: topology names all three, in node order.
    c = cluster.client([cluster.seeds[1]])
    assert c.endpoints() == cluster.seeds


def test_keyed_publishes_spread_over_the_nodes_and_every_record_arrives_once(cluster):
    c = cluster.client([cluster.seeds[0]])
    keys = [f"user-{i}" for i in range(60)]
    for k in keys:
        # Routed by shard_owners straight to each key's owner; acked there.
        c.publish("t1", "default", "orders", k.encode(), key=k.encode())
    assert c.stream_shards("t1", "default", "orders") == SHARDS
    reader = cluster.client([cluster.seeds[2]])
    sub = reader.subscribe_sharded("t1", "default", "orders", start="earliest")
    assert sub.shards == SHARDS
    got = []
    shards = set()
    while len(got) < len(keys):
        rec = sub.next_event(timeout=EVENT_TIMEOUT_S)
        assert rec is not None, f"ended after {len(got)} of {len(keys)}"
        got.append(rec.event.payload.decode())
        shards.add(rec.shard)
    assert sorted(got) == sorted(keys), "every acked record once"
    # Six shards, two led by each node: the records came from all three owners.
    assert len(shards) >= 3, shards
    sub.close()


def test_cache_calls_work_through_any_node(cluster):
    a = cluster.client([cluster.seeds[0]])
    b = cluster.client([cluster.seeds[2]])
    a.cache_put("t1", "default", "sessions", "s1", b"alice")
    assert b.cache_get("t1", "default", "sessions", "s1") == b"alice"
    b.cache_put("t1", "default", "sessions", "s1", b"bob")
    assert a.cache_get("t1", "default", "sessions", "s1") == b"bob"


def test_a_first_publish_to_an_undeclared_stream_succeeds_through_any_node(cluster):
    # Plain publish() makes one attempt: the entry node must hold it until the cluster has
    # placed the stream, not refuse it.
    for i, seed in enumerate(cluster.seeds):
        c = cluster.client([seed])
        stream = f"fresh-{i}"
        c.publish("t1", "default", stream, b"first")
        sub = c.subscribe("t1", "default", stream, start="earliest")
        rec = sub.next_event(timeout=EVENT_TIMEOUT_S)
        assert rec is not None and rec.payload == b"first", stream
        sub.close()


def test_a_killed_node_leaves_the_topology(cluster):
    # Last in the module: it kills n3 for good (SIGKILL, no goodbye). The control plane's
    # leader marks it down after half a lease without hearing it, so a client that connects
    # afterwards is told about the other two only. Polled with a bound: two leases (4 s) is
    # the promise, 15 s the patience of a loaded machine.
    os.kill(cluster.pids[2], signal.SIGKILL)
    # Each look is one connect and one `topology` round trip: the wait is the broker's
    # answer, not a sleep; bounded in count and time.
    deadline = time.monotonic() + 15
    for _ in range(2000):
        seen = cluster.client([cluster.seeds[0]]).endpoints()
        if seen == cluster.seeds[:2]:
            break
        assert time.monotonic() < deadline, f"n3 still listed: {seen}"
    else:
        raise AssertionError(f"n3 still listed after 2000 looks: {seen}")
    # Seeded with the other survivor: the same two.
    c = cluster.client([cluster.seeds[1]])
    assert c.endpoints() == cluster.seeds[:2]
