//! What the tests against real processes (`chaos/tests/`) share: the workspace's builds of
//! the broker and the CLI, a cluster laid out and started, a client of one node, `felix
//! admin …` against a node's ops endpoint, and bounded retries of an outcome.
//!
//! The broker and CLI are found as `FELIX_BROKER_BIN` / `FELIX_CLI_BIN` say, else in
//! `target/release`, else in `target/debug` (`scripts/test` builds the release ones first).

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use felix_client::{ClientConfig, Offer};

use crate::cluster::{Cluster, Layout, NODES, READY_LIMIT, TENANT};

/// Bound on every wait for an outcome in the tests.
pub const LIMIT: Duration = Duration::from_secs(60);
/// Between two attempts at an outcome.
const RETRY: Duration = Duration::from_millis(100);

/// The workspace's build of `name`: the path in `env` if set, else `target/release`, else
/// `target/debug`.
pub fn binary(env: &str, name: &str) -> PathBuf {
    if let Ok(p) = std::env::var(env) {
        return PathBuf::from(p);
    }
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target");
    for profile in ["release", "debug"] {
        let p = target.join(profile).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("no {name} build: run `cargo build --release --bin {name}` or set {env}")
}

/// `felix-broker` ([`binary`] with `FELIX_BROKER_BIN`).
pub fn broker() -> PathBuf {
    binary("FELIX_BROKER_BIN", "felix-broker")
}

/// `felix`, the CLI ([`binary`] with `FELIX_CLI_BIN`).
pub fn cli() -> PathBuf {
    binary("FELIX_CLI_BIN", "felix")
}

/// The admin tests' cluster: three durable nodes (fsync on commit), a 1 s lease, direct peer
/// links, nothing declared; the run directory's name starts with `prefix`.
pub fn admin_layout(prefix: &'static str) -> Layout {
    Layout {
        cluster: true,
        streams: Vec::new(),
        fsync_mode: "on_commit".into(),
        lease: Duration::from_millis(1000),
        relays: false,
        prefix,
    }
}

/// `layout` laid out with the workspace's broker; no node runs yet.
pub fn laid_out(layout: &Layout) -> Cluster {
    Cluster::lay_out_with(&broker(), layout).expect("the cluster is laid out")
}

/// Waits for every node to answer `/readyz`, each within [`READY_LIMIT`].
pub fn all_ready(c: &mut Cluster) {
    for i in 0..NODES.len() {
        c.wait_ready(i, READY_LIMIT).expect("a node is ready");
    }
}

/// `layout` laid out, every node started, and every node ready.
pub fn started(layout: &Layout) -> Cluster {
    let mut c = laid_out(layout);
    for i in 0..NODES.len() {
        c.start(i).expect("a node starts");
    }
    all_ready(&mut c);
    c
}

/// A client of node `i` alone, as the reference client offers, with a 5 s request bound.
pub fn client_config(c: &Cluster, i: usize) -> ClientConfig {
    let mut config = ClientConfig::new(
        c.nodes[i].client,
        c.ca_pem.as_bytes().to_vec(),
        TENANT,
        &c.token,
    );
    config.request_timeout = Duration::from_secs(5);
    config.offer = Offer::reference_client();
    config
}

/// `felix admin GROUP VERB --broker OPS --ca CA --token TOKEN REST…` against node `at`'s
/// ops endpoint, where `args` is `[VERB, REST…]` and `group` is `streams` or `caches`.
pub fn admin(c: &Cluster, at: usize, group: &str, token: &str, args: &[&str]) -> Output {
    Command::new(cli())
        .args(["admin", group])
        .args(&args[..1])
        .arg("--broker")
        .arg(c.nodes[at].ops.to_string())
        .arg("--ca")
        .arg(c.dir.join("ca.pem"))
        .args(["--token", token])
        .args(&args[1..])
        .output()
        .expect("the CLI runs")
}

/// A command's exit code and everything it wrote, for an assertion's message.
pub fn text(o: &Output) -> String {
    format!(
        "exit {:?}\n{}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The index in [`NODES`] of the node named `id`.
pub fn index(id: &str) -> usize {
    NODES.iter().position(|n| *n == id).expect("a node id")
}

/// Retries `f` until it gives `Some`, at most [`LIMIT`]; a retry is a new attempt at an
/// outcome, not a wait standing in for one.
pub fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}: not within {LIMIT:?}");
        std::thread::sleep(RETRY);
    }
}

/// [`until`] for an asynchronous attempt, on tokio.
pub async fn until_async<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    f: impl FnMut() -> F,
) -> T {
    until_slept(what, tokio::time::sleep, f).await
}

/// [`until`] for an asynchronous attempt, on any runtime: `sleep` is its timer.
pub async fn until_slept<T, F, S>(
    what: &str,
    sleep: impl Fn(Duration) -> S,
    mut f: impl FnMut() -> F,
) -> T
where
    F: std::future::Future<Output = Option<T>>,
    S: std::future::Future<Output = ()>,
{
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(t) = f().await {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}: not within {LIMIT:?}");
        sleep(RETRY).await;
    }
}
