//! One replicated log's copy on this node, as plain state: the role it plays at the
//! metadata's generation (preparing, fencing and adopting, leading, following, idle), and
//! every decision that role takes — when to persist a fence, whom to fence, whose tail to
//! adopt and where to cut for it, when to open, what to answer a follower, where a follower
//! cuts or restarts, when a copy rebuilt elsewhere is recorded.
//!
//! The engine feeds it (docs/replication.md):
//! - the metadata's view of the shard ([`ShardView`]: generation, leader, replicas and the
//!   storage identity recorded for each) and this node's own ([`Here`]),
//! - the log's position ([`LogPos`]: start, end, durable end, the replica state),
//! - peer replication messages ([`LogCopy::handle_message`]),
//! - completed log work (`appended`, `truncated`, `state_durable`, `framed`, …),
//! - time, as the `now` of each input.
//!
//! It never sends, reads or writes in place: what it decides leaves through
//! [`LogCopy::poll_output`] as a [`CopyOutput`] — a message to a peer by node id, log work
//! ([`CopyIo`]), a metadata proposal, or an event the engine counts or logs. The engine
//! drains the outputs after every input, in order; their order is the order the decisions
//! were taken in.
//!
//! The leader's and the follower's own bookkeeping is [`ShardLeader`] and [`ShardFollower`];
//! a fence's outcome is [`fence::fence_outcome`], where two logs stop agreeing is
//! [`agreed_prefix`]. This module is what joins them into one copy's life.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_peer_proto as pp;
use felix_peer_proto::PeerMessage;

use super::divergence::{agreed_prefix, EpochLog};
use super::fence::{self, FenceOutcome, LogPosition};
use super::follower::{FollowState, ShardFollower, Shipment};
use super::leader::{FollowAnswer, FollowRefused, LeaderOutput, LeaderSettings, ShardLeader};
use super::Replica;
use crate::meta::{Command, ShardRef};
use crate::NodeId;

/// Which of a shard's logs a copy is of. A stream shard's consumer-group log rides the
/// shard: same replica set, leader, generation and consistency, fenced and fed like the
/// records, so a group's ack on a quorum stream promises what a quorum publish does. A
/// cache's values and its counters are two logs of its shard in the same way, at `leader`
/// consistency (a cache declares none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CopyKind {
    Records,
    Groups,
    Values,
    Counters,
}

impl CopyKind {
    /// A log compaction rewrites: fed on only from its end, rebuilt rather than cut
    /// (`ShardLeader::follow_compacted`), and read as a projection rebuilt when led here.
    pub fn compacted(self) -> bool {
        self != CopyKind::Records
    }

    /// The log that speaks for the shard's copy (the others ride it): a new disk is recorded
    /// once every log of the shard led here has fed it level.
    pub fn primary(self) -> CopyKind {
        match self {
            CopyKind::Records | CopyKind::Groups => CopyKind::Records,
            CopyKind::Values | CopyKind::Counters => CopyKind::Values,
        }
    }

    /// The log that rides the primary one.
    pub fn rider(self) -> CopyKind {
        match self {
            CopyKind::Records | CopyKind::Groups => CopyKind::Groups,
            CopyKind::Values | CopyKind::Counters => CopyKind::Counters,
        }
    }

    /// The wire's name for this log of a shard.
    pub fn wire(self) -> pp::ShardKind {
        match self {
            CopyKind::Records => pp::ShardKind::Stream,
            CopyKind::Groups => pp::ShardKind::StreamGroups,
            CopyKind::Values => pp::ShardKind::Cache,
            CopyKind::Counters => pp::ShardKind::CacheCounters,
        }
    }
}

/// The simulator's canaries: each breaks one safety rule on purpose, so that its invariant
/// must catch it. Product configurations hold [`CopyCanary::None`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CopyCanary {
    #[default]
    None,
    /// A promoted leader opens without waiting for its fence (nor adopting a longer log).
    PromoteBehind,
    /// A follower reports shipped entries durable on arrival.
    AckBeforeDurable,
}

/// How a copy paces itself (each a named limit in the engine's settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopySettings {
    pub leader: LeaderSettings,
    /// How often unanswered requests (follow, fence, tail fetch) are sent again.
    pub retry: Duration,
    /// How often a leader tells its followers where its log starts when it has not moved
    /// (it also says so at once when retention moves it, and after answering a `follow`).
    pub log_start_resend: Duration,
    /// The most a tail fetch asks for at once.
    pub tail_fetch_bytes: u32,
    pub canary: CopyCanary,
}

/// This node: its id and the storage identity of its disk (hex), as the engine knows it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Here {
    pub me: NodeId,
    pub storage_id: String,
}

/// The metadata's view of the copy's shard.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardView {
    pub generation: u64,
    pub leader: Option<NodeId>,
    /// The replica set in the metadata's order, each with the storage identity the metadata
    /// records for its copy ("" when none is recorded).
    pub replicas: Vec<Replica>,
    /// The disk each replica's membership names now (absent: not a member).
    pub member_disks: BTreeMap<NodeId, String>,
    /// The shard is at `quorum` consistency (a cache never is).
    pub quorum: bool,
}

/// The replica state file's content (felix-storage's `ReplicaState`, as plain values).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CopyState {
    pub fence_generation: u64,
    pub commit: u64,
    /// `(generation, start offset)`, ascending.
    pub epochs: Vec<(u64, u64)>,
    pub log_start: u64,
}

/// Where the copy's log stands.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogPos {
    /// The oldest offset it still holds.
    pub start: u64,
    /// The next offset it would write.
    pub end: u64,
    /// Its own durable end.
    pub durable: u64,
    /// The replica state as durably held.
    pub state: CopyState,
    /// Nothing queued or in flight: a truncation may start.
    pub idle: bool,
    /// From here on the log holds every record (below, compaction may have dropped some).
    pub complete_from: u64,
}

/// One pass over a copy whose log is open: what the metadata and the log say now.
#[derive(Debug, Clone, Copy)]
pub struct Pass<'a> {
    pub here: &'a Here,
    pub view: &'a ShardView,
    pub pos: &'a LogPos,
    /// This process opened the shard's records as their leader at the view's generation.
    pub opened_here: bool,
    /// For a primary log: what the shard's rider log counts when it is led here (empty when
    /// it is there but not leading; `None` when there is no rider copy here).
    pub rider_counted: Option<&'a [Replica]>,
}

/// What a framed read is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadPurpose {
    /// Shipping to a follower (the leader asked from `from`).
    Ship { to: NodeId, from: u64 },
    /// Answering a promoted leader's tail fetch.
    Tail {
        to: NodeId,
        scope: pp::ShardScope,
        from: u64,
    },
}

/// A framed read's result: whole entries from `base` to `end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Framed {
    pub base: u64,
    pub end: u64,
    pub entries: Bytes,
}

/// Log work the copy asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyIo {
    /// Write the replica state; answer with [`LogCopy::state_durable`].
    Persist(CopyState),
    /// A framed read; answer with [`LogCopy::framed`] (or [`LogCopy::read_failed`]).
    Read {
        from: u64,
        max_bytes: usize,
        purpose: ReadPurpose,
    },
    /// Append shipped or fetched entries; answer with [`LogCopy::appended`].
    Append {
        base: u64,
        entries: Bytes,
    },
    /// Cut the log at `to`; answer with [`LogCopy::truncated`].
    Truncate {
        to: u64,
    },
    /// Start the copy where its leader's log starts.
    TrimTo {
        start: u64,
    },
    /// Drop the whole copy and start again, empty, at `start`; answered as a truncation.
    RestartAt {
        start: u64,
    },
    /// A leadership starts: the broker holds answers for the commit mark.
    Gate {
        committed: u64,
    },
    Ungate,
    /// Keep compaction of a led log below what every follower holds durably.
    BoundCompaction {
        below: u64,
    },
    /// The leadership here ended; its readers go to the node that fenced it at a
    /// generation, or (`None`) wherever the metadata says.
    Moved {
        fenced_by: Option<(NodeId, u64)>,
    },
    Committed {
        up_to: u64,
    },
    TimedOut {
        up_to: u64,
    },
}

/// What the engine counts or logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyEvent {
    /// A leadership opened here (requests parked for the shard may go).
    Leading {
        generation: u64,
        end: u64,
    },
    SteppedDown {
        generation: u64,
    },
    /// Records some copy knew acknowledged that no copy that answered the fence holds.
    Abandoned {
        generation: u64,
        from: u64,
        to: u64,
    },
    /// A follower's leader would have it cut below its commit mark: it stops instead.
    Halted {
        agreed: u64,
        committed: u64,
    },
    /// A follower's copy is rebuilt from this leader's log start.
    Rebuilding {
        follower: NodeId,
        from: u64,
    },
    /// A read for a follower failed: it is told to ask again.
    NotShipped {
        to: NodeId,
        detail: String,
    },
    /// Shipped (or, adopting, fetched) entries were not appended.
    NotAppended {
        adopting: bool,
        detail: String,
    },
    /// A cut failed; it is tried again.
    CutFailed {
        detail: String,
    },
    /// The log refused a replica state write; the copy decides again.
    StateRefused {
        detail: String,
    },
    /// Quorum publishes ran out of time.
    QuorumTimeout,
}

/// What a copy hands its engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyOutput {
    Send {
        to: NodeId,
        message: PeerMessage,
    },
    Io(CopyIo),
    /// A metadata command for the control plane (asked again on every pass until applied).
    Propose(Command),
    /// The copy should be passed over again soon (not at the next retry).
    Recheck,
    Event(CopyEvent),
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

#[derive(Debug)]
enum Role {
    /// Waiting for the log, or for this node's fence at the generation to be durable.
    Preparing,
    Fencing(Fencing),
    Leading(ShardLeader),
    Following(ShardFollower),
    /// Not serving it at this generation (no leader, or halted).
    Idle,
}

/// One replicated log's copy on this node: see the module.
#[derive(Debug)]
pub struct LogCopy {
    shard: ShardRef,
    kind: CopyKind,
    /// The shard's wire id (the generation is added per message).
    wire: pp::ShardId,
    settings: CopySettings,
    /// The engine opened (or found) the log.
    log_open: bool,
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
    /// The compaction bound last handed to a led compacted log.
    compaction_bound: Option<u64>,
    /// A follower's target for readiness: where its leader's log ended when it answered this
    /// copy's request to be fed at this generation.
    catch_up_to: Option<u64>,
    /// A leader's log start as last told to its followers, and when (`log_start`).
    announced_start: Option<(u64, Instant)>,
    out: VecDeque<CopyOutput>,
}

/// The generation the record before `end` was written at (0 for an empty log).
pub fn last_generation(epochs: &[(u64, u64)], end: u64) -> u64 {
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
pub fn splice(own: &[(u64, u64)], theirs: &[(u64, u64)], cut: u64) -> Vec<(u64, u64)> {
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

/// The offsets a shipment read from `from` covers: from `from` (or its first entry, when
/// that holds `from`) to the batch's end. In a log without gaps this is exactly the
/// batch's entries; in a compacted one it takes in the offsets compaction emptied.
pub fn shipped_span(from: u64, batch: &Framed) -> (u64, u32) {
    let base = batch.base.min(from);
    let span = batch.end.saturating_sub(base);
    (base, u32::try_from(span).unwrap_or(u32::MAX))
}

/// The answer to a tail fetch from `from`, read as `result`, with the log ending at `end`.
pub fn tail_chunk(
    scope: pp::ShardScope,
    from: u64,
    result: Result<Framed, String>,
    end: u64,
) -> pp::TailChunk {
    match result {
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
    }
}

fn epoch_log(state: &CopyState, end: u64) -> EpochLog {
    EpochLog {
        epochs: state.epochs.clone(),
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

fn refusal(
    scope: &pp::ShardScope,
    reason: pp::RefusalReason,
    current: u64,
    detail: &str,
) -> PeerMessage {
    PeerMessage::ReplicationRefused(pp::ReplicationRefused {
        scope: scope.clone(),
        reason,
        current_generation: current,
        detail: detail.to_owned(),
    })
}

impl LogCopy {
    /// A copy of `kind` of `shard`, preparing, its log not open yet.
    pub fn new(
        shard: ShardRef,
        kind: CopyKind,
        wire: pp::ShardId,
        settings: CopySettings,
    ) -> LogCopy {
        LogCopy {
            shard,
            kind,
            wire,
            settings,
            log_open: false,
            generation: 0,
            role: Role::Preparing,
            persisting: false,
            last_sent: None,
            gated: false,
            epochs_after_cut: None,
            compaction_bound: None,
            catch_up_to: None,
            announced_start: None,
            out: VecDeque::new(),
        }
    }

    // ---- outputs ----

    /// The next thing the copy asks of its engine.
    #[must_use]
    pub fn poll_output(&mut self) -> Option<CopyOutput> {
        self.out.pop_front()
    }

    /// When the led log's quorum deadline is due (feed it to [`LogCopy::handle_timeout`]).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.role {
            Role::Leading(l) => l.poll_timeout(),
            _ => None,
        }
    }

    // ---- getters ----

    pub fn kind(&self) -> CopyKind {
        self.kind
    }

    /// The metadata's generation the copy's role is for.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The leadership here, when leading.
    pub fn leader(&self) -> Option<&ShardLeader> {
        match &self.role {
            Role::Leading(l) => Some(l),
            _ => None,
        }
    }

    /// The leadership here, when leading (a `leader` shard's quiescence holds its answers).
    pub fn leader_mut(&mut self) -> Option<&mut ShardLeader> {
        match &mut self.role {
            Role::Leading(l) => Some(l),
            _ => None,
        }
    }

    /// Writes may be served here at `generation`: led at it, and its gate handed over.
    pub fn writable_at(&self, generation: u64) -> bool {
        matches!(&self.role, Role::Leading(l) if l.generation() == generation) && self.gated
    }

    /// The copy has caught up at `generation`: a follower holds what its leader's log held
    /// when it answered this copy's request to be fed, a leader has opened. A copy without a
    /// leader, following a node marked down (`leader_down`), or halted does not hold
    /// readiness back: waiting would not change it.
    pub fn caught_up(&self, generation: u64, leader_down: bool) -> bool {
        if self.generation != generation {
            return false;
        }
        match &self.role {
            Role::Idle => true,
            Role::Leading(_) => self.gated,
            Role::Preparing | Role::Fencing(_) => leader_down,
            Role::Following(f) => match f.state() {
                FollowState::Halted { .. } => true,
                FollowState::Fed { end } => {
                    self.catch_up_to.is_some_and(|to| end >= to) || leader_down
                }
                FollowState::Asking
                | FollowState::Truncating { .. }
                | FollowState::Rebuilding { .. } => leader_down,
            },
        }
    }

    /// The role's name for observers, and the commit mark when leading.
    pub fn role_name(&self) -> (&'static str, Option<u64>) {
        match &self.role {
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
        }
    }

    // ---- commands and inputs ----

    /// The engine opened (or found) the copy's log.
    pub fn log_opened(&mut self) {
        self.log_open = true;
    }

    /// The metadata's generation for the shard is `generation`: at a new one, a leadership
    /// here ends and the copy starts preparing again.
    pub fn set_generation(&mut self, generation: u64) {
        if self.generation == generation {
            return;
        }
        self.generation = generation;
        self.step_down(None);
        self.role = Role::Preparing;
        self.last_sent = None;
        self.catch_up_to = None;
    }

    /// The copy's leadership ends (a new generation, or the copy left this node): what it
    /// owed clients is answered `quorum_timeout` (outcome unknown), the log is ungated, and its
    /// readers are sent on (to `fenced_by` when a fence from the next leader said so first).
    pub fn step_down(&mut self, fenced_by: Option<(NodeId, u64)>) {
        let led = match &self.role {
            Role::Leading(l) if self.log_open => Some(l.generation()),
            _ => None,
        };
        self.role = Role::Preparing;
        self.gated = false;
        let Some(generation) = led else {
            return;
        };
        self.event(CopyEvent::SteppedDown { generation });
        self.io(CopyIo::TimedOut { up_to: u64::MAX });
        self.io(CopyIo::Ungate);
        self.io(CopyIo::Moved { fenced_by });
    }

    /// The engine handed the broker this copy's `Gate`.
    pub fn gate_handed_over(&mut self) {
        self.gated = matches!(self.role, Role::Leading(_));
    }

    /// What the copy does next, from where it is (a pass: on every retry, and when something
    /// changed).
    pub fn advance(&mut self, now: Instant, pass: Pass<'_>) {
        if self.persisting {
            return;
        }
        let resend = self
            .last_sent
            .is_none_or(|t| now.saturating_duration_since(t) >= self.settings.retry);
        let generation = pass.view.generation;
        let fence = pass.pos.state.fence_generation;
        match (&pass.view.leader, fence.cmp(&generation)) {
            (None, _) => self.role = Role::Idle,
            // This node took a fence above what its metadata says: it waits to catch up.
            (Some(_), std::cmp::Ordering::Greater) => {}
            (Some(_), std::cmp::Ordering::Less) => {
                let mut state = pass.pos.state.clone();
                state.fence_generation = generation;
                self.persist(state);
            }
            (Some(leader), std::cmp::Ordering::Equal) if *leader == pass.here.me => {
                self.lead(now, pass, resend);
            }
            (Some(leader), std::cmp::Ordering::Equal) => {
                let leader = leader.clone();
                self.follow(now, pass, leader, resend);
            }
        }
    }

    /// A replica state write is durable: a leader that was opening opens. `view` is the
    /// metadata's view of the shard now (`None`: no longer in it), `pos` the log's.
    pub fn state_durable(
        &mut self,
        here: &Here,
        state: CopyState,
        view: Option<&ShardView>,
        pos: Option<&LogPos>,
    ) {
        self.persisting = false;
        if let (Some(view), Some(pos)) = (view, pos) {
            self.open_leadership(here, &state, view, pos);
        }
        self.out.push_back(CopyOutput::Recheck);
    }

    /// The log refused the replica state last asked for (it was not open, or the state went
    /// back or out of order): nothing was written, and no durable answer will come. A copy
    /// opening a leadership starts it over from the log's state as it is; any other decides
    /// again on its next pass. Either way it no longer waits for the write.
    pub fn state_refused(&mut self, detail: String) {
        if !self.persisting {
            return;
        }
        self.persisting = false;
        if matches!(self.role, Role::Fencing(_)) {
            self.role = Role::Preparing;
        }
        self.event(CopyEvent::StateRefused { detail });
    }

    /// The log refused a cut for now (busy with a write, a sync or a read): asked again on
    /// the next pass instead of waiting for a truncation that will never come.
    pub fn truncation_refused(&mut self) {
        self.retry_cut();
    }

    /// A cut (or restart) of the log ended; `pos` is the log's position after it.
    pub fn truncated(&mut self, result: Result<u64, String>, pos: Option<&LogPos>) {
        let mut cut_epochs = None;
        match (&mut self.role, result) {
            (Role::Following(f), Ok(end)) => {
                f.truncated(end);
                cut_epochs = self.epochs_after_cut.take();
            }
            (Role::Fencing(fe), Ok(_)) => {
                if let Some(a) = &mut fe.adopting {
                    a.cutting = false;
                    a.cut = true;
                }
            }
            (_, Err(detail)) => {
                self.event(CopyEvent::CutFailed { detail });
                self.retry_cut();
            }
            _ => {}
        }
        self.last_sent = None;
        self.out.push_back(CopyOutput::Recheck);
        if let (Some(epochs), Some(pos)) = (cut_epochs, pos) {
            let mut state = pos.state.clone();
            state.epochs = epochs;
            if state != pos.state {
                self.persist(state);
            }
        }
    }

    /// Shipped or fetched entries were appended up to `Ok(end)` (or were not).
    pub fn appended(&mut self, result: Result<u64, String>) {
        match (&mut self.role, result) {
            (Role::Following(f), Ok(end)) => f.appended(end),
            (Role::Following(f), Err(detail)) => {
                f.ask_again();
                self.last_sent = None;
                let adopting = false;
                self.event(CopyEvent::NotAppended { adopting, detail });
            }
            (Role::Fencing(fe), Ok(_)) => {
                if let Some(a) = &mut fe.adopting {
                    a.fetching = false;
                }
                self.last_sent = None;
                self.out.push_back(CopyOutput::Recheck);
            }
            (Role::Fencing(fe), Err(detail)) => {
                if let Some(a) = &mut fe.adopting {
                    a.fetching = false;
                }
                self.last_sent = None;
                let adopting = true;
                self.event(CopyEvent::NotAppended { adopting, detail });
            }
            _ => {}
        }
    }

    /// A led log wrote (not yet synced) up to `up_to`: shipping may run ahead of the sync.
    pub fn written(&mut self, up_to: u64) {
        if let Role::Leading(l) = &mut self.role {
            l.written(up_to);
        }
        self.drain_leader();
    }

    /// A led log is durable below `up_to` here.
    pub fn local_durable(&mut self, up_to: u64) {
        if let Role::Leading(l) = &mut self.role {
            l.durable(up_to);
        }
        self.drain_leader();
    }

    /// A publish on the gated log is owed an answer once `end` is committed.
    pub fn owes(&mut self, now: Instant, end: u64) {
        if let Role::Leading(l) = &mut self.role {
            l.appended(now, end, true);
        }
    }

    /// An ungated log is durable below `up_to` (its end `end`): a follower being fed
    /// reports it to its leader.
    pub fn log_durable(&mut self, here: &Here, up_to: u64, end: u64) {
        let Role::Following(f) = &self.role else {
            return;
        };
        if !matches!(f.state(), FollowState::Fed { .. }) {
            return;
        }
        let to = f.leader().clone();
        let report = PeerMessage::ReplicaReport(pp::ReplicaReport {
            scope: self.scope(f.generation()),
            storage_id: here.storage_id.clone(),
            end,
            durable_end: up_to,
        });
        self.send(to, report);
    }

    /// A read for a follower could not start.
    pub fn read_failed(&mut self, to: &NodeId) {
        if let Role::Leading(l) = &mut self.role {
            l.ship_failed(to);
        }
    }

    /// Time passed: quorum deadlines.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Role::Leading(l) = &mut self.role {
            l.handle_timeout(now);
        }
        self.drain_leader();
    }

    /// A framed read for shipping to `to` from `from` ended; `pos` is the log's position.
    pub fn framed(
        &mut self,
        now: Instant,
        to: NodeId,
        from: u64,
        result: Result<Framed, String>,
        pos: Option<&LogPos>,
    ) {
        let generation = match &self.role {
            Role::Leading(l) => l.generation(),
            _ => return,
        };
        let scope = self.scope(generation);
        // Compaction passed this follower's end since it was last told where to be fed
        // from (the bound lags the reports): it must ask again, and is rebuilt.
        let compacted_past =
            self.kind.compacted() && pos.is_some_and(|i| from != i.start && from < i.complete_from);
        let Role::Leading(l) = &mut self.role else {
            return;
        };
        if !l.expects_read(&to, from) {
            return;
        }
        let refused = |detail: &str| {
            let reason = pp::RefusalReason::NotOpen;
            refusal(&scope, reason, generation, detail)
        };
        match result {
            Ok(_) if compacted_past => {
                l.ship_failed(&to);
                let msg = refused("its next record is in a compacted part of the log");
                self.send(to, msg);
            }
            Ok(batch) if !batch.entries.is_empty() => {
                // A compacted log (a group log) can have a gap between `from` and its first
                // entry, and between entries: the shipment spans them, so the follower's end
                // moves to the batch's end (it fills the gaps).
                let (base_offset, record_count) = shipped_span(from, &batch);
                let msg = PeerMessage::Replicate(pp::Replicate {
                    scope,
                    base_offset,
                    record_count,
                    commit: l.commit(),
                    entries: batch.entries.clone(),
                });
                l.shipped(now, &to, from, batch.end, batch.entries.len() as u64);
                self.send(to, msg);
            }
            Ok(_) => l.shipped(now, &to, from, from, 0),
            Err(detail) => {
                // Its next record is gone from this log (retention moved the start past it
                // since it asked): it asks again, and is rebuilt.
                l.ship_failed(&to);
                let msg = refused("its next record is gone from the leader's log");
                let event = CopyEvent::NotShipped {
                    to: to.clone(),
                    detail,
                };
                self.event(event);
                self.send(to, msg);
            }
        }
        self.drain_leader();
    }

    /// One replication message from the peer `from`. `pos` is the log's position (`None`
    /// while the log is not open).
    pub fn handle_message(
        &mut self,
        here: &Here,
        from: &NodeId,
        message: PeerMessage,
        pos: Option<&LogPos>,
    ) {
        match message {
            PeerMessage::Fence(f) => self.on_fence(here, from, f, pos),
            PeerMessage::FenceAnswer(a) => {
                if let Role::Fencing(fe) = &mut self.role {
                    if a.scope.generation == self.generation {
                        fe.commit = fe.commit.max(a.commit);
                        fe.answers.insert(from.clone(), a);
                        self.out.push_back(CopyOutput::Recheck);
                    }
                }
            }
            PeerMessage::TailFetch(t) => {
                let Some(pos) = pos else { return };
                if pos.state.fence_generation > t.scope.generation {
                    return;
                }
                if t.from >= pos.end {
                    let chunk = PeerMessage::TailChunk(pp::TailChunk {
                        scope: t.scope.clone(),
                        base_offset: pos.end,
                        record_count: 0,
                        entries: Bytes::new(),
                        end: pos.end,
                        last: true,
                    });
                    self.send(from.clone(), chunk);
                    return;
                }
                self.io(CopyIo::Read {
                    from: t.from,
                    // The answer must fit a tail chunk (one entry always does).
                    max_bytes: (t.max_bytes as usize).min(self.settings.tail_fetch_bytes as usize),
                    purpose: ReadPurpose::Tail {
                        to: from.clone(),
                        scope: t.scope,
                        from: t.from,
                    },
                });
            }
            PeerMessage::TailChunk(c) => {
                if !self.log_open {
                    return;
                }
                let Role::Fencing(fe) = &mut self.role else {
                    return;
                };
                let Some(a) = &mut fe.adopting else { return };
                if a.from != *from || c.scope.generation != self.generation {
                    return;
                }
                if c.entries.is_empty() {
                    // Nothing more there: adopt what was reached.
                    a.target = pos.map_or(a.target, |i| i.end.min(a.target));
                    a.fetching = false;
                    self.last_sent = None;
                    self.out.push_back(CopyOutput::Recheck);
                    return;
                }
                self.io(CopyIo::Append {
                    base: c.base_offset,
                    entries: c.entries,
                });
            }
            PeerMessage::Follow(f) => self.on_follow(from, f, pos),
            PeerMessage::ReplicaReport(rep) => {
                if let Role::Leading(l) = &mut self.role {
                    l.report(
                        from,
                        rep.scope.generation,
                        &rep.storage_id,
                        rep.end,
                        rep.durable_end,
                    );
                }
                self.drain_leader();
            }
            PeerMessage::FollowFrom(ff) => self.on_follow_from(here, from, ff, pos),
            PeerMessage::Replicate(rep) => self.on_replicate(here, from, rep, pos),
            PeerMessage::LogStart(ls) => {
                // A copy behind its leader's start is rebuilt, not cut: its next shipment
                // fails, it asks again and is answered with a rebuild.
                let (true, Some(pos)) = (self.log_open, pos) else {
                    return;
                };
                let Role::Following(f) = &self.role else {
                    return;
                };
                if ls.scope.generation != f.generation() || f.leader() != from {
                    return;
                }
                if ls.start > pos.start && ls.start <= pos.end {
                    self.io(CopyIo::TrimTo { start: ls.start });
                }
                // Kept across a restart (a busy state write is followed by the next word).
                if ls.start > pos.state.log_start && ls.start <= pos.end && !self.persisting {
                    let mut state = pos.state.clone();
                    state.log_start = ls.start;
                    self.persist(state);
                }
            }
            PeerMessage::ReplicationRefused(_) => {
                if let Role::Following(f) = &mut self.role {
                    if f.leader() == from {
                        f.ask_again();
                    }
                }
            }
            _ => {}
        }
    }

    // ---- the roles' decisions ----

    fn on_fence(&mut self, here: &Here, from: &NodeId, f: pp::Fence, pos: Option<&LogPos>) {
        let Some(pos) = pos else {
            return; // not open yet: the leader asks again
        };
        let g = f.scope.generation;
        let fence = pos.state.fence_generation;
        if fence > g {
            let msg = refusal(&f.scope, pp::RefusalReason::Fenced, fence, "fenced above");
            self.send(from.clone(), msg);
        } else if fence == g && !self.persisting {
            // Its own leader fencing again at the same generation has restarted: it feeds
            // only those who ask, so a copy that thinks itself fed asks again (else both
            // wait: sim replicated seed 3124, with the peer restart fix).
            if let Role::Following(fo) = &mut self.role {
                if fo.leader() == from && fo.state() != FollowState::Asking {
                    fo.ask_again();
                    self.last_sent = None;
                    self.out.push_back(CopyOutput::Recheck);
                }
            }
            let answer = PeerMessage::FenceAnswer(pp::FenceAnswer {
                scope: f.scope.clone(),
                storage_id: here.storage_id.clone(),
                last_generation: last_generation(&pos.state.epochs, pos.end),
                end: pos.end,
                durable_end: pos.durable,
                commit: pos.state.commit,
                epochs: wire_epochs(&pos.state.epochs),
            });
            self.send(from.clone(), answer);
        } else if fence < g && !self.persisting {
            // Stop acting at the old generation at once, then persist the fence; the
            // promoted leader asks again and is answered once it is durable. The metadata
            // here may not say yet who leads next: the fence does.
            self.step_down(Some((from.clone(), g)));
            let mut state = pos.state.clone();
            state.fence_generation = g;
            self.persist(state);
        }
    }

    fn on_follow(&mut self, from: &NodeId, f: pp::Follow, pos: Option<&LogPos>) {
        let Role::Leading(l) = &mut self.role else {
            let msg = refusal(
                &f.scope,
                pp::RefusalReason::NotOpen,
                self.generation,
                "not open",
            );
            self.send(from.clone(), msg);
            return;
        };
        if f.scope.generation != l.generation() {
            let g = l.generation();
            let msg = refusal(
                &f.scope,
                pp::RefusalReason::StaleGeneration,
                g,
                "another generation",
            );
            self.send(from.clone(), msg);
            return;
        }
        let theirs = EpochLog {
            epochs: from_wire(&f.epochs),
            end: f.end,
        };
        let log_start = pos.map_or(0, |i| i.start);
        let answer = if self.kind.compacted() {
            let complete_from = pos.map_or(0, |i| i.complete_from);
            l.follow_compacted(from, &f.storage_id, &theirs, log_start, complete_from)
        } else {
            l.follow(from, &f.storage_id, &theirs, log_start)
        };
        let mut sends = Vec::new();
        let mut events = Vec::new();
        match answer {
            Ok(answer) => {
                let (truncate_to, rebuild) = match answer {
                    FollowAnswer::TruncateTo(at) => (at, false),
                    FollowAnswer::Rebuild { from: at } => {
                        events.push(CopyEvent::Rebuilding {
                            follower: from.clone(),
                            from: at,
                        });
                        (at, true)
                    }
                };
                sends.push(PeerMessage::FollowFrom(pp::FollowFrom {
                    scope: f.scope.clone(),
                    truncate_to,
                    leader_end: l.epochs().end,
                    commit: l.commit(),
                    epochs: wire_epochs(&l.epochs().epochs),
                    rebuild,
                }));
                if self.kind == CopyKind::Records && log_start > 0 {
                    sends.push(PeerMessage::LogStart(pp::LogStart {
                        scope: f.scope.clone(),
                        start: log_start,
                    }));
                }
            }
            Err(FollowRefused::NotReplica) => {
                let reason = pp::RefusalReason::NotReplica;
                sends.push(refusal(&f.scope, reason, l.generation(), "not counted"));
            }
        }
        for e in events {
            self.event(e);
        }
        for m in sends {
            self.send(from.clone(), m);
        }
        self.drain_leader();
    }

    fn on_follow_from(
        &mut self,
        here: &Here,
        from: &NodeId,
        ff: pp::FollowFrom,
        pos: Option<&LogPos>,
    ) {
        let Some(pos) = pos else {
            return;
        };
        let Role::Following(f) = &mut self.role else {
            return;
        };
        if ff.scope.generation != f.generation() || f.leader() != from {
            return;
        }
        self.catch_up_to = Some(ff.leader_end);
        let cut = if ff.rebuild {
            f.rebuild_from(ff.truncate_to, pos.start, pos.end, pos.state.commit)
        } else {
            f.follow_from(ff.truncate_to, pos.end, pos.state.commit)
        };
        let level = cut.is_none() && matches!(f.state(), FollowState::Fed { .. });
        if let FollowState::Halted { agreed, committed } = f.state() {
            self.event(CopyEvent::Halted { agreed, committed });
            return;
        }
        // The copy will hold the leader's epochs from the cut on (nothing of its own when it
        // starts again).
        let (own, at) = if ff.rebuild {
            (&[][..], ff.truncate_to)
        } else {
            (&pos.state.epochs[..], ff.truncate_to.min(pos.end))
        };
        let epochs = splice(own, &from_wire(&ff.epochs), at);
        if cut.is_some() {
            self.epochs_after_cut = Some(epochs);
        } else {
            self.epochs_after_cut = None;
            let mut state = pos.state.clone();
            state.epochs = epochs;
            if state != pos.state {
                self.persist(state);
            }
        }
        if let Some(to) = cut {
            // A cut below what this copy still holds (its own retention went further than the
            // leader's) is a restart there too.
            self.io(if ff.rebuild || to < pos.start {
                CopyIo::RestartAt { start: to }
            } else {
                CopyIo::Truncate { to }
            });
        }
        if level {
            // Nothing to cut, and perhaps nothing to ship: say where this copy stands now, or
            // a new leader whose tail is already here would wait for a write at its own
            // generation before committing it.
            let report = PeerMessage::ReplicaReport(pp::ReplicaReport {
                scope: ff.scope.clone(),
                storage_id: here.storage_id.clone(),
                end: pos.end,
                durable_end: pos.durable,
            });
            self.send(from.clone(), report);
        }
    }

    fn on_replicate(
        &mut self,
        here: &Here,
        from: &NodeId,
        rep: pp::Replicate,
        pos: Option<&LogPos>,
    ) {
        if !self.log_open {
            return;
        }
        let Role::Following(f) = &mut self.role else {
            let g = self.generation;
            let msg = refusal(&rep.scope, pp::RefusalReason::NotOpen, g, "not following");
            self.send(from.clone(), msg);
            return;
        };
        let verdict = f.shipment(
            from,
            rep.scope.generation,
            rep.base_offset,
            u64::from(rep.record_count),
        );
        match verdict {
            Shipment::Append if !rep.entries.is_empty() => {
                if self.settings.canary == CopyCanary::AckBeforeDurable {
                    // The bug: say it is durable on arrival.
                    let end = rep.base_offset + u64::from(rep.record_count);
                    let report = PeerMessage::ReplicaReport(pp::ReplicaReport {
                        scope: rep.scope.clone(),
                        storage_id: here.storage_id.clone(),
                        end,
                        durable_end: end,
                    });
                    self.send(from.clone(), report);
                }
                self.io(CopyIo::Append {
                    base: rep.base_offset,
                    entries: rep.entries,
                });
            }
            Shipment::Append | Shipment::Held => {
                if let Some(pos) = pos {
                    let report = PeerMessage::ReplicaReport(pp::ReplicaReport {
                        scope: rep.scope.clone(),
                        storage_id: here.storage_id.clone(),
                        end: pos.end,
                        durable_end: pos.durable,
                    });
                    self.send(from.clone(), report);
                }
            }
            Shipment::Refollow => {
                self.last_sent = None;
                self.out.push_back(CopyOutput::Recheck);
            }
            Shipment::Stale => {
                let g = self.generation;
                let msg = refusal(&rep.scope, pp::RefusalReason::StaleGeneration, g, "stale");
                self.send(from.clone(), msg);
            }
            Shipment::NotReady | Shipment::Gap => {}
        }
    }

    fn lead(&mut self, now: Instant, pass: Pass<'_>, resend: bool) {
        let Pass {
            here, view, pos, ..
        } = pass;
        let generation = view.generation;
        match &mut self.role {
            Role::Leading(l) => {
                if self.kind.compacted() {
                    // Compaction stays below what every follower holds durably.
                    let below = l.epochs().end.saturating_sub(l.lag_records());
                    if self.compaction_bound != Some(below) {
                        self.compaction_bound = Some(below);
                        self.io(CopyIo::BoundCompaction { below });
                    }
                }
                self.record_rebuilt_copies(pass);
                self.announce_log_start(now, pass);
                return;
            }
            Role::Idle => return,
            Role::Fencing(_) => {}
            Role::Preparing | Role::Following(_) => {
                // This node led the shard's records at this generation before a restart: it
                // shipped what its own disk may have lost since (`ShardLeader::written`), so
                // it leads on at the next generation, where the epochs tell those records
                // apart. A copy of a compacted log ships only what it synced: it fences again.
                let reopened = self.kind == CopyKind::Records
                    && pos.state.epochs.iter().any(|&(g, _)| g == generation)
                    && !pass.opened_here;
                if reopened {
                    self.out.push_back(CopyOutput::Propose(Command::Reopen {
                        shard: self.shard.clone(),
                        generation,
                        leader: here.me.clone(),
                    }));
                    return;
                }
                self.role = Role::Fencing(Fencing {
                    answers: BTreeMap::new(),
                    adopting: None,
                    opening: false,
                    commit: pos.state.commit,
                });
            }
        }
        let me = Replica {
            node: here.me.clone(),
            storage_id: here.storage_id.clone(),
        };
        let own_epochs = epoch_log(&pos.state, pos.end);
        let own = LogPosition {
            last_generation: last_generation(&own_epochs.epochs, pos.end),
            end: pos.end,
        };
        let scope = self.scope(generation);
        let Role::Fencing(f) = &mut self.role else {
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
        let mut outcome = fence::fence_outcome(&view.replicas, &me, own, &answers);
        if self.settings.canary == CopyCanary::PromoteBehind {
            outcome = FenceOutcome::Open;
        }
        match outcome {
            FenceOutcome::Waiting { .. } => {
                if resend {
                    let fence = PeerMessage::Fence(pp::Fence {
                        scope,
                        leader_storage_id: me.storage_id.clone(),
                    });
                    let to: Vec<NodeId> = view
                        .replicas
                        .iter()
                        .map(|r| &r.node)
                        .filter(|n| **n != here.me && !f.answers.contains_key(n))
                        .cloned()
                        .collect();
                    self.last_sent = Some(now);
                    for n in to {
                        self.send(n, fence.clone());
                    }
                }
            }
            FenceOutcome::Adopt { from, position } => {
                let their = f
                    .answers
                    .get(&from)
                    .map(|a| from_wire(&a.epochs))
                    .unwrap_or_default();
                let compacted = self.kind.compacted();
                let adopting = f.adopting.get_or_insert_with(|| {
                    let theirs = EpochLog {
                        epochs: their.clone(),
                        end: position.end,
                    };
                    // A compacted log takes the other copy whole: fetched from its start,
                    // where compaction cannot have dropped what this copy would keep (see
                    // `ShardLeader::follow_compacted`), and never cut, which a compacted log
                    // cannot be.
                    let agreed = if compacted {
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
                    if pos.end > adopting.agreed {
                        if pos.idle {
                            adopting.cutting = true;
                            let to = adopting.agreed;
                            self.io(if compacted {
                                CopyIo::RestartAt { start: to }
                            } else {
                                CopyIo::Truncate { to }
                            });
                        }
                        return;
                    }
                    adopting.cut = true;
                }
                if pos.end < adopting.target {
                    adopting.fetching = true;
                    let fetch = PeerMessage::TailFetch(pp::TailFetch {
                        scope,
                        from: pos.end,
                        max_bytes: self.settings.tail_fetch_bytes,
                    });
                    let to = adopting.from.clone();
                    self.last_sent = Some(now);
                    self.send(to, fetch);
                    return;
                }
                // The tail is here: its epochs are the other copy's from the cut on.
                let epochs = splice(&own_epochs.epochs, &adopting.epochs, adopting.agreed);
                self.open(generation, epochs, pos);
            }
            FenceOutcome::Open => {
                let epochs = own_epochs.epochs.clone();
                self.open(generation, epochs, pos);
            }
        }
    }

    /// Persists the state a leader opens with: its fence, the commit it knows, and this
    /// generation's epoch, durable before the first write at it.
    fn open(&mut self, generation: u64, mut epochs: Vec<(u64, u64)>, pos: &LogPos) {
        let Role::Fencing(f) = &mut self.role else {
            return;
        };
        f.opening = true;
        let known = f.commit.max(pos.state.commit);
        let commit = known.min(pos.end);
        if known > pos.end {
            // Some copy knew records below `known` were acknowledged, and none of the copies
            // that answered holds them: only a leader whose disk is gone (or an operator's
            // abandon) gets here. The spec allows it; it is never silent.
            self.event(CopyEvent::Abandoned {
                generation,
                from: pos.end,
                to: known,
            });
        }
        // A follower takes its leader's epochs with the records it is fed; one it took for
        // records that never reached it (the leader failed first) starts past this log's
        // end. It names no record here, and the new epoch starts below it: kept, the state
        // would be refused (epochs out of order) and the copy would never open.
        epochs.retain(|&(_, start)| start <= pos.end);
        if epochs.last().is_none_or(|&(g, _)| g != generation) {
            epochs.push((generation, pos.end));
        }
        self.persist(CopyState {
            fence_generation: generation,
            commit,
            epochs,
            log_start: pos.state.log_start,
        });
    }

    /// An opening leader's state is durable at the metadata's generation, and the metadata
    /// still names this node: it leads.
    fn open_leadership(&mut self, here: &Here, state: &CopyState, view: &ShardView, pos: &LogPos) {
        let opening = matches!(&self.role, Role::Fencing(f) if f.opening);
        if !opening
            || state.fence_generation != view.generation
            || view.leader.as_ref() != Some(&here.me)
        {
            return;
        }
        let followers: Vec<Replica> = view
            .replicas
            .iter()
            .filter(|r| r.node != here.me)
            .cloned()
            .collect();
        let leader = ShardLeader::new(
            view.generation,
            followers,
            view.quorum,
            epoch_log(state, pos.end),
            pos.durable,
            state.commit,
            self.settings.leader,
        );
        self.event(CopyEvent::Leading {
            generation: view.generation,
            end: pos.end,
        });
        self.io(CopyIo::Gate {
            committed: leader.commit(),
        });
        if self.kind.compacted() {
            // Nothing compacted until the followers report what they hold.
            self.compaction_bound = Some(0);
            self.io(CopyIo::BoundCompaction { below: 0 });
        }
        self.role = Role::Leading(leader);
    }

    /// Asks the control plane to record the new disk of every copy this leadership fed level
    /// onto one (`ShardLeader::counted_storage`), so that fences and promotions at later
    /// generations count it too; asked again on every pass until the metadata says so, or can
    /// no longer (another generation, or the node's disk changed again). The copy's new disk
    /// is recorded for the whole shard, so only once every log of the shard led here was fed
    /// level onto it: the primary log's leadership asks, when the rider's counts that disk
    /// too.
    fn record_rebuilt_copies(&mut self, pass: Pass<'_>) {
        if self.kind != self.kind.primary() {
            return;
        }
        let Role::Leading(l) = &self.role else {
            return;
        };
        let view = pass.view;
        let recorded = |node: &NodeId| {
            view.replicas
                .iter()
                .find(|r| r.node == *node)
                .map(|r| r.storage_id.as_str())
        };
        let wanted: Vec<Command> = l
            .counted_storage()
            .filter(|c| recorded(&c.node) != Some(c.storage_id.as_str()))
            .filter(|c| view.member_disks.get(&c.node) == Some(&c.storage_id))
            .filter(|c| pass.rider_counted.is_none_or(|g| g.contains(c)))
            .map(|c| Command::RecordCopy {
                shard: self.shard.clone(),
                generation: l.generation(),
                node: c.node.clone(),
                storage_id: c.storage_id.clone(),
            })
            .collect();
        self.out.extend(wanted.into_iter().map(CopyOutput::Propose));
    }

    /// Tells the followers of a led stream shard where its log starts, when retention moved
    /// it since they were last told or `log_start_resend` passed: every copy is cut where the
    /// leader decided (docs/replication.md, "Retention on every copy"). Compacted logs have
    /// no retention.
    fn announce_log_start(&mut self, now: Instant, pass: Pass<'_>) {
        if self.kind != CopyKind::Records {
            return;
        }
        let start = pass.pos.start;
        let due = match self.announced_start {
            None => start > 0,
            Some((told, at)) => {
                told != start || now.saturating_duration_since(at) >= self.settings.log_start_resend
            }
        };
        if !due {
            return;
        }
        self.announced_start = Some((start, now));
        let msg = PeerMessage::LogStart(pp::LogStart {
            scope: self.scope(pass.view.generation),
            start,
        });
        for r in pass.view.replicas.iter().filter(|r| r.node != pass.here.me) {
            self.send(r.node.clone(), msg.clone());
        }
    }

    fn follow(&mut self, now: Instant, pass: Pass<'_>, leader: NodeId, resend: bool) {
        let generation = pass.view.generation;
        let asking = match &self.role {
            Role::Following(f) => f.state() == FollowState::Asking,
            Role::Idle => false,
            _ => {
                self.role = Role::Following(ShardFollower::new(generation, leader.clone()));
                true
            }
        };
        if !asking || !resend {
            return;
        }
        self.last_sent = Some(now);
        let pos = pass.pos;
        let ask = PeerMessage::Follow(pp::Follow {
            scope: self.scope(generation),
            storage_id: pass.here.storage_id.clone(),
            epochs: wire_epochs(&pos.state.epochs),
            end: pos.end,
            durable_end: pos.durable,
            commit: pos.state.commit,
        });
        self.send(leader, ask);
    }

    /// A cut that did not happen: a follower asks to be fed again (the answer brings the cut
    /// again), a fencing leader tries its cut again on its next pass.
    fn retry_cut(&mut self) {
        match &mut self.role {
            Role::Following(f) => f.ask_again(),
            Role::Fencing(fe) => {
                if let Some(a) = &mut fe.adopting {
                    a.cutting = false;
                }
            }
            _ => {}
        }
    }

    /// Turns a leader's outputs into reads and marks.
    fn drain_leader(&mut self) {
        let (Role::Leading(l), true) = (&mut self.role, self.log_open) else {
            return;
        };
        while let Some(out) = l.poll_output() {
            let io = match out {
                LeaderOutput::Ship {
                    to,
                    from,
                    max_bytes,
                } => CopyIo::Read {
                    from,
                    max_bytes,
                    purpose: ReadPurpose::Ship { to, from },
                },
                LeaderOutput::Committed { up_to } => CopyIo::Committed { up_to },
                LeaderOutput::TimedOut { up_to } => {
                    self.out
                        .push_back(CopyOutput::Event(CopyEvent::QuorumTimeout));
                    CopyIo::TimedOut { up_to }
                }
            };
            self.out.push_back(CopyOutput::Io(io));
        }
    }

    fn persist(&mut self, state: CopyState) {
        self.persisting = true;
        self.io(CopyIo::Persist(state));
    }

    fn scope(&self, generation: u64) -> pp::ShardScope {
        pp::ShardScope {
            shard: pp::ShardId {
                kind: self.kind.wire(),
                ..self.wire.clone()
            },
            generation,
        }
    }

    fn send(&mut self, to: NodeId, message: PeerMessage) {
        self.out.push_back(CopyOutput::Send { to, message });
    }

    fn io(&mut self, io: CopyIo) {
        self.out.push_back(CopyOutput::Io(io));
    }

    fn event(&mut self, event: CopyEvent) {
        self.out.push_back(CopyOutput::Event(event));
    }
}

#[cfg(test)]
mod tests;
