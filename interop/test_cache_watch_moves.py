"""Interop: felix-client 0.6.2's cache watch across a change of the cache's leader, on three
`felix-broker` processes started by `felix cluster up`, once per broker runtime.

The cache's leader is stopped (SIGSTOP) until another node leads the cache, then resumed.
The old leader ends the watch with `shard_moved` (docs/cluster.md), naming the new leader and
the first offset the watch was not offered; the client watches again there from that offset
(peer-client-cluster-wire.md, section 8), and the next change arrives with no gap. Nothing
waits by sleeping: every wait is for an answer, a change or a metric, bounded by a deadline
that fails the test.
"""

import time

import felix
import pytest

from cluster_up import LocalCluster

CACHE = "moving"
LABEL = f'shard="t1/default/{CACHE}#0"'
EVENT_TIMEOUT_S = 20
DEADLINE_S = 90


@pytest.fixture
def cache_cluster(runtime):
    # A short lease so the cache has a new leader well within the client's idle timeout
    # (6 s): the watch's connection to the stopped leader must outlive the stop.
    c = LocalCluster(runtime, ["--cache", f"t1/default/{CACHE}:3"], {"FELIX_LEASE_MS": "1000"})
    yield c
    assert c.stop() == 0, "felix cluster up must stop its nodes and exit 0 on SIGINT"


def leaders(nodes):
    """The nodes whose /metrics say they lead the cache (its values log)."""
    return [
        n for n in nodes
        if any(line.startswith("felix_broker_replication_lag_records{") and LABEL in line
               for line in n.metrics().splitlines())
    ]


def lag_zero(node):
    """The leader's followers hold every record of the cache's values log."""
    return any(line.startswith("felix_broker_replication_lag_records{") and LABEL in line
               and float(line.split()[-1]) == 0 for line in node.metrics().splitlines())


def quiet_recorded(node):
    """The leader had the cluster record a follower level with it (docs/replication.md, "Who
    may lead a `leader` shard"): only then may a follower take the cache over."""
    return any(line.startswith("felix_broker_leader_shards_quiet ")
               and float(line.split()[-1]) >= 1 for line in node.metrics().splitlines())


def wait_for(what, done, deadline):
    while not done():
        assert time.monotonic() < deadline, f"out of time waiting for {what}"


def put(client, key, value, deadline):
    """A cache put, asked again (bounded) while the cache is between leaders."""
    for _ in range(500):
        assert time.monotonic() < deadline, f"out of time putting {key}"
        try:
            return client.cache_put("t1", "default", CACHE, key, value)
        except (felix.ShardUnavailableError, felix.OverloadedError, felix.ConnectionError):
            continue
    raise AssertionError(f"put {key} refused 500 times")


def test_a_watch_follows_its_cache_to_the_next_leader(cache_cluster):
    cluster = cache_cluster
    deadline = time.monotonic() + DEADLINE_S
    client = cluster.client(cluster.seeds)
    put(client, "warm", b"w", deadline)
    wait_for("one leader", lambda: len(leaders(cluster.nodes)) == 1, deadline)
    (old,) = leaders(cluster.nodes)
    watch = client.watch_cache("t1", "default", CACHE, felix.CacheWatchFilter.prefix("k"))
    put(client, "k1", b"v1", deadline)
    first = watch.recv(timeout=EVENT_TIMEOUT_S)
    assert first is not None and first.key == "k1", first
    # Both followers hold it: the next leader has every change the watch saw.
    wait_for("followers level", lambda: lag_zero(old), deadline)
    wait_for("a follower recorded level", lambda: quiet_recorded(old), deadline)

    others = [n for n in cluster.nodes if n is not old]
    cluster.pause(old)
    try:
        wait_for("a new leader", lambda: len(leaders(others)) == 1, deadline)
    finally:
        cluster.resume(old)
    (new,) = leaders(others)

    # The old leader ends the watch with shard_moved, a notice the client hands over.
    moved = watch.recv(timeout=EVENT_TIMEOUT_S)
    assert isinstance(moved, felix.CacheWatchShardMoved), moved
    # A hint (spec 000, ShardMoved): the old leader names where its metadata says the cache
    # went. Stepping down as its lease lapsed, before it has heard of the new generation, that
    # is itself at the next one; the client is then redirected on to the new leader.
    assert moved.node_id in (new.id, old.id), (moved, new.id, old.id)
    assert moved.resume_from == first.offset + 1, (moved, first)
    # The client watches again at the new leader from there: the next change, no gap.
    put(client, "k2", b"v2", deadline)
    after = watch.recv(timeout=EVENT_TIMEOUT_S)
    assert after is not None and after.key == "k2", after
    assert after.offset == moved.resume_from, (after, moved)
    assert watch.closed is False
    watch.close()
