"""Interop: felix-client 0.6.2 against a cache of 4 shards created while the cluster runs.

Three `felix-broker` processes started by `felix cluster up` with nothing declared, once per
broker runtime. The cache is created through `felix admin caches create --shards 4 --rf 3`
(any node's ops endpoint answers, and the same create through another says it exists). Then:

- through every seed, `cache_shards` answers 4 and `shard_owners` lists 4 owners, the leaders
  `felix admin caches get` shows (`felix cache shards` asks both on the client wire);
- the real client, given ONE seed (each in turn), writes keys that hash over all 4 shards and
  reads them back through another seed. It routes each call by `shard_owners` and the shared
  key → shard function; the broker hashes the same way, so no call is forwarded between nodes
  (a call the client sent to the wrong node would be);
- a key watch follows its key's shard to its owner; a prefix watch, which names no shard in
  this client, is refused on a cache of several shards (protocol: one watch per shard).

Set FELIX_CLI_BIN / FELIX_BROKER_BIN to test other builds.
"""

import json
import subprocess
import time

import felix
import pytest

from cluster_up import CLI_BIN, LocalCluster

CACHE = "wide"
SHARDS = 4
EVENT_TIMEOUT_S = 20
DEADLINE_S = 90


@pytest.fixture(scope="module")
def cluster(runtime):
    c = LocalCluster(runtime, [])
    yield c
    assert c.stop() == 0, "felix cluster up must stop its nodes and exit 0 on SIGINT"


def cli(cluster, *args):
    return subprocess.run([CLI_BIN, *args], capture_output=True, text=True, timeout=60)


def admin(cluster, node, verb, *args):
    ops = node.ops.removeprefix("http://")
    return cli(cluster, "admin", "caches", verb, "--broker", ops, "--ca", cluster.ca,
               "--token", cluster.token, *args)


def client_shards(cluster, seed):
    """`cache_shards` and `shard_owners` through `seed`, as `felix cache shards` prints them:
    the count, and each shard's owner node id (None where none)."""
    out = cli(cluster, "cache", "shards", CACHE, "--addr", seed, "--ca", cluster.ca,
              "--token", cluster.token)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    count = int(lines[0].removeprefix("cache_shards "))
    owners = [None if line.split()[2] == "-" else line.split()[2] for line in lines[1:]]
    return count, owners


def forwards(cluster):
    """Requests the nodes forwarded to their shard's leader, all together."""
    total = 0
    for node in cluster.nodes:
        for line in node.metrics().splitlines():
            if line.startswith("felix_broker_forwards_sent"):
                total += float(line.split()[-1])
    return total


def retried(what, call, deadline):
    """A call asked again (bounded) while the cache has a shard between leaders."""
    while True:
        assert time.monotonic() < deadline, f"out of time: {what}"
        try:
            return call()
        except (felix.ShardUnavailableError, felix.OverloadedError, felix.ConnectionError):
            continue


def test_a_cache_of_four_shards_created_through_the_cli_is_routed_to_its_owners(cluster):
    deadline = time.monotonic() + DEADLINE_S
    first, *others = cluster.nodes
    out = admin(cluster, first, "create", "t1", "default", CACHE, "--shards", "4", "--rf", "3")
    assert out.returncode == 0 and out.stdout.startswith("created"), out.stdout + out.stderr
    for node in others:
        again = admin(cluster, node, "create", "t1", "default", CACHE, "--shards", "4",
                      "--rf", "3")
        assert again.returncode == 0 and again.stdout.startswith("exists"), again.stderr
    shown = admin(cluster, others[-1], "get", "t1", "default", CACHE, "--json")
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert view["spec"]["shards"] == SHARDS
    leaders = [s["leader"] for s in view["shards"]]
    assert len(leaders) == SHARDS and all(leaders), view
    assert len(set(leaders)) == 3, f"spread over the three nodes: {leaders}"

    for seed in cluster.seeds:
        assert client_shards(cluster, seed) == (SHARDS, leaders), seed

    before = forwards(cluster)
    written = {}
    for i, seed in enumerate(cluster.seeds):
        client = cluster.client([seed])
        for n in range(12):
            key = f"user-{i}-{n}"
            value = f"{seed}/{n}".encode()
            retried(f"put {key}", lambda: client.cache_put("t1", "default", CACHE, key, value),
                    deadline)
            written[key] = value
    for i, seed in enumerate(cluster.seeds):
        reader = cluster.client([cluster.seeds[(i + 1) % len(cluster.seeds)]])
        for key, value in written.items():
            got = retried(f"get {key}", lambda: reader.cache_get("t1", "default", CACHE, key),
                          deadline)
            assert got == value, (key, seed)
    assert forwards(cluster) == before, \
        "the real client and the brokers routed every key to the same shard's owner"

    # A key watch is served by its key's shard's owner (redirected there from the entry).
    client = cluster.client([cluster.seeds[0]])
    watch = client.watch_cache("t1", "default", CACHE, felix.CacheWatchFilter.key("user-0-1"))
    retried("put user-0-1", lambda: client.cache_put("t1", "default", CACHE, "user-0-1", b"again"),
            deadline)
    event = watch.recv(timeout=EVENT_TIMEOUT_S)
    assert event is not None and event.key == "user-0-1" and event.value == b"again", event
    watch.close()
    # A prefix watch covers one shard and must name it on a cache of several: this client
    # names none, and is refused rather than shown a quarter of the keys.
    with pytest.raises(felix.FelixError):
        w = client.watch_cache("t1", "default", CACHE, felix.CacheWatchFilter.prefix("user-"))
        w.recv(timeout=EVENT_TIMEOUT_S)
