//! What the tests against real processes (`chaos/tests/`) and `felix-create-bench` share: the
//! workspace's builds of the broker and the CLI, a cluster laid out and started, a client of
//! one node, `felix admin …` and a `POST` against a node's ops endpoint, and bounded waits
//! for an outcome, each look after the last woken by a node's change (`/v1/cluster/changes`).
//!
//! The broker and CLI are found as `FELIX_BROKER_BIN` / `FELIX_CLI_BIN` say, else in
//! `target/release`, else in `target/debug` (`scripts/test` builds the release ones first).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use felix_client::{ClientConfig, Offer};

use crate::cluster::{Cluster, Layout, NODES, READY_LIMIT, TENANT};

/// Bound on every wait for an outcome in the tests.
pub const LIMIT: Duration = Duration::from_secs(60);

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

/// Starts every node, then waits for every node to be ready.
pub fn start_all(c: &mut Cluster) {
    for i in 0..NODES.len() {
        c.start(i).expect("a node starts");
    }
    all_ready(c);
}

/// `layout` laid out, every node started, and every node ready.
pub fn started(layout: &Layout) -> Cluster {
    let mut c = laid_out(layout);
    start_all(&mut c);
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

/// `POST path` with `token` and the JSON `body` to the ops endpoint `ops`: the status and the
/// whole answer, waiting at most `limit` for it; `None` when it cannot be asked or read.
pub fn http_post(
    ops: SocketAddr,
    path: &str,
    token: &str,
    body: &str,
    limit: Duration,
) -> Option<(u16, String)> {
    let mut conn = TcpStream::connect_timeout(&ops, limit).ok()?;
    conn.set_read_timeout(Some(limit)).ok()?;
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nhost: {ops}\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).ok()?;
    let status = answer.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, answer))
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

/// Looks at an outcome with `f` until it gives `Some`, for at most [`LIMIT`]. Between two
/// looks it waits for the next change on any running node (`GET /v1/cluster/changes`, a
/// long-poll per node: metadata applied, a copy's role, generation, commit or log bounds, the
/// node serving), so a look follows an event rather than a pause. A node that cannot be asked
/// (down, not yet listening) is not watched; when no node can be, the last look decides.
pub fn until<T>(c: &Cluster, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + LIMIT;
    if let Some(t) = f() {
        return t;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let _watch = Watch::start(c, deadline, move || tx.send(()).is_ok());
    loop {
        let watched = rx.recv().is_ok();
        while rx.try_recv().is_ok() {}
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}: not within {LIMIT:?}");
        assert!(watched, "{what}: no node's changes could be watched");
    }
}

/// [`until`] for an asynchronous look, on any runtime (the wake comes over a channel).
pub async fn until_async<T, F: std::future::Future<Output = Option<T>>>(
    c: &Cluster,
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + LIMIT;
    if let Some(t) = f().await {
        return t;
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let _watch = Watch::start(c, deadline, move || tx.send(()).is_ok());
    loop {
        let watched = rx.recv().await.is_some();
        while rx.try_recv().is_ok() {}
        if let Some(t) = f().await {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}: not within {LIMIT:?}");
        assert!(watched, "{what}: no node's changes could be watched");
    }
}

/// Between two looks at a state only a client holds ([`until_slept`]).
const CLIENT_RETRY: Duration = Duration::from_millis(100);

/// For a state only the client holds (its own connections, say), which no broker's change
/// announces: looks every [`CLIENT_RETRY`] on `sleep`'s timer, at most [`LIMIT`]. A state a
/// broker holds is [`until_async`]'s.
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
        sleep(CLIENT_RETRY).await;
    }
}

/// How long one long-poll asks to be held (the broker caps it at its `MAX_WAIT`); with no
/// change meanwhile the watcher asks again.
const WATCH_WAIT: Duration = Duration::from_secs(5);

/// A thread per node long-polling its change counter, calling `notify` on each answer past
/// the last (the first answer too, so a change between the caller's look and the watch
/// starting is seen); ends at the deadline, when `notify` says nobody listens, when its node
/// cannot be asked, or (after the poll it is in) when dropped.
struct Watch {
    stop: Arc<AtomicBool>,
}

impl Watch {
    fn start(
        c: &Cluster,
        deadline: Instant,
        notify: impl Fn() -> bool + Send + Clone + 'static,
    ) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        for node in &c.nodes {
            let (ops, stop, notify) = (node.ops, stop.clone(), notify.clone());
            std::thread::spawn(move || {
                let mut after = 0;
                while !stop.load(Ordering::SeqCst) {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    let Some(n) = changes_after(ops, after, left.min(WATCH_WAIT)) else {
                        break;
                    };
                    if n > after {
                        after = n;
                        if !notify() {
                            break;
                        }
                    }
                }
            });
        }
        Watch { stop }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// `GET /v1/cluster/changes?after=N&timeout_ms=T` against the ops endpoint `ops`: the
/// node's change counter once past `after`, or as it stands after `wait`; `None` when the
/// node cannot be asked or its answer read.
pub fn changes_after(ops: SocketAddr, after: u64, wait: Duration) -> Option<u64> {
    let mut conn = TcpStream::connect_timeout(&ops, Duration::from_secs(5)).ok()?;
    conn.set_read_timeout(Some(wait + Duration::from_secs(5)))
        .ok()?;
    write!(
        conn,
        "GET /v1/cluster/changes?after={after}&timeout_ms={} HTTP/1.1\r\nhost: {ops}\r\n\
         connection: close\r\n\r\n",
        wait.as_millis()
    )
    .ok()?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).ok()?;
    let status: u16 = answer.split_whitespace().nth(1)?.parse().ok()?;
    if status != 200 {
        return None;
    }
    let (_, rest) = answer.split_once("\"changes\":")?;
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}
