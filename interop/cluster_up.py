"""A local cluster started the way a user starts one: `felix cluster up` (docs/cli.md).

Shared by the cluster interop tests. Set FELIX_CLI_BIN / FELIX_BROKER_BIN to test other builds.
"""

import os
import pathlib
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

import felix

REPO = pathlib.Path(__file__).resolve().parent.parent
CLI_BIN = os.environ.get("FELIX_CLI_BIN", str(REPO / "target" / "release" / "felix"))
BROKER_BIN = os.environ.get("FELIX_BROKER_BIN", str(REPO / "target" / "release" / "felix-broker"))
START_TIMEOUT_S = 60


class Node:
    """One node as `felix cluster up` prints it:
    `node n1 pid P client ADDR internal ADDR ops http://ADDR log PATH`."""

    def __init__(self, line):
        words = line.split()
        fields = dict(zip(words[2::2], words[3::2]))
        self.id = words[1]
        self.pid = int(fields["pid"])
        self.client = fields["client"]
        self.ops = fields["ops"]
        self.log = fields["log"]

    def metrics(self):
        """The node's `/metrics` text (an answer, not a wait: bounded by the HTTP timeout)."""
        with urllib.request.urlopen(f"{self.ops}/metrics", timeout=5) as r:
            return r.read().decode()


class LocalCluster:
    """`felix cluster up --nodes 3` with `args` (declarations) and `env` added to ours, which
    the nodes inherit. FELIX_INTEROP_KEEP=1 keeps the directory (configs, data, logs)."""

    def __init__(self, runtime, args, env=None):
        self.dir = tempfile.mkdtemp(prefix="felix-interop-cluster-")
        d = pathlib.Path(self.dir) / "cluster"
        self.out = open(pathlib.Path(self.dir) / "cluster-up.log", "w+")
        self.proc = subprocess.Popen(
            [CLI_BIN, "cluster", "up", "--nodes", "3", "--dir", str(d), "--broker", BROKER_BIN,
             "--runtime", runtime, *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, NO_COLOR="1", **(env or {})),
        )
        self.seeds, self.ca, self.token_path, self.nodes = None, None, None, []
        # Output is waited for (select on the pipe's descriptor, bounded by the deadline),
        # never slept on. Read raw: a buffered reader could hold lines select cannot see.
        deadline = time.monotonic() + START_TIMEOUT_S
        fd = self.proc.stdout.fileno()
        text = ""
        while "Ctrl-C stops the cluster." not in text:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(left, 0))
            if not ready:
                # SIGINT, not SIGKILL: `cluster up` then stops the nodes it started.
                self.proc.send_signal(signal.SIGINT)
                self.proc.wait(timeout=30)
                raise RuntimeError(f"the cluster did not start in {START_TIMEOUT_S}s:\n{text}")
            chunk = os.read(fd, 65536).decode()
            if not chunk:
                self.proc.wait()
                raise RuntimeError(f"felix cluster up exited {self.proc.returncode}:\n{text}")
            text += chunk
            self.out.write(chunk)
        # What the nodes print later goes on to the log file; a full pipe would block them.
        threading.Thread(target=self._drain, daemon=True).start()
        for line in text.splitlines():
            if line.startswith("seeds: "):
                self.seeds = line.split(": ", 1)[1].split(",")
            elif line.startswith("ca: "):
                self.ca = line.split(": ", 1)[1]
            elif line.startswith("token: "):
                self.token_path = line.split(": ", 1)[1].split(" ")[0]
            elif line.startswith("node ") and " pid " in line:
                self.nodes.append(Node(line))
        self.pids = [n.pid for n in self.nodes]
        # Nodes this test froze or killed: a frozen one is thawed before the cluster stops
        # (a stopped process cannot take SIGTERM), a killed one is never signalled again
        # (`cluster up` reaps it, so its pid may name another process).
        self.paused, self.killed = set(), set()
        self.token = pathlib.Path(self.token_path).read_text().strip()

    def _drain(self):
        fd = self.proc.stdout.fileno()
        while chunk := os.read(fd, 65536):
            self.out.write(chunk.decode(errors="replace"))

    def read_out(self):
        self.out.flush()
        self.out.seek(0)
        return self.out.read()

    def client(self, seeds):
        return felix.Client(seeds, tenant_id="t1", token=self.token, ca_file=self.ca)

    def _signal(self, node, sig):
        assert node.pid not in self.killed, f"{node.id} was killed"
        os.kill(node.pid, sig)

    def pause(self, node):
        self.paused.add(node.pid)
        self._signal(node, signal.SIGSTOP)

    def resume(self, node):
        self._signal(node, signal.SIGCONT)
        self.paused.discard(node.pid)

    def kill(self, node):
        self._signal(node, signal.SIGKILL)
        self.killed.add(node.pid)
        self.paused.discard(node.pid)

    def stop(self):
        for node in self.nodes:
            if node.pid in self.paused:
                self.resume(node)
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.out.close()
        if os.environ.get("FELIX_INTEROP_KEEP") == "1":
            print(f"\nkept {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
        return code
