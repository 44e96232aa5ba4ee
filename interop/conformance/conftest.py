"""The conformance kit's pytest plumbing for felix-client 0.6.2 (docs/conformance.md).

- Each test names its catalogue scenario with ``@pytest.mark.scenario("pubsub.roundtrip")``.
- The fixture: ``FELIX_FIXTURE=path/fixture.json`` runs against one already started with
  ``felix-conformance client-fixture``; without it this suite starts one
  (``FELIX_CONFORMANCE_BIN``, default ``target/release/felix-conformance``) and stops it at the
  end, which completes its evidence file.
- Before each test the fixture is told which scenario runs (``POST /scenario``); after it every
  fault is undone (``POST /heal``) and the scenario closed.
- ``FELIX_CONFORMANCE_CANARY=serve-redirects-locally`` starts the fixture with that rule
  broken (the kit's self-check: the verifier must reject the run).
- At the end ``results.json`` is written to ``FELIX_CONFORMANCE_OUT`` (default: a temporary
  directory, printed), beside the started fixture's ``fixture.json`` and ``evidence.json``.
"""

import json
import os
import pathlib
import select
import signal
import subprocess
import tempfile
import time
import urllib.request

import felix
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("FELIX_CONFORMANCE_BIN", str(REPO / "target" / "release" / "felix-conformance"))
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 60
CONTROL_TIMEOUT_S = 30

_outcomes = {}
_out_dir = None


def pytest_configure(config):
    config.addinivalue_line("markers", "scenario(id): the catalogue scenario this test shows")


def scenario_of(item):
    m = item.get_closest_marker("scenario")
    return m.args[0] if m else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    sid = scenario_of(item)
    if sid is None:
        return
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _outcomes[sid] = {"id": sid, "status": "skip", "detail": reason.removeprefix("Skipped: ")}
    elif report.failed:
        errors = [l[1:].strip() for l in report.longreprtext.splitlines() if l.startswith("E ")]
        _outcomes[sid] = {"id": sid, "status": "fail",
                          "detail": f"{report.when}: {(errors or ['failed'])[0]}"}
    elif report.when == "call" and sid not in _outcomes:
        _outcomes[sid] = {"id": sid, "status": "pass", "detail": ""}


def pytest_sessionfinish(session, exitstatus):
    if _out_dir is None:
        return
    doc = {"client": "felix-client (Python)", "version": felix.__version__,
           "outcomes": sorted(_outcomes.values(), key=lambda o: o["id"])}
    path = pathlib.Path(_out_dir) / "results.json"
    path.write_text(json.dumps(doc, indent=2))
    print(f"\nconformance results: {path}")


class Fixture:
    """`fixture.json`, and the control endpoint's calls."""

    def __init__(self, doc):
        self.doc = doc
        self.addrs = doc["addrs"]
        self.tenant = doc["tenant_id"]
        self.ns = doc["namespace"]
        self.token = doc["token"]
        self.control_url = doc["control_url"]
        self.link_addr = doc["link_addr"]
        self.link_stream = doc["link_stream"]
        self.node_addr = {n["id"]: n["addr"] for n in doc["nodes"]}

    def client(self, addrs=None, token=None):
        return felix.Client(addrs or self.addrs, tenant_id=self.tenant,
                            token=token or self.token, ca_file=self.doc["ca_file"])

    def control(self, path, body=None):
        data = json.dumps(body or {}).encode()
        req = urllib.request.Request(self.control_url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=CONTROL_TIMEOUT_S) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise AssertionError(f"POST {path} {body}: {e.code} {e.read().decode()}") from None


def _start_fixture(out):
    canary = os.environ.get("FELIX_CONFORMANCE_CANARY")
    proc = subprocess.Popen([BIN, "client-fixture", "--out", str(out / "fixture.json"),
                             "--ca-file", str(out / "brokers.pem"),
                             *(["--canary", canary] if canary else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    fd = proc.stdout.fileno()
    text = ""
    # Waits for the ready line (select on the pipe, bounded by the deadline), never sleeps.
    while "fixture ready" not in text:
        ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=STOP_TIMEOUT_S)
            raise RuntimeError(f"the fixture did not start in {START_TIMEOUT_S}s:\n{text}")
        chunk = os.read(fd, 65536).decode()
        if not chunk:
            proc.wait()
            raise RuntimeError(f"the fixture exited {proc.returncode}:\n{text}")
        text += chunk
    return proc


@pytest.fixture(scope="session")
def fx():
    global _out_dir
    given = os.environ.get("FELIX_FIXTURE")
    if given:
        _out_dir = os.environ.get("FELIX_CONFORMANCE_OUT") or str(pathlib.Path(given).parent)
        yield Fixture(json.loads(pathlib.Path(given).read_text()))
        return
    out = pathlib.Path(os.environ.get("FELIX_CONFORMANCE_OUT") or
                       tempfile.mkdtemp(prefix="felix-conformance-"))
    out.mkdir(parents=True, exist_ok=True)
    _out_dir = str(out)
    proc = _start_fixture(out)
    try:
        yield Fixture(json.loads((out / "fixture.json").read_text()))
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=STOP_TIMEOUT_S)
        assert proc.returncode == 0, f"the fixture exited {proc.returncode}:\n{rest}"


@pytest.fixture(autouse=True)
def announced(request, fx):
    sid = scenario_of(request.node)
    fx.control("/scenario", {"id": sid})
    yield
    fx.control("/heal")
    fx.control("/scenario", {"id": None})
