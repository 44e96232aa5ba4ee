"""The real client (felix-client 0.6.2 from PyPI) against the compose cluster through ONE seed.

    python3 deploy/smoke.py SEED CA_FILE TOKEN_FILE NODE_ADDR...

Given one node's address, the client learns every node from `topology`, routes keyed
publishes to each shard's owner, reads them all back with a sharded subscription, and
writes and reads a cache entry through the seed. Exit 0 when all of it holds.
(scripts/test-deploy runs it; docs/deploy.md.)
"""

import pathlib
import sys
import time

import felix

TENANT, NAMESPACE, STREAM, CACHE = "t1", "deploy", "events", "sessions"
RECORDS = 60
# Bound on the whole read-back, and on each wait for one event.
READ_LIMIT_S = 30
EVENT_TIMEOUT_S = 10


def main():
    seed, ca, token_file, *nodes = sys.argv[1:]
    token = pathlib.Path(token_file).read_text().strip()
    c = felix.Client([seed], tenant_id=TENANT, token=token, ca_file=ca)
    endpoints = c.endpoints()
    assert sorted(endpoints) == sorted(nodes), f"topology named {endpoints}, expected {nodes}"
    run = f"{time.time_ns():x}"
    keys = [f"{run}-{i}" for i in range(RECORDS)]
    for k in keys:
        offset = c.publish(TENANT, NAMESPACE, STREAM, k.encode(), key=k.encode())
        assert offset is not None, f"publish {k}: no offset"
    sub = c.subscribe_sharded(TENANT, NAMESPACE, STREAM, start="earliest")
    got, shards = set(), set()
    deadline = time.monotonic() + READ_LIMIT_S
    while not set(keys) <= got:
        assert time.monotonic() < deadline, f"read back {len(got & set(keys))} of {RECORDS}"
        ev = sub.next_event(timeout=EVENT_TIMEOUT_S)
        assert ev is not None, f"no event within {EVENT_TIMEOUT_S} s"
        if hasattr(ev, "event"):
            got.add(ev.event.payload.decode())
            shards.add(ev.shard)
    sub.close()
    c.cache_put(TENANT, NAMESPACE, CACHE, f"smoke-{run}", b"ok")
    assert c.cache_get(TENANT, NAMESPACE, CACHE, f"smoke-{run}") == b"ok"
    print(f"real client: one seed {seed}; topology {endpoints}; {RECORDS} keyed publishes "
          f"read back from {len(shards)} shards; cache put/get through the seed")


if __name__ == "__main__":
    main()
