"""Interop: felix-client 0.6.2 uses a stream created while the cluster runs, through the CLI.

The cluster starts with nothing declared (`felix cluster up`); the operator creates a `quorum`
stream of four shards with `felix admin streams create` on one node's ops endpoint. The real
client, seeded with another node, sees the shard count the admin API placed, routes each keyed
publish straight to its shard's owner (no node forwards one: the client's `shard_owners` and
the placement agree), and reads every record back from every shard.
"""

import json
import re
import subprocess

import pytest

from cluster_up import CLI_BIN, LocalCluster

EVENT_TIMEOUT_S = 10
SHARDS = 4


@pytest.fixture(scope="module")
def cluster(runtime):
    c = LocalCluster(runtime, [])
    yield c
    assert c.stop() == 0, "felix cluster up must stop its nodes and exit 0 on SIGINT"


def admin(cluster, node, *args):
    ops = cluster.nodes[node].ops.removeprefix("http://")
    return subprocess.run(
        [CLI_BIN, "admin", "streams", args[0], "--broker", ops, "--ca", cluster.ca,
         "--token", cluster.token, *args[1:]],
        capture_output=True, text=True, timeout=60,
    )


def forwards(cluster):
    """Requests every node forwarded to a shard's leader, in all."""
    total = 0
    for n in cluster.nodes:
        m = re.search(r"^felix_broker_forwards_sent_total (\d+)", n.metrics(), re.M)
        total += int(m.group(1)) if m else 0
    return total


def test_a_stream_created_through_the_cli_is_used_by_the_real_client(cluster):
    out = admin(cluster, 0, "create", "t1", "default", "made", "--shards", str(SHARDS),
                "--replication-factor", "3", "--consistency", "quorum")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("created: "), out.stdout
    got = admin(cluster, 1, "get", "t1", "default", "made", "--json")
    assert got.returncode == 0, got.stdout + got.stderr
    view = json.loads(got.stdout)
    assert len(view["shards"]) == SHARDS and all(s["leader"] for s in view["shards"]), view

    c = cluster.client([cluster.seeds[2]])
    assert c.stream_shards("t1", "default", "made") == SHARDS
    before = forwards(cluster)
    keys = [f"k-{i}" for i in range(40)]
    for k in keys:
        c.publish("t1", "default", "made", k.encode(), key=k.encode())
    assert forwards(cluster) == before, "a keyed publish went to a node that does not own its shard"

    sub = cluster.client([cluster.seeds[1]]).subscribe_sharded(
        "t1", "default", "made", start="earliest")
    assert sub.shards == SHARDS
    seen, shards = [], set()
    while len(seen) < len(keys):
        rec = sub.next_event(timeout=EVENT_TIMEOUT_S)
        assert rec is not None, f"ended after {len(seen)} of {len(keys)}"
        seen.append(rec.event.payload.decode())
        shards.add(rec.shard)
    assert sorted(seen) == sorted(keys), "every acked record once"
    assert len(shards) >= 2, shards
    sub.close()
