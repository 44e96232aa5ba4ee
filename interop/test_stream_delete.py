"""Interop: felix-client 0.6.2 watching a durable stream that an operator deletes through
`DELETE /v1/streams/{tenant}/{namespace}/{stream}` on the broker's ops endpoint.

The real client offers FEATURE_STREAM_DELETED (client_features_hi 0xF), so its subscription
ends with `stream_deleted`: a plain subscription ends (`next_event()` answers `None`,
`closed` turns true), and a sharded one yields `felix.StreamDeleted` for the shard. The
stream then starts again at offset 0, and a restart keeps it deleted. Each test runs once per
broker runtime (conftest.py).
"""

import pathlib
import socket
import tempfile
import urllib.error
import urllib.request

import felix
import pytest

from test_durable import DurableBroker, collect

EVENT_TIMEOUT_S = 5


def free_tcp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ops_addr(monkeypatch):
    addr = f"127.0.0.1:{free_tcp_port()}"
    monkeypatch.setenv("FELIX_METRICS_BIND", addr)
    return addr


@pytest.fixture
def storage():
    with tempfile.TemporaryDirectory(prefix="felix-interop-delete-") as d:
        yield pathlib.Path(d)


@pytest.fixture
def broker(storage, runtime, ops_addr):
    b = DurableBroker(storage, runtime)
    yield b
    b.stop()


def delete(ops_addr, path, token=None):
    """The status of `DELETE path`."""
    req = urllib.request.Request(f"http://{ops_addr}{path}", method="DELETE")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_real_client_sees_its_stream_deleted(broker, ops_addr):
    c = broker.client()
    sub = c.subscribe("t1", "default", "doomed")
    sharded = c.subscribe_sharded("t1", "default", "doomed")
    assert [c.publish("t1", "default", "doomed", f"d-{i}".encode()) for i in range(3)] == [0, 1, 2]
    assert [e.offset for e in collect(sub, 3)] == [0, 1, 2]
    records = [sharded.next_event(timeout=EVENT_TIMEOUT_S) for _ in range(3)]
    assert all(isinstance(r, felix.ShardRecord) for r in records), records

    path = "/v1/streams/t1/default/doomed"
    assert delete(ops_addr, path) == 401
    assert delete(ops_addr, path, "not-a-token") == 401
    assert delete(ops_addr, "/v1/streams/t1/default/never-used", broker.token) == 404
    assert delete(ops_addr, path, broker.token) == 204

    # The plain subscription ends; the sharded one says why.
    assert sub.next_event(timeout=EVENT_TIMEOUT_S) is None
    assert sub.closed
    notice = sharded.next_event(timeout=EVENT_TIMEOUT_S)
    assert isinstance(notice, felix.StreamDeleted), notice
    assert notice.shard == 0

    # Recreated afresh, and still so after a restart.
    assert c.publish("t1", "default", "doomed", b"reborn") == 0
    sharded.close()
    del c
    broker.restart()
    c = broker.client()
    again = c.subscribe("t1", "default", "doomed", start="earliest")
    got = collect(again, 1)
    assert [(e.offset, e.payload) for e in got] == [(0, b"reborn")]
    assert c.publish("t1", "default", "doomed", b"next") == 1
