//! Three brokers on loopback as one cluster, in this process: the harness the cluster tests
//! and `examples/bench_cluster.rs` share. Shared JWKS (every node verifies the same tokens),
//! unauthenticated peer links (mTLS is covered by `felix cluster up`'s process test and the
//! interop suite), one declared stream and one declared cache.

use std::net::SocketAddr;
use std::path::PathBuf;

use felix_client::Offer;
use felix_proto::message::{self, Message, ShardKind};
use felix_runtime_tokio::felix_engine::{
    ClusterConfig, Consistency, DeclaredCache, DeclaredStream, PeerAddr,
};
use felix_runtime_tokio::{BrokerOptions, RunningBroker};

use crate::ops_support::get;
use crate::{client_config, start_broker, unique, within, Claims, TokenMinter, TENANT};

pub const NODES: [&str; 3] = ["n1", "n2", "n3"];

pub struct Node {
    pub id: &'static str,
    pub client: SocketAddr,
    pub internal: SocketAddr,
    pub ops: SocketAddr,
}

pub struct Cluster {
    pub nodes: Vec<Node>,
    pub brokers: Vec<Option<RunningBroker>>,
    jwks: Vec<u8>,
    token: String,
    /// The declared stream (a unique name per cluster).
    pub stream: String,
    /// Each node's storage directory, for a durable cluster.
    pub data_dirs: Option<Vec<PathBuf>>,
    /// The metadata log's compaction threshold on a durable cluster.
    pub metadata_log_compact_bytes: Option<u64>,
    /// The declared stream's replication factor and consistency (1 and leader by default).
    pub replication: (u8, Consistency),
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

impl Cluster {
    pub async fn start(shards: u32) -> Cluster {
        Cluster::start_with(shards, None, None).await
    }

    /// Every node durable, storing under its own directory of `dirs` (streams and the
    /// metadata log alike), compacting the metadata log past `compact_bytes` if given.
    pub async fn start_durable(
        shards: u32,
        dirs: Vec<PathBuf>,
        compact_bytes: Option<u64>,
    ) -> Cluster {
        Cluster::start_with(shards, Some(dirs), compact_bytes).await
    }

    /// A durable cluster whose stream is replicated on all three nodes.
    pub async fn start_replicated(
        shards: u32,
        dirs: Vec<PathBuf>,
        consistency: Consistency,
    ) -> Cluster {
        Cluster::start_full(shards, Some(dirs), None, (3, consistency)).await
    }

    async fn start_with(
        shards: u32,
        data_dirs: Option<Vec<PathBuf>>,
        metadata_log_compact_bytes: Option<u64>,
    ) -> Cluster {
        Cluster::start_full(
            shards,
            data_dirs,
            metadata_log_compact_bytes,
            (1, Consistency::Leader),
        )
        .await
    }

    async fn start_full(
        shards: u32,
        data_dirs: Option<Vec<PathBuf>>,
        metadata_log_compact_bytes: Option<u64>,
        replication: (u8, Consistency),
    ) -> Cluster {
        let minter = TokenMinter::new("k1", [7; 32]);
        let token = minter.mint(&Claims::new(
            TENANT,
            &[
                "stream.publish:stream:t1/*/*",
                "stream.subscribe:stream:t1/*/*",
                "cache.read:cache:t1/*/*",
                "cache.write:cache:t1/*/*",
            ],
        ));
        let nodes: Vec<Node> = NODES
            .iter()
            .map(|id| Node {
                id,
                client: loopback(kept_port()),
                internal: loopback(kept_port()),
                ops: loopback(kept_port()),
            })
            .collect();
        let mut c = Cluster {
            nodes,
            brokers: Vec::new(),
            jwks: minter.jwks(),
            token,
            stream: unique("orders"),
            data_dirs,
            metadata_log_compact_bytes,
            replication,
        };
        for i in 0..NODES.len() {
            let b = c.boot(i, shards).await;
            c.brokers.push(Some(b));
        }
        for i in 0..NODES.len() {
            c.wait_ready(i).await;
        }
        // Ready is joined; a test starts from a cluster whose every shard is led, as every
        // node sees it.
        for i in 0..NODES.len() {
            c.wait_led(i).await;
        }
        c
    }

    /// Waits until node `i` names a leader for every shard of the stream. Bounded.
    pub async fn wait_led(&self, i: usize) {
        within(30, async {
            loop {
                let changed = self.brokers[i]
                    .as_ref()
                    .expect("running")
                    .metadata_changed();
                if self.owners(i).await.iter().all(|o| o.node_id.is_some()) {
                    return;
                }
                let _ = changed.await;
            }
        })
        .await;
    }

    pub async fn boot(&self, i: usize, shards: u32) -> RunningBroker {
        let node = &self.nodes[i];
        let mut opts = BrokerOptions::new(node.client);
        opts.jwks = Some(self.jwks.clone());
        opts.internal_bind = Some(node.internal);
        opts.metrics_bind = Some(node.ops);
        opts.storage_dir = self.data_dirs.as_ref().map(|d| d[i].clone());
        let compact = self.metadata_log_compact_bytes;
        let peers: Vec<PeerAddr> = self
            .nodes
            .iter()
            .map(|n| PeerAddr {
                node_id: n.id.into(),
                addr: n.internal,
            })
            .collect();
        let (id, advertise, stream) = (node.id, node.client.to_string(), self.stream.clone());
        let (rf, consistency) = self.replication;
        let opts = opts.configure_engine(move |e| {
            let mut cluster = ClusterConfig::new(id, peers);
            cluster.client_advertise_addr = Some(advertise);
            if let Some(b) = compact {
                cluster.metadata_log_compact_bytes = b;
            }
            cluster
                .declared_caches
                .push(DeclaredCache::new(TENANT, "default", "sessions", 1));
            e.cluster = Some(cluster);
            let mut declared = DeclaredStream::new(TENANT, "default", &stream, shards);
            declared.replication_factor = rf;
            declared.consistency = consistency;
            e.declared_streams.push(declared);
        });
        within(10, start_broker(opts)).await.expect("node starts")
    }

    /// Waits for the node to say it has joined (the event `/readyz` reports). Bounded.
    pub async fn wait_ready(&self, i: usize) {
        let b = self.brokers[i].as_ref().expect("running");
        within(20, b.until_ready())
            .await
            .unwrap_or_else(|_| panic!("{} stopped before it was ready", NODES[i]));
        // The ops endpoint says the same.
        let ops = self.nodes[i].ops;
        let status = tokio::task::spawn_blocking(move || get(ops, "/readyz"))
            .await
            .unwrap()
            .map(|(s, _)| s);
        assert_eq!(status, Some(200), "{} /readyz", NODES[i]);
    }

    pub async fn client(&self, i: usize, offer: Offer) -> felix_client::Client {
        let b = self.brokers[i].as_ref().expect("running");
        let mut config = client_config(
            self.nodes[i].client,
            b.ca_cert_pem().as_bytes().to_vec(),
            &self.token,
        );
        config.offer = offer;
        within(15, felix_client::Client::connect(config))
            .await
            .expect("connects")
    }

    pub async fn ask(&self, i: usize, offer: Offer, ask: &Message) -> Message {
        let c = self.client(i, offer).await;
        let mut raw = c.open_raw_stream(true).await.unwrap();
        raw.send(ask.to_frame().to_bytes()).await.unwrap();
        let frame = within(10, raw.recv_frame())
            .await
            .unwrap()
            .expect("an answer");
        Message::decode(&frame.payload).unwrap()
    }

    pub async fn owners(&self, i: usize) -> Vec<message::ShardOwner> {
        let ask = Message::ShardOwners(message::ShardOwners {
            tenant_id: TENANT.into(),
            namespace: "default".into(),
            name: self.stream.clone(),
            kind: ShardKind::Stream,
            request_id: 1,
        });
        match self.ask(i, Offer::reference_client(), &ask).await {
            Message::ShardOwnersView(v) => v.owners,
            other => panic!("expected shard_owners_view, got {other:?}"),
        }
    }

    pub async fn topology(&self, i: usize) -> Vec<(String, String)> {
        let c = self.client(i, Offer::reference_client()).await;
        let view = c.topology().await.unwrap();
        c.close().await;
        view.brokers
            .into_iter()
            .map(|b| (b.node_id, b.addr))
            .collect()
    }

    pub fn expected_topology(&self, without: Option<usize>) -> Vec<(String, String)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != without)
            .map(|(_, n)| (n.id.to_owned(), n.client.to_string()))
            .collect()
    }

    pub async fn shutdown(mut self) {
        for b in self.brokers.iter_mut() {
            if let Some(b) = b.take() {
                within(15, b.shutdown()).await.expect("clean shutdown");
            }
        }
    }
}

/// A loopback port, free now for UDP and TCP, that a node keeps across its restarts.
///
/// Taken below the kernel's ephemeral range (32768 and up on Linux), so no `bind(0)` elsewhere
/// is handed it while the node is down between a stop and its restart: a just-freed
/// ephemeral port is the kernel's likely next pick, and another test took one that way.
/// Ports go round a window from a per-process start; one in use is skipped.
pub fn kept_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id() * 7919) % SPAN,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let port = (LOW + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN) as u16;
        let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
        let tcp = std::net::TcpListener::bind(("127.0.0.1", port));
        if udp.is_ok() && tcp.is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {LOW}..{}", LOW + SPAN);
}

pub fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
