"""Renders and lints the felix chart offline (PyPI helm-python-sdk: Helm's own Go code, no
helm binary, no cluster), validates every rendered manifest against the Kubernetes schemas
(PyPI kubernetes-validate, strict: unknown fields are errors), and checks what the chart
promises (docs/deploy.md, "Helm"). With FELIX_BROKER_BIN and FELIX_CLI_BIN set, the broker
itself also loads the configuration the chart renders (`--print-config`) with pod 0's
environment, on certificates made by deploy/compose/make-secrets. scripts/test-deploy runs it:

    python3 deploy/helm/check.py deploy/helm/felix
"""

import os
import pathlib
import subprocess
import sys
import tempfile

import helm_python as helm
import kubernetes_validate
import yaml

# The Kubernetes version the manifests are validated against: kubernetes-validate's newest.
KUBE_VERSION = kubernetes_validate.utils.latest_version()
RELEASE, NAMESPACE = "demo", "brokers"


def lint(chart_dir, values):
    report = helm.lint(chart_dir, values, strict=True, namespace=NAMESPACE)
    problems = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
    assert not problems and not report.get("errors"), f"helm lint {values}: {report}"


def render(chart_dir, values):
    chart = helm.Chart.load(chart_dir)
    out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend((path, d) for d in yaml.safe_load_all(text) if d)
    return docs


def validate(docs):
    for path, doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(f"{path}: {doc['kind']}: {e.message} at {list(e.path)}")


def by_kind(docs, kind):
    found = [d for _, d in docs if d["kind"] == kind]
    assert found, f"no {kind} rendered"
    return found


def check_promises(docs, replicas):
    sts = by_kind(docs, "StatefulSet")[0]
    spec = sts["spec"]
    assert spec["replicas"] == replicas
    assert spec["podManagementPolicy"] == "Parallel"
    pod = spec["template"]["spec"]
    broker = pod["containers"][0]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert probe in broker, f"no {probe}"
    assert broker["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "preStop" in broker["lifecycle"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert spec["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    env = {e["name"]: e for e in broker["env"]}
    assert env["FELIX_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    headless = [s for s in by_kind(docs, "Service") if s["spec"].get("clusterIP") == "None"]
    assert len(headless) == 1 and headless[0]["spec"]["publishNotReadyAddresses"] is True
    assert spec["serviceName"] == headless[0]["metadata"]["name"]
    pdb = by_kind(docs, "PodDisruptionBudget")[0]
    assert pdb["spec"]["maxUnavailable"] == 1
    config = by_kind(docs, "ConfigMap")[0]["data"]["cluster.toml"]
    peers = next(l for l in config.splitlines() if l.startswith("peers = "))
    names = [p.split("=")[0] for p in peers.split('"')[1].split(",")]
    full = sts["metadata"]["name"]
    assert names == [f"{full}-{i}" for i in range(replicas)], peers
    # Each peer at its own Service (a stable address across pod restarts), which selects
    # exactly its pod and lists it before it is ready.
    hosts = [p.split("=")[1].split(":")[0] for p in peers.split('"')[1].split(",")]
    assert hosts == [f"{n}.{NAMESPACE}.svc.cluster.local" for n in names], peers
    own = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    for n in names:
        spec = own[n]["spec"]
        assert spec["selector"]["statefulset.kubernetes.io/pod-name"] == n
        assert spec["publishNotReadyAddresses"] is True and spec.get("clusterIP") != "None"
    assert "[[streams]]" in config and "[[caches]]" in config
    test = [p for p in by_kind(docs, "Pod")
            if p["metadata"]["annotations"].get("helm.sh/hook") == "test"]
    assert len(test) == 1, "one helm test pod"


def broker_loads(docs):
    """The rendered cluster.toml and pod 0's FELIX_* variables, as the broker reads them; the
    files the pod would mount made here, the peers (names only a cluster resolves) at
    loopback stand-ins."""
    broker, cli = os.environ.get("FELIX_BROKER_BIN"), os.environ.get("FELIX_CLI_BIN")
    if not (broker and cli):
        print("the broker's own check of the rendered configuration skipped: "
              "set FELIX_BROKER_BIN and FELIX_CLI_BIN")
        return
    sts = by_kind(docs, "StatefulSet")[0]
    pod = f"{sts['metadata']['name']}-0"
    config = by_kind(docs, "ConfigMap")[0]["data"]["cluster.toml"]
    with tempfile.TemporaryDirectory() as tmp:
        secrets = pathlib.Path(tmp) / "secrets"
        subprocess.run([pathlib.Path(__file__).parent.parent / "compose" / "make-secrets",
                        secrets, pod], check=True, stdout=subprocess.DEVNULL,
                       env=dict(os.environ, FELIX_CLI=cli))
        mine = secrets / pod
        mounted = {"/etc/felix/tls/ca.crt": mine / "ca.pem",
                   "/etc/felix/tls/jwks.json": mine / "jwks.json",
                   '"/data"': f'"{tmp}/data"'}
        for path, here in mounted.items():
            config = config.replace(path, str(here))
        (pathlib.Path(tmp) / "cluster.toml").write_text(config)
        env = dict(os.environ, NO_COLOR="1")
        broker_env = sts["spec"]["template"]["spec"]["containers"][0]["env"]
        names = [f"{sts['metadata']['name']}-{i}" for i in range(sts["spec"]["replicas"])]
        for e in broker_env:
            value = e.get("value", pod).replace("$(FELIX_NODE_ID)", pod)
            value = value.replace(f"/etc/felix/tls/{pod}.crt", str(mine / "cert.pem"))
            env[e["name"]] = value.replace(f"/etc/felix/tls/{pod}.key", str(mine / "key.pem"))
        env["FELIX_CONFIG"] = str(pathlib.Path(tmp) / "cluster.toml")
        env["FELIX_CLUSTER_PEERS"] = ",".join(
            f"{n}=127.0.0.1:{7001 + i}" for i, n in enumerate(names))
        out = subprocess.run([broker, "--print-config"], env=env, capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0 and f'node_id = "{pod}"' in out.stdout, (
            f"the broker refused the chart's configuration:\n{out.stderr}")
        assert "[[streams]]" in out.stdout and "[[caches]]" in out.stdout
    print(f"felix-broker loads the rendered configuration with {pod}'s environment")


def main():
    chart_dir = sys.argv[1]
    for values in ({}, {"replicas": 5}):
        lint(chart_dir, values)
        docs = render(chart_dir, values)
        validate(docs)
        check_promises(docs, values.get("replicas", 3))
        kinds = sorted({d["kind"] for _, d in docs})
        print(f"chart with {values or 'default values'}: lint clean; {len(docs)} manifests "
              f"({', '.join(kinds)}) valid for Kubernetes {KUBE_VERSION} (strict)")
        broker_loads(docs)
    # The edge: a cluster is 3 or 5 nodes, and the chart refuses anything else.
    for bad in (4, 1):
        try:
            render(chart_dir, {"replicas": bad})
        except helm.HelmError as e:
            assert "replicas must be 3 or 5" in str(e), e
        else:
            raise AssertionError(f"replicas={bad} rendered")
    print("chart refuses replicas 1 and 4 (a cluster is 3 or 5 nodes)")


if __name__ == "__main__":
    main()
