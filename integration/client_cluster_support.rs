//! The harness the cluster client's tests against real processes share
//! (`tests/client_cluster.rs`, `tests/client_cluster_moves.rs`): felix-chaos's cluster of
//! three `felix-broker` processes with one declared quorum stream and one cache replicated on
//! every node, a cluster client of it, and the runtime each scenario runs on (tokio or smol).

use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use felix_chaos::cluster::{
    http_get, Cluster, Layout, StreamDecl, LEASE, NAMESPACE, NODES, READY_LIMIT, TENANT,
};
use felix_client::{ClientConfig, RetryPolicy, Runtime};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a scenario needs of its runtime: a timer.
pub trait Rt: Sync {
    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()>;
}

pub struct TokioRt;
impl Rt for TokioRt {
    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(d))
    }
}

pub struct SmolRt;
impl Rt for SmolRt {
    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            smol::Timer::after(d).await;
        })
    }
}

/// Runs `scenario` to its end on tokio (two worker threads), its client on tokio too.
pub fn on_tokio<F: Future<Output = ()>>(scenario: impl FnOnce(&'static dyn Rt, Runtime) -> F) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(scenario(&TokioRt, Runtime::Tokio));
}

/// Runs `scenario` to its end on smol, its client on smol too.
pub fn on_smol<F: Future<Output = ()>>(scenario: impl FnOnce(&'static dyn Rt, Runtime) -> F) {
    smol::block_on(scenario(&SmolRt, Runtime::Smol));
}

/// `fut`, or `None` once `d` has passed.
pub async fn within<T>(rt: &dyn Rt, d: Duration, fut: impl Future<Output = T>) -> Option<T> {
    let mut fut = std::pin::pin!(fut);
    let mut timer = rt.sleep(d);
    poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        timer.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// The sum of every sample of the metric `name` on the ops endpoint `ops`; `None` when it
/// does not answer.
pub fn metric(ops: SocketAddr, name: &str) -> Option<f64> {
    let (_, text) = http_get(ops, "/metrics", true)?;
    Some(
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum(),
    )
}

/// What [`started`] lays out beside its defaults (durable, fsync on commit, chaos's lease).
pub struct Spec {
    /// The declared quorum stream, replicated on every node.
    pub stream: &'static str,
    pub shards: u32,
    /// The cache declared on every node: one shard, replicated on every node.
    pub cache: &'static str,
    /// Every peer link through a relay of its own, so a node can be cut off.
    pub relays: bool,
    /// The run directory's name starts with it.
    pub prefix: &'static str,
}

/// The cluster of `spec`, every node started and ready.
pub fn started(spec: &Spec) -> Cluster {
    let layout = Layout {
        cluster: true,
        streams: vec![StreamDecl {
            name: spec.stream,
            shards: spec.shards,
            replication_factor: 3,
            consistency: "quorum",
        }],
        fsync_mode: "on_commit".into(),
        lease: LEASE,
        relays: spec.relays,
        prefix: spec.prefix,
    };
    let mut cluster =
        Cluster::lay_out_with(&crate::broker_binary(), &layout).expect("lay out the cluster");
    // The cache, declared on every node (the layout declares streams only).
    for node in &cluster.nodes {
        let path = cluster.dir.join(format!("{}.toml", node.id));
        let mut text = std::fs::read_to_string(&path).expect("a node's config");
        text.push_str(&format!(
            "\n[[caches]]\ntenant = \"{TENANT}\"\nnamespace = \"{NAMESPACE}\"\ncache = \"{}\"\n\
             shards = 1\nreplication_factor = 3\n",
            spec.cache
        ));
        std::fs::write(&path, text).expect("write a node's config");
    }
    for i in 0..NODES.len() {
        cluster.start(i).expect("start a node");
    }
    for i in 0..NODES.len() {
        cluster.wait_ready(i, READY_LIMIT).expect("a node ready");
    }
    cluster
}

/// A cluster client seeded with `seeds`, on `runtime`, with a 5 s request bound; a
/// leadership change is ridden through (retries bounded by a 30 s deadline, not a small
/// attempt count), its backoff's jitter from `jitter_seed`.
pub fn client_config(
    cluster: &Cluster,
    seeds: Vec<SocketAddr>,
    runtime: Runtime,
    jitter_seed: u64,
) -> ClientConfig {
    let mut config = ClientConfig::with_seeds(
        seeds,
        cluster.ca_pem.as_bytes().to_vec(),
        TENANT,
        &cluster.token,
    );
    config.runtime = runtime;
    config.request_timeout = Duration::from_secs(5);
    config.jitter_seed = jitter_seed;
    config.retry = RetryPolicy {
        max_attempts: 1_000,
        deadline: Some(Duration::from_secs(30)),
        ..RetryPolicy::default()
    };
    config
}
