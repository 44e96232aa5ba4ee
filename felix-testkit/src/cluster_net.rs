//! Several engines as one cluster in one process: each node a [`Net`] (its engine and its
//! own clients), the peer datagrams between them carried by hand, one virtual clock for all.
//! Links can be cut one way, to make a node silent towards another.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use felix_engine::{
    ClusterConfig, Consistency, Datagram, DeclaredCache, DeclaredStream, EngineConfig, PeerAddr,
};
use felix_proto::binary::{AckResult, PublishAck};

use felix_proto::Frame;
use quinn_proto::StreamId;

use crate::frames::real_client_auth;
use crate::net::Net;
use felix_storage::memfs::MemFs;

/// Rounds of stepping every node before a test is declared stuck.
const MAX_ROUNDS: usize = 100_000;
/// How much virtual time [`ClusterNet::settle`] gives a cluster to elect and place.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// What a test cluster is made of.
#[derive(Clone)]
pub struct ClusterSpec {
    /// Node ids, in order (`n1`, `n2`, `n3` by default).
    pub nodes: Vec<String>,
    /// Streams declared on every node.
    pub streams: Vec<DeclaredStream>,
    /// Caches declared on every node.
    pub caches: Vec<DeclaredCache>,
}

impl ClusterSpec {
    /// The default three nodes and one stream, `t1/default/orders`, of `shards` shards with
    /// three copies each at quorum consistency.
    pub fn quorum_orders(shards: u32) -> ClusterSpec {
        let mut s = ClusterSpec::default();
        let mut d = DeclaredStream::new("t1", "default", "orders", shards);
        d.replication_factor = 3;
        d.consistency = Consistency::Quorum;
        s.streams.push(d);
        s
    }
}

impl Default for ClusterSpec {
    fn default() -> ClusterSpec {
        ClusterSpec {
            nodes: ["n1", "n2", "n3"].map(String::from).to_vec(),
            streams: Vec::new(),
            caches: Vec::new(),
        }
    }
}

/// N engines configured as cluster nodes (peer links unauthenticated, clients at
/// `127.0.0.1:500i`, peers at `127.0.0.1:710i`, `i` from 1), the virtual clock, and the
/// one-way cuts in force.
pub struct ClusterNet {
    pub now: Instant,
    pub nodes: Vec<Net>,
    pub ids: Vec<String>,
    /// Each node's internal (peer) address.
    pub internal: Vec<SocketAddr>,
    /// `(from, to)` node indices whose peer datagrams are dropped.
    pub cut: BTreeSet<(usize, usize)>,
    /// Peer datagrams carried so far.
    pub peer_datagrams: u64,
    /// The largest peer datagram carried, and the most datagrams one peer transmit held
    /// (a GSO batch).
    pub peer_largest_datagram: usize,
    pub peer_most_segments: usize,
    /// Nodes stopped as by SIGSTOP ([`ClusterNet::freeze`]), each with the peer datagrams
    /// that reached it since, in arrival order.
    frozen: BTreeMap<usize, Vec<Datagram>>,
    /// How many times each node's process was replaced ([`ClusterNet::restart`]).
    restarts: Vec<u8>,
    /// The virtual instant the engines' Unix clocks started at [`START_UNIX_MICROS`].
    started: Instant,
}

/// When every engine's Unix clock starts (2026-01-01T00:00:00Z).
const START_UNIX_MICROS: u64 = 1_767_225_600_000_000;

fn client_addr(i: usize) -> SocketAddr {
    ([127, 0, 0, 1], 5001 + i as u16).into()
}

fn internal_addr(i: usize) -> SocketAddr {
    ([127, 0, 0, 1], 7101 + i as u16).into()
}

/// Node `i`'s cluster settings, in its process started after `restarts` others.
fn node_config(spec: &ClusterSpec, i: usize, restarts: u8, c: &mut EngineConfig) {
    let peers: Vec<PeerAddr> = spec
        .nodes
        .iter()
        .enumerate()
        .map(|(j, id)| PeerAddr {
            node_id: id.clone(),
            addr: internal_addr(j),
        })
        .collect();
    // Each node its own randomness (storage ids, election timeouts), each process anew.
    c.rng_seed = [i as u8 + 1; 32];
    c.rng_seed[1] ^= restarts;
    let mut cluster = ClusterConfig::new(spec.nodes[i].clone(), peers);
    cluster.client_advertise_addr = Some(client_addr(i).to_string());
    cluster.declared_caches = spec.caches.clone();
    c.cluster = Some(cluster);
    c.declared_streams = spec.streams.clone();
}

impl ClusterNet {
    /// A cluster as `spec` says, every engine tuned by `tweak(node index, config)` after the
    /// cluster settings are in. Not yet settled: see [`ClusterNet::settle`].
    pub fn new(spec: &ClusterSpec, tweak: impl Fn(usize, &mut EngineConfig)) -> ClusterNet {
        let now = Instant::now();
        let n = spec.nodes.len();
        let internal: Vec<SocketAddr> = (0..n).map(internal_addr).collect();
        let nodes = (0..n)
            .map(|i| {
                Net::on_clock(now, START_UNIX_MICROS, client_addr(i), |c| {
                    node_config(spec, i, 0, c);
                    tweak(i, c);
                })
            })
            .collect();
        ClusterNet {
            now,
            nodes,
            ids: spec.nodes.clone(),
            internal,
            cut: BTreeSet::new(),
            peer_datagrams: 0,
            peer_largest_datagram: 0,
            peer_most_segments: 0,
            frozen: BTreeMap::new(),
            restarts: vec![0; n],
            started: now,
        }
    }

    /// Node `i`'s process is replaced, as after a crash (`kill -9`: what it wrote is kept):
    /// a new engine with new randomness, so a new incarnation, on the same disk, recovered
    /// before it returns. Its clients are gone. `spec` and `tweak` as the cluster was made.
    pub fn restart(
        &mut self,
        i: usize,
        spec: &ClusterSpec,
        tweak: impl Fn(usize, &mut EngineConfig),
    ) {
        self.restarts[i] = self.restarts[i].wrapping_add(1);
        let restarts = self.restarts[i];
        let disk = std::mem::take(&mut self.nodes[i].disk);
        // The same wall clock as the others.
        let unix = START_UNIX_MICROS + (self.now - self.started).as_micros() as u64;
        let mut net = Net::on_clock(self.now, unix, client_addr(i), |c| {
            node_config(spec, i, restarts, c);
            tweak(i, c);
        });
        net.disk = disk;
        self.nodes[i] = net;
        self.run();
        assert!(
            self.nodes[i].engine.is_ready(),
            "node {i} did not recover: {:?}",
            self.nodes[i].engine.storage_error()
        );
    }

    /// Node `i`'s process is replaced on an empty disk, as after losing its drive: a new
    /// storage identity, no metadata log, no shard logs. `spec` and `tweak` as the cluster
    /// was made.
    pub fn restart_wiped(
        &mut self,
        i: usize,
        spec: &ClusterSpec,
        tweak: impl Fn(usize, &mut EngineConfig),
    ) {
        self.nodes[i].disk = Default::default();
        self.restart(i, spec, tweak);
    }

    /// A cluster that has elected, joined every node and led every declared shard.
    pub fn started(spec: &ClusterSpec, tweak: impl Fn(usize, &mut EngineConfig)) -> ClusterNet {
        let mut net = ClusterNet::new(spec, tweak);
        let shards: u64 = spec
            .streams
            .iter()
            .map(|s| u64::from(s.shards))
            .sum::<u64>()
            + spec.caches.iter().map(|c| u64::from(c.shards)).sum::<u64>();
        net.settle(|net| {
            net.nodes.iter().all(|n| n.engine.is_serving())
                && net
                    .nodes
                    .iter()
                    .map(|n| n.engine.metrics().cluster_shards_led)
                    .sum::<u64>()
                    == shards
        });
        net
    }

    /// Lets virtual time pass in small steps until `done` holds; panics if it does not
    /// within [`SETTLE_LIMIT`].
    pub fn settle(&mut self, done: impl Fn(&ClusterNet) -> bool) {
        let start = self.now;
        self.run();
        while !done(self) {
            assert!(
                self.now - start < SETTLE_LIMIT,
                "the cluster did not settle within {SETTLE_LIMIT:?}"
            );
            self.advance(Duration::from_millis(10));
        }
    }

    /// The node with this id.
    pub fn index(&self, id: &str) -> usize {
        self.ids.iter().position(|n| n == id).expect("a node id")
    }

    /// Connects a client to node `i` and completes the handshake.
    pub fn connect(&mut self, i: usize) -> usize {
        let p = self.nodes[i].start_connect(&[]);
        self.run();
        assert!(
            self.nodes[i].peers[p].connected,
            "handshake did not complete: {:?}",
            self.nodes[i].peers[p].lost
        );
        p
    }

    /// Sends `bytes` on a client stream of node `i`, settles the whole cluster, and returns
    /// what came back on that stream.
    pub fn exchange(&mut self, i: usize, p: usize, id: StreamId, bytes: &[u8]) -> Vec<Frame> {
        self.nodes[i].send(p, id, bytes);
        self.run();
        self.nodes[i].read_frames(p, id)
    }

    /// Opens a stream to node `i` authenticated with `auth` (a whole frame); returns it and
    /// the answer.
    pub fn auth_with(&mut self, i: usize, p: usize, auth: &[u8]) -> (StreamId, Frame) {
        let id = self.nodes[i].open_bi(p);
        let mut frames = self.exchange(i, p, id, auth);
        assert_eq!(frames.len(), 1, "one answer to auth");
        (id, frames.remove(0))
    }

    /// Opens a stream to node `i` authenticated with the real client's offer.
    pub fn auth_stream(&mut self, i: usize, p: usize) -> (StreamId, Frame) {
        let auth = real_client_auth("t1", &self.nodes[i].token());
        self.auth_with(i, p, &auth)
    }

    /// Steps every node once and carries their peer datagrams. True if anything moved.
    pub fn step(&mut self) -> bool {
        let mut moved = false;
        for (i, net) in self.nodes.iter_mut().enumerate() {
            if self.frozen.contains_key(&i) {
                continue;
            }
            net.now = self.now;
            moved |= net.step();
        }
        for from in 0..self.nodes.len() {
            for (t, bytes) in std::mem::take(&mut self.nodes[from].peer_out) {
                moved = true;
                let Some(to) = self.internal.iter().position(|a| *a == t.destination) else {
                    continue;
                };
                if self.cut.contains(&(from, to)) {
                    continue;
                }
                self.peer_datagrams += 1;
                let segment = t.segment_size.unwrap_or(bytes.len()).max(1);
                self.peer_largest_datagram = self.peer_largest_datagram.max(segment);
                self.peer_most_segments =
                    self.peer_most_segments.max(bytes.len().div_ceil(segment));
                let datagram = Datagram {
                    remote: self.internal[from],
                    local_ip: None,
                    ecn: None,
                    data: BytesMut::from(&bytes[..]),
                    segment_size: t.segment_size,
                };
                if let Some(backlog) = self.frozen.get_mut(&to) {
                    backlog.push(datagram);
                    continue;
                }
                self.nodes[to]
                    .engine
                    .handle_peer_datagram(self.now, datagram);
            }
        }
        moved
    }

    /// Moves datagrams (client and peer) until nothing moves; no time passes.
    pub fn run(&mut self) {
        for _ in 0..MAX_ROUNDS {
            if !self.step() {
                return;
            }
        }
        panic!("the cluster did not settle in {MAX_ROUNDS} rounds");
    }

    /// Lets `d` pass, firing every timer of every node and client at its instant.
    pub fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        self.run();
        for _ in 0..MAX_ROUNDS {
            let frozen = &self.frozen;
            let next = self
                .nodes
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| !frozen.contains_key(i))
                .filter_map(|(_, n)| n.next_timer())
                .min()
                .filter(|t| *t <= end);
            let Some(at) = next else { break };
            self.now = self.now.max(at);
            self.fire_timers();
            self.run();
        }
        self.now = end;
        self.fire_timers();
        self.run();
    }

    fn fire_timers(&mut self) {
        for (i, net) in self.nodes.iter_mut().enumerate() {
            if self.frozen.contains_key(&i) {
                continue;
            }
            net.now = self.now;
            net.fire_timers();
        }
    }

    /// Stops node `i` as SIGSTOP would: it runs nothing and fires no timer, and the peer
    /// datagrams that reach it wait, in order, for [`ClusterNet::thaw`]. Its clients share
    /// its `Net` and pause with it.
    pub fn freeze(&mut self, i: usize) {
        self.frozen.entry(i).or_default();
    }

    /// Resumes node `i`: what reached it while stopped is handled first, at the present
    /// instant, and its overdue timers fire after (on the next [`ClusterNet::advance`]), as a
    /// resumed process reads its sockets before its clock.
    pub fn thaw(&mut self, i: usize) {
        let Some(backlog) = self.frozen.remove(&i) else {
            return;
        };
        self.nodes[i].now = self.now;
        for datagram in backlog {
            self.nodes[i]
                .engine
                .handle_peer_datagram(self.now, datagram);
        }
        self.run();
    }

    /// Node `at` may accept a write on `shard` now, by its own lease.
    pub fn writable(&self, at: usize, shard: u32) -> bool {
        let view = self.nodes[at]
            .engine
            .cluster_view()
            .expect("a cluster node");
        view.replicas()
            .iter()
            .any(|r| r.shard == shard && r.writable_until.is_some_and(|until| self.now < until))
    }

    /// The control plane's leader, as node 0 sees it.
    pub fn control_leader(&self) -> usize {
        let view = self.nodes[0].engine.cluster_view().expect("a cluster node");
        self.index(view.raft_leader().expect("an elected control plane"))
    }

    /// The leader (if any) and generation of `shard` of `t1/default/orders`, as node `at`
    /// sees them.
    pub fn orders_leader(&self, at: usize, shard: u32) -> (Option<usize>, u64) {
        let view = self.nodes[at]
            .engine
            .cluster_view()
            .expect("a cluster node");
        let s = view
            .shard_leaders()
            .into_iter()
            .find(|s| s.object == "stream:t1/default/orders" && s.shard == shard)
            .expect("the shard is placed");
        (s.leader.map(|l| self.index(&l)), s.generation)
    }

    /// A shard of `t1/default/orders` (`shards` wide) led off the control plane's node, once
    /// its leader may write: (the control plane's leader, the shard, its leader, its
    /// generation). Stopping or cutting that leader leaves the control plane its leader.
    /// Leaders are balanced, one shard each, so there is one.
    pub fn shard_led_off_control(&mut self, shards: u32) -> (usize, u32, usize, u64) {
        let control = self.control_leader();
        let shard = (0..shards)
            .find(|&s| {
                self.orders_leader(control, s)
                    .0
                    .is_some_and(|l| l != control)
            })
            .expect("leaders are balanced: some shard is led off the control plane's node");
        let (leader, generation) = self.orders_leader(control, shard);
        let leader = leader.expect("led");
        self.until(Duration::from_secs(10), |c| c.writable(leader, shard));
        (control, shard, leader, generation)
    }

    /// Drops (`on`) or carries again every peer datagram between nodes `a` and `b`, both ways.
    pub fn cut_both(&mut self, a: usize, b: usize, on: bool) {
        for pair in [(a, b), (b, a)] {
            if on {
                self.cut.insert(pair);
            } else {
                self.cut.remove(&pair);
            }
        }
    }

    /// Sends one request frame to node `at` on a new connection and waits (virtual time, at
    /// most 20 s) for its first answer.
    pub fn request(&mut self, at: usize, frame: &[u8]) -> Frame {
        let p = self.connect(at);
        let (id, _) = self.auth_stream(at, p);
        let mut answer = self.exchange(at, p, id, frame);
        let start = self.now;
        while answer.is_empty() {
            assert!(
                self.now - start < Duration::from_secs(20),
                "a request to node {at} never answered"
            );
            self.advance(Duration::from_millis(10));
            answer = self.nodes[at].read_frames(p, id);
        }
        answer.remove(0)
    }

    /// Publishes `payload` to `shard` of `t1/default/orders` (`shards` shards) through node
    /// `at` on a new connection, and waits (virtual time, at most 20 s) for its ack: the
    /// offset it was written at. Panics on a refusal.
    pub fn publish_acked(
        &mut self,
        at: usize,
        (shards, shard): (u32, u32),
        request_id: u64,
        payload: &[u8],
    ) -> u64 {
        let key = key_for_shard(shards, shard);
        let frame = crate::binary_publish(Some(request_id), Some(&key), "orders", &[payload]);
        let answer = self.request(at, &frame);
        let a = PublishAck::decode(answer.flags, &answer.payload).expect("a binary ack");
        match a.result {
            AckResult::Ok { offset, .. } => offset.expect("an offset"),
            other => panic!("publish {request_id} refused: {other:?}"),
        }
    }

    /// Runs until `done` holds, letting time pass in 1 ms steps, for at most `limit`.
    /// Returns the virtual time it took.
    pub fn until(&mut self, limit: Duration, done: impl Fn(&mut ClusterNet) -> bool) -> Duration {
        let start = self.now;
        self.run();
        while !done(self) {
            assert!(self.now - start < limit, "not reached within {limit:?}");
            self.advance(Duration::from_millis(1));
        }
        self.now - start
    }
}

/// A routing key that lands on `shard` of a stream of `shards` shards (modulo routing).
pub fn key_for_shard(shards: u32, shard: u32) -> Vec<u8> {
    use felix_proto::routing::{shard_for_key, RoutingMapping};
    (0..1000)
        .map(|i| format!("key-{i}").into_bytes())
        .find(|k| shard_for_key(Some(k), shards, RoutingMapping::Modulo) == shard)
        .expect("some key lands on the shard")
}

/// The entries of `stream`'s `shard` log (tenant `t1`, namespace `default`) on `disk`, as
/// (first offset, bytes), in offset order: the bytes a leader ships.
pub fn shard_log_on(disk: &MemFs, stream: &str, shard: u32) -> Vec<(u64, Vec<u8>)> {
    let dir = felix_storage::layout::stream_shard_dir("t1", "default", stream, shard);
    log_entries_on(disk, &dir)
}

/// The entries of the log in directory `dir` on `disk`, as (first offset, bytes), in offset
/// order, read with the storage's own entry scanner.
pub fn log_entries_on(disk: &MemFs, dir: &str) -> Vec<(u64, Vec<u8>)> {
    use felix_storage::record::{self, Step, SEGMENT_HEADER_LEN};
    let mut out = Vec::new();
    for name in disk.list(dir).into_iter().filter(|n| n.ends_with(".seg")) {
        let Some(bytes) = disk.file(&format!("{dir}/{name}")) else {
            continue;
        };
        let mut at = SEGMENT_HEADER_LEN as usize;
        while at < bytes.len() {
            let Step::Entry(meta) = record::step(&bytes[at..]) else {
                break;
            };
            let len = meta.len as usize;
            out.push((meta.base, bytes[at..at + len].to_vec()));
            at += len;
        }
    }
    out.sort_by_key(|e| e.0);
    out
}
