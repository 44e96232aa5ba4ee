"""Interop: felix-client 0.6.2 against replicated shards (docs/replication.md) on three
`felix-broker` processes started by `felix cluster up`, once per broker runtime.

Three faults, each on a cluster of its own, against a stream of 3 shards with replication
factor 3 and `consistency = "quorum"` (and, for the second, one with `"leader"`):

- the leader of one shard is SIGKILLed while client threads publish acked keyed records to
  it: publishes resume once the client has failed over and the shard has a new leader, and
  every acknowledged record is read back from the survivors once, at the offset its ack gave;
- both followers of a shard are SIGSTOPped: a quorum publish is answered `quorum_timeout`
  (felix.OutcomeUnknownError) while a leader-consistency publish on the same leader is acked;
  after SIGCONT a quorum publish is acked again;
- a consumer group acknowledges four of six records on a shard's leader, which is then
  SIGKILLed: the next leader hands out only the other two (and a new record), since the
  shard's group log is replicated with it.

The shard a key lands on is computed here as the broker does (felix-proto/src/routing.rs);
who leads a shard is read from the nodes' /metrics (`replication_lag_records` lists each
replicated shard a node leads). Nothing waits by sleeping: every wait is for an answer, an
ack, an event or a thread, bounded by a deadline that fails the test.
"""

import collections
import threading
import time

import felix
import pytest

from cluster_up import LocalCluster

SHARDS = 3
QUORUM = "repl-quorum"
LEADER = "repl-leader"
EVENT_TIMEOUT_S = 20
# The killed leader: how many acks each publisher gets before the kill and after it.
PUBLISHERS = 3
ACKS_BEFORE_KILL = 15
ACKS_AFTER_KILL = 15
# Attempts per record, counted apart by kind. A publish lost with its broker or its quorum
# costs seconds (the client notices a dead broker after its 6 s idle timeout; a forward to a
# dead leader ends in its 10 s timeout; a quorum wait in its own). A refusal that nothing was
# written (shard_unavailable, overloaded) comes back at once while a shard is between leaders,
# which it also is for a moment after `cluster up` says every node is ready: each attempt is
# still one broker round trip, bounded in count and by the deadline.
LOST_ATTEMPTS = 25
REFUSED_ATTEMPTS = 5000
# The whole run under load; the client's failover alone takes 6-8 s (peer-client-cluster-wire.md).
RUN_DEADLINE_S = 150
# Records one publisher sends at most (a bound on the loop, far above what the run needs).
MAX_RECORDS = 5000
LOST = (felix.ConnectionError, felix.OutcomeUnknownError)
REFUSED = (felix.ShardUnavailableError, felix.OverloadedError)

MASK = (1 << 64) - 1


def key_hash(key):
    """FNV-1a, then the splitmix64 finalizer: the broker's and the client's key hash."""
    h = 0xCBF29CE484222325
    for byte in key:
        h = ((h ^ byte) * 0x100000001B3) & MASK
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & MASK
    return h ^ (h >> 31)


def keys_on(shard, count=8):
    """`count` routing keys that land on `shard` of a SHARDS-shard stream (modulo mapping)."""
    keys = (f"key-{i}".encode() for i in range(10_000))
    return [k for k in keys if key_hash(k) % SHARDS == shard][:count]


def test_the_key_hash_is_the_brokers():
    # Rows of the pinned vector table (felix-proto/src/routing.rs, docs/routing.md).
    assert key_hash(b"user-42") == 0x7A1596F0E94B5793
    assert key_hash(b"") == 0xF52A15E9A9B5E89B
    assert key_hash(b"k1") % 3 == 1


def leaders_of(nodes, stream, shard):
    """The nodes whose /metrics say they lead `stream`'s `shard`."""
    label = f'shard="t1/default/{stream}#{shard}"'
    return [
        n for n in nodes
        if any(line.startswith("felix_broker_replication_lag_records{") and label in line
               for line in n.metrics().splitlines())
    ]


def counter(node, name):
    for line in node.metrics().splitlines():
        if line.startswith(f"felix_broker_{name} ") or line.startswith(f"felix_broker_{name}_total "):
            return int(float(line.split()[1]))
    raise AssertionError(f"{node.id} exports no {name}")


def the_leader(cluster, stream, shard):
    # Asked after an acked publish to the shard, so its leader leads it at the current
    # generation: exactly one node says so.
    leaders = leaders_of(cluster.nodes, stream, shard)
    assert len(leaders) == 1, f"{stream}#{shard} led by {[n.id for n in leaders]}"
    return leaders[0]


def publish_acked(client, stream, payload, key, deadline):
    """An acked publish, re-sent (as a new record) on a retryable error, bounded in count and
    time. Returns the payload acked, its offset, and the attempts that failed (payload, error):
    each of those may or may not be in the log."""
    failed = []
    lost = refused = 0
    while lost < LOST_ATTEMPTS and refused < REFUSED_ATTEMPTS:
        body = f"{payload}/{lost + refused}"
        assert time.monotonic() < deadline, f"{payload}: out of time after {failed[-5:]}"
        try:
            offset = client.publish("t1", "default", stream, body.encode(), key=key)
        except LOST as e:
            lost += 1
            failed.append((body, f"{type(e).__name__}: {e}"))
            continue
        except REFUSED as e:
            refused += 1
            failed.append((body, f"{type(e).__name__}: {e}"))
            continue
        assert offset is not None, "a durable replicated log gives every ack its offset"
        return body, offset, failed
    raise AssertionError(f"{payload}: not acked in {lost} lost and {refused} refused attempts, "
                         f"the last {failed[-5:]}")


@pytest.fixture
def quorum_cluster(runtime):
    c = LocalCluster(runtime, ["--stream", f"t1/default/{QUORUM}:{SHARDS}:3:quorum"])
    yield c
    assert c.stop() == 0, "felix cluster up must stop its nodes and exit 0 on SIGINT"


class Run:
    """What the publishers saw, under one lock: acks, failed attempts and the first error
    that is not a retryable one."""

    def __init__(self):
        self.cond = threading.Condition()
        self.acked = {}  # payload -> offset
        self.failed = []  # (payload, error): each may or may not be in the log
        self.acks_before = [0] * PUBLISHERS
        self.acks_after = [0] * PUBLISHERS
        self.first_after = None  # when the first record begun after the kill was acked
        self.error = None
        self.killed_at = None
        self.stop = threading.Event()

    def publisher(self, i, client, keys, deadline):
        try:
            for n in range(MAX_RECORDS):
                if self.stop.is_set():
                    return
                with self.cond:
                    after = self.killed_at is not None
                body, offset, failed = publish_acked(
                    client, QUORUM, f"p{i}-{n}", keys[n % len(keys)], deadline)
                with self.cond:
                    self.acked[body] = offset
                    self.failed.extend(failed)
                    if after:
                        self.acks_after[i] += 1
                        self.first_after = self.first_after or time.monotonic()
                    else:
                        self.acks_before[i] += 1
                    self.cond.notify_all()
        except BaseException as e:  # handed to the test's thread, which fails with it
            with self.cond:
                self.error = self.error or e
                self.cond.notify_all()

    def wait_for(self, what, deadline):
        with self.cond:
            while not what():
                if self.error is not None:
                    raise self.error
                left = deadline - time.monotonic()
                assert left > 0, (f"out of time: acks before the kill {self.acks_before}, "
                                  f"after {self.acks_after}; failed attempts {self.failed[-6:]}")
                self.cond.wait(left)


def test_a_killed_leader_under_load_loses_no_acknowledged_record(quorum_cluster):
    cluster = quorum_cluster
    deadline = time.monotonic() + RUN_DEADLINE_S
    shard = 0  # a plain subscribe() reads shard 0
    keys = keys_on(shard)
    run = Run()

    first = cluster.client(cluster.seeds)
    body, offset, failed = publish_acked(first, QUORUM, "first", keys[0], deadline)
    run.acked[body] = offset
    run.failed.extend(failed)
    victim = the_leader(cluster, QUORUM, shard)
    survivors = [n for n in cluster.nodes if n is not victim]

    # Each publisher enters through a different node, so one of them loses its entry broker
    # and the others lose the owner they publish to directly.
    clients = [cluster.client(cluster.seeds[i:] + cluster.seeds[:i]) for i in range(PUBLISHERS)]
    threads = [threading.Thread(target=run.publisher, args=(i, c, keys, deadline), daemon=True)
               for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    try:
        run.wait_for(lambda: min(run.acks_before) >= ACKS_BEFORE_KILL, deadline)
        cluster.kill(victim)
        with run.cond:
            run.killed_at = time.monotonic()
        # Publishes resume: every publisher has acks for records it started after the kill.
        run.wait_for(lambda: min(run.acks_after) >= ACKS_AFTER_KILL, deadline)
    finally:
        run.stop.set()
        for t in threads:
            t.join(max(deadline - time.monotonic(), 0))
    assert not any(t.is_alive() for t in threads), "a publisher is still in a publish"
    if run.error is not None:
        raise run.error
    # A figure for the report (pytest -s), not a pass/fail bound.
    print(f"\n{victim.id} killed: first ack of a record started after the kill "
          f"{run.first_after - run.killed_at:.1f}s later; {len(run.acked)} acked, "
          f"failed attempts {dict(collections.Counter(e.split(':')[0] for _, e in run.failed))}")
    for e in sorted({e for _, e in run.failed}):
        print(f"  {e}")

    # The end of the shard, from a survivor: read up to this record's offset and the log
    # below it is complete, so "exactly once" is a count, not a wait for quiet.
    reader = cluster.client([n.client for n in survivors])
    end_body, end, failed = publish_acked(reader, QUORUM, "end", keys[0], deadline)
    run.acked[end_body] = end
    run.failed.extend(failed)
    sub = reader.subscribe("t1", "default", QUORUM, start="earliest")
    seen = []  # (offset, payload)
    for _ in range(end + 1):
        assert time.monotonic() < deadline, f"out of time reading, at {seen[-1:]} of {end}"
        ev = sub.next_event(timeout=EVENT_TIMEOUT_S)
        assert ev is not None, f"no record after {seen[-1:]} (closed={sub.closed}), end {end}"
        seen.append((ev.offset, ev.payload.decode()))
        if ev.offset >= end:
            break
    sub.close()

    offsets = [o for o, _ in seen]
    assert offsets == list(range(end + 1)), "offsets 0..end, each once, in order"
    at = {}
    for o, p in seen:
        assert p not in at, f"{p} at offsets {at[p]} and {o}"
        at[p] = o
    lost = {p: o for p, o in run.acked.items() if at.get(p) != o}
    assert not lost, f"acked records missing or moved (payload: acked offset -> read): " + \
        str({p: (o, at.get(p)) for p, o in list(lost.items())[:10]})
    maybe = {p for p, _ in run.failed}
    phantoms = [p for p in at if p not in run.acked and p not in maybe]
    assert not phantoms, f"records no publisher sent: {phantoms[:10]}"


@pytest.fixture
def frozen_cluster(runtime):
    # A short quorum timeout, so a quorum publish without its followers is answered quickly;
    # a long lease, so the leader (which cannot renew it while both followers are stopped)
    # still takes writes when the publish arrives, however slow this machine. The nodes
    # inherit both from `cluster up`'s environment.
    env = {"FELIX_QUORUM_TIMEOUT_MS": "500", "FELIX_LEASE_MS": "8000"}
    c = LocalCluster(runtime, ["--stream", f"t1/default/{QUORUM}:{SHARDS}:3:quorum",
                               "--stream", f"t1/default/{LEADER}:{SHARDS}:3:leader"], env)
    yield c
    assert c.stop() == 0, "felix cluster up must stop its nodes and exit 0 on SIGINT"


def test_a_quorum_publish_without_its_followers_is_outcome_unknown(frozen_cluster):
    cluster = frozen_cluster
    deadline = time.monotonic() + RUN_DEADLINE_S
    warm = cluster.client(cluster.seeds)
    for stream in (QUORUM, LEADER):
        for shard in range(SHARDS):
            publish_acked(warm, stream, f"warm-{shard}", keys_on(shard)[0], deadline)
    # A quorum shard, and if its leader also leads a leader-consistency shard (placement
    # usually gives each node one of each, but need not), that one too.
    led = {(stream, s): the_leader(cluster, stream, s)
           for stream in (QUORUM, LEADER) for s in range(SHARDS)}
    pairs = [(q, s) for q in range(SHARDS) for s in range(SHARDS)
             if led[(QUORUM, q)] is led[(LEADER, s)]]
    qshard, lshard = pairs[0] if pairs else (0, None)
    leader = led[(QUORUM, qshard)]
    followers = [n for n in cluster.nodes if n is not leader]

    # Entered through the leader alone, and warmed: its routing is known, so the publishes
    # below go to the leader only and need nothing from the frozen nodes.
    client = cluster.client([leader.client])
    qkey = keys_on(qshard)[0]
    before = client.publish("t1", "default", QUORUM, b"before", key=qkey)
    if lshard is not None:
        lkey = keys_on(lshard)[0]
        client.publish("t1", "default", LEADER, b"before", key=lkey)
    else:
        print(f"\n{leader.id} leads no shard of {LEADER}: its publish is not tried")
    timeouts = counter(leader, "replication_quorum_timeouts")
    try:
        for n in followers:
            cluster.pause(n)
        if lshard is not None:
            # The leader alone holds a leader-consistency record: acked.
            assert client.publish("t1", "default", LEADER, b"alone", key=lkey) is not None
        # A quorum one waits for a majority that cannot answer, then is refused as possibly
        # written: outcome unknown.
        with pytest.raises(felix.OutcomeUnknownError) as refused:
            client.publish("t1", "default", QUORUM, b"unknown", key=qkey)
        assert refused.value.code == "quorum_timeout", refused.value
    finally:
        for n in followers:
            if n.pid in cluster.paused:
                cluster.resume(n)
    assert counter(leader, "replication_quorum_timeouts") > timeouts
    # The followers are back: a majority acknowledges again.
    after = client.publish("t1", "default", QUORUM, b"after", key=qkey)
    assert after is not None and after > before, (before, after)


GROUP_ATTEMPTS = 200


def group_call(call, deadline):
    """A group call, asked again (bounded in count and time) while the shard is between
    leaders: a refusal says nothing was done."""
    for _ in range(GROUP_ATTEMPTS):
        assert time.monotonic() < deadline, "out of time for a group call"
        try:
            return call()
        except REFUSED:
            continue
    raise AssertionError(f"a group call refused {GROUP_ATTEMPTS} times")


def test_a_groups_acknowledged_records_stay_acknowledged_after_its_leader_is_killed(
        quorum_cluster):
    cluster = quorum_cluster
    deadline = time.monotonic() + RUN_DEADLINE_S
    shard = 0
    keys = keys_on(shard)
    publisher = cluster.client(cluster.seeds)
    offsets = []
    for n in range(6):
        _, offset, _ = publish_acked(publisher, QUORUM, f"job-{n}", keys[0], deadline)
        offsets.append(offset)
    victim = the_leader(cluster, QUORUM, shard)

    def poll(client):
        return client.group_poll("t1", "default", QUORUM, shard, "workers", max_records=32,
                                 wait=0)

    # Group calls are served by the shard's leader: the consumer is seeded with it.
    consumer = cluster.client([victim.client])
    handed = group_call(lambda: poll(consumer), deadline)
    assert [r.offset for r in handed] == offsets
    # On a quorum stream a group ack is answered once a majority of the copies holds it.
    for r in handed[:4]:
        group_call(lambda: consumer.group_ack("t1", "default", QUORUM, shard, "workers",
                                              r.offset), deadline)

    cluster.kill(victim)
    survivors = [n for n in cluster.nodes if n is not victim]
    after = cluster.client([n.client for n in survivors])
    # A record at the new generation commits everything below it, and names the new leader.
    _, last, _ = publish_acked(after, QUORUM, "job-after", keys[0], deadline)
    (leader,) = leaders_of(survivors, QUORUM, shard)
    consumer = cluster.client([leader.client])
    again = group_call(lambda: poll(consumer), deadline)
    assert [r.offset for r in again] == offsets[4:] + [last], \
        "what was acknowledged before the kill is not handed out again"
