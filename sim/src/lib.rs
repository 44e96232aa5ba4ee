//! # felix-sim
//!
//! A deterministic simulator for the Felix broker: the real [`felix_engine::Engine`] driven
//! by a seeded model of the network, the disk and the clock, with simulated clients built on
//! the felix-client Sans-IO core over real quinn-proto connections (QUIC and TLS run for real;
//! a seeded rustls provider makes them repeat). A run is a function of its seed: the same
//! seed gives the same event trace and the same trace hash.
//!
//! Modules:
//! - `clock`, `rng`, `queue`, `trace`: virtual time, seeded randomness, the (time, seq)
//!   event queue and the hashed event trace;
//! - `net`: delay, jitter, loss, duplication, reordering, partitions;
//! - `disk`: file operations with latency; a crash drops unsynced bytes and tears writes;
//! - `crypto`: the seeded TLS provider, certificate and client endpoints;
//! - `client`: a simulated client and its workload;
//! - `oracle` and `invariants/`: what was promised, and the checks, one per file;
//! - `world`: one run; `cluster`: one run of a cluster of nodes.
//!
//! See `docs/simulator.md`.

mod client;
mod clock;
mod cluster;
mod crypto;
mod disk;
mod invariants;
mod net;
mod oracle;
mod producer;
mod queue;
mod rng;
mod trace;
mod watcher;
mod world;

pub use oracle::Violation;
pub use trace::{current_node, print_live as print_trace_live};

/// A deliberately broken piece of the *simulator* that the invariants must catch, proving
/// they can fail. Never part of a normal run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Canary {
    /// The network layer silently loses one event frame on its way to a subscriber
    /// (caught by `subscriber_order`).
    DropEventFrame,
    /// The disk acknowledges an fsync without persisting anything; a power loss then drops
    /// acknowledged records (caught by `no_acked_loss`).
    LyingSync,
    /// An idempotent producer re-sends a batch whose answer was lost under a new sequence
    /// instead of the same one (caught by `idempotent_once`).
    ResendAsNew,
    /// One put change vanishes on its way to a cache watcher (caught by `watch_gapless`).
    DropWatchChange,
    /// A read cache in front of the broker that is never invalidated: a get of a key read
    /// before answers the value first read (caught by `cache_reads`).
    StaleCacheRead,
    /// A record one worker's poll was handed also turns up in the next poll answer of
    /// another worker, as if misrouted (caught by `group_claims`).
    MisrouteClaim,
    /// One client stops taking answers on each of its publish streams after the first: the
    /// answers stay owed on a live connection, as a broker that forgot them would leave
    /// them (caught by `requests_answered`).
    WithholdAnswers,
    /// Cluster: the simulator reports one node's metadata digest altered at one raft index,
    /// as if it had applied another entry there (caught by `meta_agreement`).
    MetadataDivergence,
    /// Cluster: one node's view names another leader for a shard at the same generation
    /// (caught by `one_leader_per_generation`).
    SplitLeader,
    /// Cluster: at the end of the faults the leader most forwarded-to loses power and comes
    /// back on an empty disk (caught by `forwarded_acks`).
    WipeLeaderDisk,
    /// Cluster: a subscriber follows each `not_leader` back to the node that sent it
    /// (caught by `redirects_end`).
    RedirectLoop,
    /// Cluster: a promoted leader opens at once, without fencing a majority of the replica
    /// set or adopting the most advanced copy (the rule of docs/replication.md invariant 4
    /// removed); the run crashes a leader mid-load (caught by `no_acked_loss` or
    /// `committed_prefix`).
    PromoteBehind,
    /// Cluster: a leader keeps writing after its lease lapsed; the run freezes a leader past
    /// two leases and resumes it (caught by `leases_disjoint`).
    ServePastLease,
    /// Cluster: a follower's report counts what it received, not what it made durable; the
    /// run cuts one follower off, powers the other down and then crashes the leader once it
    /// is back (caught by `no_acked_loss`).
    AckBeforeDurable,
    /// Cluster, `leader` consistency: a `leader` shard whose leader went silent is handed to
    /// a follower although none was recorded level with it (the old rule); the run cuts the
    /// busiest leader off from its followers while it acknowledges alone, then crashes it
    /// (caught by `no_acked_loss`).
    AbandonOnSilence,
    /// Cluster, with `--admin-ops` (turned on by it): at the end one node's view of the first
    /// stream the operator created reports a retention nobody asked for (caught by
    /// `object_specs`).
    SpecDivergence,
}

impl std::str::FromStr for Canary {
    type Err = String;
    fn from_str(s: &str) -> Result<Canary, String> {
        match s {
            "drop-event-frame" => Ok(Canary::DropEventFrame),
            "lying-sync" => Ok(Canary::LyingSync),
            "resend-as-new" => Ok(Canary::ResendAsNew),
            "drop-watch-change" => Ok(Canary::DropWatchChange),
            "stale-cache-read" => Ok(Canary::StaleCacheRead),
            "misroute-claim" => Ok(Canary::MisrouteClaim),
            "withhold-answers" => Ok(Canary::WithholdAnswers),
            "metadata-divergence" => Ok(Canary::MetadataDivergence),
            "split-leader" => Ok(Canary::SplitLeader),
            "wipe-leader-disk" => Ok(Canary::WipeLeaderDisk),
            "redirect-loop" => Ok(Canary::RedirectLoop),
            "promote-behind" => Ok(Canary::PromoteBehind),
            "serve-past-lease" => Ok(Canary::ServePastLease),
            "ack-before-durable" => Ok(Canary::AckBeforeDurable),
            "abandon-on-silence" => Ok(Canary::AbandonOnSilence),
            "spec-divergence" => Ok(Canary::SpecDivergence),
            other => Err(format!(
                "unknown canary {other:?}: expected drop-event-frame, lying-sync, resend-as-new, drop-watch-change, stale-cache-read, misroute-claim, withhold-answers, metadata-divergence, split-leader, wipe-leader-disk, redirect-loop, promote-behind, serve-past-lease, ack-before-durable, abandon-on-silence or spec-divergence"
            )),
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Every random choice of the run derives from it.
    pub seed: u64,
    /// Keep the event trace's lines in [`Outcome::trace`].
    pub verbose: bool,
    /// Break the simulator on purpose.
    pub canary: Option<Canary>,
    /// Cluster runs: crashes may leave a majority of nodes down or blank at once (off: at
    /// most a minority, what this version's in-memory metadata log survives).
    pub majority_crashes: bool,
    /// Cluster runs: declare the stream with three replicas at `quorum` consistency (off: one
    /// copy per shard). The replication canaries turn it on themselves.
    pub replicated: bool,
    /// Cluster runs: every other crash a fault draws replaces the node's disk with an empty
    /// one (a lost drive), so replicated copies are rebuilt from their leaders
    /// (docs/replication.md, "Rebuilding a copy"). A wipe that would leave a shard a second
    /// copy not recorded on its node's disk is withheld (the crash still happens). Off by
    /// default, so a seed's schedule stays what earlier sweeps ran.
    pub wipe_disks: bool,
    /// Cluster runs with `replicated`: three replicas at `leader` consistency instead of
    /// `quorum`, so `no_acked_loss` holds a crashed leader's own acknowledgements to the
    /// spec (docs/replication.md, "Who may lead a `leader` shard").
    pub leader_consistency: bool,
    /// Cluster runs: the operator creates streams and changes their retention through the
    /// admin API while faults run (`cluster/admin.rs`, checked by `object_specs`). Off by
    /// default, so a seed's schedule stays what earlier sweeps ran.
    pub admin_ops: bool,
}

impl RunOptions {
    /// A plain run of `seed`.
    pub fn seed(seed: u64) -> RunOptions {
        RunOptions {
            seed,
            verbose: false,
            canary: None,
            majority_crashes: false,
            replicated: false,
            wipe_disks: false,
            leader_consistency: false,
            admin_ops: false,
        }
    }
}

/// What one run found.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The seed run.
    pub seed: u64,
    /// Hash of the whole event trace (16 hex digits); equal for equal seeds.
    pub hash: String,
    /// Events in the trace.
    pub events: u64,
    /// The first invariant that failed, if any.
    pub violation: Option<Violation>,
    /// The trace's lines, when [`RunOptions::verbose`] was set.
    pub trace: Vec<String>,
    /// One line about the run (mode, counts, virtual and wall time).
    pub summary: String,
    /// Group handouts the `group_claims` invariant checked (0 in memory runs).
    pub group_claims_checked: u64,
}

/// Runs one seed to its end (or its first violation).
pub fn run(options: &RunOptions) -> Outcome {
    world::World::new(options).run()
}

/// Runs one seed of the cluster workload (3 or 5 nodes, see `cluster.rs`).
pub fn run_cluster(options: &RunOptions) -> Outcome {
    cluster::ClusterWorld::new(options).run()
}
