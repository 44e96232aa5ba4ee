//! This node's copies of replicated shards, wired to the peer links, the broker's logs and
//! the control plane (docs/replication.md).
//!
//! Only streams with more than one replica, on a node with durable storage, take part; a
//! shard with one replica is served from its leader's log as on a single node. Each log's copy
//! is felix-cluster's [`LogCopy`] (`replication/copy.rs`), which takes every decision: this
//! file feeds it the metadata's view of its shard, its log's position, peer messages and
//! completed log work, and carries its outputs to `self.net`, to [`ReplicaIo`] (the log work
//! the engine does on the broker's logs and reports back) and to the control plane.
//! `ready.rs` answers sessions (may a write be served here) and observers from the copies.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use felix_cluster::meta::{Consistency, ObjectKey, ObjectKind, ShardMeta, ShardRef};
use felix_cluster::replication::copy::{
    self, CopyOutput, CopySettings, Here, LogCopy, Pass, ShardView,
};
use felix_cluster::replication::leader::LeaderSettings;
use felix_cluster::replication::Replica;
use felix_cluster::NodeId;
use felix_peer_proto as pp;
use felix_peer_proto::PeerMessage;
use felix_storage::log::{ReadTicket, ReplicaEvent};
use felix_storage::ops::LogId;

use super::ClusterNode;

mod io;
mod quiet;
mod ready;
use crate::broker::LogInfo;
pub(crate) use felix_cluster::replication::copy::{CopyKind, ReadPurpose};
pub(crate) use io::ReplicaIo;
use io::{copy_state, framed_batch, log_pos};
pub(crate) use ready::ReplicationStats;

/// One replicated log of one shard: the key of a replica slot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct CopyRef {
    pub(crate) shard: ShardRef,
    pub(crate) kind: CopyKind,
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
/// How often a leader tells its followers where its log starts when it has not moved (it
/// also says so at once when retention moves it, and after answering a `follow`): a copy
/// busy cutting when the first word came still starts where its leader does soon after.
pub(crate) const LOG_START_RESEND: Duration = Duration::from_secs(5);

/// What the broker's logs can tell replication.
pub(crate) trait LogView {
    fn info(&self, log: LogId) -> Option<LogInfo>;
}

/// One copy here: its log once open, and the copy's state.
struct Slot {
    log: Option<LogId>,
    copy: LogCopy,
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
    opened: BTreeSet<(ShardRef, u64)>,
    /// `leader` shards led here: their quiescence (`quiet.rs`).
    quiet: BTreeMap<ShardRef, quiet::ShardQuiet>,
    quiet_after: Duration,
    /// This node as its copies see it, for the disk it was worked out for.
    here: Option<([u8; 16], Here)>,
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
            opened: BTreeSet::new(),
            quiet: BTreeMap::new(),
            quiet_after,
            here: None,
        }
    }
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
                        [CopyKind::Records, CopyKind::Groups].map(|kind| {
                            let copy = CopyRef {
                                shard: shard.clone(),
                                kind,
                            };
                            (copy, m.clone())
                        })
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
        scope.shard.kind = copy.kind.wire();
        scope
    }

    /// This node as its copies see it.
    fn here(&mut self) -> Here {
        let disk = self
            .metalog
            .as_ref()
            .map_or(self.storage_id, |l| l.storage_id());
        match &self.replicas.here {
            Some((d, here)) if *d == disk => here.clone(),
            _ => {
                let here = Here {
                    me: self.me.clone(),
                    storage_id: self.storage_hex(),
                };
                self.replicas.here = Some((disk, here.clone()));
                here
            }
        }
    }

    /// The metadata's view of a shard, for its copies.
    fn shard_view(&self, shard: &ShardRef, m: &ShardMeta) -> ShardView {
        let meta = self.meta();
        let quorum = match shard.kind {
            ObjectKind::Stream => meta
                .streams
                .get(&shard.key)
                .is_some_and(|s| s.spec.consistency == Consistency::Quorum),
            ObjectKind::Cache => false,
        };
        ShardView {
            generation: m.generation,
            leader: m.leader.clone(),
            replicas: m
                .replicas
                .iter()
                .map(|n| Replica {
                    node: n.clone(),
                    storage_id: m.storage_of(n).unwrap_or("").to_owned(),
                })
                .collect(),
            member_disks: m
                .replicas
                .iter()
                .filter_map(|n| Some((n.clone(), meta.members.get(n)?.storage_id.clone())))
                .collect(),
            quorum,
        }
    }

    fn copy_settings(&self) -> CopySettings {
        use crate::config::ReplicationCanary;
        CopySettings {
            leader: self.replicas.settings,
            retry: REPLICATION_RETRY,
            log_start_resend: LOG_START_RESEND,
            tail_fetch_bytes: TAIL_FETCH_BYTES,
            canary: match self.canary {
                ReplicationCanary::PromoteBehind => copy::CopyCanary::PromoteBehind,
                ReplicationCanary::AckBeforeDurable => copy::CopyCanary::AckBeforeDurable,
                _ => copy::CopyCanary::None,
            },
        }
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
                if let Some(slot) = self.slot_of(*log) {
                    slot.copy.gate_handed_over();
                }
            }
            _ => {}
        }
        Some(io)
    }

    pub(crate) fn replication_timeout(&self) -> Option<Instant> {
        let leaders = self
            .replicas
            .slots
            .values()
            .filter_map(|s| s.copy.poll_timeout());
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
            if let Some(slot) = self.replicas.slots.get_mut(&r) {
                slot.copy.handle_timeout(now);
            }
            self.drain_copy(&r);
        }
        self.note_caught_up();
    }

    /// Brings every slot in line with the metadata, and passes over each.
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
            if let Some(slot) = self.replicas.slots.get_mut(&r) {
                slot.copy.step_down(None);
            }
            self.drain_copy(&r);
            self.replicas.slots.remove(&r);
        }
        for (r, m) in wanted {
            if !self.replicas.slots.contains_key(&r) {
                let wire = self.shard_scope(&r, 0).shard;
                let copy = LogCopy::new(r.shard.clone(), r.kind, wire, self.copy_settings());
                let slot = Slot { log: None, copy };
                self.replicas.slots.insert(r.clone(), slot);
            }
            let slot = self.replicas.slots.get_mut(&r).expect("present");
            slot.copy.set_generation(m.generation);
            let log = slot.log;
            self.drain_copy(&r);
            let Some(info) = log.and_then(|log| logs.info(log)) else {
                self.replicas.io.push_back(ReplicaIo::Open { copy: r });
                continue;
            };
            self.pass(now, &r, &m, &info);
        }
    }

    /// One pass over a copy whose log is open.
    fn pass(&mut self, now: Instant, r: &CopyRef, m: &ShardMeta, info: &LogInfo) {
        let here = self.here();
        let view = self.shard_view(&r.shard, m);
        let pos = log_pos(info);
        let opened_here = self
            .replicas
            .opened
            .contains(&(r.shard.clone(), m.generation));
        let rider_counted: Option<Vec<Replica>> = (r.kind == r.kind.primary())
            .then(|| {
                let rider = CopyRef {
                    shard: r.shard.clone(),
                    kind: r.kind.rider(),
                };
                let slot = self.replicas.slots.get(&rider)?;
                Some(
                    slot.copy
                        .leader()
                        .map_or_else(Vec::new, |l| l.counted_storage().cloned().collect()),
                )
            })
            .flatten();
        let pass = Pass {
            here: &here,
            view: &view,
            pos: &pos,
            opened_here,
            rider_counted: rider_counted.as_deref(),
        };
        if let Some(slot) = self.replicas.slots.get_mut(r) {
            slot.copy.advance(now, pass);
        }
        self.drain_copy(r);
    }

    /// Carries a copy's outputs to the peers, the logs and the control plane.
    fn drain_copy(&mut self, r: &CopyRef) {
        loop {
            let Some(slot) = self.replicas.slots.get_mut(r) else {
                return;
            };
            let log = slot.log;
            let Some(out) = slot.copy.poll_output() else {
                return;
            };
            match out {
                CopyOutput::Send { to, message } => self.net.send(to.as_str(), &message),
                CopyOutput::Io(io) => {
                    if let Some(log) = log {
                        let io = self.replica_io(r, log, io);
                        self.replicas.io.push_back(io);
                    }
                }
                CopyOutput::Propose(command) => {
                    if let (Some(now), Some(control)) = (self.replicas.now, self.control.as_mut()) {
                        control.want(command, now);
                    }
                }
                CopyOutput::Recheck => self.replicas_changed = true,
                CopyOutput::Event(event) => self.copy_event(r, event),
            }
        }
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

    /// The engine opened (or found) the shard's log.
    pub(crate) fn replica_log(&mut self, copy: &CopyRef, log: LogId) {
        if let Some(slot) = self.replicas.slots.get_mut(copy) {
            slot.log = Some(log);
            slot.copy.log_opened();
            self.replicas.by_log.insert(log, copy.clone());
        }
    }

    pub(crate) fn read_started(&mut self, log: LogId, ticket: ReadTicket, purpose: ReadPurpose) {
        self.replicas.reads.insert((log, ticket.0), purpose);
    }

    pub(crate) fn read_failed(&mut self, log: LogId, purpose: ReadPurpose) {
        if let ReadPurpose::Ship { to, .. } = purpose {
            if let Some(slot) = self.slot_of(log) {
                slot.copy.read_failed(&to);
            }
        }
    }

    fn slot_of(&mut self, log: LogId) -> Option<&mut Slot> {
        let r = self.replicas.by_log.get(&log)?;
        self.replicas.slots.get_mut(r)
    }

    /// Feeds the copy of `log` one input, then carries its outputs.
    fn with_copy(&mut self, log: LogId, input: impl FnOnce(&mut LogCopy)) {
        let Some(r) = self.replicas.by_log.get(&log).cloned() else {
            return;
        };
        if let Some(slot) = self.replicas.slots.get_mut(&r) {
            input(&mut slot.copy);
        }
        self.drain_copy(&r);
    }

    /// A publish on a gated log is owed an answer once `end` is committed.
    pub(crate) fn replica_owes(&mut self, log: LogId, end: u64) {
        let Some(now) = self.replicas.now else {
            return;
        };
        if let Some(slot) = self.slot_of(log) {
            slot.copy.owes(now, end);
        }
    }

    /// The log of a shard led here is durable below `up_to` on this node.
    pub(crate) fn local_durable(&mut self, log: LogId, up_to: u64) {
        self.with_copy(log, |c| c.local_durable(up_to));
    }

    /// An ungated log is durable below `up_to`: a follower reports it.
    pub(crate) fn log_durable(&mut self, log: LogId, up_to: u64, end: u64) {
        let here = self.here();
        self.with_copy(log, |c| c.log_durable(&here, up_to, end));
    }

    /// The engine appended shipped or fetched entries (or could not).
    pub(crate) fn replica_appended(&mut self, log: LogId, result: Result<u64, String>) {
        self.with_copy(log, |c| c.appended(result));
    }

    /// The log refused a cut for now (busy with a write, a sync or a read): the slot asks
    /// again on its next pass instead of waiting for a truncation that will never come.
    pub(crate) fn truncation_refused(&mut self, log: LogId) {
        self.with_copy(log, |c| c.truncation_refused());
    }

    /// The log refused a replica state write: the copy stops waiting for it.
    pub(crate) fn state_refused(&mut self, log: LogId, detail: String) {
        self.with_copy(log, |c| c.state_refused(detail));
    }

    /// A replication event from a log: a framed read, a truncation, a durable state.
    pub(crate) fn replica_event(
        &mut self,
        now: Instant,
        log: LogId,
        event: ReplicaEvent,
        logs: &dyn LogView,
    ) {
        let pos = || logs.info(log).map(|i| log_pos(&i));
        match event {
            ReplicaEvent::Framed { ticket, result } => {
                let Some(purpose) = self.replicas.reads.remove(&(log, ticket.0)) else {
                    return;
                };
                match purpose {
                    ReadPurpose::Ship { to, from } => {
                        let result = framed_batch(result);
                        self.with_copy(log, |c| c.framed(now, to, from, result, pos().as_ref()));
                    }
                    ReadPurpose::Tail { to, scope, from } => {
                        let end = self
                            .replicas
                            .by_log
                            .get(&log)
                            .and_then(|_| logs.info(log))
                            .map_or(0, |i| i.end);
                        let chunk = copy::tail_chunk(scope, from, framed_batch(result), end);
                        self.net.send(to.as_str(), &PeerMessage::TailChunk(chunk));
                    }
                }
            }
            ReplicaEvent::Truncated { result } => {
                let result = result.map_err(|e| format!("{e:?}"));
                self.with_copy(log, |c| c.truncated(result, pos().as_ref()));
            }
            ReplicaEvent::Written { up_to } => self.with_copy(log, |c| c.written(up_to)),
            ReplicaEvent::StateDurable(state) => {
                let Some(r) = self.replicas.by_log.get(&log).cloned() else {
                    return;
                };
                let here = self.here();
                let view = self
                    .meta()
                    .shard(&r.shard)
                    .map(|m| self.shard_view(&r.shard, m));
                let pos = pos();
                if let Some(slot) = self.replicas.slots.get_mut(&r) {
                    let state = copy_state(&state);
                    slot.copy
                        .state_durable(&here, state, view.as_ref(), pos.as_ref());
                }
                self.drain_copy(&r);
                self.replicas_changed = true;
            }
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
        let here = self.here();
        let Some(slot) = self.replicas.slots.get_mut(&r) else {
            if !matches!(message, PeerMessage::ReplicationRefused(_)) {
                let msg = PeerMessage::ReplicationRefused(pp::ReplicationRefused {
                    scope,
                    reason: pp::RefusalReason::NotReplica,
                    current_generation: 0,
                    detail: "no copy of this shard here".to_owned(),
                });
                self.net.send(from, &msg);
            }
            return;
        };
        let pos = slot.log.and_then(|l| logs.info(l)).map(|i| log_pos(&i));
        if let PeerMessage::ReplicationRefused(rr) = &message {
            tracing::debug!(shard = %r, from, reason = ?rr.reason, detail = %rr.detail, "refused");
        }
        slot.copy
            .handle_message(&here, &NodeId::new(from), message, pos.as_ref());
        self.drain_copy(&r);
    }
}
