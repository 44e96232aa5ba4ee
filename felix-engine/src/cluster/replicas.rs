//! This node's replicas of replicated shards: leading one (fence, then ship and count), or
//! following one (ask, cut, append, report), over the peer links (docs/replication.md).
//!
//! Only streams with more than one replica, on a node with durable storage, take part; a
//! shard with one replica is served from its leader's log as on a single node. The decisions
//! are felix-cluster's (`replication::{leader, follower, fence, divergence}`); this file turns
//! peer messages and log events into their inputs and their outputs into peer messages and
//! [`ReplicaIo`] — the log work the engine does on the broker's logs and reports back.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_cluster::meta::{Command, Consistency, ObjectKey, ObjectKind, ShardMeta, ShardRef};
use felix_cluster::replication::divergence::{agreed_prefix, EpochLog};
use felix_cluster::replication::fence::{self, FenceOutcome, LogPosition};
use felix_cluster::replication::follower::{FollowState, ShardFollower, Shipment};
use felix_cluster::replication::leader::{
    FollowAnswer, FollowRefused, LeaderOutput, LeaderSettings, ShardLeader,
};
use felix_cluster::replication::Replica;
use felix_cluster::routing::Owner;
use felix_cluster::NodeId;
use felix_peer_proto as pp;
use felix_peer_proto::PeerMessage;
use felix_storage::log::{ReadTicket, ReplicaEvent};
use felix_storage::ops::LogId;
use felix_storage::replica_state::{Epoch as StoredEpoch, ReplicaState};
use tracing::{info, warn};

use super::ClusterNode;

mod quiet;
use crate::broker::replicated::MovedTo;
use crate::broker::LogInfo;

/// Which of a shard's logs a copy is of. A stream shard's consumer-group log rides the
/// shard: same replica set, leader, generation and consistency, fenced and fed like the
/// records, so a group's ack on a quorum stream promises what a quorum publish does. A
/// cache's values and its counters are two logs of its shard in the same way, at `leader`
/// consistency (a cache declares none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum CopyKind {
    Records,
    Groups,
    Values,
    Counters,
}

impl CopyKind {
    /// A log compaction rewrites: fed on only from its end, rebuilt rather than cut
    /// (`ShardLeader::follow_compacted`), and read as a projection rebuilt when led here.
    pub(crate) fn compacted(self) -> bool {
        self != CopyKind::Records
    }

    /// The log that speaks for the shard's copy (the others ride it): a new disk is recorded
    /// once every log of the shard led here has fed it level.
    fn primary(self) -> CopyKind {
        match self {
            CopyKind::Records | CopyKind::Groups => CopyKind::Records,
            CopyKind::Values | CopyKind::Counters => CopyKind::Values,
        }
    }

    fn rider(self) -> CopyKind {
        match self {
            CopyKind::Records | CopyKind::Groups => CopyKind::Groups,
            CopyKind::Values | CopyKind::Counters => CopyKind::Counters,
        }
    }
}

/// One replicated log of one shard: the key of a replica slot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct CopyRef {
    pub(crate) shard: ShardRef,
    pub(crate) kind: CopyKind,
}

impl CopyRef {
    pub(crate) fn records(shard: ShardRef) -> CopyRef {
        CopyRef {
            shard,
            kind: CopyKind::Records,
        }
    }
}

impl std::fmt::Display for CopyRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            CopyKind::Records | CopyKind::Values => write!(f, "{}", self.shard),
            CopyKind::Groups => write!(f, "{} groups", self.shard),
            CopyKind::Counters => write!(f, "{} counters", self.shard),
        }
    }
}

/// How often unanswered requests (follow, fence, tail fetch) are sent again, and shards are
/// checked against the metadata.
pub(crate) const REPLICATION_RETRY: Duration = Duration::from_millis(200);
/// The most a tail fetch asks for at once.
const TAIL_FETCH_BYTES: u32 = 1 << 20;

/// Log work for the engine, on the broker's logs.
#[derive(Debug)]
pub(crate) enum ReplicaIo {
    /// Make the shard's log exist and open; answer with [`ClusterNode::replica_log`].
    Open {
        copy: CopyRef,
    },
    PersistState {
        log: LogId,
        state: ReplicaState,
    },
    /// A framed read; answer with [`ClusterNode::read_started`] (or `read_failed`).
    ReadFramed {
        log: LogId,
        from: u64,
        max_bytes: usize,
        purpose: ReadPurpose,
    },
    /// Append shipped entries; answer with [`ClusterNode::replica_appended`].
    Append {
        log: LogId,
        base: u64,
        entries: Bytes,
    },
    Truncate {
        log: LogId,
        to: u64,
    },
    /// Drop the whole copy and start the log again, empty, at `start`; answered as a
    /// truncation is.
    RestartAt {
        log: LogId,
        start: u64,
    },
    Gate {
        log: LogId,
        committed: u64,
    },
    Ungate {
        log: LogId,
    },
    /// Keep compaction of a led group log below what every follower holds durably.
    BoundCompaction {
        log: LogId,
        below: u64,
    },
    /// The leadership here ended: its readers are ended with `shard_moved`, naming where the
    /// shard went as far as the metadata knows.
    Moved {
        log: LogId,
        to: MovedTo,
    },
    Committed {
        log: LogId,
        up_to: u64,
    },
    TimedOut {
        log: LogId,
        up_to: u64,
    },
}

/// What a framed read is for.
#[derive(Debug, Clone)]
pub(crate) enum ReadPurpose {
    /// Shipping to a follower (the leader asked from `from`).
    Ship { to: NodeId, from: u64 },
    /// Answering a promoted leader's tail fetch.
    Tail {
        to: String,
        scope: pp::ShardScope,
        from: u64,
    },
}

/// What the broker's logs can tell replication.
pub(crate) trait LogView {
    fn info(&self, log: LogId) -> Option<LogInfo>;
}

#[derive(Debug)]
struct Adopting {
    from: NodeId,
    /// Where this copy and the adopted one stop agreeing.
    agreed: u64,
    target: u64,
    epochs: Vec<(u64, u64)>,
    /// This copy was cut at `agreed` (or needed no cut).
    cut: bool,
    /// The cut is under way.
    cutting: bool,
    /// A tail fetch is in flight.
    fetching: bool,
}

#[derive(Debug)]
struct Fencing {
    answers: BTreeMap<NodeId, pp::FenceAnswer>,
    adopting: Option<Adopting>,
    /// The open state (epochs with this generation's) is being written.
    opening: bool,
    commit: u64,
}

enum Role {
    /// Waiting for the log, or for this node's fence at the generation to be durable.
    Preparing,
    Fencing(Fencing),
    Leading(ShardLeader),
    Following(ShardFollower),
    /// Not serving it at this generation (no leader, or halted).
    Idle,
}

struct Slot {
    log: Option<LogId>,
    /// The metadata's generation this role is for.
    generation: u64,
    role: Role,
    /// A replica state write is in flight: wait for it before deciding on the next.
    persisting: bool,
    last_sent: Option<Instant>,
    /// The broker holds this leadership's answers for the commit mark: its `Gate` has been
    /// handed over. Until then a write would be answered by the log's own durability.
    gated: bool,
    /// A follower's epochs once its cut is made (the leader's from the cut on). Persisted
    /// only then: a request to be fed sent before the cut would otherwise claim the leader's
    /// epochs for records that are still this copy's own, and be cut too little.
    epochs_after_cut: Option<Vec<(u64, u64)>>,
    /// The compaction bound last handed to a led group log.
    compaction_bound: Option<u64>,
    /// A follower's target for readiness: where its leader's log ended when it answered this
    /// copy's request to be fed at this generation.
    catch_up_to: Option<u64>,
}

/// This node's part in every replicated shard it holds.
pub(crate) struct Replicas {
    slots: BTreeMap<CopyRef, Slot>,
    by_log: BTreeMap<LogId, CopyRef>,
    io: VecDeque<ReplicaIo>,
    reads: BTreeMap<(LogId, u64), ReadPurpose>,
    inbox: VecDeque<(String, PeerMessage)>,
    settings: LeaderSettings,
    next_check: Option<Instant>,
    /// The last time the engine drove replication: quorum deadlines count from it.
    now: Option<Instant>,
    /// Whether this node has durable storage at all (replication needs it).
    durable: bool,
    /// Counters for `/metrics`.
    pub(super) stats: ReplicationStats,
    /// Generations of shard records this process opened as their leader: one found opened
    /// in the log's epochs but not here was opened before a restart, and is not opened
    /// again (`Command::Reopen`).
    opened: std::collections::BTreeSet<(ShardRef, u64)>,
    /// `leader` shards led here: their quiescence (`quiet.rs`).
    quiet: BTreeMap<ShardRef, quiet::ShardQuiet>,
    quiet_after: Duration,
}

/// What `/metrics` reports about replication on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ReplicationStats {
    /// Per shard led here: records the slowest follower lacks durably.
    pub(crate) lag_records: Vec<(String, u64)>,
    /// Shard leadership changes this node applied (cluster-wide).
    pub(crate) leader_changes: u64,
    /// Times quorum publishes on shards led here ran out of time, or were cut off by a
    /// step-down.
    pub(crate) quorum_timeouts: u64,
    /// Bytes of shipped or adopted entries appended here.
    pub(crate) catch_up_bytes: u64,
    /// Records known acknowledged that a new leadership here could not recover (a lost
    /// disk, or an operator's abandon).
    pub(crate) acknowledged_abandoned: u64,
    /// `leader` shards led here holding acknowledgements for a resumption.
    pub(crate) leader_shards_quiet: u64,
}

impl Replicas {
    pub(crate) fn new(settings: LeaderSettings, durable: bool, quiet_after: Duration) -> Replicas {
        Replicas {
            slots: BTreeMap::new(),
            by_log: BTreeMap::new(),
            io: VecDeque::new(),
            reads: BTreeMap::new(),
            inbox: VecDeque::new(),
            settings,
            next_check: None,
            now: None,
            durable,
            stats: ReplicationStats::default(),
            opened: std::collections::BTreeSet::new(),
            quiet: BTreeMap::new(),
            quiet_after,
        }
    }
}

fn to_epoch_log(state: &ReplicaState, end: u64) -> EpochLog {
    EpochLog {
        epochs: state
            .epochs
            .iter()
            .map(|e| (e.generation, e.start_offset))
            .collect(),
        end,
    }
}

fn wire_epochs(epochs: &[(u64, u64)]) -> Vec<pp::Epoch> {
    epochs
        .iter()
        .map(|&(generation, start)| pp::Epoch { generation, start })
        .collect()
}

fn from_wire(epochs: &[pp::Epoch]) -> Vec<(u64, u64)> {
    epochs.iter().map(|e| (e.generation, e.start)).collect()
}

fn stored(epochs: &[(u64, u64)]) -> Vec<StoredEpoch> {
    epochs
        .iter()
        .map(|&(generation, start_offset)| StoredEpoch {
            generation,
            start_offset,
        })
        .collect()
}

/// The generation the record before `end` was written at (0 for an empty log).
fn last_generation(epochs: &[(u64, u64)], end: u64) -> u64 {
    if end == 0 {
        return 0;
    }
    epochs
        .iter()
        .rev()
        .find(|&&(_, start)| start < end)
        .map_or(0, |&(g, _)| g)
}

/// `own` up to `cut`, then `theirs` from `cut` on: the epochs of a copy cut at the agreed
/// prefix and then filled from another. Consecutive epochs of one generation merge.
fn splice(own: &[(u64, u64)], theirs: &[(u64, u64)], cut: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = own.iter().copied().filter(|&(_, s)| s < cut).collect();
    // The epoch of theirs covering `cut`, then every later one.
    let covering = theirs.iter().rev().find(|&&(_, s)| s <= cut).copied();
    let after = theirs.iter().copied().filter(|&(_, s)| s > cut);
    for (g, s) in covering.map(|(g, _)| (g, cut)).into_iter().chain(after) {
        match out.last() {
            Some(&(lg, _)) if lg == g => {}
            Some(&(lg, _)) if lg > g => {} // never back: an older generation cannot follow
            _ => out.push((g, s)),
        }
    }
    out
}

impl ClusterNode {
    /// Replicated logs this node holds a copy of, as the metadata says now: each stream
    /// shard's records and group log, and each cache's values and counters.
    fn replicated_here(&self) -> Vec<(CopyRef, ShardMeta)> {
        if !self.replicas.durable {
            return Vec::new();
        }
        let meta = self.meta();
        let streams = meta
            .streams
            .iter()
            .filter(|(k, _)| !self.removing(ObjectKind::Stream, k))
            .filter(|(_, s)| s.shards.first().is_some_and(|m| m.replicas.len() > 1))
            .flat_map(|(key, s)| {
                s.shards
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| m.replicas.contains(&self.me))
                    .flat_map(move |(i, m)| {
                        let shard = ShardRef {
                            kind: ObjectKind::Stream,
                            key: key.clone(),
                            shard: i as u32,
                        };
                        let groups = CopyRef {
                            shard: shard.clone(),
                            kind: CopyKind::Groups,
                        };
                        [(CopyRef::records(shard), m.clone()), (groups, m.clone())]
                    })
            });
        // Every shard of a cache, each its values and its counters, as a stream shard's.
        let caches = meta
            .caches
            .iter()
            .filter(|(key, _)| !self.removing(ObjectKind::Cache, key))
            .flat_map(|(key, c)| c.shards.iter().enumerate().map(move |(i, m)| (key, i, m)))
            .filter(|(_, _, m)| m.replicas.len() > 1 && m.replicas.contains(&self.me))
            .flat_map(|(key, i, m)| {
                let shard = ShardRef {
                    kind: ObjectKind::Cache,
                    key: key.clone(),
                    shard: i as u32,
                };
                [CopyKind::Values, CopyKind::Counters].map(|kind| {
                    let copy = CopyRef {
                        shard: shard.clone(),
                        kind,
                    };
                    (copy, m.clone())
                })
            });
        streams.chain(caches).collect()
    }

    fn shard_scope(&self, copy: &CopyRef, generation: u64) -> pp::ShardScope {
        let k = &copy.shard.key;
        let mut scope = self.scope(
            copy.shard.kind == ObjectKind::Cache,
            (&k.tenant, &k.namespace, &k.name),
            copy.shard.shard,
            generation,
        );
        scope.shard.kind = match copy.kind {
            CopyKind::Records => pp::ShardKind::Stream,
            CopyKind::Groups => pp::ShardKind::StreamGroups,
            CopyKind::Values => pp::ShardKind::Cache,
            CopyKind::Counters => pp::ShardKind::CacheCounters,
        };
        scope
    }

    /// Whether a write on this stream shard may be served here now: the lease holds, and a
    /// replicated shard's copy is open for writes at the metadata's generation.
    pub(crate) fn local_ready(
        &self,
        now: Instant,
        names: (&str, &str, &str),
        shard: u32,
    ) -> Result<(), &'static str> {
        self.ready(
            now,
            (ObjectKind::Stream, names, shard),
            &[CopyKind::Records],
        )
    }

    /// Whether a consumer-group request on this stream shard may be served here now: as
    /// [`local_ready`](Self::local_ready), and the shard's group log is open too.
    pub(crate) fn groups_ready(
        &self,
        now: Instant,
        names: (&str, &str, &str),
        shard: u32,
    ) -> Result<(), &'static str> {
        let copies = [CopyKind::Records, CopyKind::Groups];
        self.ready(now, (ObjectKind::Stream, names, shard), &copies)
    }

    /// Whether a request on this cache shard led here may be served now: the lease holds,
    /// and a replicated shard's values and counters are open at the metadata's generation.
    pub(crate) fn local_ready_cache(
        &self,
        now: Instant,
        names: (&str, &str, &str),
        shard: u32,
    ) -> Result<(), &'static str> {
        let copies = [CopyKind::Values, CopyKind::Counters];
        self.ready(now, (ObjectKind::Cache, names, shard), &copies)
    }

    /// The lease holds, and each of `copies` of the shard is ready (`copy_ready`).
    fn ready(
        &self,
        now: Instant,
        (kind, names, shard): (ObjectKind, (&str, &str, &str), u32),
        copies: &[CopyKind],
    ) -> Result<(), &'static str> {
        if !self.lease_valid(now) {
            return Err("this node's lease on the shard lapsed; it is being renewed");
        }
        let r = ShardRef {
            kind,
            key: ObjectKey::new(names.0, names.1, names.2),
            shard,
        };
        if self.removing(kind, &r.key) {
            return Err("the object's deleted copies are still being removed here");
        }
        copies
            .iter()
            .try_for_each(|&copy| self.copy_ready(r.clone(), copy))
    }

    fn copy_ready(&self, r: ShardRef, kind: CopyKind) -> Result<(), &'static str> {
        let copy = CopyRef { shard: r, kind };
        match self.replicas.slots.get(&copy) {
            // No copy kept here yet: fine for a shard of one replica, but a replicated one
            // must wait for its slot (and its fence), or the write would skip replication.
            None if self
                .meta()
                .shard(&copy.shard)
                .is_some_and(|m| m.replicas.len() > 1) =>
            {
                Err("the shard's copy here is still being prepared")
            }
            None => Ok(()),
            Some(s) => match &s.role {
                Role::Leading(l)
                    if Some(l.generation()) == self.generation_of(&copy.shard) && s.gated =>
                {
                    Ok(())
                }
                _ => Err("the shard's new leader is still fencing its replicas"),
            },
        }
    }

    /// Whether every copy placed here has caught up with its leader: a follower holds what
    /// its leader's log held when it answered this copy's request to be fed, a leader here has
    /// opened its generation. Readiness waits for it once after a start (docs/deploy.md). A
    /// copy without a leader, following a node marked down, or halted does not hold readiness
    /// back: waiting would not change it.
    pub(super) fn copies_caught_up(&self) -> bool {
        let meta = self.meta();
        let leader_down = |m: &ShardMeta| {
            m.leader
                .as_ref()
                .is_none_or(|l| *l != self.me && !meta.members.get(l).is_some_and(|mm| mm.up))
        };
        self.replicated_here().iter().all(|(r, m)| {
            let Some(slot) = self.replicas.slots.get(r) else {
                return false;
            };
            if slot.generation != m.generation {
                return false;
            }
            match &slot.role {
                Role::Idle => true,
                Role::Leading(_) => slot.gated,
                Role::Preparing | Role::Fencing(_) => leader_down(m),
                Role::Following(f) => match f.state() {
                    FollowState::Halted { .. } => true,
                    FollowState::Fed { end } => {
                        slot.catch_up_to.is_some_and(|to| end >= to) || leader_down(m)
                    }
                    FollowState::Asking
                    | FollowState::Truncating { .. }
                    | FollowState::Rebuilding { .. } => leader_down(m),
                },
            }
        })
    }

    /// What [`super::observe::ClusterView::replicas`] shows.
    pub(super) fn replica_views(&self) -> Vec<super::observe::ReplicaView> {
        self.replicas
            .slots
            .iter()
            .map(|(r, slot)| {
                let (role, commit) = match &slot.role {
                    Role::Preparing => ("preparing", None),
                    Role::Fencing(_) => ("fencing", None),
                    Role::Leading(l) => ("leading", Some(l.commit())),
                    Role::Following(f) => match f.state() {
                        FollowState::Asking => ("asking", None),
                        FollowState::Truncating { .. } => ("truncating", None),
                        FollowState::Rebuilding { .. } => ("rebuilding", None),
                        FollowState::Fed { .. } => ("following", None),
                        FollowState::Halted { .. } => ("halted", None),
                    },
                    Role::Idle => ("idle", None),
                };
                let current = match &slot.role {
                    Role::Leading(l) => Some(l.generation()) == self.generation_of(&r.shard),
                    _ => false,
                };
                let object = match r.kind {
                    CopyKind::Records => format!("stream:{}", r.shard.key),
                    CopyKind::Groups => format!("stream-groups:{}", r.shard.key),
                    CopyKind::Values => format!("cache:{}", r.shard.key),
                    CopyKind::Counters => format!("cache-counters:{}", r.shard.key),
                };
                super::observe::ReplicaView {
                    object,
                    shard: r.shard.shard,
                    generation: slot.generation,
                    role,
                    commit,
                    writable_until: if current {
                        self.lease.writable_until()
                    } else {
                        None
                    },
                }
            })
            .collect()
    }

    /// A publish on this stream shard is served here as its leader (it passed
    /// [`local_ready`](Self::local_ready)): counted for the simulator's one-writer checks.
    pub(crate) fn note_write(&mut self, names: (&str, &str, &str), shard: u32) {
        let r = ShardRef {
            kind: ObjectKind::Stream,
            key: ObjectKey::new(names.0, names.1, names.2),
            shard,
        };
        let generation = self.generation_of(&r).unwrap_or(0);
        let mark = self.writes_served.entry(r).or_insert((generation, 0));
        *mark = (generation, mark.1 + 1);
    }

    fn generation_of(&self, shard: &ShardRef) -> Option<u64> {
        self.meta().shard(shard).map(|m| m.generation)
    }

    /// A replication message for the engine's next drive (it needs the logs to answer).
    pub(super) fn replication_message(&mut self, from: String, message: PeerMessage) {
        self.replicas.inbox.push_back((from, message));
    }

    pub(crate) fn poll_replica_io(&mut self) -> Option<ReplicaIo> {
        let io = self.replicas.io.pop_front()?;
        match &io {
            ReplicaIo::Append { entries, .. } => {
                self.replicas.stats.catch_up_bytes += entries.len() as u64;
            }
            ReplicaIo::Gate { log, .. } => {
                let slot = self
                    .replicas
                    .by_log
                    .get(log)
                    .and_then(|r| self.replicas.slots.get_mut(r));
                if let Some(slot) = slot {
                    slot.gated = matches!(slot.role, Role::Leading(_));
                }
            }
            _ => {}
        }
        Some(io)
    }

    /// Replication's figures for `/metrics`, with each led shard's lag as of now.
    pub(crate) fn replication_stats(&self) -> ReplicationStats {
        let mut stats = self.replicas.stats.clone();
        stats.lag_records = self
            .replicas
            .slots
            .iter()
            .filter_map(|(r, s)| {
                let Role::Leading(l) = &s.role else {
                    return None;
                };
                let shard = format!("{}#{}", r.shard.key, r.shard.shard);
                let label = match r.kind {
                    CopyKind::Records | CopyKind::Values => shard,
                    CopyKind::Groups => format!("{shard}/groups"),
                    CopyKind::Counters => format!("{shard}/counters"),
                };
                Some((label, l.lag_records()))
            })
            .collect();
        stats.leader_shards_quiet = self.leader_shards_quiet() as u64;
        stats
    }

    pub(crate) fn replication_timeout(&self) -> Option<Instant> {
        let leaders = self.replicas.slots.values().filter_map(|s| match &s.role {
            Role::Leading(l) => l.poll_timeout(),
            _ => None,
        });
        leaders.chain(self.replicas.next_check).min()
    }

    /// One pass: messages in, metadata reconciled when due, quorum deadlines.
    pub(crate) fn drive_replication(&mut self, now: Instant, logs: &dyn LogView) {
        self.replicas.now = Some(now);
        while let Some((from, message)) = self.replicas.inbox.pop_front() {
            self.on_replication(&from, message, logs);
        }
        let due = self.replicas.next_check.is_none_or(|t| t <= now);
        if due || self.replicas_changed {
            self.replicas_changed = false;
            self.replicas.next_check = Some(now + REPLICATION_RETRY);
            self.reconcile(now, logs);
        }
        self.drive_quiet(now);
        let refs: Vec<CopyRef> = self.replicas.slots.keys().cloned().collect();
        for r in refs {
            if let Some(Role::Leading(l)) = self.replicas.slots.get_mut(&r).map(|s| &mut s.role) {
                l.handle_timeout(now);
            }
            self.drain_leader(&r);
        }
        self.note_caught_up();
    }

    /// Brings every slot in line with the metadata, and re-sends what is unanswered.
    fn reconcile(&mut self, now: Instant, logs: &dyn LogView) {
        let wanted = self.replicated_here();
        // Copies no longer held here.
        let keep: Vec<&CopyRef> = wanted.iter().map(|(r, _)| r).collect();
        let gone: Vec<CopyRef> = self
            .replicas
            .slots
            .keys()
            .filter(|r| !keep.contains(r))
            .cloned()
            .collect();
        for r in gone {
            self.step_down(&r);
            self.replicas.slots.remove(&r);
        }
        for (r, m) in wanted {
            let slot = self.replicas.slots.entry(r.clone()).or_insert(Slot {
                log: None,
                generation: 0,
                role: Role::Preparing,
                persisting: false,
                last_sent: None,
                gated: false,
                epochs_after_cut: None,
                compaction_bound: None,
                catch_up_to: None,
            });
            if slot.generation != m.generation {
                slot.generation = m.generation;
                self.step_down(&r);
                let slot = self.replicas.slots.get_mut(&r).expect("present");
                slot.role = Role::Preparing;
                slot.last_sent = None;
                slot.catch_up_to = None;
            }
            let slot = self.replicas.slots.get_mut(&r).expect("present");
            let Some(log) = slot.log else {
                self.replicas.io.push_back(ReplicaIo::Open { copy: r });
                continue;
            };
            let Some(info) = logs.info(log) else {
                self.replicas.io.push_back(ReplicaIo::Open { copy: r });
                continue;
            };
            self.advance(now, &r, &m, log, &info);
        }
    }

    /// What the slot does next, from where it is.
    fn advance(&mut self, now: Instant, r: &CopyRef, m: &ShardMeta, log: LogId, info: &LogInfo) {
        let generation = m.generation;
        let resend = {
            let slot = &self.replicas.slots[r];
            if slot.persisting {
                return;
            }
            slot.last_sent
                .is_none_or(|t| now.saturating_duration_since(t) >= REPLICATION_RETRY)
        };
        let fence = info.state.fence_generation;
        match (&m.leader, fence.cmp(&generation)) {
            (None, _) => {
                self.replicas.slots.get_mut(r).expect("present").role = Role::Idle;
            }
            // This node took a fence above what its metadata says: it waits to catch up.
            (Some(_), std::cmp::Ordering::Greater) => {}
            (Some(_), std::cmp::Ordering::Less) => {
                let mut state = info.state.clone();
                state.fence_generation = generation;
                self.persist(r, log, state);
            }
            (Some(leader), std::cmp::Ordering::Equal) if *leader == self.me => {
                self.lead(now, r, m, log, info, resend);
            }
            (Some(leader), std::cmp::Ordering::Equal) => {
                let leader = leader.clone();
                self.follow(now, r, generation, leader, log, info, resend);
            }
        }
    }

    fn persist(&mut self, r: &CopyRef, log: LogId, state: ReplicaState) {
        let slot = self.replicas.slots.get_mut(r).expect("present");
        slot.persisting = true;
        self.replicas
            .io
            .push_back(ReplicaIo::PersistState { log, state });
    }

    #[allow(clippy::too_many_arguments)]
    fn lead(
        &mut self,
        now: Instant,
        r: &CopyRef,
        m: &ShardMeta,
        log: LogId,
        info: &LogInfo,
        resend: bool,
    ) {
        let generation = m.generation;
        let slot = self.replicas.slots.get_mut(r).expect("present");
        match &mut slot.role {
            Role::Leading(l) => {
                if r.kind.compacted() {
                    // Compaction stays below what every follower holds durably.
                    let below = l.epochs().end.saturating_sub(l.lag_records());
                    if slot.compaction_bound != Some(below) {
                        slot.compaction_bound = Some(below);
                        let io = ReplicaIo::BoundCompaction { log, below };
                        self.replicas.io.push_back(io);
                    }
                }
                self.record_rebuilt_copies(now, r, m);
                return;
            }
            Role::Idle => return,
            Role::Fencing(_) => {}
            Role::Preparing | Role::Following(_) => {
                // This node led the shard's records at this generation before a restart: it
                // shipped what its own disk may have lost since (`ShardLeader::written`), so
                // it leads on at the next generation, where the epochs tell those records
                // apart. A copy of a compacted log ships only what it synced: it fences again.
                let reopened = r.kind == CopyKind::Records
                    && info.state.epochs.iter().any(|e| e.generation == generation)
                    && !self
                        .replicas
                        .opened
                        .contains(&(r.shard.clone(), generation));
                if reopened {
                    let reopen = Command::Reopen {
                        shard: r.shard.clone(),
                        generation,
                        leader: self.me.clone(),
                    };
                    if let Some(control) = self.control.as_mut() {
                        control.want(reopen, now);
                    }
                    return;
                }
                let slot = self.replicas.slots.get_mut(r).expect("present");
                slot.role = Role::Fencing(Fencing {
                    answers: BTreeMap::new(),
                    adopting: None,
                    opening: false,
                    commit: info.state.commit,
                });
            }
        }
        let set: Vec<Replica> = m
            .replicas
            .iter()
            .map(|n| Replica {
                node: n.clone(),
                storage_id: m.storage_of(n).unwrap_or("").to_owned(),
            })
            .collect();
        let me = Replica {
            node: self.me.clone(),
            storage_id: self.storage_hex(),
        };
        let own_epochs = to_epoch_log(&info.state, info.end);
        let own = LogPosition {
            last_generation: last_generation(&own_epochs.epochs, info.end),
            end: info.end,
        };
        let scope = self.shard_scope(r, generation);
        let slot = self.replicas.slots.get_mut(r).expect("present");
        let Role::Fencing(f) = &mut slot.role else {
            unreachable!("fencing");
        };
        if f.opening {
            return;
        }
        let answers: Vec<fence::FenceAnswer> = f
            .answers
            .iter()
            .map(|(n, a)| fence::FenceAnswer {
                node: n.clone(),
                storage_id: a.storage_id.clone(),
                position: LogPosition {
                    last_generation: a.last_generation,
                    end: a.end,
                },
            })
            .collect();
        let mut outcome = fence::fence_outcome(&set, &me, own, &answers);
        if self.canary == crate::config::ReplicationCanary::PromoteBehind {
            outcome = FenceOutcome::Open;
        }
        match outcome {
            FenceOutcome::Waiting { .. } => {
                if resend {
                    let fence = PeerMessage::Fence(pp::Fence {
                        scope,
                        leader_storage_id: me.storage_id.clone(),
                    });
                    for n in m.replicas.iter().filter(|n| **n != self.me) {
                        if !f.answers.contains_key(n) {
                            self.net.send(n.as_str(), &fence);
                        }
                    }
                    slot.last_sent = Some(now);
                }
            }
            FenceOutcome::Adopt { from, position } => {
                let their = f
                    .answers
                    .get(&from)
                    .map(|a| from_wire(&a.epochs))
                    .unwrap_or_default();
                let adopting = f.adopting.get_or_insert_with(|| {
                    let theirs = EpochLog {
                        epochs: their.clone(),
                        end: position.end,
                    };
                    // A group log takes the other copy whole: fetched from its start, where
                    // compaction cannot have dropped what this copy would keep (see
                    // `ShardLeader::follow_compacted`), and never cut, which a compacted
                    // log cannot be.
                    let agreed = if r.kind.compacted() {
                        0
                    } else {
                        agreed_prefix(&own_epochs, &theirs)
                    };
                    Adopting {
                        from: from.clone(),
                        agreed,
                        target: position.end,
                        epochs: their,
                        cut: false,
                        cutting: false,
                        fetching: false,
                    }
                });
                if adopting.cutting || (adopting.fetching && !resend) {
                    return;
                }
                if !adopting.cut {
                    if info.end > adopting.agreed {
                        if info.idle {
                            adopting.cutting = true;
                            let to = adopting.agreed;
                            self.replicas.io.push_back(if r.kind.compacted() {
                                ReplicaIo::RestartAt { log, start: to }
                            } else {
                                ReplicaIo::Truncate { log, to }
                            });
                        }
                        return;
                    }
                    adopting.cut = true;
                }
                if info.end < adopting.target {
                    adopting.fetching = true;
                    let fetch = PeerMessage::TailFetch(pp::TailFetch {
                        scope,
                        from: info.end,
                        max_bytes: TAIL_FETCH_BYTES,
                    });
                    let to = adopting.from.clone();
                    self.net.send(to.as_str(), &fetch);
                    slot.last_sent = Some(now);
                    return;
                }
                // The tail is here: its epochs are the other copy's from the cut on.
                let epochs = splice(&own_epochs.epochs, &adopting.epochs, adopting.agreed);
                self.open(r, log, generation, epochs, info);
            }
            FenceOutcome::Open => {
                let epochs = own_epochs.epochs.clone();
                self.open(r, log, generation, epochs, info);
            }
        }
    }

    /// Asks the control plane to record the new disk of every copy this leadership fed
    /// level onto one (`ShardLeader::counted_storage`), so that fences and promotions at
    /// later generations count it too; asked again on every pass until the metadata says
    /// so, or can no longer (another generation, or the node's disk changed again).
    /// The copy's new disk is recorded for the whole shard, so only once every log of the
    /// shard led here was fed level onto it: the records' leadership asks, when the group
    /// log's counts that disk too.
    fn record_rebuilt_copies(&mut self, now: Instant, r: &CopyRef, m: &ShardMeta) {
        if r.kind != r.kind.primary() {
            return;
        }
        let Some(Role::Leading(l)) = self.replicas.slots.get(r).map(|s| &s.role) else {
            return;
        };
        let groups = CopyRef {
            shard: r.shard.clone(),
            kind: r.kind.rider(),
        };
        let groups_counted: Option<Vec<&Replica>> =
            match self.replicas.slots.get(&groups).map(|s| &s.role) {
                Some(Role::Leading(g)) => Some(g.counted_storage().collect()),
                Some(_) => Some(Vec::new()),
                None => None,
            };
        let members = &self.meta().members;
        let wanted: Vec<Command> = l
            .counted_storage()
            .filter(|c| m.storage_of(&c.node) != Some(c.storage_id.as_str()))
            .filter(|c| members.get(&c.node).map(|mm| &mm.storage_id) == Some(&c.storage_id))
            .filter(|c| groups_counted.as_ref().is_none_or(|g| g.contains(c)))
            .map(|c| Command::RecordCopy {
                shard: r.shard.clone(),
                generation: l.generation(),
                node: c.node.clone(),
                storage_id: c.storage_id.clone(),
            })
            .collect();
        let Some(control) = self.control.as_mut() else {
            return;
        };
        for c in wanted {
            control.want(c, now);
        }
    }

    /// Persists the state a leader opens with: its fence, the commit it knows, and this
    /// generation's epoch, durable before the first write at it.
    fn open(
        &mut self,
        r: &CopyRef,
        log: LogId,
        generation: u64,
        mut epochs: Vec<(u64, u64)>,
        info: &LogInfo,
    ) {
        let Some(Role::Fencing(f)) = self.replicas.slots.get_mut(r).map(|s| &mut s.role) else {
            return;
        };
        f.opening = true;
        let known = f.commit.max(info.state.commit);
        let commit = known.min(info.end);
        if known > info.end {
            // Some copy knew records below `known` were acknowledged, and none of the copies
            // that answered holds them: only a leader whose disk is gone (or an operator's
            // abandon) gets here. The spec allows it; it is never silent.
            let lost = known - info.end;
            warn!(shard = %r, generation, from = info.end, to = known, lost,
                "acknowledged records abandoned: no surviving copy holds them");
            self.replicas.stats.acknowledged_abandoned += lost;
        }
        if epochs.last().is_none_or(|&(g, _)| g != generation) {
            epochs.push((generation, info.end));
        }
        let state = ReplicaState {
            fence_generation: generation,
            commit,
            epochs: stored(&epochs),
        };
        self.persist(r, log, state);
    }

    #[allow(clippy::too_many_arguments)]
    fn follow(
        &mut self,
        now: Instant,
        r: &CopyRef,
        generation: u64,
        leader: NodeId,
        _log: LogId,
        info: &LogInfo,
        resend: bool,
    ) {
        let slot = self.replicas.slots.get_mut(r).expect("present");
        let asking = match &slot.role {
            Role::Following(f) => f.state() == FollowState::Asking,
            Role::Idle => false,
            _ => {
                slot.role = Role::Following(ShardFollower::new(generation, leader.clone()));
                true
            }
        };
        if !asking || !resend {
            return;
        }
        slot.last_sent = Some(now);
        let epochs = to_epoch_log(&info.state, info.end);
        let ask = PeerMessage::Follow(pp::Follow {
            scope: self.shard_scope(r, generation),
            storage_id: self.storage_hex(),
            epochs: wire_epochs(&epochs.epochs),
            end: info.end,
            durable_end: info.durable,
            commit: info.state.commit,
        });
        tracing::debug!(shard = %r, generation, %leader, end = info.end, "asking to be fed");
        self.net.send(leader.as_str(), &ask);
    }

    /// The stream (or cache) was deleted: its slots go without a word to readers (the broker
    /// ends them, and fails what waited on its logs).
    pub(super) fn forget_copies(&mut self, kind: ObjectKind, key: &ObjectKey) {
        let gone: Vec<CopyRef> = self
            .replicas
            .slots
            .keys()
            .filter(|r| r.shard.kind == kind && r.shard.key == *key)
            .cloned()
            .collect();
        for r in gone {
            if let Some(log) = self.replicas.slots.remove(&r).and_then(|s| s.log) {
                self.replicas.by_log.remove(&log);
            }
        }
    }

    /// The slot's leadership ends (a new generation, or the copy left this node): what it
    /// owed clients is answered `quorum_timeout` (outcome unknown), and the log is ungated.
    fn step_down(&mut self, r: &CopyRef) {
        self.step_down_to(r, None);
    }

    /// [`step_down`](Self::step_down), its readers sent to `to` when known better than the
    /// metadata here says (a fence from the next leader arrived first).
    fn step_down_to(&mut self, r: &CopyRef, to: Option<MovedTo>) {
        let Some(slot) = self.replicas.slots.get_mut(r) else {
            return;
        };
        let led = match (&slot.role, slot.log) {
            (Role::Leading(l), Some(log)) => Some((l.generation(), log)),
            _ => None,
        };
        slot.role = Role::Preparing;
        slot.gated = false;
        let Some((generation, log)) = led else {
            return;
        };
        info!(shard = %r, generation, "no longer leading");
        self.replicas.io.push_back(ReplicaIo::TimedOut {
            log,
            up_to: u64::MAX,
        });
        self.replicas.io.push_back(ReplicaIo::Ungate { log });
        let to = to.unwrap_or_else(|| self.moved_to(r));
        self.replicas.io.push_back(ReplicaIo::Moved { log, to });
    }

    /// Where the shard `r` went, as the metadata here says.
    fn moved_to(&self, r: &CopyRef) -> MovedTo {
        let generation = self.generation_of(&r.shard).unwrap_or(0);
        let k = &r.shard.key;
        let owner = match r.shard.kind {
            ObjectKind::Stream => {
                self.stream_owner(&k.tenant, &k.namespace, &k.name, r.shard.shard)
            }
            ObjectKind::Cache => {
                self.cache_owner((&k.tenant, &k.namespace, &k.name), r.shard.shard)
            }
        };
        match owner {
            Some(Owner::Remote {
                node,
                addr,
                generation,
            }) => MovedTo {
                node_id: Some(node.0),
                addr,
                generation,
            },
            // Led here again at a new generation once its fence is done.
            Some(Owner::Local) => MovedTo {
                node_id: Some(self.me.0.clone()),
                addr: self
                    .meta()
                    .members
                    .get(&self.me)
                    .and_then(|m| m.client_addr.clone()),
                generation,
            },
            _ => MovedTo {
                node_id: None,
                addr: None,
                generation,
            },
        }
    }

    /// The engine opened (or found) the shard's log.
    pub(crate) fn replica_log(&mut self, copy: &CopyRef, log: LogId) {
        if let Some(slot) = self.replicas.slots.get_mut(copy) {
            slot.log = Some(log);
            self.replicas.by_log.insert(log, copy.clone());
        }
    }

    pub(crate) fn read_started(&mut self, log: LogId, ticket: ReadTicket, purpose: ReadPurpose) {
        self.replicas.reads.insert((log, ticket.0), purpose);
    }

    pub(crate) fn read_failed(&mut self, log: LogId, purpose: ReadPurpose) {
        if let ReadPurpose::Ship { to, .. } = purpose {
            if let Some(Role::Leading(l)) = self.slot_role(log) {
                l.ship_failed(&to);
            }
        }
    }

    fn slot_role(&mut self, log: LogId) -> Option<&mut Role> {
        let r = self.replicas.by_log.get(&log)?;
        self.replicas.slots.get_mut(r).map(|s| &mut s.role)
    }

    /// A publish on a gated log is owed an answer once `end` is committed.
    pub(crate) fn replica_owes(&mut self, log: LogId, end: u64) {
        let Some(now) = self.replicas.now else {
            return;
        };
        if let Some(Role::Leading(l)) = self.slot_role(log) {
            l.appended(now, end, true);
        }
    }

    /// The log of a shard led here is durable below `up_to` on this node.
    pub(crate) fn local_durable(&mut self, log: LogId, up_to: u64) {
        if let Some(Role::Leading(l)) = self.slot_role(log) {
            l.durable(up_to);
        }
        if let Some(r) = self.replicas.by_log.get(&log).cloned() {
            self.drain_leader(&r);
        }
    }

    /// An ungated log is durable below `up_to`: a follower reports it.
    pub(crate) fn log_durable(&mut self, log: LogId, up_to: u64, end: u64) {
        let Some(r) = self.replicas.by_log.get(&log).cloned() else {
            return;
        };
        let Some(slot) = self.replicas.slots.get(&r) else {
            return;
        };
        if let Role::Following(f) = &slot.role {
            if matches!(f.state(), FollowState::Fed { .. }) {
                let report = PeerMessage::ReplicaReport(pp::ReplicaReport {
                    scope: self.shard_scope(&r, f.generation()),
                    storage_id: self.storage_hex(),
                    end,
                    durable_end: up_to,
                });
                let to = f.leader().clone();
                self.net.send(to.as_str(), &report);
            }
        }
    }

    /// The engine appended shipped or fetched entries (or could not).
    pub(crate) fn replica_appended(&mut self, log: LogId, result: Result<u64, String>) {
        let Some(r) = self.replicas.by_log.get(&log).cloned() else {
            return;
        };
        let Some(slot) = self.replicas.slots.get_mut(&r) else {
            return;
        };
        match (&mut slot.role, result) {
            (Role::Following(f), Ok(end)) => f.appended(end),
            (Role::Following(f), Err(e)) => {
                warn!(shard = %r, error = %e, "shipped entries not appended; asking again");
                f.ask_again();
                slot.last_sent = None;
            }
            (Role::Fencing(fe), Ok(_)) => {
                if let Some(a) = &mut fe.adopting {
                    a.fetching = false;
                }
                slot.last_sent = None;
                self.replicas_changed = true;
            }
            (Role::Fencing(fe), Err(e)) => {
                warn!(shard = %r, error = %e, "adopted tail not appended; fetching again");
                if let Some(a) = &mut fe.adopting {
                    a.fetching = false;
                }
                slot.last_sent = None;
            }
            _ => {}
        }
    }

    /// The log refused a cut for now (busy with a write, a sync or a read): the slot asks
    /// again on its next pass instead of waiting for a truncation that will never come.
    pub(crate) fn truncation_refused(&mut self, log: LogId) {
        if let Some(role) = self.slot_role(log) {
            retry_cut(role);
        }
    }

    /// A replication event from a log: a framed read, a truncation, a durable state.
    pub(crate) fn replica_event(
        &mut self,
        now: Instant,
        log: LogId,
        event: ReplicaEvent,
        logs: &dyn LogView,
    ) {
        match event {
            ReplicaEvent::Framed { ticket, result } => {
                let Some(purpose) = self.replicas.reads.remove(&(log, ticket.0)) else {
                    return;
                };
                self.framed(now, log, purpose, result, logs);
            }
            ReplicaEvent::Truncated { result } => {
                let Some(r) = self.replicas.by_log.get(&log).cloned() else {
                    return;
                };
                let Some(slot) = self.replicas.slots.get_mut(&r) else {
                    return;
                };
                let mut cut_epochs = None;
                match (&mut slot.role, result) {
                    (Role::Following(f), Ok(end)) => {
                        f.truncated(end);
                        cut_epochs = slot.epochs_after_cut.take();
                    }
                    (Role::Fencing(fe), Ok(_)) => {
                        if let Some(a) = &mut fe.adopting {
                            a.cutting = false;
                            a.cut = true;
                        }
                    }
                    (_, Err(e)) => {
                        warn!(shard = %r, error = ?e, "truncation failed; trying again");
                        retry_cut(&mut slot.role);
                    }
                    _ => {}
                }
                slot.last_sent = None;
                self.replicas_changed = true;
                if let (Some(epochs), Some(info)) = (cut_epochs, logs.info(log)) {
                    let mut state = info.state.clone();
                    state.epochs = stored(&epochs);
                    if state != info.state {
                        self.persist(&r, log, state);
                    }
                }
            }
            ReplicaEvent::Written { up_to } => {
                if let Some(Role::Leading(l)) = self.slot_role(log) {
                    l.written(up_to);
                }
                if let Some(r) = self.replicas.by_log.get(&log).cloned() {
                    self.drain_leader(&r);
                }
            }
            ReplicaEvent::StateDurable(state) => {
                let Some(r) = self.replicas.by_log.get(&log).cloned() else {
                    return;
                };
                if let Some(slot) = self.replicas.slots.get_mut(&r) {
                    slot.persisting = false;
                }
                self.state_durable(&r, log, state, logs);
                self.replicas_changed = true;
            }
        }
    }

    /// A replica state write is durable: fence answers owed go, and a leader that was
    /// opening opens.
    fn state_durable(&mut self, r: &CopyRef, log: LogId, state: ReplicaState, logs: &dyn LogView) {
        let Some(m) = self.meta().shard(&r.shard).cloned() else {
            return;
        };
        let consistency = match r.shard.kind {
            ObjectKind::Stream => self
                .meta()
                .streams
                .get(&r.shard.key)
                .map_or(Consistency::Leader, |s| s.spec.consistency),
            ObjectKind::Cache => Consistency::Leader,
        };
        let Some(info) = logs.info(log) else {
            return;
        };
        let slot = self.replicas.slots.get_mut(r).expect("present");
        let opening = matches!(&slot.role, Role::Fencing(f) if f.opening);
        if opening && state.fence_generation == m.generation && m.leader.as_ref() == Some(&self.me)
        {
            let followers: Vec<Replica> = m
                .replicas
                .iter()
                .filter(|n| **n != self.me)
                .map(|n| Replica {
                    node: n.clone(),
                    storage_id: m.storage_of(n).unwrap_or("").to_owned(),
                })
                .collect();
            let epochs = to_epoch_log(&state, info.end);
            let leader = ShardLeader::new(
                m.generation,
                followers,
                consistency == Consistency::Quorum,
                epochs,
                info.durable,
                state.commit,
                self.replicas.settings,
            );
            info!(shard = %r, generation = m.generation, end = info.end, "leading");
            if r.kind == CopyKind::Records {
                // Only a shard's latest generation is ever asked about.
                let opened = &mut self.replicas.opened;
                opened.retain(|(s, _)| *s != r.shard);
                opened.insert((r.shard.clone(), m.generation));
            }
            self.replicas.io.push_back(ReplicaIo::Gate {
                log,
                committed: leader.commit(),
            });
            if r.kind.compacted() {
                // Nothing compacted until the followers report what they hold.
                slot.compaction_bound = Some(0);
                let io = ReplicaIo::BoundCompaction { log, below: 0 };
                self.replicas.io.push_back(io);
            }
            slot.role = Role::Leading(leader);
            // Requests parked for this shard may go now.
            self.metadata_changed = true;
        }
    }

    fn framed(
        &mut self,
        now: Instant,
        log: LogId,
        purpose: ReadPurpose,
        result: Result<felix_storage::log::FramedBatch, felix_storage::log::ReadError>,
        logs: &dyn LogView,
    ) {
        match purpose {
            ReadPurpose::Ship { to, from } => {
                let Some(r) = self.replicas.by_log.get(&log).cloned() else {
                    return;
                };
                let scope_generation = match self.replicas.slots.get(&r).map(|s| &s.role) {
                    Some(Role::Leading(l)) => l.generation(),
                    _ => return,
                };
                let scope = self.shard_scope(&r, scope_generation);
                // Compaction passed this follower's end since it was last told where to
                // be fed from (the bound lags the reports): it must ask again, and is rebuilt.
                let compacted_past = r.kind.compacted()
                    && logs
                        .info(log)
                        .is_some_and(|i| from != i.start && from < i.complete_from);
                let Some(Role::Leading(l)) = self.replicas.slots.get_mut(&r).map(|s| &mut s.role)
                else {
                    return;
                };
                if !l.expects_read(&to, from) {
                    return;
                }
                match result {
                    Ok(_) if compacted_past => {
                        l.ship_failed(&to);
                        let msg = PeerMessage::ReplicationRefused(pp::ReplicationRefused {
                            scope,
                            reason: pp::RefusalReason::NotOpen,
                            current_generation: scope_generation,
                            detail: "its next record is in a compacted part of the log".to_owned(),
                        });
                        self.net.send(to.as_str(), &msg);
                    }
                    Ok(batch) if !batch.entries.is_empty() => {
                        // A compacted log (a group log) can have a gap between `from` and
                        // its first entry, and between entries: the shipment spans them, so
                        // the follower's end moves to the batch's end (it fills the gaps).
                        let (base_offset, record_count) = shipped_span(from, &batch);
                        let msg = PeerMessage::Replicate(pp::Replicate {
                            scope,
                            base_offset,
                            record_count,
                            commit: l.commit(),
                            entries: batch.entries.clone(),
                        });
                        l.shipped(now, &to, from, batch.end, batch.entries.len() as u64);
                        self.net.send(to.as_str(), &msg);
                    }
                    Ok(_) => l.shipped(now, &to, from, from, 0),
                    Err(e) => {
                        // Its next record is gone from this log (retention moved the start
                        // past it since it asked): it asks again, and is rebuilt.
                        warn!(shard = %r, to = %to, error = ?e, "nothing to ship from there; the follower is told to ask again");
                        l.ship_failed(&to);
                        let msg = PeerMessage::ReplicationRefused(pp::ReplicationRefused {
                            scope,
                            reason: pp::RefusalReason::NotOpen,
                            current_generation: scope_generation,
                            detail: "its next record is gone from the leader's log".to_owned(),
                        });
                        self.net.send(to.as_str(), &msg);
                    }
                }
                self.drain_leader(&r);
            }
            ReadPurpose::Tail { to, scope, from } => {
                let end = self
                    .replicas
                    .by_log
                    .get(&log)
                    .and_then(|_| logs.info(log))
                    .map_or(0, |i| i.end);
                let chunk = match result {
                    Ok(b) => pp::TailChunk {
                        scope,
                        base_offset: shipped_span(from, &b).0,
                        record_count: shipped_span(from, &b).1,
                        last: b.end >= end,
                        entries: b.entries,
                        end,
                    },
                    Err(_) => pp::TailChunk {
                        scope,
                        base_offset: end,
                        record_count: 0,
                        entries: Bytes::new(),
                        end,
                        last: true,
                    },
                };
                self.net.send(&to, &PeerMessage::TailChunk(chunk));
            }
        }
    }

    /// Turns a leader's outputs into reads and marks.
    fn drain_leader(&mut self, r: &CopyRef) {
        let Some(slot) = self.replicas.slots.get_mut(r) else {
            return;
        };
        let (Role::Leading(l), Some(log)) = (&mut slot.role, slot.log) else {
            return;
        };
        while let Some(out) = l.poll_output() {
            self.replicas.io.push_back(match out {
                LeaderOutput::Ship {
                    to,
                    from,
                    max_bytes,
                } => ReplicaIo::ReadFramed {
                    log,
                    from,
                    max_bytes,
                    purpose: ReadPurpose::Ship { to, from },
                },
                LeaderOutput::Committed { up_to } => ReplicaIo::Committed { log, up_to },
                LeaderOutput::TimedOut { up_to } => {
                    self.replicas.stats.quorum_timeouts += 1;
                    ReplicaIo::TimedOut { log, up_to }
                }
            });
        }
    }

    /// One replication message from a peer.
    fn on_replication(&mut self, from: &str, message: PeerMessage, logs: &dyn LogView) {
        let Some(scope) = message.scope().cloned() else {
            return;
        };
        let s = &scope.shard;
        let (object, kind) = match s.kind {
            pp::ShardKind::Stream => (ObjectKind::Stream, CopyKind::Records),
            pp::ShardKind::StreamGroups => (ObjectKind::Stream, CopyKind::Groups),
            pp::ShardKind::Cache => (ObjectKind::Cache, CopyKind::Values),
            pp::ShardKind::CacheCounters => (ObjectKind::Cache, CopyKind::Counters),
        };
        let r = CopyRef {
            shard: ShardRef {
                kind: object,
                key: ObjectKey::new(&s.tenant, &s.namespace, &s.name),
                shard: s.shard,
            },
            kind,
        };
        let from_node = NodeId::new(from);
        let refuse = |reason: pp::RefusalReason, current: u64, detail: &str| {
            PeerMessage::ReplicationRefused(pp::ReplicationRefused {
                scope: scope.clone(),
                reason,
                current_generation: current,
                detail: detail.to_owned(),
            })
        };
        let Some(slot) = self.replicas.slots.get_mut(&r) else {
            let msg = refuse(
                pp::RefusalReason::NotReplica,
                0,
                "no copy of this shard here",
            );
            if !matches!(message, PeerMessage::ReplicationRefused(_)) {
                self.net.send(from, &msg);
            }
            return;
        };
        let info = slot.log.and_then(|l| logs.info(l));
        match message {
            PeerMessage::Fence(f) => {
                let Some((log, info)) = slot.log.zip(info) else {
                    return; // not open yet: the leader asks again
                };
                let g = f.scope.generation;
                let fence = info.state.fence_generation;
                if fence > g {
                    let msg = refuse(pp::RefusalReason::Fenced, fence, "fenced above");
                    self.net.send(from, &msg);
                } else if fence == g && !slot.persisting {
                    // Its own leader fencing again at the same generation has restarted: it
                    // feeds only those who ask, so a copy that thinks itself fed asks again
                    // (else both wait: sim replicated seed 3124, with the peer restart fix).
                    if let Role::Following(fo) = &mut slot.role {
                        if *fo.leader() == from_node && fo.state() != FollowState::Asking {
                            fo.ask_again();
                            slot.last_sent = None;
                            self.replicas_changed = true;
                        }
                    }
                    let epochs = to_epoch_log(&info.state, info.end);
                    let answer = PeerMessage::FenceAnswer(pp::FenceAnswer {
                        scope: f.scope.clone(),
                        storage_id: self.storage_hex(),
                        last_generation: last_generation(&epochs.epochs, info.end),
                        end: info.end,
                        durable_end: info.durable,
                        commit: info.state.commit,
                        epochs: wire_epochs(&epochs.epochs),
                    });
                    self.net.send(from, &answer);
                } else if fence < g && !slot.persisting {
                    // Stop acting at the old generation at once, then persist the fence; the
                    // promoted leader asks again and is answered once it is durable. The
                    // metadata here may not say yet who leads next: the fence does.
                    let to = MovedTo {
                        node_id: Some(from.to_owned()),
                        addr: self.member_addr(&from_node),
                        generation: g,
                    };
                    self.step_down_to(&r, Some(to));
                    let mut state = info.state.clone();
                    state.fence_generation = g;
                    self.persist(&r, log, state);
                }
            }
            PeerMessage::FenceAnswer(a) => {
                if let Role::Fencing(fe) = &mut slot.role {
                    if a.scope.generation == slot.generation {
                        fe.commit = fe.commit.max(a.commit);
                        fe.answers.insert(from_node, a);
                        self.replicas_changed = true;
                    }
                }
            }
            PeerMessage::TailFetch(t) => {
                let Some((log, info)) = slot.log.zip(info) else {
                    return;
                };
                if info.state.fence_generation > t.scope.generation {
                    return;
                }
                if t.from >= info.end {
                    let chunk = PeerMessage::TailChunk(pp::TailChunk {
                        scope: t.scope.clone(),
                        base_offset: info.end,
                        record_count: 0,
                        entries: Bytes::new(),
                        end: info.end,
                        last: true,
                    });
                    self.net.send(from, &chunk);
                    return;
                }
                self.replicas.io.push_back(ReplicaIo::ReadFramed {
                    log,
                    from: t.from,
                    // The answer must fit a tail chunk (one entry always does).
                    max_bytes: (t.max_bytes as usize).min(TAIL_FETCH_BYTES as usize),
                    purpose: ReadPurpose::Tail {
                        to: from.to_owned(),
                        scope: t.scope,
                        from: t.from,
                    },
                });
            }
            PeerMessage::TailChunk(c) => {
                let Some(log) = slot.log else { return };
                let Role::Fencing(fe) = &mut slot.role else {
                    return;
                };
                let Some(a) = &mut fe.adopting else { return };
                if a.from != from_node || c.scope.generation != slot.generation {
                    return;
                }
                if c.entries.is_empty() {
                    // Nothing more there: adopt what was reached.
                    a.target = info.map_or(a.target, |i| i.end.min(a.target));
                    a.fetching = false;
                    slot.last_sent = None;
                    self.replicas_changed = true;
                    return;
                }
                self.replicas.io.push_back(ReplicaIo::Append {
                    log,
                    base: c.base_offset,
                    entries: c.entries,
                });
            }
            PeerMessage::Follow(f) => {
                let Role::Leading(l) = &mut slot.role else {
                    let msg = refuse(pp::RefusalReason::NotOpen, slot.generation, "not open");
                    self.net.send(from, &msg);
                    return;
                };
                if f.scope.generation != l.generation() {
                    let g = l.generation();
                    let msg = refuse(pp::RefusalReason::StaleGeneration, g, "another generation");
                    self.net.send(from, &msg);
                    return;
                }
                let theirs = EpochLog {
                    epochs: from_wire(&f.epochs),
                    end: f.end,
                };
                let log_start = info.as_ref().map_or(0, |i| i.start);
                let answer = if r.kind.compacted() {
                    let complete_from = info.as_ref().map_or(0, |i| i.complete_from);
                    let storage = &f.storage_id;
                    l.follow_compacted(&from_node, storage, &theirs, log_start, complete_from)
                } else {
                    l.follow(&from_node, &f.storage_id, &theirs, log_start)
                };
                tracing::debug!(shard = %r, from, ?answer, "follow request");
                match answer {
                    Ok(answer) => {
                        let (truncate_to, rebuild) = match answer {
                            FollowAnswer::TruncateTo(at) => (at, false),
                            FollowAnswer::Rebuild { from } => {
                                info!(shard = %r, follower = %from_node, from, "rebuilding a follower's copy from this log");
                                (from, true)
                            }
                        };
                        let answer = PeerMessage::FollowFrom(pp::FollowFrom {
                            scope: f.scope.clone(),
                            truncate_to,
                            leader_end: l.epochs().end,
                            commit: l.commit(),
                            epochs: wire_epochs(&l.epochs().epochs),
                            rebuild,
                        });
                        self.net.send(from, &answer);
                    }
                    Err(FollowRefused::NotReplica) => {
                        let reason = pp::RefusalReason::NotReplica;
                        let msg = refuse(reason, l.generation(), "not counted");
                        self.net.send(from, &msg);
                    }
                }
                self.drain_leader(&r);
            }
            PeerMessage::ReplicaReport(rep) => {
                if let Role::Leading(l) = &mut slot.role {
                    l.report(
                        &from_node,
                        rep.scope.generation,
                        &rep.storage_id,
                        rep.end,
                        rep.durable_end,
                    );
                }
                self.drain_leader(&r);
            }
            PeerMessage::FollowFrom(ff) => {
                let Some((log, info)) = slot.log.zip(info) else {
                    return;
                };
                let Role::Following(f) = &mut slot.role else {
                    return;
                };
                if ff.scope.generation != f.generation() || *f.leader() != from_node {
                    return;
                }
                slot.catch_up_to = Some(ff.leader_end);
                let cut = if ff.rebuild {
                    f.rebuild_from(ff.truncate_to, info.start, info.end, info.state.commit)
                } else {
                    f.follow_from(ff.truncate_to, info.end, info.state.commit)
                };
                let level = cut.is_none() && matches!(f.state(), FollowState::Fed { .. });
                tracing::debug!(shard = %r, truncate_to = ff.truncate_to, rebuild = ff.rebuild, end = info.end, ?cut, state = ?f.state(), "fed from");
                if let FollowState::Halted { agreed, committed } = f.state() {
                    warn!(shard = %r, agreed, committed, "halted: the leader's log disagrees below this copy's commit");
                    return;
                }
                // The copy will hold the leader's epochs from the cut on (nothing of its own
                // when it starts again).
                let own = to_epoch_log(&info.state, info.end);
                let (own, at) = if ff.rebuild {
                    (&[][..], ff.truncate_to)
                } else {
                    (&own.epochs[..], ff.truncate_to.min(info.end))
                };
                let epochs = splice(own, &from_wire(&ff.epochs), at);
                if cut.is_some() {
                    slot.epochs_after_cut = Some(epochs);
                } else {
                    slot.epochs_after_cut = None;
                    let mut state = info.state.clone();
                    state.epochs = stored(&epochs);
                    if state != info.state {
                        self.persist(&r, log, state);
                    }
                }
                if let Some(to) = cut {
                    // A cut below what this copy still holds (its own retention went
                    // further than the leader's) is a restart there too.
                    self.replicas
                        .io
                        .push_back(if ff.rebuild || to < info.start {
                            ReplicaIo::RestartAt { log, start: to }
                        } else {
                            ReplicaIo::Truncate { log, to }
                        });
                }
                if level {
                    // Nothing to cut, and perhaps nothing to ship: say where this copy
                    // stands now, or a new leader whose tail is already here would wait
                    // for a write at its own generation before committing it.
                    let report = PeerMessage::ReplicaReport(pp::ReplicaReport {
                        scope: ff.scope.clone(),
                        storage_id: self.storage_hex(),
                        end: info.end,
                        durable_end: info.durable,
                    });
                    self.net.send(from, &report);
                }
            }
            PeerMessage::Replicate(rep) => {
                let Some(log) = slot.log else { return };
                let Role::Following(f) = &mut slot.role else {
                    let g = slot.generation;
                    let msg = refuse(pp::RefusalReason::NotOpen, g, "not following");
                    self.net.send(from, &msg);
                    return;
                };
                let verdict = f.shipment(
                    &from_node,
                    rep.scope.generation,
                    rep.base_offset,
                    u64::from(rep.record_count),
                );
                tracing::debug!(shard = %r, base = rep.base_offset, count = rep.record_count, ?verdict, "shipment");
                match verdict {
                    Shipment::Append if !rep.entries.is_empty() => {
                        if self.canary == crate::config::ReplicationCanary::AckBeforeDurable {
                            // The bug: say it is durable on arrival.
                            let end = rep.base_offset + u64::from(rep.record_count);
                            let report = PeerMessage::ReplicaReport(pp::ReplicaReport {
                                scope: rep.scope.clone(),
                                storage_id: self.storage_hex(),
                                end,
                                durable_end: end,
                            });
                            self.net.send(from, &report);
                        }
                        self.replicas.io.push_back(ReplicaIo::Append {
                            log,
                            base: rep.base_offset,
                            entries: rep.entries,
                        });
                    }
                    Shipment::Append | Shipment::Held => {
                        if let Some(info) = info {
                            let report = PeerMessage::ReplicaReport(pp::ReplicaReport {
                                scope: rep.scope.clone(),
                                storage_id: self.storage_hex(),
                                end: info.end,
                                durable_end: info.durable,
                            });
                            self.net.send(from, &report);
                        }
                    }
                    Shipment::Refollow => {
                        slot.last_sent = None;
                        self.replicas_changed = true;
                    }
                    Shipment::Stale => {
                        let g = slot.generation;
                        let msg = refuse(pp::RefusalReason::StaleGeneration, g, "stale");
                        self.net.send(from, &msg);
                    }
                    Shipment::NotReady | Shipment::Gap => {}
                }
            }
            PeerMessage::ReplicationRefused(rr) => {
                tracing::debug!(shard = %r, from, reason = ?rr.reason, detail = %rr.detail, "refused");
                if let Role::Following(f) = &mut slot.role {
                    if *f.leader() == from_node {
                        f.ask_again();
                    }
                }
            }
            _ => {}
        }
    }
}

/// The offsets a shipment read from `from` covers: from `from` (or its first entry, when
/// that holds `from`) to the batch's end. In a log without gaps this is exactly the
/// batch's entries; in a compacted one it takes in the offsets compaction emptied.
fn shipped_span(from: u64, batch: &felix_storage::log::FramedBatch) -> (u64, u32) {
    let base = batch.base.min(from);
    let span = batch.end.saturating_sub(base);
    (base, u32::try_from(span).unwrap_or(u32::MAX))
}

/// A cut that did not happen: a follower asks to be fed again (the answer brings the cut
/// again), a fencing leader tries its cut again on its next pass.
fn retry_cut(role: &mut Role) {
    match role {
        Role::Following(f) => f.ask_again(),
        Role::Fencing(fe) => {
            if let Some(a) = &mut fe.adopting {
                a.cutting = false;
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splicing_keeps_the_own_prefix_and_takes_the_other_copys_epochs_after_the_cut() {
        let own = [(1, 0), (2, 5)];
        let theirs = [(1, 0), (3, 4), (4, 9)];
        assert_eq!(splice(&own, &theirs, 4), [(1, 0), (3, 4), (4, 9)]);
        assert_eq!(splice(&own, &theirs, 6), [(1, 0), (2, 5), (3, 6), (4, 9)]);
        assert_eq!(splice(&own, &[], 3), [(1, 0)]);
        assert_eq!(last_generation(&[(1, 0), (3, 4)], 4), 1);
        assert_eq!(last_generation(&[(1, 0), (3, 4)], 5), 3);
        assert_eq!(last_generation(&[], 0), 0);
    }
}
