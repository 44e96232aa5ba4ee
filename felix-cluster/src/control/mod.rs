//! The control plane: raft-rs's `RawNode` over the metadata, driven Sans-IO.
//!
//! Inputs are the caller's time (`handle_timeout`), raft messages from authenticated peers
//! (`handle_message`) and confirmations that a record is durable (`persisted`); outputs, drained
//! with `poll_output`, are messages to send, records to append and sync, and what each applied
//! entry changed. raft-rs is handed one `Ready` at a time: its entries and hard state become one
//! record, and the messages raft says need them durable (votes, append answers) are held until
//! that record is confirmed. Metadata is small, so it lives in memory and is rebuilt on start
//! from the log.
//!
//! What this adds to raft-rs, each for a failure others have paid for:
//! - elections follow the node's seed (`election.rs`), so a simulated run repeats;
//! - `check_quorum` and `pre_vote` are on: a partitioned leader steps down, and a node that
//!   rejoins does not disrupt a healthy term;
//! - a node whose disk is blank neither votes nor counts as a voter until it has caught up, or
//!   until a majority of voters says it is blank too (a fresh cluster): a voter with a wiped
//!   log would otherwise help elect a leader that lacks committed entries;
//! - every proposal is retried until its effect is applied (commands are idempotent), since raft
//!   drops proposals across leader changes without a word; nothing waits on one forever.

mod election;
pub mod record;
pub mod store;
pub mod wire;

/// raft-rs's entry and state types, which [`store::MetaStore`] speaks.
pub use raft::eraftpb;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use raft::eraftpb::{Message, MessageType};
use raft::{RawNode, StateRole};

use crate::ids::{NodeId, Voters};
use crate::meta::{Applied, Command, Metadata, ObjectKey, ObjectKind, StreamSpec};
use crate::replication::lease::LeaseTerms;
use crate::replication::promotion::{self, Renewals};
use election::{ElectionRange, SeededRng};
use store::MetaStore;

/// How the control plane keeps time.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    pub node: NodeId,
    pub voters: Voters,
    /// Seeds the election jitter; the engine derives it from its own seed.
    pub seed: u64,
    /// One raft tick.
    pub tick: Duration,
    /// Election timeout in ticks; each timer is drawn from `[election_ticks, 2 × election_ticks)`.
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
    /// How often an unapplied proposal is made again.
    pub retry: Duration,
    /// Silence after which the control plane's leader marks a member down.
    pub down_after: Duration,
    /// The shard leadership lease and its margins (docs/replication.md, "Leases").
    pub lease: LeaseTerms,
    /// Renewals waiting for their leadership check; past this the oldest is dropped (its
    /// holder asks again within a quarter lease). At least 1.
    pub max_pending_grants: usize,
    /// Who may take a lapsed `leader` shard: the spec's rule, or the simulator's canary.
    pub leader_shards: promotion::LeaderShards,
}

impl ControlConfig {
    /// Defaults for a cluster on one network: 100 ms ticks, elections after 1–2 s of silence.
    pub fn new(node: NodeId, voters: Voters, seed: u64, lease: Duration) -> ControlConfig {
        ControlConfig {
            node,
            voters,
            seed,
            tick: Duration::from_millis(100),
            election_ticks: 10,
            heartbeat_ticks: 2,
            retry: Duration::from_millis(500),
            down_after: lease / 2,
            lease: LeaseTerms::for_lease(lease.as_millis() as u64),
            max_pending_grants: DEFAULT_MAX_PENDING_GRANTS,
            leader_shards: promotion::LeaderShards::Proven,
        }
    }
}

/// Something the caller must do.
#[derive(Debug)]
pub enum ControlOutput {
    /// Send a raft message to a peer.
    Send { to: NodeId, message: Message },
    /// Append `record` to the metadata log, sync it, then call [`ControlPlane::persisted`]
    /// with `ready`.
    Persist { ready: u64, record: Vec<u8> },
    /// A committed entry was applied to the metadata.
    Applied(Applied),
    /// A renewal from [`ControlPlane::lease_renewed`] is granted: a majority confirmed this
    /// node still led after the request arrived. Answer `seq` of `node` with `grant`.
    LeaseGranted {
        node: NodeId,
        seq: u64,
        grant: LeaseGrant,
    },
}

/// How many renewals may wait for their leadership check by default
/// ([`ControlConfig::max_pending_grants`]): a few per member for the largest cluster, with room.
pub const DEFAULT_MAX_PENDING_GRANTS: usize = 256;

/// A snapshot of the metadata and the log that follows it, as files.
#[derive(Debug, Clone)]
pub struct Compaction {
    /// The last entry the snapshot covers.
    pub index: u64,
    /// The snapshot file's bytes (one snapshot record).
    pub snapshot_file: Vec<u8>,
    /// The new log's first records: the entries after `index` and the hard state.
    pub head: Vec<u8>,
    data: Vec<u8>,
}

impl Compaction {
    /// `store` compacted at `index` (applied, so in the log), `data` being the state machine
    /// there. `None` when `index` is not after the store's snapshot or not in its log.
    pub fn of(store: &MetaStore, index: u64, data: Vec<u8>) -> Option<Compaction> {
        let mut after = store.clone();
        if !after.compact(index, data.clone()) {
            return None;
        }
        Some(Compaction {
            index,
            snapshot_file: record::snapshot_file(&after)?,
            head: record::log_head(&after),
            data,
        })
    }
}

/// Why this node will not vote yet.
#[derive(Debug, Clone, PartialEq, Eq)]
enum DiskGuard {
    /// Voting normally.
    Open,
    /// Blank disk: waiting to hear either a leader (then catching up to the commit it
    /// announced) or a majority of blank peers.
    Blank {
        blank_peers: BTreeSet<NodeId>,
        catch_up_to: Option<u64>,
    },
}

pub struct ControlPlane {
    cfg: ControlConfig,
    node: RawNode<MetaStore>,
    range: ElectionRange,
    rng: SeededRng,
    meta: Metadata,
    next_tick: Instant,
    /// The `Ready` whose record is being written, and the messages that wait for it.
    in_flight: Option<(u64, Vec<Message>)>,
    /// The record in flight holds a snapshot from the leader.
    apply_after_persist: bool,
    out: VecDeque<ControlOutput>,
    /// Commands whose effect this node needs and has not seen applied.
    wanted: Vec<Command>,
    next_retry: Instant,
    last_heard: BTreeMap<NodeId, Instant>,
    guard: DiskGuard,
    was_leader: bool,
    /// The last promotion pass's count of shards waiting for their lapsed leader.
    awaiting_leader: usize,
    /// As leader: when each node's last lease renewal arrived, by this node's clock.
    renewed: BTreeMap<NodeId, Instant>,
    /// As leader: when this term began here, and its first entry (everything before it must be
    /// applied before a lease is granted, so a grant never predates a promotion in the log).
    took_over: Option<(Instant, u64)>,
    /// As leader: renewals waiting for raft to confirm the leadership (a read index), by
    /// the context they were sent with.
    pending_grants: BTreeMap<u64, (NodeId, u64)>,
    next_grant_ctx: u64,
}

/// A lease renewal the control plane's leader accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseGrant {
    /// The granting leader's raft term.
    pub term: u64,
    /// The holder may count the lease only once it has applied the metadata this far: every
    /// promotion the grant could contradict is at or below it.
    pub applied: u64,
}

impl ControlPlane {
    /// Starts from `store` (replayed from disk, or blank).
    pub fn new(cfg: ControlConfig, store: MetaStore, now: Instant) -> ControlPlane {
        let voters = cfg.voters.names().to_vec();
        // Rebuild the metadata from what was committed before the restart (the snapshot,
        // then the entries after it); raft is then told these are applied so it does not
        // hand them over again. Replay checked that the snapshot decodes.
        let mut meta = match store.snapshot_point().0 {
            0 => Metadata::new(voters),
            _ => Metadata::restore(store.snapshot_data()).unwrap_or_else(|_| Metadata::new(voters)),
        };
        let commit = store.hard_state().commit;
        let mut applied = Vec::new();
        for e in store.entries_after_snapshot() {
            if e.index <= commit {
                applied.push(meta.apply_entry(e.index, &e.data));
            }
        }
        // A name still deleted is removed again (idempotent), in case the restart cut its
        // removal short. A delete replayed for a name that lives again is not: the new life's
        // copies were opened only once the old ones were gone.
        applied.retain(|a| match a {
            Applied::StreamDeleted { key, .. } => !meta.streams.contains_key(key),
            Applied::CacheDeleted { key, .. } => !meta.caches.contains_key(key),
            _ => true,
        });
        // Unless a crash cut the old files' retirement short after the re-creation was
        // applied (whether the node's log still holds the delete or only a snapshot after
        // it): every name that lives again is told with the generations of its old lives,
        // and the node removes copies of those only.
        let streams = meta
            .streams
            .iter()
            .map(|(k, s)| (ObjectKind::Stream, k, s.born_above));
        let caches = meta
            .caches
            .iter()
            .map(|(k, c)| (ObjectKind::Cache, k, c.born_above));
        applied.extend(streams.chain(caches).filter(|(_, _, g)| *g > 0).map(
            |(kind, key, generation)| Applied::Recreated {
                kind,
                key: key.clone(),
                generation,
            },
        ));
        let guard = if store.is_blank() {
            DiskGuard::Blank {
                blank_peers: BTreeSet::new(),
                catch_up_to: None,
            }
        } else {
            DiskGuard::Open
        };
        let id = cfg.voters.raft_id(&cfg.node).expect("the node is a voter");
        let range = ElectionRange {
            min: cfg.election_ticks,
            max: cfg.election_ticks * 2,
        };
        let raft_cfg = raft::Config {
            id,
            election_tick: cfg.election_ticks,
            heartbeat_tick: cfg.heartbeat_ticks,
            min_election_tick: range.min,
            max_election_tick: range.max,
            check_quorum: true,
            pre_vote: true,
            applied: meta.applied,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            ..Default::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let node = RawNode::new(&raft_cfg, store, &logger).expect("a valid raft config");
        let mut rng = SeededRng::new(cfg.seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut node = node;
        election::reseed_if_reset(&mut node, range, &mut rng);
        let next_tick = now + cfg.tick;
        ControlPlane {
            next_retry: now,
            cfg,
            node,
            range,
            rng,
            meta,
            next_tick,
            in_flight: None,
            apply_after_persist: false,
            out: applied.into_iter().map(ControlOutput::Applied).collect(),
            wanted: Vec::new(),
            last_heard: BTreeMap::new(),
            guard,
            was_leader: false,
            awaiting_leader: 0,
            renewed: BTreeMap::new(),
            took_over: None,
            pending_grants: BTreeMap::new(),
            next_grant_ctx: 0,
        }
    }

    /// A node (this one included) asks to renew its shard leases with its request `seq`.
    /// Refused (`false`) when this node is not the leader, has not applied all of its
    /// predecessors' entries yet, or is moving one of that node's shards away (a grant then
    /// would overlap the next leader). Accepted, the grant follows as
    /// [`ControlOutput::LeaseGranted`] once a majority has confirmed this node still leads:
    /// so every grant answers a request sent before any later leader's term began, which
    /// is what lets that leader count an unheard holder's lease from its own takeover
    /// (`promote_due`).
    pub fn lease_renewed(&mut self, now: Instant, node: &NodeId, seq: u64) -> bool {
        if !self.may_grant(node) {
            return false;
        }
        self.renewed.insert(node.clone(), now);
        let ctx = self.next_grant_ctx;
        self.next_grant_ctx += 1;
        self.pending_grants.insert(ctx, (node.clone(), seq));
        while self.pending_grants.len() > self.cfg.max_pending_grants.max(1) {
            self.pending_grants.pop_first();
        }
        self.node.read_index(ctx.to_be_bytes().to_vec());
        self.drive();
        true
    }

    fn may_grant(&self, node: &NodeId) -> bool {
        let Some((_, first)) = self.took_over else {
            return false;
        };
        if !self.is_leader() || self.meta.applied < first {
            return false;
        }
        let moving_away = self.wanted.iter().any(|c| match c {
            Command::Promote { shard, .. } => self
                .meta
                .shard(shard)
                .is_some_and(|m| m.leader.as_ref() == Some(node)),
            _ => false,
        });
        !moving_away && self.cfg.voters.names().contains(node)
    }

    /// Raft confirmed the leadership for these read-index contexts: their renewals are
    /// granted, each checked again (a promotion may have become due meanwhile).
    fn confirmed(&mut self, states: Vec<raft::ReadState>) {
        for rs in states {
            let Ok(ctx) = <[u8; 8]>::try_from(rs.request_ctx.as_slice()) else {
                continue;
            };
            let Some((node, seq)) = self.pending_grants.remove(&u64::from_be_bytes(ctx)) else {
                continue;
            };
            if self.may_grant(&node) {
                let grant = LeaseGrant {
                    term: self.term(),
                    applied: self.meta.applied,
                };
                self.out
                    .push_back(ControlOutput::LeaseGranted { node, seq, grant });
            }
        }
    }

    /// Shards the last promotion pass left waiting for their lapsed leader (0 unless this
    /// node leads the control plane).
    pub fn shards_awaiting_leader(&self) -> usize {
        if self.is_leader() {
            self.awaiting_leader
        } else {
            0
        }
    }

    /// The metadata as applied here.
    pub fn metadata(&self) -> &Metadata {
        &self.meta
    }

    pub fn is_leader(&self) -> bool {
        self.node.raft.state == StateRole::Leader
    }

    /// The control plane's leader, as this node knows it.
    pub fn leader(&self) -> Option<&NodeId> {
        match self.node.raft.leader_id {
            0 => None,
            id => self.cfg.voters.name(id),
        }
    }

    pub fn term(&self) -> u64 {
        self.node.raft.term
    }

    /// False while a blank disk keeps this node from voting.
    pub fn votes(&self) -> bool {
        self.guard == DiskGuard::Open
    }

    /// The election timer raft will use next, in ticks (for the seed hook's test).
    pub fn election_timeout_ticks(&self) -> usize {
        self.node.raft.randomized_election_timeout()
    }

    /// Asks for `cmd`'s effect until it is applied. A second identical wish is ignored.
    pub fn want(&mut self, cmd: Command, now: Instant) {
        if !self.wanted.contains(&cmd) && !reflected(&self.meta, &cmd) {
            self.wanted.push(cmd);
            self.next_retry = now;
        }
    }

    /// Asks for a stream created on first use.
    pub fn want_stream(&mut self, key: ObjectKey, spec: StreamSpec, now: Instant) {
        self.want(Command::CreateStream { key, spec }, now);
    }

    /// The next time [`ControlPlane::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Instant {
        if self.wanted.is_empty() {
            self.next_tick
        } else {
            self.next_tick.min(self.next_retry)
        }
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        while self.next_tick <= now {
            self.next_tick += self.cfg.tick;
            self.node.tick();
            election::reseed_if_reset(&mut self.node, self.range, &mut self.rng);
            self.maybe_lift_guard();
        }
        self.leader_duties(now);
        if !self.wanted.is_empty() && self.next_retry <= now {
            self.next_retry = now + self.cfg.retry;
            self.propose_wanted();
        }
        self.drive();
    }

    /// A raft message from `from`, whose identity the peer handshake established.
    pub fn handle_message(&mut self, now: Instant, from: &NodeId, message: Message) {
        let Some(from_id) = self.cfg.voters.raft_id(from) else {
            return;
        };
        if message.from != from_id || message.to != self.node.raft.id {
            // A message must be from the peer that sent it and for us; anything else is a
            // confused or hostile peer and raft-rs would trust it.
            return;
        }
        self.last_heard.insert(from.clone(), now);
        if let DiskGuard::Blank {
            blank_peers,
            catch_up_to,
        } = &mut self.guard
        {
            match message.msg_type {
                MessageType::MsgRequestVote | MessageType::MsgRequestPreVote => {
                    // Not answered: a blank voter must not help elect anyone. What the request
                    // says about the candidate's log is evidence for a fresh cluster.
                    if message.index == 0 && message.log_term == 0 {
                        blank_peers.insert(from.clone());
                    }
                    self.maybe_lift_guard();
                    self.drive();
                    return;
                }
                MessageType::MsgAppend | MessageType::MsgSnapshot => {
                    *catch_up_to = Some(catch_up_to.unwrap_or(0).max(message.commit));
                }
                _ => {}
            }
        }
        let mut message = message;
        if message.msg_type == MessageType::MsgHeartbeat {
            // The leader may still think this node holds what it held before its disk went
            // blank, and says so in the commit a heartbeat carries; raft-rs would abort on a
            // commit beyond its log. Nothing here is committed until appends bring it. Not
            // only while the guard holds: a guard lifted by a fresh-cluster or catch-up
            // verdict can still meet a leader whose view of this node predates the loss (the
            // simulator's cluster seed 8850). Entries this node holds past a loss came from
            // appends the leader checked, so committing up to them is what the leader meant.
            let last = self.node.store().last_index_now();
            message.commit = message.commit.min(last);
        }
        let _ = self.node.step(message);
        election::reseed_if_reset(&mut self.node, self.range, &mut self.rng);
        self.maybe_lift_guard();
        self.drive();
    }

    /// `node` has (re)connected, perhaps after a restart that lost its log. A leader forgets
    /// what it knew of that node's log and probes it again from the start: raft-rs would
    /// otherwise trust the old match and never resend what the node lost.
    pub fn peer_reconnected(&mut self, node: &NodeId) {
        if !self.is_leader() {
            return;
        }
        let Some(id) = self.cfg.voters.raft_id(node) else {
            return;
        };
        if id == self.node.raft.id {
            return;
        }
        if let Some(pr) = self.node.raft.mut_prs().get_mut(id) {
            pr.matched = 0;
            pr.become_probe();
        }
    }

    /// The record of `ready` is durable.
    pub fn persisted(&mut self, ready: u64) {
        let Some((number, held)) = self.in_flight.take_if(|(n, _)| *n == ready) else {
            return;
        };
        self.node.on_persist_ready(number);
        if std::mem::take(&mut self.apply_after_persist) {
            self.node.advance_apply();
        }
        self.send_all(held);
        self.drive();
    }

    /// A snapshot of the metadata as applied here, to write before the log is restarted
    /// after it; `None` when nothing was applied since the last one.
    pub fn compaction(&self) -> Option<Compaction> {
        let store = self.node.store();
        if self.meta.applied <= store.snapshot_point().0 {
            return None;
        }
        Compaction::of(store, self.meta.applied, self.meta.snapshot())
    }

    /// `c`'s snapshot file is durable: the in-memory log drops what it covers. A peer that
    /// needs those entries is sent the snapshot instead.
    pub fn compacted(&mut self, c: &Compaction) {
        self.node.mut_store().compact(c.index, c.data.clone());
    }

    pub fn poll_output(&mut self) -> Option<ControlOutput> {
        self.out.pop_front()
    }

    fn maybe_lift_guard(&mut self) {
        let lift = match &self.guard {
            DiskGuard::Open => false,
            DiskGuard::Blank {
                blank_peers,
                catch_up_to,
            } => {
                let fresh_cluster = blank_peers.len() + 1 >= self.cfg.voters.quorum();
                let caught_up = catch_up_to.is_some_and(|c| self.meta.applied >= c);
                fresh_cluster || caught_up
            }
        };
        if lift {
            self.guard = DiskGuard::Open;
        }
    }

    /// What only the leader decides: who is down, and which shards change hands.
    fn leader_duties(&mut self, now: Instant) {
        let leader = self.is_leader();
        if leader && !self.was_leader {
            // Everyone gets a fresh allowance from the moment this node took over; it knows
            // nothing older about them.
            for n in self.cfg.voters.names() {
                self.last_heard.insert(n.clone(), now);
            }
            self.renewed.clear();
            self.took_over = Some((now, self.node.raft.raft_log.last_index()));
        }
        if !leader {
            self.took_over = None;
            self.pending_grants.clear();
            // Its verdicts came from its own record of renewals, which the next leader does
            // not share: proposed now, raft would forward them to that leader.
            self.wanted.retain(|c| !leader_only(c));
        }
        self.was_leader = leader;
        if !leader {
            return;
        }
        self.promote_due(now);
        let mut changes = Vec::new();
        for (n, m) in &self.meta.members {
            if *n == self.cfg.node {
                // A leader judged down by an earlier one (it was frozen, or cut off) is
                // plainly up: nobody else will say so, and a `leader` shard it leads is
                // awaited by clients while it reads as down.
                if !m.up {
                    changes.push(Command::Liveness {
                        node: n.clone(),
                        up: true,
                    });
                }
                continue;
            }
            let heard = self.last_heard.get(n).copied().unwrap_or(now);
            let quiet = now.saturating_duration_since(heard) > self.cfg.down_after;
            if m.up == quiet {
                changes.push(Command::Liveness {
                    node: n.clone(),
                    up: !quiet,
                });
            }
        }
        // A verdict that no longer holds is not pursued.
        self.wanted.retain(|c| match c {
            Command::Liveness { node, up } => !changes.iter().any(
                |x| matches!(x, Command::Liveness { node: n2, up: u2 } if n2 == node && u2 != up),
            ),
            _ => true,
        });
        for c in changes {
            self.want(c, now);
        }
    }

    /// Proposes the promotions due (`replication::promotion`). A node this leader has not
    /// heard renew since it took over is treated as renewing at the takeover: a lease runs
    /// from when its request was sent, and an earlier leader granted one only after a
    /// majority confirmed it still led (`lease_renewed`). Some member of that majority voted
    /// for this term too, and it acknowledged the old leader before it voted (its term only
    /// rises), so every such request was sent before this term began, whatever the clocks
    /// and delays.
    fn promote_due(&mut self, now: Instant) {
        let Some((since, first)) = self.took_over else {
            return;
        };
        // Until its own node renews, this leader has no sign that leases are kept at all (a
        // control plane driven without shard leaders, as in its own tests): it moves nothing.
        if self.meta.applied < first || !self.renewed.contains_key(&self.cfg.node) {
            return;
        }
        let book = LeaseBook {
            now,
            terms: self.cfg.lease,
            renewed: &self.renewed,
            default: since,
        };
        let plan = promotion::promotions_by(&self.meta, &book, self.cfg.leader_shards);
        self.awaiting_leader = plan.awaiting_leader.len();
        let due = plan.due;
        for c in &due {
            self.want(c.clone(), now);
        }
        // A promotion no longer due (its leader renewed before it was applied) is dropped.
        self.wanted
            .retain(|c| !matches!(c, Command::Promote { .. }) || due.contains(c));
    }

    fn propose_wanted(&mut self) {
        if self.node.raft.leader_id == 0 {
            return;
        }
        let leader = self.is_leader();
        for i in 0..self.wanted.len() {
            if !leader && leader_only(&self.wanted[i]) {
                continue;
            }
            let data = self.wanted[i].encode();
            // Dropped when there is no leader or a transfer is under way: retried later.
            let _ = self.node.propose(Vec::new(), data);
            election::reseed_if_reset(&mut self.node, self.range, &mut self.rng);
        }
    }

    /// Hands raft's work to the caller, one record at a time.
    fn drive(&mut self) {
        while self.in_flight.is_none() && self.node.has_ready() {
            let mut rd = self.node.ready();
            let states = rd.take_read_states();
            self.confirmed(states);
            let msgs = rd.take_messages();
            self.send_all(msgs);
            let snapshot = (!rd.snapshot().is_empty()).then(|| rd.snapshot().clone());
            if let Some(snap) = &snapshot {
                self.node.mut_store().apply_snapshot(snap);
                if let Ok(m) = Metadata::restore(&snap.data) {
                    let gone = self.meta.streams_gone_in(&m);
                    self.out
                        .extend(gone.into_iter().map(ControlOutput::Applied));
                    self.meta = m;
                }
            }
            let committed = rd.take_committed_entries();
            self.apply(&committed);
            let entries = rd.take_entries();
            self.node.mut_store().append(&entries);
            let hs = rd.hs().cloned();
            if let Some(hs) = &hs {
                self.node.mut_store().set_hard_state(hs.clone());
            }
            let persisted_msgs = rd.take_persisted_messages();
            if entries.is_empty() && hs.is_none() && snapshot.is_none() {
                self.send_all(persisted_msgs);
                let mut light = self.node.advance_append(rd);
                self.send_all(light.take_messages());
                let committed = light.take_committed_entries();
                self.apply(&committed);
                self.node.advance_apply();
                continue;
            }
            let mut record = Vec::new();
            if let Some(snap) = &snapshot {
                // A snapshot from the leader replaces the log; it is durable like any entry.
                record::encode_snapshot(snap, &mut record);
            }
            record::encode(&entries, hs.as_ref(), &mut record);
            let number = rd.number();
            self.out.push_back(ControlOutput::Persist {
                ready: number,
                record,
            });
            self.in_flight = Some((number, persisted_msgs));
            self.node.advance_append_async(rd);
            if snapshot.is_some() {
                // raft-rs counts a snapshot as applied only once it is durable.
                self.apply_after_persist = true;
            } else {
                self.node.advance_apply();
            }
        }
    }

    fn apply(&mut self, entries: &[raft::eraftpb::Entry]) {
        for e in entries {
            let applied = self.meta.apply_entry(e.index, &e.data);
            if applied != Applied::Unchanged {
                self.out.push_back(ControlOutput::Applied(applied));
            }
        }
        if !entries.is_empty() {
            let meta = &self.meta;
            self.wanted.retain(|c| !reflected(meta, c));
            self.maybe_lift_guard();
        }
    }

    fn send_all(&mut self, msgs: Vec<Message>) {
        for m in msgs {
            if let Some(to) = self.cfg.voters.name(m.to) {
                self.out.push_back(ControlOutput::Send {
                    to: to.clone(),
                    message: m,
                });
            }
        }
    }
}

/// The leader's record of lease renewals, as `promotion` asks about it.
struct LeaseBook<'a> {
    now: Instant,
    terms: LeaseTerms,
    renewed: &'a BTreeMap<NodeId, Instant>,
    /// The renewal assumed for a node not heard since the takeover.
    default: Instant,
}

impl LeaseBook<'_> {
    fn quiet_ms(&self, node: &NodeId) -> u64 {
        let at = self.renewed.get(node).copied().unwrap_or(self.default);
        self.now.saturating_duration_since(at).as_millis() as u64
    }
}

impl Renewals for LeaseBook<'_> {
    fn may_hold_lease(&self, node: &NodeId) -> bool {
        !crate::replication::lease::may_regrant(0, self.quiet_ms(node), &self.terms)
    }

    fn is_live(&self, node: &NodeId) -> bool {
        self.renewed.contains_key(node) && self.quiet_ms(node) <= self.terms.lease_ms / 2
    }
}

/// A decision only the control plane's leader makes, from what it alone has heard (lease
/// renewals, silence): never proposed by another node.
fn leader_only(cmd: &Command) -> bool {
    matches!(cmd, Command::Promote { .. } | Command::Liveness { .. })
}

/// Whether `cmd`'s effect is already in the metadata.
fn reflected(meta: &Metadata, cmd: &Command) -> bool {
    match cmd {
        Command::Join {
            node,
            client_addr,
            storage_id,
            durable,
        } => meta.members.get(node).is_some_and(|m| {
            m.up && m.client_addr == *client_addr
                && m.storage_id == *storage_id
                && m.durable == *durable
        }),
        Command::Declare { node, .. } => {
            meta.declared_by.get(node) == Some(&true) || meta.refused.contains_key(node)
        }
        Command::CreateStream { key, .. } => meta.streams.contains_key(key),
        Command::CreateCache { key, .. } => meta.caches.contains_key(key),
        Command::DeleteStream { key, incarnation } => meta
            .streams
            .get(key)
            .is_none_or(|s| s.incarnation != *incarnation),
        Command::DeleteCache { key, incarnation } => meta
            .caches
            .get(key)
            .is_none_or(|c| c.incarnation != *incarnation),
        Command::AlterStream { key, retention } => meta
            .streams
            .get(key)
            .is_none_or(|s| s.spec.retention == *retention),
        Command::Liveness { node, up } => meta.members.get(node).is_some_and(|m| m.up == *up),
        Command::Promote {
            shard, generation, ..
        } => meta
            .shard(shard)
            .is_none_or(|m| m.generation >= *generation),
        Command::Reopen {
            shard, generation, ..
        } => meta.shard(shard).is_none_or(|m| m.generation > *generation),
        Command::Quiesce {
            shard,
            generation,
            end,
            ..
        } => meta.shard(shard).is_none_or(|m| {
            m.generation != *generation
                || m.quiet.as_ref().is_some_and(|q| q.end == *end)
                || m.resumed_at.is_some_and(|r| r >= *end)
        }),
        Command::Resume {
            shard,
            generation,
            end,
        } => meta
            .shard(shard)
            .is_none_or(|m| m.generation != *generation || m.resumed_at.is_some_and(|r| r >= *end)),
        Command::Abandon {
            shard, generation, ..
        } => meta
            .shard(shard)
            .is_none_or(|m| m.generation != *generation),
        // Done, or no longer possible: another generation, or the node's disk changed again.
        Command::RecordCopy {
            shard,
            generation,
            node,
            storage_id,
        } => {
            meta.members.get(node).map(|m| &m.storage_id) != Some(storage_id)
                || meta.shard(shard).is_none_or(|m| {
                    m.generation != *generation || m.storage_of(node) == Some(storage_id)
                })
        }
    }
}

#[cfg(test)]
mod tests;
