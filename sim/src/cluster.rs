//! A cluster run: N real [`Engine`]s (3, or 5, from the seed), each a cluster node with its
//! own disk, its own clock (an offset and a drift), a client listener and a peer listener,
//! all on the seeded network. The clients (`client.rs`, in their cluster mode) are seeded
//! with different nodes, publish acked to a multi-shard declared stream, use the cache and
//! subscribe, each call where felix-client's cluster core routes it (by `shard_owners`, or
//! for half the clients always through their entry node, which forwards), following
//! `not_leader` as the core's redirects say. Faults: peer and client links cut one way, a node isolated, links healed, a
//! node crashed (its memory gone, its disk as the crash model leaves it) and restarted.
//! Most seeds declare the stream with three replicas at `quorum` consistency: leaders fail
//! over, a frozen node (SIGSTOP) resumes past its lease, a follower rejoins and is cut.
//! Invariants: the single-node ones the workload touches, and `meta_agreement`,
//! `one_leader_per_generation`, `forwarded_acks`, `redirects_end`, and for replicated shards
//! `one_writer_per_generation`, `leases_disjoint`, `committed_prefix`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use felix_engine::{
    AuthConfig, ClusterConfig, Consistency, Datagram, DeclaredCache, DeclaredStream, DurableConfig,
    Engine, EngineConfig, FileOp, FileOpKind, FsyncPolicy, OpId, Output, PeerAddr,
    ReplicationCanary,
};

use crate::client::{Ctx, Role, Setup, SimClient, CACHE, NAMESPACE, STREAM, TENANT};
use felix_client::core::cluster::Routing;

/// The cluster workload's cache: its keys hash over this many shards (each led by one node).
const CACHE_SHARDS: u32 = 3;
use crate::clock::VirtualClock;
use crate::disk::{CrashKind, MemFs};
use crate::invariants::committed_prefix;
use crate::invariants::forwarded_acks::{self, ReadBack};
use crate::invariants::leases_disjoint::{self, LeasesDisjoint};
use crate::invariants::meta_agreement::{self, EndState, MetaAgreement};
use crate::invariants::no_acked_loss;
use crate::invariants::object_specs::ObjectSpecs;
use crate::invariants::one_writer::OneWriter;
use crate::invariants::requests_answered;
use crate::invariants::shard_leaders::ShardLeaders;
use crate::net::{NetConfig, Network, Node};
use crate::oracle::{Oracle, Promise, Violation};
use crate::queue::EventQueue;
use crate::rng::SimRng;
use crate::trace::{short_hash, Trace};
use crate::{Canary, Outcome, RunOptions};

mod admin;
mod lost_drives;

const START_UNIX_MICROS: u64 = 1_767_225_600_000_000;
const FAULT_PHASE: Duration = Duration::from_secs(10);
const QUIET_PHASE: Duration = Duration::from_secs(25);
/// Above the forward timeout (10 s) plus a client's idle timeout.
const ANSWER_GRACE: Duration = Duration::from_secs(20);
const EXTENSION: Duration = Duration::from_secs(5);
const MAX_EXTENSIONS: u32 = 8;
const MAX_STEPS: u64 = 8_000_000;
const PPM: i128 = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `on_commit`; nodes lose power.
    OnCommitPowerLoss,
    /// `periodic`, acks after the write; node processes die (the page cache survives).
    PeriodicProcessCrash,
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Nothing from `.0` reaches `.1` until healed.
    Cut(Node, Node),
    Isolate(usize),
    HealNode(usize),
    LossBurst(Duration, f64),
    Crash(usize, CrashKind),
    Restart(usize),
    /// The node's process is stopped (SIGSTOP): it handles nothing, its datagrams and disk
    /// completions wait, until `Thaw`.
    Freeze(usize),
    Thaw(usize),
    /// Canaries: the node leading the most replicated shards is frozen for this long.
    FreezeLeader(Duration),
    /// Canaries: the node leading the most replicated shards crashes (process).
    CrashLeader,
    /// Canary (`AckBeforeDurable`): the links between the busiest leader and one follower
    /// are cut both ways, so that follower falls behind and the other one alone makes the
    /// quorum; a second later that one loses power (see `PowerLossUnsynced`), and the leader
    /// crashes as soon as it is back, staying down long enough for a new leader to be named.
    StrandLeader,
    /// Canary (`AckBeforeDurable`): `node` loses power at the first moment it has a write
    /// not yet durable (checked every millisecond, `tries` more times); `leader` crashes
    /// when it restarts.
    PowerLossUnsynced {
        node: usize,
        leader: usize,
        tries: u32,
    },
    /// Canary (`AbandonOnSilence`): the busiest leader's links to every other node are cut
    /// both ways, so it acknowledges `leader` writes its followers never receive for what
    /// is left of its lease; half a lease later it crashes (`CrashStranded`).
    StrandLeaderAlone,
    /// Canary (`AbandonOnSilence`): the stranded leader's links are healed and it crashes,
    /// staying down long enough for the control plane to decide who leads its shards.
    CrashStranded(usize),
    /// Canary (`WipeLeaderDisk`): the busiest forwarded-to leader dies and comes back on an
    /// empty disk.
    WipeLeader,
    /// `--admin-ops`: one admin call on a node that is up (`admin.rs`).
    Admin,
    EndOfFaults,
    StartAudit,
}

enum Ev {
    ToNode {
        node: usize,
        peer: bool,
        from: SocketAddr,
        data: Bytes,
    },
    ToClient {
        client: usize,
        from: SocketAddr,
        data: Bytes,
    },
    FileDone {
        node: usize,
        generation: u64,
        op: FileOp,
    },
    Fault(Fault),
}

struct Running {
    engine: Engine,
    generation: u64,
    ready: bool,
}

struct SimNode {
    id: String,
    client_addr: SocketAddr,
    peer_addr: SocketAddr,
    /// The node's clock: `offset` ahead of true time, running `drift_ppm` fast (or slow).
    offset: Duration,
    drift_ppm: i64,
    disk: MemFs,
    in_flight: BTreeMap<OpId, FileOp>,
    running: Option<Running>,
    generations: u64,
    last_applied: Option<u64>,
    /// Restarted blank: catching up until its applied index reaches this.
    catching_up_to: Option<u64>,
    /// Stopped (SIGSTOP): what reached it meanwhile, in order, handled on `Thaw`.
    frozen: Option<Vec<Ev>>,
    /// Canary (`AckBeforeDurable`): crash this node when the given node restarts.
    crash_when_restarted: Option<usize>,
    /// Canary (`AckBeforeDurable`): a restart due before this instant waits for it.
    down_until: Option<Instant>,
}

pub(crate) struct ClusterWorld {
    seed: u64,
    mode: Mode,
    canary: Option<Canary>,
    clock: VirtualClock,
    queue: EventQueue<Ev>,
    trace: Trace,
    net: Network,
    nodes: Vec<SimNode>,
    config: EngineConfig,
    shards: u32,
    disk_rng: SimRng,
    disk_slowness: u32,
    crash_rng: SimRng,
    clients: Vec<SimClient>,
    by_addr: BTreeMap<SocketAddr, usize>,
    oracle: Oracle,
    token: String,
    crypto: Arc<quinn_proto::crypto::rustls::QuicClientConfig>,
    client_rng: SimRng,
    /// Each stream shard's leader (client address), from the freshest metadata seen.
    leaders: BTreeMap<u32, SocketAddr>,
    leaders_from: u64,
    agreement: MetaAgreement,
    shard_leaders: ShardLeaders,
    quiet: bool,
    workers: usize,
    steps: u64,
    crashes: u64,
    /// Canary (`MetadataDivergence`): the index at which node 1's digest is altered.
    diverge_at: Option<u64>,
    /// The single-node canaries' switches `Ctx` lends out: always off here.
    unused_flags: (bool, bool),
    /// Let crashes take down (or leave blank) a majority at once. Off by default: the
    /// metadata log is in memory in this version, so a blank majority re-founds the
    /// cluster and forgets committed metadata (a known engine bug, docs/simulator.md).
    majority_crashes: bool,
    /// `--wipe-disks`: every other drawn crash replaces the node's disk, unless that would
    /// leave some shard more than a minority of its copies lost (`lost_drives`).
    wipe_disks: bool,
    crashes_skipped: u64,
    /// Drawn wipes turned into plain crashes by `lost_drives`.
    wipes_skipped: u64,
    /// The stream's replicas and consistency, from the seed.
    replication: (u8, Consistency),
    one_writer: OneWriter,
    leases: LeasesDisjoint,
    prefix_entries_checked: u64,
    freezes: u64,
    /// `--admin-ops`: the operator's calls, drawn from their own stream.
    admin_ops: bool,
    admin_rng: SimRng,
    specs: ObjectSpecs,
}

impl ClusterWorld {
    pub(crate) fn new(opts: &RunOptions) -> ClusterWorld {
        let root = SimRng::new(opts.seed);
        let mut plan = root.fork("cluster plan");
        let n = *plan.pick(&[3usize, 3, 3, 5]);
        // The replication canaries' fault plans name followers: every node holds a copy.
        let n = if replication_canary(opts.canary).is_some() {
            3
        } else {
            n
        };
        let shards = plan.range(2..7) as u32;
        let mode = *plan.pick(&[Mode::OnCommitPowerLoss, Mode::PeriodicProcessCrash]);
        // A follower's report ahead of its sync shows only when power is lost.
        let mode = if opts.canary == Some(Canary::AckBeforeDurable) {
            Mode::OnCommitPowerLoss
        } else {
            mode
        };
        let mut tls_rng = root.fork("tls");
        let provider = crate::crypto::seeded_provider(tls_rng.fork("provider"));
        let identity = felix_testkit::ed25519_identity(tls_rng.seed32());
        let mut config =
            EngineConfig::new(identity, AuthConfig::Dev { seed: [7; 32] }, plan.seed32());
        config.crypto_provider = Some(provider.clone());
        let mut declared = DeclaredStream::new(TENANT, NAMESPACE, STREAM, shards);
        // `--replicated`: three copies, quorum acks; otherwise one copy per shard, which
        // waits for its node. The wiped-disk canary needs lone copies to lose.
        let replicated = match opts.canary {
            Some(Canary::WipeLeaderDisk) => false,
            Some(
                Canary::PromoteBehind
                | Canary::ServePastLease
                | Canary::AckBeforeDurable
                | Canary::AbandonOnSilence,
            ) => true,
            _ => opts.replicated,
        };
        if replicated {
            declared.replication_factor = 3;
            declared.consistency =
                if opts.leader_consistency || opts.canary == Some(Canary::AbandonOnSilence) {
                    Consistency::Leader
                } else {
                    Consistency::Quorum
                };
        }
        let replication = (declared.replication_factor, declared.consistency);
        config.declared_streams = vec![declared];
        config.subscriber_queue_capacity = *plan.pick(&[8, 64, 512]);
        config.quic_idle_timeout = Duration::from_secs(10);
        let mut durable = DurableConfig::default();
        durable.fsync = match mode {
            Mode::OnCommitPowerLoss => FsyncPolicy::OnCommit,
            Mode::PeriodicProcessCrash => {
                FsyncPolicy::Periodic(Duration::from_millis(plan.range(20..500)))
            }
        };
        durable.segment_max_bytes = *plan.pick(&[2048, 64 << 20]);
        config.durable = Some(durable);
        let nodes = (0..n)
            .map(|i| SimNode {
                id: format!("n{}", i + 1),
                client_addr: SocketAddr::from(([10, 0, 0, i as u8 + 1], 5000)),
                peer_addr: SocketAddr::from(([10, 0, 1, i as u8 + 1], 6000)),
                offset: plan.duration(Duration::ZERO, Duration::from_secs(5)),
                drift_ppm: plan.range(0..401) as i64 - 200,
                disk: MemFs::new(),
                in_flight: BTreeMap::new(),
                running: None,
                generations: 0,
                last_applied: None,
                catching_up_to: None,
                frozen: None,
                crash_when_restarted: None,
                down_until: None,
            })
            .collect();
        let mut net_rng = root.fork("net");
        let net = Network::new(NetConfig::draw(&mut net_rng), net_rng.fork("route"));
        let workers = plan.range(3..8) as usize;
        let mut world = ClusterWorld {
            seed: opts.seed,
            mode,
            canary: opts.canary,
            clock: VirtualClock::new(),
            queue: EventQueue::new(),
            trace: Trace::new(opts.verbose),
            net,
            nodes,
            config,
            shards,
            disk_rng: root.fork("disk"),
            disk_slowness: *plan.pick(&[1, 1, 4]),
            crash_rng: root.fork("crash"),
            clients: Vec::new(),
            by_addr: BTreeMap::new(),
            oracle: Oracle {
                cache_values_may_be_lost: opts.wipe_disks,
                ..Oracle::new(Promise::Durable, shards)
            },
            token: String::new(),
            crypto: crate::crypto::client_crypto(provider),
            client_rng: root.fork("clients"),
            leaders: BTreeMap::new(),
            leaders_from: 0,
            agreement: MetaAgreement::default(),
            shard_leaders: ShardLeaders::default(),
            quiet: false,
            workers,
            steps: 0,
            crashes: 0,
            diverge_at: None,
            unused_flags: (false, false),
            majority_crashes: opts.majority_crashes,
            wipe_disks: opts.wipe_disks,
            crashes_skipped: 0,
            wipes_skipped: 0,
            replication,
            one_writer: OneWriter::default(),
            leases: LeasesDisjoint::default(),
            prefix_entries_checked: 0,
            freezes: 0,
            admin_ops: opts.admin_ops || opts.canary == Some(Canary::SpecDivergence),
            admin_rng: root.fork("admin"),
            specs: ObjectSpecs::default(),
        };
        let clocks: Vec<String> = world
            .nodes
            .iter()
            .map(|s| format!("{}+{}ms@{}ppm", s.id, s.offset.as_millis(), s.drift_ppm))
            .collect();
        let header = format!(
            "seed {} cluster {n} nodes mode {mode:?} shards {shards} replicas {} {:?} workers {workers} clocks {clocks:?} net {:?}",
            opts.seed, replication.0, replication.1, world.net.config
        );
        world.log(format_args!("{header}"));
        world.schedule_faults(&mut plan);
        if world.admin_ops {
            // Its own fork: a seed's other draws stay what runs without it made.
            let mut admin_plan = root.fork("admin plan");
            world.schedule_admin(&mut admin_plan);
        }
        world
    }

    fn log(&mut self, what: std::fmt::Arguments<'_>) {
        self.trace.event(self.clock.elapsed(), what);
    }

    fn schedule_faults(&mut self, plan: &mut SimRng) {
        let n = self.nodes.len() as u64;
        let at = |plan: &mut SimRng| plan.duration(Duration::from_millis(800), FAULT_PHASE);
        let count = plan.range(0..8);
        // The ack-before-durable canary needs its own faults alone: one more (a freeze, a
        // cut) on the follower it aims at keeps that follower from holding what it reported.
        let alone = [Canary::AckBeforeDurable, Canary::AbandonOnSilence];
        let count = if self.canary.is_some_and(|c| alone.contains(&c)) {
            0
        } else {
            count
        };
        for _ in 0..count {
            let t = at(plan);
            let heal = (t + plan.duration(Duration::from_millis(200), Duration::from_secs(6)))
                .min(FAULT_PHASE);
            let a = plan.below(n) as usize;
            let fault = match plan.below(7) {
                0 => {
                    let b = (a + 1 + plan.below(n - 1) as usize) % n as usize;
                    self.push_fault(heal, Fault::HealNode(a));
                    Fault::Cut(Node::Server(a), Node::Server(b))
                }
                1 => {
                    self.push_fault(heal, Fault::HealNode(a));
                    Fault::Isolate(a)
                }
                2 => {
                    let c = plan.below(self.workers as u64) as usize;
                    self.push_fault(heal, Fault::HealNode(a));
                    if plan.chance(0.5) {
                        Fault::Cut(Node::Client(c), Node::Server(a))
                    } else {
                        Fault::Cut(Node::Server(a), Node::Client(c))
                    }
                }
                5 => {
                    // Stopped past two leases, so that its shards move on meanwhile.
                    let lease = felix_engine::DEFAULT_LEASE;
                    let d = plan.duration(
                        lease * 2 + Duration::from_millis(300),
                        lease * 2 + Duration::from_secs(2),
                    );
                    self.push_fault((t + d).min(FAULT_PHASE), Fault::Thaw(a));
                    Fault::Freeze(a)
                }
                3 => Fault::LossBurst(
                    plan.duration(Duration::from_millis(50), Duration::from_secs(2)),
                    *plan.pick(&[0.3, 0.7, 1.0]),
                ),
                _ => Fault::Crash(
                    a,
                    match self.mode {
                        Mode::OnCommitPowerLoss => CrashKind::Power,
                        Mode::PeriodicProcessCrash => CrashKind::Process,
                    },
                ),
            };
            self.push_fault(t, fault);
        }
        if self.canary == Some(Canary::WipeLeaderDisk) {
            self.push_fault(FAULT_PHASE, Fault::WipeLeader);
        }
        let three = Duration::from_secs(3);
        match self.canary {
            Some(Canary::ServePastLease) => {
                self.push_fault(three, Fault::FreezeLeader(Duration::from_secs(5)))
            }
            Some(Canary::PromoteBehind) => {
                self.push_fault(three, Fault::CrashLeader);
                self.push_fault(Duration::from_secs(7), Fault::CrashLeader);
            }
            Some(Canary::AckBeforeDurable) => self.push_fault(three, Fault::StrandLeader),
            Some(Canary::AbandonOnSilence) => self.push_fault(three, Fault::StrandLeaderAlone),
            _ => {}
        }
        self.push_fault(FAULT_PHASE, Fault::EndOfFaults);
        self.push_fault(FAULT_PHASE + Duration::from_secs(3), Fault::StartAudit);
    }

    fn push_fault(&mut self, at: Duration, f: Fault) {
        self.queue.push(self.clock.at(at), Ev::Fault(f));
    }

    pub(crate) fn run(mut self) -> Outcome {
        let started = std::time::Instant::now();
        // A panic inside an engine (raft-rs asserts on states it cannot handle) is a finding
        // like any violation: caught here so the trace so far and the sweep survive it.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.simulate()));
        let violation = match result {
            Ok(r) => r.err(),
            Err(panic) => Some(Violation {
                invariant: "no_panic",
                detail: panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "a panic without a message".into()),
            }),
        };
        if let Some(v) = &violation {
            self.log(format_args!("VIOLATION {v}"));
        }
        let summary = format!(
            "cluster {} nodes, mode {:?}, {} shards, {} workers, {} events, {} acked publishes, {} acked records forwarded, {} events seen, {} cache reads checked, {} redirects ({} without an address), {} owners and {} topology answers, {} metadata digests agreed, {} leader claims agreed, {} writes by one writer, {} leases checked disjoint, {} committed entries agreed, {} freezes, {} crashes ({} skipped, {} wipes withheld), {} datagrams ({} dropped), {:.0} ms virtual in {:.0} ms",
            self.nodes.len(),
            self.mode,
            self.shards,
            self.workers,
            self.trace.count(),
            self.oracle.acked_count,
            self.oracle.forwarded_acks.len(),
            self.oracle.events_seen,
            self.oracle.cache_reads_checked,
            self.clients.iter().map(|c| c.stats.redirects).sum::<u64>(),
            self.clients
                .iter()
                .map(|c| c.stats.addressless_redirects)
                .sum::<u64>(),
            self.clients
                .iter()
                .map(|c| c.stats.owners_answers)
                .sum::<u64>(),
            self.clients
                .iter()
                .map(|c| c.stats.topology_answers)
                .sum::<u64>(),
            self.agreement.checked,
            self.shard_leaders.checked,
            self.one_writer.checked,
            self.leases.checked,
            self.prefix_entries_checked,
            self.freezes,
            self.crashes,
            self.crashes_skipped,
            self.wipes_skipped,
            self.net.stats.sent,
            self.net.stats.dropped,
            self.clock.elapsed().as_secs_f64() * 1e3,
            started.elapsed().as_secs_f64() * 1e3,
        );
        let summary = if self.admin_ops {
            format!(
                "{summary}, {} admin calls ({} unavailable, {} deletes, {} seen applied, {} re-created)",
                self.specs.calls,
                self.specs.unavailable,
                self.specs.deleted,
                self.specs.deletes_applied,
                self.specs.recreated
            )
        } else {
            summary
        };
        Outcome {
            seed: self.seed,
            hash: self.trace.hash(),
            events: self.trace.count(),
            violation,
            trace: self.trace.take_lines(),
            summary,
            group_claims_checked: 0,
        }
    }

    fn simulate(&mut self) -> Result<(), Violation> {
        for i in 0..self.nodes.len() {
            self.start_node(i)?;
        }
        self.token = self.nodes[0]
            .running
            .as_ref()
            .and_then(|r| r.engine.dev_token())
            .expect("dev mode")
            .to_owned();
        for i in 0..self.workers {
            let home = self.client_rng.below(self.nodes.len() as u64) as usize;
            self.add_client(Role::Worker, i, home, None);
        }
        let mut end = self.clock.at(FAULT_PHASE + QUIET_PHASE);
        let mut extensions = 0;
        let mut backlog = usize::MAX;
        loop {
            self.run_until(end)?;
            let waiting = self.oracle.outstanding.len();
            if waiting == 0 || waiting >= backlog || extensions >= MAX_EXTENSIONS {
                break;
            }
            self.log(format_args!("drain: {waiting} requests waiting: extending"));
            backlog = waiting;
            extensions += 1;
            end += EXTENSION;
        }
        self.final_checks()
    }

    fn add_client(&mut self, role: Role, id: usize, home: usize, shard: Option<u32>) {
        let now = self.clock.now();
        // Half the clients route by `shard_owners`; the others send every call to their
        // entry broker, which forwards (so `forwarded_acks` has forwards to judge).
        let routing = if self.client_rng.chance(0.5) {
            Routing::ByOwners
        } else {
            Routing::EntryOnly
        };
        let client = SimClient::new(Setup {
            id,
            role,
            shards: self.shards,
            durable: true,
            slow: false,
            crypto: self.crypto.clone(),
            rng: self.client_rng.fork(&format!("client {id}")),
            now,
            cluster: Some((self.nodes[home].client_addr, shard)),
            routing,
        });
        let line = format!(
            "c{id} joins as {role:?} seeded with {} routing {routing:?}{}",
            self.nodes[home].id,
            shard.map_or(String::new(), |s| format!(" reading shard {s}"))
        );
        self.log(format_args!("{line}"));
        self.by_addr.insert(client.addr, self.clients.len());
        self.clients.push(client);
    }

    // ---- node clocks ---------------------------------------------------------------------

    /// Node `i`'s clock at true time `now`.
    fn local(&self, i: usize, now: Instant) -> Instant {
        let n = &self.nodes[i];
        let elapsed = now.saturating_duration_since(self.clock.at(Duration::ZERO));
        let scaled = elapsed.as_nanos() as i128 * (PPM + i128::from(n.drift_ppm)) / PPM;
        self.clock
            .at(n.offset + Duration::from_nanos(scaled as u64))
    }

    /// The first true instant at which node `i`'s clock reads `local` or later.
    fn global(&self, i: usize, local: Instant) -> Instant {
        let n = &self.nodes[i];
        let since = local.saturating_duration_since(self.clock.at(n.offset));
        let rate = PPM + i128::from(n.drift_ppm);
        let g = (since.as_nanos() as i128 * PPM + rate - 1) / rate;
        self.clock.at(Duration::from_nanos(g as u64))
    }

    // ---- nodes ---------------------------------------------------------------------------

    fn start_node(&mut self, i: usize) -> Result<(), Violation> {
        crate::trace::set_node(i);
        let now = self.clock.now();
        let local = self.local(i, now);
        let node = &mut self.nodes[i];
        node.generations += 1;
        let mut config = self.config.clone();
        config.rng_seed[0] ^= i as u8 + 1;
        config.rng_seed[1] ^= node.generations as u8;
        let peers = self
            .nodes
            .iter()
            .map(|n| PeerAddr {
                node_id: n.id.clone(),
                addr: n.peer_addr,
            })
            .collect();
        let node = &self.nodes[i];
        let mut cluster = ClusterConfig::new(node.id.clone(), peers);
        cluster.client_advertise_addr = Some(node.client_addr.to_string());
        cluster.canary = replication_canary(self.canary).unwrap_or_default();
        // Several shards, so cache calls route by key to different owners and are forwarded.
        let mut cache = DeclaredCache::new(TENANT, NAMESPACE, CACHE, 1);
        cache.shards = CACHE_SHARDS;
        cluster.declared_caches.push(cache);
        config.cluster = Some(cluster);
        let unix = START_UNIX_MICROS
            + local
                .saturating_duration_since(self.clock.at(Duration::ZERO))
                .as_micros() as u64;
        let engine = Engine::new(config, local, unix).map_err(|e| Violation {
            invariant: "broker_starts",
            detail: format!("{}: {e}", node.id),
        })?;
        let ready = engine.is_ready();
        let generation = node.generations;
        let id = node.id.clone();
        self.log(format_args!(
            "{id} generation {generation} starts (ready {ready})"
        ));
        let node = &mut self.nodes[i];
        node.running = Some(Running {
            engine,
            generation,
            ready,
        });
        node.last_applied = None;
        // Blank (the metadata log is in memory): catching up to where the others are.
        let target = self
            .nodes
            .iter()
            .filter_map(|n| n.last_applied)
            .max()
            .filter(|t| *t > 0);
        self.nodes[i].catching_up_to = target;
        self.drain(i, now)
    }

    /// `forced`: a canary's planned crash, made even when it leaves a majority down.
    fn crash(&mut self, i: usize, kind: CrashKind, wipe: bool, forced: bool) {
        let now = self.clock.now();
        if self.nodes[i].running.is_none() {
            return;
        }
        let blank = (0..self.nodes.len()).filter(|j| self.blank(*j)).count();
        if !forced && !self.majority_crashes && blank + 1 > (self.nodes.len() - 1) / 2 {
            self.crashes_skipped += 1;
            let id = self.nodes[i].id.clone();
            self.log(format_args!(
                "{id} crash skipped: {blank} nodes down or catching up, a majority would be blank"
            ));
            return;
        }
        // A canary's wipe is its own plan; a drawn one stays within the fault model.
        let wipe = wipe && (forced || self.may_wipe(i));
        let node = &mut self.nodes[i];
        node.running = None;
        // Whatever waited for a stopped process dies with it.
        node.frozen = None;
        self.crashes += 1;
        let in_flight: Vec<FileOp> = std::mem::take(&mut node.in_flight).into_values().collect();
        let what = if wipe {
            node.disk = MemFs::new();
            "its disk replaced by an empty one".to_owned()
        } else {
            node.disk.crash_drawn(kind, &in_flight, &mut self.crash_rng)
        };
        let id = node.id.clone();
        self.log(format_args!("{id} crashed: {what}"));
        let down = self
            .crash_rng
            .duration(Duration::from_millis(100), Duration::from_secs(3));
        self.queue.push(now + down, Ev::Fault(Fault::Restart(i)));
    }

    /// Whether node `i`'s disk may be replaced now (see `lost_drives`); when not, says why in
    /// the trace. Judged by the freshest metadata any running node has applied: a copy's record
    /// on a disk only ever arrives, so an older view at worst withholds a wipe needlessly.
    fn may_wipe(&mut self, i: usize) -> bool {
        let meta = self
            .nodes
            .iter()
            .filter_map(|n| n.running.as_ref()?.engine.cluster_view())
            .max_by_key(|v| v.applied_index())
            .and_then(|v| felix_cluster::meta::Metadata::restore(&v.metadata_bytes()).ok());
        let disks = self
            .nodes
            .iter()
            .map(|n| (n.id.clone(), lost_drives::identity(&n.disk)))
            .collect();
        let why = match &meta {
            Some(meta) => lost_drives::wipe_blocker(meta, &self.nodes[i].id, &disks),
            None => Some("no metadata to judge by".to_owned()),
        };
        let Some(why) = why else {
            return true;
        };
        self.wipes_skipped += 1;
        let id = self.nodes[i].id.clone();
        self.log(format_args!("{id} wipe skipped: {why}"));
        false
    }

    /// Node `j` is down, or may hold an empty (or not caught up) metadata log: restarted and
    /// not yet where the others are, or with nothing applied while others have. Conservative:
    /// a node merely behind counts too.
    fn blank(&self, j: usize) -> bool {
        let n = &self.nodes[j];
        if n.running.is_none() || n.catching_up_to.is_some() || n.frozen.is_some() {
            return true;
        }
        let mine = n.last_applied.unwrap_or(0);
        let others = (0..self.nodes.len())
            .filter(|k| *k != j)
            .filter_map(|k| self.nodes[k].last_applied)
            .max()
            .unwrap_or(0);
        (n.generations > 1 && mine < others) || (mine == 0 && others > 0)
    }

    fn crash_kind(&self) -> CrashKind {
        match self.mode {
            Mode::OnCommitPowerLoss => CrashKind::Power,
            Mode::PeriodicProcessCrash => CrashKind::Process,
        }
    }

    /// Stops node `i`'s process (SIGSTOP), within the bound on nodes down at once unless
    /// `forced`.
    fn freeze(&mut self, i: usize, forced: bool) {
        let node = &self.nodes[i];
        if node.running.is_none() || node.frozen.is_some() {
            return;
        }
        let blank = (0..self.nodes.len()).filter(|j| self.blank(*j)).count();
        if !forced && !self.majority_crashes && blank + 1 > (self.nodes.len() - 1) / 2 {
            self.crashes_skipped += 1;
            return;
        }
        self.freezes += 1;
        self.nodes[i].frozen = Some(Vec::new());
    }

    /// Resumes node `i`: what reached it while stopped is handled now, in arrival order.
    fn thaw(&mut self, now: Instant, i: usize) -> Result<(), Violation> {
        let Some(backlog) = self.nodes[i].frozen.take() else {
            return Ok(());
        };
        let id = self.nodes[i].id.clone();
        self.log(format_args!(
            "{id} resumes with {} events waiting",
            backlog.len()
        ));
        for ev in backlog {
            self.handle(now, ev)?;
        }
        // Its timers fire too, late.
        let local = self.local(i, now);
        if let Some(r) = &mut self.nodes[i].running {
            crate::trace::set_node(i);
            r.engine.handle_timeout(local);
            self.drain(i, now)?;
        }
        Ok(())
    }

    /// The node leading the most shards of the stream, by the freshest metadata seen.
    fn busiest_leader(&self) -> Option<usize> {
        let mut count: BTreeMap<SocketAddr, usize> = BTreeMap::new();
        for addr in self.leaders.values() {
            *count.entry(*addr).or_default() += 1;
        }
        let busiest = count
            .iter()
            .max_by_key(|(a, n)| (**n, **a))
            .map(|(a, _)| *a)?;
        self.nodes.iter().position(|n| n.client_addr == busiest)
    }

    fn handle(&mut self, now: Instant, ev: Ev) -> Result<(), Violation> {
        // A stopped process takes nothing in: it waits in its socket and its disk queue.
        let target = match &ev {
            Ev::ToNode { node, .. } | Ev::FileDone { node, .. } => Some(*node),
            _ => None,
        };
        if let Some(backlog) = target.and_then(|n| self.nodes[n].frozen.as_mut()) {
            backlog.push(ev);
            return Ok(());
        }
        match ev {
            Ev::ToNode {
                node,
                peer,
                from,
                data,
            } => {
                let local = self.local(node, now);
                let Some(r) = &mut self.nodes[node].running else {
                    return Ok(());
                };
                if !r.ready {
                    return Ok(());
                }
                let d = Datagram {
                    remote: from,
                    local_ip: None,
                    ecn: None,
                    data: BytesMut::from(&data[..]),
                    segment_size: None,
                };
                crate::trace::set_node(node);
                if peer {
                    r.engine.handle_peer_datagram(local, d);
                } else {
                    r.engine.handle_datagram(local, d);
                }
                self.drain(node, now)
            }
            Ev::ToClient { client, from, data } => {
                let out = {
                    let (c, mut ctx) = self.client_ctx(client);
                    c.handle_datagram(now, from, data, &mut ctx)?
                };
                self.send_from_client(now, client, out);
                Ok(())
            }
            Ev::FileDone {
                node,
                generation,
                op,
            } => {
                let local = self.local(node, now);
                let n = &mut self.nodes[node];
                let Some(r) = &mut n.running else {
                    return Ok(());
                };
                if r.generation != generation {
                    return Ok(());
                }
                n.in_flight.remove(&op.id);
                let completion = n
                    .disk
                    .execute(op.clone())
                    .expect("the simulated disk dies only through crash_drawn");
                let ok = completion.result.is_ok();
                crate::trace::set_node(node);
                r.engine.handle_file_completion(local, completion);
                let id = n.id.clone();
                self.trace.event(
                    self.clock.elapsed(),
                    format_args!("{id} disk done {} {} ok={ok}", op.id.0, describe(&op.kind)),
                );
                self.drain(node, now)
            }
            Ev::Fault(f) => self.fault(now, f),
        }
    }

    fn fault(&mut self, now: Instant, f: Fault) -> Result<(), Violation> {
        self.log(format_args!("FAULT {f:?}"));
        match f {
            Fault::Cut(a, b) => self.net.cut(a, b),
            Fault::Isolate(i) => {
                let me = Node::Server(i);
                let others = (0..self.nodes.len())
                    .filter(|j| *j != i)
                    .map(Node::Server)
                    .chain((0..self.clients.len()).map(Node::Client))
                    .collect::<Vec<_>>();
                for o in others {
                    self.net.cut(me, o);
                    self.net.cut(o, me);
                }
            }
            Fault::HealNode(i) => self.net.heal_node(Node::Server(i)),
            Fault::LossBurst(d, loss) => self.net.loss_burst(now + d, loss),
            Fault::Crash(i, kind) => {
                let wipe = self.wipe_disks && self.crashes % 2 == 1;
                self.crash(i, kind, wipe, false)
            }
            Fault::Restart(i) => {
                if let Some(until) = self.nodes[i].down_until {
                    if now < until {
                        self.queue.push(until, Ev::Fault(Fault::Restart(i)));
                        return Ok(());
                    }
                    self.nodes[i].down_until = None;
                }
                if self.nodes[i].running.is_none() {
                    self.start_node(i)?;
                    if let Some(leader) = self.nodes[i].crash_when_restarted.take() {
                        self.net.heal_node(Node::Server(leader));
                        self.crash(leader, CrashKind::Process, false, true);
                        // Past the lease it held and, when it also led the control plane,
                        // the next control-plane leader's election and wait for that lease:
                        // its copy is not there when the others fence a new leadership.
                        self.nodes[leader].down_until = Some(now + Duration::from_secs(8));
                    }
                }
            }
            Fault::Freeze(i) => self.freeze(i, false),
            Fault::Thaw(i) => self.thaw(now, i)?,
            Fault::FreezeLeader(d) => {
                if let Some(i) = self.busiest_leader() {
                    self.freeze(i, true);
                    self.push_fault(self.clock.elapsed() + d, Fault::Thaw(i));
                }
            }
            Fault::CrashLeader => {
                if let Some(i) = self.busiest_leader() {
                    self.crash(i, self.crash_kind(), false, true);
                }
            }
            Fault::StrandLeader => {
                if let Some(l) = self.busiest_leader() {
                    let n = self.nodes.len();
                    let (cut, down) = ((l + 1) % n, (l + 2) % n);
                    self.net.cut(Node::Server(l), Node::Server(cut));
                    self.net.cut(Node::Server(cut), Node::Server(l));
                    let later = self.clock.elapsed() + Duration::from_secs(1);
                    let f = Fault::PowerLossUnsynced {
                        node: down,
                        leader: l,
                        tries: 3000,
                    };
                    self.push_fault(later, f);
                }
            }
            Fault::StrandLeaderAlone => {
                if let Some(l) = self.busiest_leader() {
                    for o in (0..self.nodes.len()).filter(|&o| o != l) {
                        self.net.cut(Node::Server(l), Node::Server(o));
                        self.net.cut(Node::Server(o), Node::Server(l));
                    }
                    let later = self.clock.elapsed() + felix_engine::DEFAULT_LEASE / 2;
                    self.push_fault(later, Fault::CrashStranded(l));
                }
            }
            Fault::CrashStranded(l) => {
                self.net.heal_node(Node::Server(l));
                self.crash(l, CrashKind::Process, false, true);
                self.nodes[l].down_until = Some(now + Duration::from_secs(8));
            }
            Fault::PowerLossUnsynced {
                node,
                leader,
                tries,
            } => {
                let n = &self.nodes[node];
                // A shard's records received (and, under the canary, reported) but not yet
                // durable: an append in flight, or written and not yet synced.
                let appending = n.in_flight.values().any(|op| {
                    matches!(&op.kind, FileOpKind::Append { path, .. } if path.starts_with("streams/"))
                });
                let unsynced = appending || n.disk.has_unsynced_data_under("streams/");
                if n.running.is_some() && !unsynced && tries > 0 {
                    let f = Fault::PowerLossUnsynced {
                        node,
                        leader,
                        tries: tries - 1,
                    };
                    self.queue
                        .push(now + Duration::from_millis(1), Ev::Fault(f));
                    return Ok(());
                }
                self.nodes[node].crash_when_restarted = Some(leader);
                self.crash(node, CrashKind::Power, false, true);
            }
            Fault::WipeLeader => {
                let mut count: BTreeMap<SocketAddr, usize> = BTreeMap::new();
                for (shard, ..) in &self.oracle.forwarded_acks {
                    if let Some(l) = self.leaders.get(shard) {
                        *count.entry(*l).or_default() += 1;
                    }
                }
                let busiest = count
                    .iter()
                    .max_by_key(|(a, n)| (**n, **a))
                    .map(|(a, _)| *a);
                if let Some(i) = self
                    .nodes
                    .iter()
                    .position(|n| Some(n.client_addr) == busiest)
                {
                    self.crash(i, CrashKind::Power, true, true);
                }
            }
            Fault::Admin => self.admin_call(now)?,
            Fault::EndOfFaults => {
                self.quiet = true;
                self.net.heal_all();
                for i in 0..self.nodes.len() {
                    self.thaw(now, i)?;
                }
                for i in 0..self.nodes.len() {
                    // A node the canary keeps down restarts on its own `Restart`.
                    let kept_down = self.nodes[i].down_until.is_some_and(|t| now < t);
                    if self.nodes[i].running.is_none() && !kept_down {
                        self.start_node(i)?;
                    }
                }
            }
            Fault::StartAudit => {
                for shard in 0..self.shards {
                    let id = self.clients.len();
                    let home = self.client_rng.below(self.nodes.len() as u64) as usize;
                    self.add_client(Role::Auditor, id, home, Some(shard));
                }
            }
        }
        Ok(())
    }

    fn client_ctx(&mut self, i: usize) -> (&mut SimClient, Ctx<'_>) {
        let ctx = Ctx {
            start: self.clock.at(Duration::ZERO),
            oracle: &mut self.oracle,
            trace: &mut self.trace,
            token: &self.token,
            broker_addr: self.nodes[0].client_addr,
            client_count: self.workers,
            drop_one_event_frame: &mut self.unused_flags.0,
            resend_as_new: false,
            drop_one_watch_change: &mut self.unused_flags.1,
            stale_cache: None,
            misroute_claim: None,
            withhold_answers: false,
            quiet: self.quiet,
            leaders: Some(&self.leaders),
            redirect_loop: self.canary == Some(Canary::RedirectLoop),
        };
        (&mut self.clients[i], ctx)
    }

    fn send_from_client(&mut self, now: Instant, i: usize, out: Vec<(SocketAddr, Bytes)>) {
        let from = self.clients[i].addr;
        for (dest, data) in out {
            let Some(node) = self.nodes.iter().position(|n| n.client_addr == dest) else {
                continue;
            };
            let delays = self.net.route(now, Node::Client(i), Node::Server(node));
            self.trace.event(
                self.clock.elapsed(),
                format_args!(
                    "net c{i}>{} {}B #{:08x} {}",
                    self.nodes[node].id,
                    data.len(),
                    short_hash(&data),
                    fate(&delays)
                ),
            );
            for d in delays {
                self.queue.push(
                    now + d,
                    Ev::ToNode {
                        node,
                        peer: false,
                        from,
                        data: data.clone(),
                    },
                );
            }
        }
    }

    /// Takes every output of node `i`'s engine, then looks at its metadata.
    fn drain(&mut self, i: usize, now: Instant) -> Result<(), Violation> {
        crate::trace::set_node(i);
        let local = self.local(i, now);
        let mut buf = Vec::new();
        let (peer_addr, client_addr) = (self.nodes[i].peer_addr, self.nodes[i].client_addr);
        for _ in 0..1_000_000 {
            let node = &mut self.nodes[i];
            let Some(r) = &mut node.running else {
                return Ok(());
            };
            let generation = r.generation;
            let Some(out) = r.engine.poll_output(local, &mut buf) else {
                break;
            };
            let (t, peer) = match out {
                Output::Transmit(t) => (t, false),
                Output::PeerTransmit(t) => (t, true),
                Output::FileOp(op) => {
                    let base = match op.kind {
                        FileOpKind::Sync { .. } | FileOpKind::SyncDir { .. } => self
                            .disk_rng
                            .duration(Duration::from_micros(300), Duration::from_millis(6)),
                        _ => self
                            .disk_rng
                            .duration(Duration::from_micros(10), Duration::from_micros(500)),
                    };
                    let latency = base * self.disk_slowness;
                    let id = node.id.clone();
                    node.in_flight.insert(op.id, op.clone());
                    self.trace.event(
                        self.clock.elapsed(),
                        format_args!(
                            "{id} disk op {} {} +{}us",
                            op.id.0,
                            describe(&op.kind),
                            latency.as_micros()
                        ),
                    );
                    self.queue.push(
                        now + latency,
                        Ev::FileDone {
                            node: i,
                            generation,
                            op,
                        },
                    );
                    continue;
                }
                other => unreachable!("an engine output the simulator does not model: {other:?}"),
            };
            let to = if peer {
                self.nodes
                    .iter()
                    .position(|n| n.peer_addr == t.destination)
                    .map(Node::Server)
            } else {
                self.by_addr.get(&t.destination).map(|c| Node::Client(*c))
            };
            let Some(to) = to else { continue };
            let from = if peer { peer_addr } else { client_addr };
            let seg = t.segment_size.unwrap_or(t.size).max(1);
            for dg in buf[..t.size].chunks(seg) {
                let delays = self.net.route(now, Node::Server(i), to);
                let name = match to {
                    Node::Server(j) => self.nodes[j].id.clone(),
                    Node::Client(c) => format!("c{c}"),
                    Node::Broker => unreachable!("no single broker here"),
                };
                self.trace.event(
                    self.clock.elapsed(),
                    format_args!(
                        "net {}>{name} {}B #{:08x} {}",
                        self.nodes[i].id,
                        dg.len(),
                        short_hash(dg),
                        fate(&delays)
                    ),
                );
                let data = Bytes::copy_from_slice(dg);
                for d in delays {
                    let ev = match to {
                        Node::Server(node) => Ev::ToNode {
                            node,
                            peer: true,
                            from,
                            data: data.clone(),
                        },
                        Node::Client(client) => Ev::ToClient {
                            client,
                            from,
                            data: data.clone(),
                        },
                        Node::Broker => unreachable!(),
                    };
                    self.queue.push(now + d, ev);
                }
            }
        }
        let node = &mut self.nodes[i];
        let Some(r) = &mut node.running else {
            return Ok(());
        };
        if !r.ready && r.engine.is_ready() {
            r.ready = true;
            let (id, generation) = (node.id.clone(), r.generation);
            self.log(format_args!("{id} generation {generation} ready"));
        }
        let node = &self.nodes[i];
        let r = node.running.as_ref().expect("running");
        if let Some(e) = r.engine.storage_error() {
            return Err(Violation {
                invariant: "recovery",
                detail: format!("{} refuses to start: {e}", node.id),
            });
        }
        self.observe_replicas(i, now)?;
        self.observe(i)
    }

    /// Feeds node `i`'s replication roles, leases and served writes to the one-writer and
    /// lease invariants, at true time `now`.
    fn observe_replicas(&mut self, i: usize, now: Instant) -> Result<(), Violation> {
        let node = &self.nodes[i];
        let Some(view) = node.running.as_ref().and_then(|r| r.engine.cluster_view()) else {
            return Ok(());
        };
        let replicas = view.replicas();
        let served = view.writes_served();
        let id = node.id.clone();
        let wrote = self.one_writer.observe(&id, &served)?;
        for r in &replicas {
            let lease_end = r.writable_until.map(|w| self.global(i, w));
            let seen = leases_disjoint::Seen {
                node: &id,
                object: &r.object,
                shard: r.shard,
                generation: r.generation,
                lease_end,
            };
            self.leases.observe(now, &seen)?;
        }
        for (object, shard) in wrote {
            if replicas
                .iter()
                .any(|r| r.object == object && r.shard == shard)
            {
                self.leases.wrote(now, &id, &object, shard)?;
            }
        }
        Ok(())
    }

    /// Feeds node `i`'s metadata to the cluster invariants when its applied index moved.
    fn observe(&mut self, i: usize) -> Result<(), Violation> {
        let node = &self.nodes[i];
        let Some(view) = node.running.as_ref().and_then(|r| r.engine.cluster_view()) else {
            return Ok(());
        };
        let applied = view.applied_index();
        if node.last_applied == Some(applied) {
            return Ok(());
        }
        let id = node.id.clone();
        let line = format!(
            "{id} applied {applied} (term {}, raft leader {:?})",
            view.raft_term(),
            view.raft_leader()
        );
        let mut digest = meta_agreement::digest(&view.metadata_bytes());
        let leaders = view.shard_leaders();
        let incarnations = view.incarnations();
        let facts = metadata_facts(&view.members(), &leaders, &incarnations);
        let deleted = deleted_incarnations(&incarnations);
        if self.admin_ops {
            self.see_deletes(&incarnations);
        }
        self.nodes[i].last_applied = Some(applied);
        if self.nodes[i].catching_up_to.is_some_and(|t| applied >= t) {
            self.nodes[i].catching_up_to = None;
        }
        self.log(format_args!("{line}"));
        // Canary: node 2 "applies" something else once, at the first index past 3 it reaches.
        if self.canary == Some(Canary::MetadataDivergence)
            && i == 1
            && applied >= 3
            && *self.diverge_at.get_or_insert(applied) == applied
        {
            digest[0] ^= 1;
        }
        let mut leaders = leaders;
        if self.canary == Some(Canary::SplitLeader) && i == 1 {
            // Node 2 believes another node leads its first shard at the same generation.
            if let Some(first) = leaders.first_mut() {
                let other = self
                    .nodes
                    .iter()
                    .map(|n| n.id.clone())
                    .find(|n| first.leader.as_deref() != Some(n.as_str()));
                first.leader = other;
            }
        }
        self.agreement.observe(&id, applied, digest)?;
        self.agreement
            .observe_facts(&id, applied, &facts, &deleted)?;
        self.shard_leaders.observe(&id, &leaders)?;
        if applied >= self.leaders_from {
            let stream = format!("stream:{TENANT}/{NAMESPACE}/{STREAM}");
            let mut map = BTreeMap::new();
            for l in leaders.iter().filter(|l| l.object == stream) {
                let addr = l
                    .leader
                    .as_ref()
                    .and_then(|id| self.nodes.iter().find(|n| n.id == *id))
                    .map(|n| n.client_addr);
                if let Some(a) = addr {
                    map.insert(l.shard, a);
                }
            }
            if !map.is_empty() {
                self.leaders = map;
                self.leaders_from = applied;
            }
        }
        Ok(())
    }

    fn run_until(&mut self, end: Instant) -> Result<(), Violation> {
        while self.steps < MAX_STEPS {
            self.steps += 1;
            let Some(next) = self.next_time() else { break };
            if next > end {
                break;
            }
            self.clock.advance_to(next);
            let now = self.clock.now();
            while let Some(ev) = self.queue.pop_due(now) {
                self.handle(now, ev)?;
            }
            for i in 0..self.nodes.len() {
                let local = self.local(i, now);
                if self.nodes[i].frozen.is_some() {
                    continue;
                }
                let Some(r) = &mut self.nodes[i].running else {
                    continue;
                };
                if r.engine.poll_timeout().is_some_and(|t| t <= local) {
                    crate::trace::set_node(i);
                    r.engine.handle_timeout(local);
                    self.drain(i, now)?;
                }
            }
            for c in 0..self.clients.len() {
                let due = self.clients[c]
                    .next_deadline(self.quiet)
                    .is_some_and(|t| t <= now);
                if due {
                    let out = {
                        let (client, mut ctx) = self.client_ctx(c);
                        client.tick(now, &mut ctx)?
                    };
                    self.send_from_client(now, c, out);
                }
            }
        }
        if self.steps >= MAX_STEPS {
            return Err(Violation {
                invariant: "bounded_run",
                detail: format!("no end after {MAX_STEPS} steps"),
            });
        }
        self.clock.advance_to(end);
        Ok(())
    }

    fn next_time(&mut self) -> Option<Instant> {
        let mut next = self.queue.peek_time();
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        for i in 0..self.nodes.len() {
            let t = self.nodes[i]
                .running
                .as_ref()
                .filter(|_| self.nodes[i].frozen.is_none())
                .and_then(|r| r.engine.poll_timeout());
            consider(t.map(|t| self.global(i, t)));
        }
        for c in &mut self.clients {
            consider(c.next_deadline(self.quiet));
        }
        next.map(|t| t.max(self.clock.now()))
    }

    fn final_checks(&mut self) -> Result<(), Violation> {
        let now = self.clock.now();
        for c in &self.clients {
            self.trace.event(
                self.clock.elapsed(),
                format_args!("end {} served by {:?}", c.describe(), c.served_by),
            );
        }
        let heard = self
            .clients
            .iter()
            .flat_map(|c| {
                c.last_heard()
                    .into_iter()
                    .map(|(gen, at)| ((c.id, gen), at))
            })
            .collect();
        requests_answered::check(
            &self.oracle,
            now,
            ANSWER_GRACE,
            self.clock.at(Duration::ZERO),
            &heard,
        )?;
        let mut ends = Vec::new();
        for n in &self.nodes {
            let Some(view) = n.running.as_ref().and_then(|r| r.engine.cluster_view()) else {
                continue;
            };
            let incarnations = view.incarnations();
            let mut facts = metadata_facts(&view.members(), &view.shard_leaders(), &incarnations);
            facts.sort();
            ends.push(EndState {
                node: n.id.clone(),
                applied: view.applied_index(),
                digest: meta_agreement::digest(&view.metadata_bytes()),
                facts,
                deleted: deleted_incarnations(&incarnations),
            });
        }
        self.agreement.check_end(&ends)?;
        self.check_object_specs()?;
        self.check_committed_prefixes()?;
        let auditors: BTreeMap<u32, &SimClient> = self
            .clients
            .iter()
            .filter(|c| c.role == Role::Auditor)
            .filter_map(|c| c.audit.keys().next().map(|s| (*s, c)))
            .collect();
        let read_back: BTreeMap<u32, ReadBack<'_>> = auditors
            .iter()
            .map(|(shard, c)| {
                (
                    *shard,
                    ReadBack {
                        from: c.served_by,
                        records: c.audit.get(shard).map(|(_, r)| r),
                    },
                )
            })
            .collect();
        forwarded_acks::check(&self.oracle, &self.leaders, &read_back)?;
        let mut start = BTreeMap::new();
        let mut read = BTreeMap::new();
        for shard in 0..self.shards {
            let (first, records) = auditors
                .get(&shard)
                .and_then(|c| c.audit.get(&shard))
                .map(|(s, r)| (*s, r.iter().map(|(o, p)| (*o, p.clone())).collect()))
                .unwrap_or((0, Vec::new()));
            let tail = self.oracle.known_tail(shard);
            let reached = records.last().map_or(first, |(o, _): &(u64, Bytes)| o + 1);
            if reached < tail {
                return Err(Violation {
                    invariant: no_acked_loss::NAME,
                    detail: format!(
                        "the audit of shard {shard} read up to offset {reached} from {first}, but offsets up to {tail} were acknowledged or delivered"
                    ),
                });
            }
            start.insert(shard, first);
            read.insert(shard, records);
        }
        no_acked_loss::check(&self.oracle, &start, &read)
    }
}

impl ClusterWorld {
    /// `committed_prefix` over every replicated shard, from each node's disk.
    fn check_committed_prefixes(&mut self) -> Result<(), Violation> {
        if self.replication.0 < 2 {
            return Ok(());
        }
        let object = format!("stream:{TENANT}/{NAMESPACE}/{STREAM}");
        for shard in 0..self.shards {
            // The leader at the highest generation any node leads the shard at.
            let mut leader: Option<(u64, usize, u64)> = None;
            for (i, n) in self.nodes.iter().enumerate() {
                let Some(view) = n.running.as_ref().and_then(|r| r.engine.cluster_view()) else {
                    continue;
                };
                for r in view.replicas() {
                    if r.object == object && r.shard == shard && r.role == "leading" {
                        let commit = r.commit.unwrap_or(0);
                        if leader.is_none_or(|(g, ..)| r.generation > g) {
                            leader = Some((r.generation, i, commit));
                        }
                    }
                }
            }
            let Some((_, l, commit)) = leader else {
                continue;
            };
            let dir = felix_storage::layout::stream_shard_dir(TENANT, NAMESPACE, STREAM, shard);
            let logs: Vec<(String, Vec<committed_prefix::Entry>)> = self
                .nodes
                .iter()
                .map(|n| (n.id.clone(), committed_prefix::read_log(&n.disk, &dir)))
                .collect();
            let copies: Vec<(&str, &[committed_prefix::Entry])> = logs
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != l)
                .map(|(_, (id, e))| (id.as_str(), &e[..]))
                .collect();
            let leader_log = (logs[l].0.as_str(), &logs[l].1[..]);
            self.prefix_entries_checked +=
                committed_prefix::check(&object, shard, commit, leader_log, &copies)?;
        }
        Ok(())
    }
}

/// The engine's bug put back for a replication canary.
fn replication_canary(canary: Option<Canary>) -> Option<ReplicationCanary> {
    match canary? {
        Canary::PromoteBehind => Some(ReplicationCanary::PromoteBehind),
        Canary::ServePastLease => Some(ReplicationCanary::ServePastLease),
        Canary::AckBeforeDurable => Some(ReplicationCanary::AckBeforeDurable),
        Canary::AbandonOnSilence => Some(ReplicationCanary::AbandonOnSilence),
        _ => None,
    }
}

/// Per object: its placed incarnation and the highest one deleted (`ClusterView::incarnations`).
pub(crate) type Incarnations = BTreeMap<String, (Option<u64>, Option<u64>)>;

/// What committed metadata never forgets (but a delete): the members that joined, the shards
/// placed, each with its object's incarnation.
fn metadata_facts(
    members: &[String],
    leaders: &[felix_engine::ShardLeader],
    incarnations: &Incarnations,
) -> Vec<String> {
    members
        .iter()
        .map(|m| format!("member {m}"))
        .chain(leaders.iter().map(|l| {
            let incarnation = incarnations
                .get(&l.object)
                .and_then(|(placed, _)| *placed)
                .unwrap_or(0);
            format!("shard {}@{incarnation} {}", l.object, l.shard)
        }))
        .collect()
}

/// Per object, the highest incarnation the metadata shows deleted.
fn deleted_incarnations(incarnations: &Incarnations) -> BTreeMap<String, u64> {
    incarnations
        .iter()
        .filter_map(|(o, (_, deleted))| deleted.map(|d| (o.clone(), d)))
        .collect()
}

fn fate(delays: &[Duration]) -> String {
    match delays {
        [] => "lost".to_owned(),
        ds => ds
            .iter()
            .map(|d| format!("+{}us", d.as_micros()))
            .collect::<Vec<_>>()
            .join(","),
    }
}

fn describe(kind: &FileOpKind) -> String {
    format!("{} {}", kind.name(), kind.path())
}
