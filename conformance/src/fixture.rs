//! `felix-conformance client-fixture`: a real three-node cluster of `felix-broker` processes on
//! loopback for a client's conformance suite (docs/conformance.md).
//!
//! The nodes, their CA, JWKS, token and peer relays come from felix-chaos's [`Cluster`]; this
//! module adds the scenario streams and caches, a UDP relay in front of the broker leading
//! `link_stream` (the `link_addr` the `fault.*` scenarios connect through), an HTTP control
//! endpoint on 127.0.0.1 (`/scenario`, `/fence`, `/partition`, `/heal`, `/link`, `/stop`), and
//! the evidence file: per scenario, the requests each node ran and the answers worth telling
//! apart (from each node's `/metrics`, read at the scenario's start and end), and the faults
//! applied. The evidence is what `felix-conformance verify --evidence` checks a client's
//! claims against.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use felix_chaos::cluster::{http_get, Cluster, Layout, READY_LIMIT, TENANT};
use felix_client::{Client, ClientConfig};
use felix_proto::message::{self, Message, ShardKind};
use felix_testkit::{Counts, Direction, Relay, Rule};
use serde_json::{json, Value};

/// The namespace every scenario stream and cache lives in.
pub const NAMESPACE: &str = "conformance";
/// `(name, shards, replication factor, consistency)` of each declared stream.
pub const STREAMS: [(&str, u32, u32, &str); 8] = [
    ("events", 1, 3, "leader"),
    ("sharded", 3, 3, "leader"),
    ("quorum", 1, 3, "quorum"),
    ("fenced", 1, 1, "leader"),
    ("link", 1, 3, "leader"),
    ("queue", 1, 3, "leader"),
    ("ledger", 2, 3, "leader"),
    // Deleted under a subscriber by `POST /delete` (the broker ends its event stream).
    ("doomed", 1, 3, "leader"),
];
/// The declared caches (replication factor 3).
pub const CACHES: [&str; 2] = ["cache", "watch"];
/// The stream behind `link_addr`.
pub const LINK_STREAM: &str = "link";
/// What `faults` lists: the control endpoint's faults and the link's.
pub const FAULTS: [&str; 6] = [
    "fence",
    "partition",
    "heal",
    "link.drop",
    "link.reset",
    "link.stall",
];
/// The nodes' settings the scenarios lean on, as environment the nodes inherit: a quorum
/// write nobody confirms is answered in half a second; a fenced leader's held request is
/// refused after 3 s; a watch queues one change (so a busy one lags); only the declared
/// streams exist (an undeclared one is `not_found`, with 0 shards).
pub const NODE_ENV: [(&str, &str); 4] = [
    ("FELIX_PLACE_STREAMS_ON_FIRST_USE", "false"),
    ("FELIX_QUORUM_TIMEOUT_MS", "500"),
    ("FELIX_FORWARD_TIMEOUT_MS", "3000"),
    ("FELIX_CACHE_WATCH_QUEUE_CAPACITY", "1"),
];
/// `cluster.lease_ms`: long enough that a partitioned leader still takes the write it is
/// asked for right after the cut, short enough that a fence bites in seconds.
pub const LEASE: Duration = Duration::from_millis(3000);
/// A link fault's `hold_ms` at most (the catalogue's longest is 8 s).
pub const MAX_HOLD: Duration = Duration::from_secs(30);
/// Bound on a control request's body.
const MAX_BODY: usize = 64 * 1024;
/// How long a control connection may take to send its request.
const CONTROL_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on one `shard_owners` question.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long every declared shard may take to be named an owner after the nodes are ready.
const PLACED_LIMIT: Duration = Duration::from_secs(60);
/// Between two looks at the shard owners while waiting for placement.
const PLACED_POLL: Duration = Duration::from_millis(200);
/// How long every node may take to answer `/readyz` 200 again after `/heal`.
const HEALED_LIMIT: Duration = Duration::from_secs(30);
/// How long a freeze waits for the node's `leader` shards to be recorded quiet first.
const QUIET_LIMIT: Duration = Duration::from_secs(15);
/// Validity of the tokens the fixture hands out.
const TOKEN_TTL_SECS: u64 = 24 * 3600;

pub struct Options {
    pub out: PathBuf,
    pub ca_file: PathBuf,
    pub broker: PathBuf,
    pub evidence: PathBuf,
    pub canary: Canary,
}

/// A rule broken on purpose, for the kit's self-check: the verifier must reject a client run
/// against it even though the client's own tests pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Canary {
    None,
    /// Every node's address in `fixture.json` leads to the broker that owns `events`: a
    /// subscribe sent to a "non-owner" is served where it lands, with no redirect, as by a
    /// broker that serves redirected requests locally.
    ServeRedirectsLocally,
}

impl Canary {
    pub fn parse(name: &str) -> Option<Canary> {
        match name {
            "none" => Some(Canary::None),
            "serve-redirects-locally" => Some(Canary::ServeRedirectsLocally),
            _ => None,
        }
    }
}

/// Requests and answers one node reported at a moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub received: BTreeMap<String, u64>,
    pub answered: BTreeMap<String, u64>,
}

/// Reads the counters the evidence is made of out of a node's `/metrics` text.
pub fn parse_metrics(text: &str) -> Snapshot {
    let mut s = Snapshot::default();
    for line in text.lines() {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<u64>() else {
            continue;
        };
        let label = |prefix: &str| {
            name.strip_prefix(prefix)
                .and_then(|rest| rest.strip_suffix("\"}"))
                .map(str::to_owned)
        };
        if let Some(t) = label("felix_broker_requests_total{type=\"") {
            s.received.insert(t, value);
        } else if let Some(code) = label("felix_broker_errors_total{code=\"") {
            s.answered.insert(code, value);
        } else if name == "felix_broker_redirects_total" {
            s.answered.insert("redirect".into(), value);
        }
    }
    s
}

fn diff(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> Value {
    let mut out = serde_json::Map::new();
    for (k, v) in after {
        let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
        if d > 0 {
            out.insert(k.clone(), d.into());
        }
    }
    Value::Object(out)
}

/// A scenario's id, the nodes' counters and the link's at its start, and its faults so far.
type Running = (String, Vec<Option<Snapshot>>, [Counts; 2], Vec<Value>);

/// The scenario being run and what has been recorded.
struct Recorder {
    started: Instant,
    path: PathBuf,
    /// The scenario running: its id, the nodes' counters and the link's at its start, and the
    /// faults applied since.
    current: Option<Running>,
    done: Vec<Value>,
    /// Faults applied between scenarios.
    loose: Vec<Value>,
}

impl Recorder {
    fn at_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn fault(&mut self, fault: Value) {
        match &mut self.current {
            Some((_, _, _, faults)) => faults.push(fault),
            None => self.loose.push(fault),
        }
    }

    /// Ends the current scenario with the nodes' counters and the link's `now`.
    fn end(&mut self, ids: &[&str], now: &[Option<Snapshot>], link_now: [Counts; 2]) {
        let Some((id, before, link_before, faults)) = self.current.take() else {
            return;
        };
        let mut nodes = serde_json::Map::new();
        for (i, node) in ids.iter().enumerate() {
            let entry = match (&before[i], &now[i]) {
                (Some(b), Some(a)) => json!({
                    "received": diff(&a.received, &b.received),
                    "answered": diff(&a.answered, &b.answered),
                }),
                // Frozen or gone at one end: nothing can be said of it.
                _ => json!({"unreadable": true}),
            };
            nodes.insert((*node).to_owned(), entry);
        }
        // Datagrams through `link_addr` while it ran, both ways together.
        let sum = |c: [Counts; 2], f: fn(&Counts) -> u64| f(&c[0]) + f(&c[1]);
        let link = json!({
            "passed": sum(link_now, |c| c.passed) - sum(link_before, |c| c.passed),
            "dropped": sum(link_now, |c| c.dropped) - sum(link_before, |c| c.dropped),
            "held": sum(link_now, |c| c.held) - sum(link_before, |c| c.held),
        });
        self.done
            .push(json!({"id": id, "nodes": nodes, "faults": faults, "link": link}));
    }

    fn write(&self, complete: bool) -> Result<(), String> {
        let doc = json!({
            "complete": complete,
            "scenarios": self.done,
            "faults_between_scenarios": self.loose,
        });
        let text = serde_json::to_string_pretty(&doc).expect("plain JSON");
        // Written aside and renamed: a reader never sees half a file.
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &self.path))
            .map_err(|e| format!("writing {}: {e}", self.path.display()))
    }
}

struct State {
    cluster: Cluster,
    link: Relay,
    /// The canary's relays (kept for the fixture's life).
    _canary: Vec<Relay>,
    /// Nodes this fixture stopped with SIGSTOP (`/fence` with `"how": "freeze"`).
    frozen: Vec<bool>,
    recorder: Recorder,
    rt: tokio::runtime::Runtime,
    /// Bumped by every link fault and heal: a timed heal of an older fault does nothing.
    link_generation: u64,
}

impl State {
    fn ids(&self) -> Vec<&'static str> {
        self.cluster.nodes.iter().map(|n| n.id).collect()
    }

    fn link_counts(&self) -> [Counts; 2] {
        [
            self.link.counts(Direction::Forward),
            self.link.counts(Direction::Backward),
        ]
    }

    /// Points `link_addr` at the node leading `link_stream` now (leadership moves when
    /// nodes are fenced), so a client seeded with it reaches the owner through the relay.
    fn follow_link_leader(&mut self) {
        let Ok(i) = self.leader(LINK_STREAM, 0) else {
            return;
        };
        let to = self.cluster.nodes[i].client;
        if self.link.target() != to {
            self.link.retarget(to);
            let at_ms = self.recorder.at_ms();
            let node = self.cluster.nodes[i].id;
            self.recorder
                .fault(json!({"kind": "link_target", "node": node, "at_ms": at_ms}));
        }
    }

    fn snapshots(&self) -> Vec<Option<Snapshot>> {
        self.cluster
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                if self.frozen[i] {
                    return None;
                }
                http_get(n.ops, "/metrics", true).map(|(_, text)| parse_metrics(&text))
            })
            .collect()
    }

    /// Which node leads `stream`'s `shard`, asked of a node that is not frozen.
    fn leader(&self, stream: &str, shard: u64) -> Result<usize, String> {
        let mut last = String::from("no node to ask");
        for (i, node) in self.cluster.nodes.iter().enumerate() {
            if self.frozen[i] {
                continue;
            }
            match self.rt.block_on(owners(
                node.client,
                &self.cluster.ca_pem,
                &self.cluster.token,
                stream,
            )) {
                Ok(owners) => {
                    let owner = owners
                        .get(shard as usize)
                        .cloned()
                        .flatten()
                        .ok_or_else(|| format!("{stream} shard {shard} has no owner"))?;
                    return self
                        .cluster
                        .nodes
                        .iter()
                        .position(|n| n.id == owner)
                        .ok_or_else(|| format!("unknown owner {owner}"));
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Which node a fault request names: `{"node": "n2"}` or `{"stream": S, "shard": N}`.
    fn target(&self, body: &Value) -> Result<usize, String> {
        if let Some(node) = body["node"].as_str() {
            return self
                .cluster
                .nodes
                .iter()
                .position(|n| n.id == node)
                .ok_or_else(|| format!("no node {node}"));
        }
        let stream = body["stream"]
            .as_str()
            .ok_or("name a \"node\" or a \"stream\"")?;
        self.leader(stream, body["shard"].as_u64().unwrap_or(0))
    }

    /// Cuts every peer link between node `i` and the others, both ways.
    fn cut(&self, i: usize) {
        for (from, row) in self.cluster.relays.iter().enumerate() {
            for (to, relay) in row.iter().enumerate() {
                if let Some(r) = relay {
                    if from == i || to == i {
                        r.set(Direction::Forward, Rule::DropAll);
                        r.set(Direction::Backward, Rule::DropAll);
                    }
                }
            }
        }
    }

    fn heal(&mut self) -> Result<(), String> {
        self.cluster.heal_all();
        self.link.heal();
        self.link_generation += 1;
        for i in 0..self.frozen.len() {
            if std::mem::take(&mut self.frozen[i]) {
                self.cluster.signal(i, libc::SIGCONT)?;
            }
        }
        Ok(())
    }
}

/// `shard_owners` of a stream: each shard's owner node id, if it has one.
async fn owners(
    addr: SocketAddr,
    ca: &str,
    token: &str,
    stream: &str,
) -> Result<Vec<Option<String>>, String> {
    let ask = async {
        let mut config = ClientConfig::new(addr, ca.as_bytes().to_vec(), TENANT, token);
        config.request_timeout = ASK_TIMEOUT;
        config.connect_timeout = ASK_TIMEOUT;
        let client = Client::connect(config).await.map_err(|e| e.to_string())?;
        let ask = Message::ShardOwners(message::ShardOwners {
            tenant_id: TENANT.into(),
            namespace: NAMESPACE.into(),
            name: stream.into(),
            kind: ShardKind::Stream,
            request_id: 1,
        });
        let mut raw = client
            .open_raw_stream(true)
            .await
            .map_err(|e| e.to_string())?;
        raw.send(ask.to_frame().to_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let frame = raw
            .recv_frame()
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the stream ended without an answer")?;
        client.close().await;
        match Message::decode(&frame.payload).map_err(|e| e.to_string())? {
            Message::ShardOwnersView(v) => Ok(v.owners.into_iter().map(|o| o.node_id).collect()),
            other => Err(format!("expected shard_owners_view, got {other:?}")),
        }
    };
    tokio::time::timeout(ASK_TIMEOUT * 2, ask)
        .await
        .map_err(|_| format!("no shard_owners answer from {addr}"))?
}

/// Waits, at most [`QUIET_LIMIT`], until every replicated `leader` stream shard and cache the
/// node at `ops` leads is recorded quiet (`felix_broker_leader_shards_quiet` counts them all).
fn wait_quiet(ops: SocketAddr) {
    let leader_streams: Vec<&str> = STREAMS
        .iter()
        .filter(|s| s.3 == "leader")
        .map(|s| s.0)
        .chain(CACHES)
        .collect();
    let deadline = Instant::now() + QUIET_LIMIT;
    while Instant::now() < deadline {
        let Some((_, text)) = http_get(ops, "/metrics", true) else {
            return;
        };
        let led = text
            .lines()
            .filter(|l| l.starts_with("felix_broker_replication_lag_records{"))
            .filter_map(|l| l.split('"').nth(1))
            .filter(|shard| !shard.contains("/groups") && !shard.contains("/counters"))
            .filter(|shard| {
                let name = shard.split('#').next().unwrap_or("");
                leader_streams
                    .iter()
                    .any(|s| name.ends_with(&format!("/{NAMESPACE}/{s}")))
            })
            .count();
        let quiet = text
            .lines()
            .find(|l| l.starts_with("felix_broker_leader_shards_quiet "))
            .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        if quiet >= led as f64 {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `[[streams]]` and `[[caches]]` of the scenarios.
fn declarations() -> String {
    use felix_cli::layout::toml_string;
    let mut out = String::new();
    for (name, shards, rf, consistency) in STREAMS {
        out.push_str(&format!(
            "\n[[streams]]\ntenant = {}\nnamespace = {}\nstream = {}\nshards = {shards}\n\
             replication_factor = {rf}\nconsistency = {}\n",
            toml_string(TENANT),
            toml_string(NAMESPACE),
            toml_string(name),
            toml_string(consistency),
        ));
    }
    for name in CACHES {
        out.push_str(&format!(
            "\n[[caches]]\ntenant = {}\nnamespace = {}\ncache = {}\nreplication_factor = 3\n",
            toml_string(TENANT),
            toml_string(NAMESPACE),
            toml_string(name),
        ));
    }
    out
}

/// What a running fixture stops on.
enum Stop {
    Signal(i32),
    Control,
}

/// Starts the cluster, writes `fixture.json`, serves the control endpoint until SIGINT,
/// SIGTERM or `POST /stop`, then stops every node and completes the evidence file.
pub fn run(opts: &Options) -> Result<(), String> {
    // Signals are taken by one thread (sigwait): blocked here, before any thread starts, so
    // every thread inherits the mask.
    let signals = block_stop_signals()?;
    for (k, v) in NODE_ENV {
        std::env::set_var(k, v);
    }
    std::env::set_var("NO_COLOR", "1");
    let layout = Layout {
        cluster: true,
        streams: Vec::new(),
        fsync_mode: "on_commit".into(),
        lease: LEASE,
        relays: true,
        prefix: "felix-conformance",
    };
    let mut cluster = Cluster::lay_out_with(&opts.broker, &layout)?;
    cluster.append_config(&declarations())?;
    for i in 0..cluster.nodes.len() {
        cluster.start(i)?;
    }
    for i in 0..cluster.nodes.len() {
        cluster.wait_ready(i, READY_LIMIT)?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("a runtime: {e}"))?;
    // Every declared stream's shards have an owner before a client is told to start.
    let deadline = Instant::now() + PLACED_LIMIT;
    for (name, shards, _, _) in STREAMS {
        loop {
            let got = rt.block_on(owners(
                cluster.nodes[0].client,
                &cluster.ca_pem,
                &cluster.token,
                name,
            ));
            match got {
                Ok(o) if o.len() == shards as usize && o.iter().all(Option::is_some) => break,
                other if Instant::now() >= deadline => {
                    return Err(format!("{name} not placed in {PLACED_LIMIT:?}: {other:?}"))
                }
                _ => std::thread::sleep(PLACED_POLL),
            }
        }
    }
    let link_owner = {
        let o = rt.block_on(owners(
            cluster.nodes[0].client,
            &cluster.ca_pem,
            &cluster.token,
            LINK_STREAM,
        ))?;
        let id = o[0].clone().ok_or("the link stream has no owner")?;
        cluster
            .nodes
            .iter()
            .position(|n| n.id == id)
            .ok_or("the link stream's owner is no node")?
    };
    let link = Relay::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        cluster.nodes[link_owner].client,
    )
    .map_err(|e| format!("starting the link relay: {e}"))?;
    // The addresses clients are given for each node: their own, or, for the canary, a relay
    // to the node leading `events` in front of every other node's id.
    let mut advertised: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.client).collect();
    let mut canary_relays = Vec::new();
    if opts.canary == Canary::ServeRedirectsLocally {
        let o = rt.block_on(owners(
            cluster.nodes[0].client,
            &cluster.ca_pem,
            &cluster.token,
            "events",
        ))?;
        let owner = o[0].clone().ok_or("events has no owner")?;
        let to = cluster
            .nodes
            .iter()
            .find(|n| n.id == owner)
            .ok_or("the owner of events is no node")?
            .client;
        for (i, node) in cluster.nodes.iter().enumerate() {
            if node.id != owner {
                let relay = Relay::start(SocketAddr::from(([127, 0, 0, 1], 0)), to)
                    .map_err(|e| format!("starting a canary relay: {e}"))?;
                advertised[i] = relay.listen_addr();
                canary_relays.push(relay);
            }
        }
    }
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .map_err(|e| format!("binding the control endpoint: {e}"))?;
    let control = listener.local_addr().map_err(|e| e.to_string())?;

    std::fs::write(&opts.ca_file, &cluster.ca_pem)
        .map_err(|e| format!("writing {}: {e}", opts.ca_file.display()))?;
    let ca_file = std::fs::canonicalize(&opts.ca_file).map_err(|e| e.to_string())?;
    // No `stream.publish`: a publish with it is refused as `forbidden`.
    let unauthorized = cluster.mint(
        felix_auth::full_permissions(TENANT)
            .into_iter()
            .filter(|p| !p.starts_with("stream.publish"))
            .collect(),
        TOKEN_TTL_SECS,
    );
    let token = cluster.mint(felix_auth::full_permissions(TENANT), TOKEN_TTL_SECS);
    let evidence = absolute(&opts.evidence)?;
    let fixture = json!({
        "addrs": advertised.iter().map(SocketAddr::to_string).collect::<Vec<_>>(),
        "nodes": cluster.nodes.iter().zip(&advertised).map(|(n, a)| json!({"id": n.id, "addr": a.to_string()})).collect::<Vec<_>>(),
        "tenant_id": TENANT,
        "namespace": NAMESPACE,
        "token": token,
        "unauthorized_token": unauthorized,
        "ca_file": ca_file,
        "server_name": "localhost",
        "streams": STREAMS.iter().map(|(n, s, rf, c)| (n.to_string(), json!({"shards": s, "replication_factor": rf, "consistency": c}))).collect::<serde_json::Map<_, _>>(),
        "caches": CACHES,
        "control_url": format!("http://{control}"),
        "link_addr": link.listen_addr().to_string(),
        "link_stream": LINK_STREAM,
        "faults": FAULTS,
        "evidence": evidence,
    });
    let recorder = Recorder {
        started: Instant::now(),
        path: evidence,
        current: None,
        done: Vec::new(),
        loose: Vec::new(),
    };
    recorder.write(false)?;
    let state = Arc::new(Mutex::new(State {
        frozen: vec![false; cluster.nodes.len()],
        cluster,
        link,
        _canary: canary_relays,
        recorder,
        rt,
        link_generation: 0,
    }));
    let text = serde_json::to_string_pretty(&fixture).expect("plain JSON");
    let tmp = opts.out.with_extension("tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &opts.out))
        .map_err(|e| format!("writing {}: {e}", opts.out.display()))?;

    let (stop_tx, stop_rx) = mpsc::channel();
    let tx = stop_tx.clone();
    std::thread::spawn(move || {
        let _ = tx.send(Stop::Signal(wait_signal(&signals)));
    });
    {
        let state = Arc::clone(&state);
        std::thread::spawn(move || serve(listener, state, stop_tx));
    }
    println!(
        "fixture ready: {} (control http://{control}); Ctrl-C stops it",
        opts.out.display()
    );
    let why = stop_rx.recv().unwrap_or(Stop::Control);
    let mut st = state.lock().expect("fixture state");
    let _ = st.heal();
    let now = st.snapshots();
    let ids = st.ids();
    let link_now = st.link_counts();
    st.recorder.end(&ids, &now, link_now);
    st.cluster.stop_all();
    st.recorder.write(true)?;
    // The nodes' configs, data and logs go with them unless asked to stay.
    if std::env::var_os("FELIX_CONFORMANCE_KEEP").is_some() {
        println!("nodes' files kept in {}", st.cluster.dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&st.cluster.dir);
    }
    match why {
        Stop::Signal(sig) => println!("stopped on signal {sig}; evidence complete"),
        Stop::Control => println!("stopped by POST /stop; evidence complete"),
    }
    Ok(())
}

fn absolute(p: &Path) -> Result<PathBuf, String> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    Ok(std::env::current_dir().map_err(|e| e.to_string())?.join(p))
}

fn block_stop_signals() -> Result<libc::sigset_t, String> {
    // SAFETY: plain libc calls on a set we own; pthread_sigmask only changes this thread's
    // mask (no other thread exists yet).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err("blocking SIGINT and SIGTERM failed".into());
        }
        Ok(set)
    }
}

fn wait_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: `set` is initialised and its signals are blocked in every thread.
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}

fn serve(listener: TcpListener, state: Arc<Mutex<State>>, stop: mpsc::Sender<Stop>) {
    for conn in listener.incoming().flatten() {
        let state = Arc::clone(&state);
        let stop = stop.clone();
        std::thread::spawn(move || handle(conn, &state, &stop));
    }
}

/// Reads one HTTP request: method, path, body.
fn read_request(conn: &mut TcpStream) -> Result<(String, String, Vec<u8>), String> {
    conn.set_read_timeout(Some(CONTROL_READ_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if buf.len() > MAX_BODY {
            return Err("request head too long".into());
        }
        let n = conn.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed mid-request".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut words = head.split_whitespace();
    let method = words.next().unwrap_or_default().to_owned();
    let path = words.next().unwrap_or_default().to_owned();
    let length = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())
                .flatten()
        })
        .unwrap_or(0);
    if length > MAX_BODY {
        return Err("request body too long".into());
    }
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let n = conn.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    Ok((method, path, body))
}

fn handle(mut conn: TcpStream, state: &Arc<Mutex<State>>, stop: &mpsc::Sender<Stop>) {
    let (status, answer) = match read_request(&mut conn) {
        Ok((method, path, body)) => {
            let body: Value = if body.is_empty() {
                json!({})
            } else {
                serde_json::from_slice(&body).unwrap_or(Value::Null)
            };
            if method != "POST" {
                (405, json!({"error": "POST only"}))
            } else if body.is_null() {
                (400, json!({"error": "the body is not JSON"}))
            } else {
                match control(&path, &body, state, stop) {
                    Ok(v) => (200, v),
                    Err(e) => (400, json!({ "error": e })),
                }
            }
        }
        Err(e) => (400, json!({ "error": e })),
    };
    let text = answer.to_string();
    let reason = if status == 200 { "OK" } else { "Bad Request" };
    let _ = write!(
        conn,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
}

/// One control request; the answer's JSON or why it was refused.
fn control(
    path: &str,
    body: &Value,
    state: &Arc<Mutex<State>>,
    stop: &mpsc::Sender<Stop>,
) -> Result<Value, String> {
    let mut st = state.lock().map_err(|_| "fixture state poisoned")?;
    match path {
        "/scenario" => {
            let now = st.snapshots();
            let ids = st.ids();
            let link_now = st.link_counts();
            st.recorder.end(&ids, &now, link_now);
            if let Some(id) = body["id"].as_str() {
                st.recorder.current = Some((id.to_owned(), now, link_now, Vec::new()));
                st.follow_link_leader();
            }
            st.recorder.write(false)?;
            Ok(json!({"ok": true}))
        }
        "/fence" | "/partition" => {
            let i = st.target(body)?;
            let how = body["how"].as_str().unwrap_or("cut");
            let kind = &path[1..];
            match (kind, how) {
                (_, "cut") => st.cut(i),
                ("fence", "freeze") => {
                    // A `leader` shard passes on only to a follower its leader had recorded
                    // level with it (docs/replication.md, "Who may lead a `leader` shard");
                    // a frozen node's shards must be able to move, so its leader shards are
                    // let go quiet first (bounded; frozen anyway after that).
                    wait_quiet(st.cluster.nodes[i].ops);
                    st.cluster.signal(i, libc::SIGSTOP)?;
                    st.frozen[i] = true;
                }
                _ => return Err(format!("unknown \"how\": {how}")),
            }
            let (id, addr) = (st.cluster.nodes[i].id, st.cluster.nodes[i].client);
            let answer = json!({"node": id, "addr": addr.to_string()});
            let at_ms = st.recorder.at_ms();
            st.recorder
                .fault(json!({"kind": kind, "how": how, "node": id, "at_ms": at_ms}));
            Ok(answer)
        }
        "/heal" => {
            st.heal()?;
            // The next scenario starts on a whole cluster: every node ready again.
            for i in 0..st.cluster.nodes.len() {
                st.cluster.wait_ready(i, HEALED_LIMIT)?;
            }
            let at_ms = st.recorder.at_ms();
            st.recorder.fault(json!({"kind": "heal", "at_ms": at_ms}));
            Ok(json!({"ok": true}))
        }
        "/link" => {
            let fault = body["fault"].as_str().ok_or("name a \"fault\"")?.to_owned();
            let hold = Duration::from_millis(body["hold_ms"].as_u64().unwrap_or(0));
            if hold > MAX_HOLD {
                return Err(format!("hold_ms above {}", MAX_HOLD.as_millis()));
            }
            let rule = match fault.as_str() {
                "drop" => Rule::DropAll,
                "stall" => Rule::Hold,
                "reset" => Rule::UntilNewConnection,
                other => return Err(format!("unknown link fault {other}")),
            };
            st.link.set(Direction::Forward, rule);
            st.link.set(Direction::Backward, rule);
            st.link_generation += 1;
            let generation = st.link_generation;
            let at_ms = st.recorder.at_ms();
            st.recorder.fault(json!({"kind": "link", "fault": fault, "hold_ms": hold.as_millis() as u64, "at_ms": at_ms}));
            if rule != Rule::UntilNewConnection {
                // The fault ends by itself after hold_ms (a later fault or heal supersedes it).
                let state = Arc::clone(state);
                std::thread::spawn(move || {
                    std::thread::sleep(hold);
                    if let Ok(mut st) = state.lock() {
                        if st.link_generation == generation {
                            st.link.heal();
                            let at_ms = st.recorder.at_ms();
                            st.recorder
                                .fault(json!({"kind": "link_over", "at_ms": at_ms}));
                        }
                    }
                });
            }
            Ok(json!({"ok": true}))
        }
        "/leader" => {
            let stream = body["stream"].as_str().ok_or("name a \"stream\"")?;
            let i = st.leader(stream, body["shard"].as_u64().unwrap_or(0))?;
            let node = &st.cluster.nodes[i];
            Ok(json!({"node": node.id, "addr": node.client.to_string()}))
        }
        "/delete" => {
            // The operator's delete (DELETE /v1/streams/...), sent to the stream's leader.
            let stream = body["stream"].as_str().ok_or("name a \"stream\"")?;
            let i = st.leader(stream, 0)?;
            let path = format!("/v1/streams/{TENANT}/{NAMESPACE}/{stream}");
            let status = http_delete(st.cluster.nodes[i].ops, &path, &st.cluster.token)
                .ok_or("no answer to the delete")?;
            let at_ms = st.recorder.at_ms();
            st.recorder.fault(
                json!({"kind": "delete", "stream": stream, "status": status, "at_ms": at_ms}),
            );
            if status != 204 {
                return Err(format!("DELETE {path}: {status}"));
            }
            Ok(json!({"ok": true}))
        }
        "/stop" => {
            let _ = stop.send(Stop::Control);
            Ok(json!({"ok": true}))
        }
        other => Err(format!("no such control path {other}")),
    }
}

/// `DELETE path` with a bearer token: the status code.
fn http_delete(addr: SocketAddr, path: &str, token: &str) -> Option<u16> {
    let mut conn = TcpStream::connect_timeout(&addr, CONTROL_READ_TIMEOUT).ok()?;
    conn.set_read_timeout(Some(CONTROL_READ_TIMEOUT)).ok()?;
    write!(
        conn,
        "DELETE {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 64];
    let n = conn.read(&mut head).ok()?;
    let text = String::from_utf8_lossy(&head[..n]);
    text.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_evidence_counters_are_read_from_metrics_text() {
        let text = "# HELP felix_broker_requests requests run, by type\n\
                    felix_broker_requests_total{type=\"subscribe\"} 3\n\
                    felix_broker_requests_total{type=\"binary_publish\"} 12\n\
                    felix_broker_errors_total{code=\"not_leader\"} 1\n\
                    felix_broker_redirects_total 2\n\
                    felix_broker_deliveries_total 9\n";
        let s = parse_metrics(text);
        assert_eq!(s.received["subscribe"], 3);
        assert_eq!(s.received["binary_publish"], 12);
        assert_eq!(s.answered["not_leader"], 1);
        assert_eq!(s.answered["redirect"], 2);
        assert_eq!(s.received.len() + s.answered.len(), 4);
        let before = parse_metrics("felix_broker_requests_total{type=\"subscribe\"} 1\n");
        assert_eq!(
            diff(&s.received, &before.received),
            json!({"subscribe": 2, "binary_publish": 12})
        );
    }
}
