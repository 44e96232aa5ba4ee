"""Cache watches and counters with felix-client 0.6.2 against a durable `felix-broker`
(FELIX_DURABLE_STORAGE_DIR on a temporary directory), once per broker runtime (conftest.py).

Watches on a key and a prefix deliver each write in order with its log offset (a delete has
no value); `retained=True` delivers the current values first with `retained_count` (0 for
an empty key); `start=<offset>` resumes without a gap; a resume into history compaction
collapsed is a marked resnapshot; a watch that falls behind ends with `CacheWatchLagged`
and re-watching from `resume_from` is gapless; a key whose TTL passes reaches the watch as a
delete. Counters answer the sum including the delta, `None` for a counter never written,
and survive a restart.

felix-client 0.6.2 has no call for `cache_put_if` / `cache_delete_if`, so conditional writes
are covered by our own client only (integration/tests/cache_conditional.rs).
"""

import threading

import felix
import pytest

from test_durable import DurableBroker

# A deadline for a change that should come; generous, so only a hung broker fails on it.
TIMEOUT_S = 30


@pytest.fixture
def storage(tmp_path):
    return tmp_path


def start(storage, runtime, monkeypatch, **env):
    for k, v in env.items():
        monkeypatch.setenv(k, str(v))
    return DurableBroker(storage, runtime, fsync_mode="periodic")


@pytest.fixture
def broker(storage, runtime, monkeypatch):
    b = start(storage, runtime, monkeypatch)
    yield b
    b.stop()


def changes(handle, n):
    got = []
    while len(got) < n:
        item = handle.recv(timeout=TIMEOUT_S)
        assert item is not None, f"watch ended after {len(got)} of {n} changes"
        assert isinstance(item, felix.CacheChange), item
        got.append(item)
    return got


def test_key_and_prefix_watches_deliver_each_write_with_its_offset(broker):
    c = broker.client()
    by_key = c.watch_cache("t1", "default", "room", felix.CacheWatchFilter.key("a"))
    by_prefix = c.watch_cache("t1", "default", "room", felix.CacheWatchFilter.prefix("p/"))
    c.cache_put("t1", "default", "room", "a", b"a1")
    c.cache_put("t1", "default", "room", "p/1", b"x")
    c.cache_put("t1", "default", "room", "q", b"not watched")
    c.cache_put("t1", "default", "room", "a", b"a2")
    assert c.cache_delete("t1", "default", "room", "p/1") == b"x"

    a1, a2 = changes(by_key, 2)
    assert (a1.key, a1.value, a2.key, a2.value) == ("a", b"a1", "a", b"a2")
    assert a2.offset - a1.offset == 3
    p1, gone = changes(by_prefix, 2)
    assert (p1.key, p1.value, p1.offset) == ("p/1", b"x", a1.offset + 1)
    assert (gone.key, gone.value) == ("p/1", None), "a delete is a change with no value"
    assert gone.offset == a2.offset + 1


def test_retained_gives_current_values_first_and_zero_for_an_empty_key(broker):
    c = broker.client()
    empty = c.watch_cache("t1", "default", "presence", felix.CacheWatchFilter.key("nobody"), retained=True)
    assert empty.retained_count == 0
    c.cache_put("t1", "default", "presence", "u/alice", b"old")
    c.cache_put("t1", "default", "presence", "u/alice", b"here")
    c.cache_put("t1", "default", "presence", "u/bob", b"here")
    c.cache_put("t1", "default", "presence", "x", b"other")
    full = c.watch_cache("t1", "default", "presence", felix.CacheWatchFilter.prefix("u/"), retained=True)
    assert full.retained_count == 2
    state = {ch.key: ch.value for ch in changes(full, 2)}
    assert state == {"u/alice": b"here", "u/bob": b"here"}
    c.cache_put("t1", "default", "presence", "u/carol", b"new")
    (live,) = changes(full, 1)
    assert live.key == "u/carol" and live.offset >= full.resume_offset
    c.cache_put("t1", "default", "presence", "nobody", b"somebody")
    (first,) = changes(empty, 1)
    assert first.value == b"somebody"


def test_a_resumed_watch_misses_nothing_under_concurrent_writes(broker):
    c = broker.client()
    writes = 200
    w = c.watch_cache("t1", "default", "resume", felix.CacheWatchFilter.prefix("k"))

    def writer():
        wc = broker.client()
        for i in range(writes):
            wc.cache_put("t1", "default", "resume", f"k{i % 3}", str(i).encode())
            if i % 7 == 0:
                wc.cache_put("t1", "default", "resume", "zz", b"noise")

    t = threading.Thread(target=writer)
    t.start()
    seen = []
    for _ in range(3):
        got = changes(w, 30)
        seen += [int(ch.value) for ch in got]
        w.close()
        w = c.watch_cache("t1", "default", "resume", felix.CacheWatchFilter.prefix("k"), start=got[-1].offset + 1)
        assert not w.resnapshot
    t.join(timeout=60)
    seen += [int(ch.value) for ch in changes(w, writes - len(seen))]
    assert seen == list(range(writes))


def test_a_resume_into_compacted_history_is_a_marked_resnapshot(storage, runtime, monkeypatch):
    b = start(storage, runtime, monkeypatch, FELIX_DURABLE_SEGMENT_MAX_BYTES=65536)
    try:
        c = b.client()
        c.cache_put("t1", "default", "compacted", "keep", b"kept")
        big = b"v" * 16384
        for i in range(130):
            c.cache_put("t1", "default", "compacted", "hot", str(i).encode() + big)
        c.cache_put("t1", "default", "compacted", "hot", b"last")
        w = None
        for _ in range(100):
            w = c.watch_cache("t1", "default", "compacted", felix.CacheWatchFilter.prefix(""), start=1)
            if w.resnapshot:
                break
            w.close()
            c.cache_put("t1", "default", "compacted", "nudge", b"x")
        assert w is not None and w.resnapshot, "compaction collapsed offset 1"
        state = {}
        while len(state) < 2 or "hot" not in state or "keep" not in state:
            (ch,) = changes(w, 1)
            assert ch.offset < w.resume_offset
            state[ch.key] = ch.value
        assert state["keep"] == b"kept" and state["hot"] == b"last"
    finally:
        b.stop()


def test_a_watch_that_falls_behind_ends_lagged_and_resumes_gaplessly(storage, runtime, monkeypatch):
    b = start(storage, runtime, monkeypatch, FELIX_CACHE_WATCH_QUEUE_CAPACITY=1)
    try:
        c = b.client()
        w = c.watch_cache("t1", "default", "busy", felix.CacheWatchFilter.prefix("k"))
        writers, each = 8, 40

        def writer(n):
            wc = b.client()
            for i in range(each):
                wc.cache_put("t1", "default", "busy", f"k{n}", str(i).encode())

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        seen = []
        lagged = None
        while True:
            item = w.recv(timeout=TIMEOUT_S)
            if isinstance(item, felix.CacheWatchLagged):
                lagged = item
                break
            if item is None or len(seen) == writers * each:
                break
            seen.append(item)
        assert lagged is not None, "one change queued at most: concurrent writes overflow it"
        # docs/limits.md: the watch delivers what it had queued, then the lagged signal naming
        # the change that did not fit, i.e. the one right after the last delivered. With one
        # change queued at the overflow, at least that one was delivered first.
        assert seen, "the queued change comes before the lagged signal"
        assert lagged.resume_from == seen[-1].offset + 1
        again = c.watch_cache("t1", "default", "busy", felix.CacheWatchFilter.prefix("k"), start=lagged.resume_from)
        seen += changes(again, writers * each - len(seen))
        offsets = [ch.offset for ch in seen]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        per_key = {}
        for ch in seen:
            per_key.setdefault(ch.key, []).append(int(ch.value))
        assert per_key == {f"k{n}": list(range(each)) for n in range(writers)}
    finally:
        b.stop()


def test_counters_answer_sums_and_survive_a_restart(broker):
    c = broker.client()
    assert c.counter_get("t1", "default", "stats", "hits") is None
    assert c.counter_add("t1", "default", "stats", "hits", 5) == 5
    assert c.counter_add("t1", "default", "stats", "hits", -2) == 3
    assert c.counter_add("t1", "default", "stats", "zero", 0) == 0
    assert c.counter_get("t1", "default", "stats", "zero") == 0
    del c
    broker.restart()
    c = broker.client()
    assert c.counter_get("t1", "default", "stats", "hits") == 3
    assert c.counter_get("t1", "default", "stats", "never") is None
    assert c.counter_add("t1", "default", "stats", "hits", 10) == 13


def test_an_expired_key_reaches_the_watch_as_a_delete(broker):
    c = broker.client()
    w = c.watch_cache("t1", "default", "ttl", felix.CacheWatchFilter.key("s"))
    c.cache_put("t1", "default", "ttl", "s", b"short", ttl=0.5)
    (put,) = changes(w, 1)
    assert put.value == b"short" and put.expires_at_millis > 0
    # The broker's expiry pass (once a second) writes the delete after the TTL.
    item = w.recv(timeout=TIMEOUT_S)
    assert isinstance(item, felix.CacheChange), item
    assert (item.key, item.value, item.offset) == ("s", None, put.offset + 1)
    assert c.cache_get("t1", "default", "ttl", "s") is None
