"""Interop with durable storage: felix-client 0.6.2 against `felix-broker` started with
FELIX_DURABLE_STORAGE_DIR on a temporary directory and FELIX_DURABLE_FSYNC_MODE=on_commit.

Publishes return their offsets, events carry them, `start="earliest"` and `start=<offset>`
replay the log and join live delivery, and records and cache values (with their TTL) survive
a restart of the broker on the same directory. Each test runs once per broker runtime (conftest.py).
"""

import os
import pathlib
import socket
import subprocess
import tempfile
import time

import felix
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
BROKER_BIN = os.environ.get("FELIX_BROKER_BIN", str(REPO / "target" / "release" / "felix-broker"))
START_TIMEOUT_S = 20
EVENT_TIMEOUT_S = 5


def free_udp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DurableBroker:
    """One broker process on `storage`; `restart()` stops it (SIGTERM) and starts another."""

    def __init__(self, storage, runtime, fsync_mode="on_commit", **extra_env):
        self.storage = storage
        self.runtime = runtime
        self.fsync_mode = fsync_mode
        self.extra_env = extra_env
        self.dir = tempfile.TemporaryDirectory(prefix="felix-interop-durable-")
        self.runs = 0
        self._start()

    def _start(self):
        d = pathlib.Path(self.dir.name)
        self.runs += 1
        self.ca = d / f"ca-{self.runs}.pem"
        self.token_file = d / f"token-{self.runs}"
        self.addr = f"127.0.0.1:{free_udp_port()}"
        env = dict(os.environ)
        env.update(
            FELIX_QUIC_BIND=self.addr,
            FELIX_TLS_CERT_EXPORT=str(self.ca),
            NO_COLOR="1",
            FELIX_DEV_TOKEN_EXPORT=str(self.token_file),
            FELIX_DURABLE_STORAGE_DIR=str(self.storage),
            FELIX_DURABLE_FSYNC_MODE=self.fsync_mode,
        )
        env.update(self.extra_env)
        self.log_path = d / f"broker-{self.runs}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([BROKER_BIN, "--runtime", self.runtime], env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (self.ca.exists() and self.token_file.exists() and self.token_file.stat().st_size > 0):
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}: {self.read_log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"broker did not start in {START_TIMEOUT_S}s: {self.read_log()}")
            time.sleep(0.05)
        self.token = self.token_file.read_text().strip()

    def read_log(self):
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def client(self):
        return felix.Client(self.addr, tenant_id="t1", token=self.token, ca_file=str(self.ca))

    def _stop(self):
        self.proc.terminate()
        try:
            code = self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.log.close()
        assert code == 0, f"broker must exit 0 on SIGTERM: {self.read_log()}"

    def restart(self):
        self._stop()
        self._start()

    def stop(self):
        self._stop()
        self.dir.cleanup()


@pytest.fixture
def storage():
    with tempfile.TemporaryDirectory(prefix="felix-interop-storage-") as d:
        yield pathlib.Path(d)


@pytest.fixture
def broker(storage, runtime):
    b = DurableBroker(storage, runtime)
    yield b
    b.stop()


def collect(sub, n):
    got = []
    while len(got) < n:
        ev = sub.next_event(timeout=EVENT_TIMEOUT_S)
        assert ev is not None, f"subscription ended after {len(got)} of {n} events"
        got.append(ev)
    return got


def test_publish_returns_offsets_and_events_carry_them(broker):
    c = broker.client()
    sub = c.subscribe("t1", "default", "orders")
    offsets = [c.publish("t1", "default", "orders", f"o-{i}".encode()) for i in range(10)]
    assert offsets == list(range(10))
    # per_batch and keyed publishes are answered after the write too.
    assert c.publish("t1", "default", "orders", b"batch", ack="per_batch") == 10
    assert c.publish("t1", "default", "orders", b"keyed", key=b"k1") == 11
    got = collect(sub, 12)
    assert [e.offset for e in got] == list(range(12))
    assert [e.payload for e in got] == [f"o-{i}".encode() for i in range(10)] + [b"batch", b"keyed"]


def test_earliest_and_offset_replay_join_live_delivery(broker):
    c = broker.client()
    history = [f"h-{i}".encode() for i in range(30)]
    for p in history:
        c.publish("t1", "default", "replay", p)
    from_start = c.subscribe("t1", "default", "replay", start="earliest")
    from_25 = c.subscribe("t1", "default", "replay", start=25)
    live = [f"l-{i}".encode() for i in range(5)]
    for p in live:
        c.publish("t1", "default", "replay", p)
    everything = history + live
    got = collect(from_start, len(everything))
    assert [(e.offset, e.payload) for e in got] == list(enumerate(everything))
    got = collect(from_25, len(everything) - 25)
    assert [(e.offset, e.payload) for e in got] == list(enumerate(everything))[25:]


def test_an_offset_past_the_tail_is_refused(broker):
    c = broker.client()
    for i in range(3):
        c.publish("t1", "default", "short", bytes([i]))
    with pytest.raises(felix.CursorError, match="past the end of the stream; tail is 3"):
        c.subscribe("t1", "default", "short", start=10)


def expiry_of(c, key):
    """The absolute expiry (Unix ms) the broker holds for `key` of cache c1, from a retained
    watch: the broker's own figure, not one guessed from our clock."""
    w = c.watch_cache("t1", "default", "c1", felix.CacheWatchFilter.key(key), retained=True)
    assert w.retained_count == 1, key
    ch = w.recv(timeout=EVENT_TIMEOUT_S)
    assert isinstance(ch, felix.CacheChange) and ch.key == key, ch
    w.close()
    return ch.expires_at_millis


def test_records_and_cache_values_with_ttl_survive_a_restart(broker):
    c = broker.client()
    records = [f"kept-{i}".encode() for i in range(20)]
    for p in records:
        c.publish("t1", "default", "kept", p)
    c.cache_put("t1", "default", "c1", "forever", b"v1")
    c.cache_put("t1", "default", "c1", "long", b"stays", ttl=600)
    long_expiry = expiry_of(c, "long")
    c.cache_put("t1", "default", "c1", "short", b"goes", ttl=2.0)
    c.cache_put("t1", "default", "c1", "deleted", b"x")
    assert c.cache_delete("t1", "default", "c1", "deleted") == b"x"
    del c

    broker.restart()
    c = broker.client()
    sub = c.subscribe("t1", "default", "kept", start="earliest")
    got = collect(sub, len(records))
    assert [(e.offset, e.payload) for e in got] == list(enumerate(records))
    assert c.publish("t1", "default", "kept", b"after") == len(records)
    assert c.cache_get("t1", "default", "c1", "forever") == b"v1"
    assert c.cache_get("t1", "default", "c1", "long") == b"stays"
    assert c.cache_get("t1", "default", "c1", "deleted") is None
    # The expiry set before the restart still holds: it was not restarted with the broker.
    # Compared as the broker's absolute figure, to the millisecond, instead of racing a
    # 2 s TTL against the restart's wall time.
    assert expiry_of(c, "long") == long_expiry
    # And a TTL that passes after the restart still ends its value: wait for that event (the
    # deadline only fails a value that never expires).
    deadline = time.monotonic() + 60
    while c.cache_get("t1", "default", "c1", "short") is not None:
        assert time.monotonic() < deadline, "a 2 s TTL set before the restart never expired"
        time.sleep(0.05)
    assert c.cache_get("t1", "default", "c1", "long") == b"stays"
