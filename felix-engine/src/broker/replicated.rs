//! Durable shards whose log is replicated across a replica set, as the broker sees them.
//!
//! On the leader of a replicated shard, "durable here" is not what an acknowledgement or a
//! subscriber waits for: the commit mark is (a majority's durability for `quorum`, the
//! leader's own for `leader`), and the cluster's replication computes it. So such a log is
//! *gated*: its own durability is reported as [`Notice::LocalDurable`] for the replication to
//! count, and answers and fan-out move only when the replication says
//! [`Broker::committed`]. Quorum publishes that ran out of time are answered
//! `quorum_timeout` from [`Broker::timed_out`]'s mark.

use std::time::Instant;

use bytes::Bytes;
use felix_storage::log::ReadTicket;
use felix_storage::ops::LogId;
use felix_storage::replica_state::ReplicaState;

use felix_proto::message::{Message, ShardMoved};

use super::durable::{LogState, Notice, Owner};
use super::encode::encode_message;
use super::{Broker, StreamKey};

/// Where a shard went when its leadership here ended, as the metadata here knew it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MovedTo {
    pub(crate) node_id: Option<String>,
    pub(crate) addr: Option<String>,
    pub(crate) generation: u64,
}

/// Ended leaderships of one log whose marks are kept for the answers they still owe.
const RETIRED_LEADERSHIPS_KEPT: u64 = 4;

/// One gated log's marks.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Gate {
    /// Which leadership of the log here this is (1, 2, …): held answers name it.
    pub(crate) leadership: u64,
    /// Records below this are committed.
    pub(crate) committed: u64,
    /// Quorum publishes ending at or below this timed out (unless committed since).
    pub(crate) timed_out: u64,
}

impl Broker {
    /// Gates `log` (its shard is led here and replicated), committed below `committed`.
    pub(crate) fn gate(&mut self, log: LogId, committed: u64) {
        if !self.gates.contains_key(&log) {
            let n = self.leaderships.entry(log).or_default();
            *n += 1;
            let leadership = *n;
            self.gates.insert(
                log,
                Gate {
                    leadership,
                    ..Gate::default()
                },
            );
        }
        // A led stream log ships what it has written, while it syncs (`ShardLeader::written`).
        if self.store_of(log).is_some() {
            let _ = self.with_replica_log(log, |l| l.ship_before_sync(true));
        }
        let gate = self.gates.get_mut(&log).expect("just made");
        gate.committed = gate.committed.max(committed);
        let committed = gate.committed;
        // A log opened (or last led) here counts its whole durable end as released; past the
        // commit mark that is not this leadership's to serve: the records may never have
        // reached a majority, and the next leader would hand out those offsets again.
        if let Some(store) = self.store_of(log) {
            store.released = store.released.min(committed);
        }
    }

    /// The stream shard store that `log` backs, if it is one.
    fn store_of(&mut self, log: LogId) -> Option<&mut super::durable::ShardStore> {
        let owner = self.logs.as_ref()?.slot(log)?.owner;
        let Owner::Stream { stream, shard } = owner else {
            return None;
        };
        self.streams[stream].shards[shard as usize].store.as_mut()
    }

    /// The leadership of `log` here that a publish written now is answered under (0: the log
    /// is not gated, and answers by its own durability).
    pub(crate) fn leadership(&self, log: LogId) -> u64 {
        self.gates.get(&log).map_or(0, |g| g.leadership)
    }

    /// What leadership `leadership` of `log` had committed when it ended (0 once forgotten:
    /// a held answer from so long ago is an unknown outcome).
    pub(crate) fn retired_committed(&self, log: LogId, leadership: u64) -> u64 {
        self.retired_gates
            .get(&(log, leadership))
            .map_or(0, |g| g.committed)
    }

    /// The latest ended leadership of `log` here, if any.
    pub(crate) fn last_retired(&self, log: LogId) -> Option<&Gate> {
        self.retired_gates
            .range((log, 0)..=(log, u64::MAX))
            .next_back()
            .map(|(_, g)| g)
    }

    /// The shard is no longer led here: its log answers by its own durability again.
    /// Its marks are kept: a publish held under the leadership that ended must still be
    /// answered by them (`quorum_timeout`), never by the log's own durability.
    pub(crate) fn ungate(&mut self, log: LogId) {
        if self.store_of(log).is_some() {
            let _ = self.with_replica_log(log, |l| l.ship_before_sync(false));
        }
        // Polls waiting here would otherwise wait out their deadline, and then serve from a
        // follower's copy; they end empty and the client polls the next leader.
        if let Some(Owner::Groups { stream, shard }) = self
            .logs
            .as_ref()
            .and_then(|l| l.slot(log))
            .map(|s| s.owner)
        {
            self.end_group_polls((stream, shard));
        }
        if let Some(g) = self.gates.remove(&log) {
            // What it wrote past its commit mark waits for fan-out no longer: the next
            // leader may cut it, and should a later leadership here commit those offsets,
            // their records are replayed from the log as it is then (`release`), not from
            // here, where two leaderships' writes at one offset would both go out.
            let owner = self
                .logs
                .as_ref()
                .and_then(|l| l.slot(log))
                .map(|s| s.owner);
            if let Some(Owner::Stream { stream, shard }) = owner {
                if let Some(store) = self.streams[stream].shards[shard as usize].store.as_mut() {
                    store.unreleased.clear();
                }
            }
            self.retired_gates.insert((log, g.leadership), g);
            // A few are kept; an answer held across more leaderships than that is old
            // enough to be an unknown outcome.
            let keep_from = g.leadership.saturating_sub(RETIRED_LEADERSHIPS_KEPT);
            self.retired_gates
                .retain(|&(l, n), _| l != log || n > keep_from);
        }
    }

    /// The leadership of `log`'s shard here ended: every reader of the shard gets what was
    /// committed and fanned in, then `shard_moved` (a client that did not offer it sees the
    /// stream finish), and resubscribes where `to` says from `resume_from`. A reader left
    /// attached would otherwise see records appended here as a follower never, and the next
    /// leadership's from wherever that one's commit starts: a gap with no signal.
    pub(crate) fn shard_moved(&mut self, log: LogId, to: &MovedTo) {
        let owner = self
            .logs
            .as_ref()
            .and_then(|l| l.slot(log))
            .map(|s| s.owner);
        let (stream, shard) = match owner {
            Some(Owner::Stream { stream, shard }) => (stream, shard),
            Some(Owner::Cache) => return self.watches_moved(log, to),
            _ => return,
        };
        self.end_readers(stream, Some(shard), |sub, resume_from| {
            if sub.ends_on_move {
                encode_message(&Message::ShardMoved(ShardMoved {
                    subscription_id: sub.subscription_id,
                    resume_from: Some(resume_from),
                    node_id: to.node_id.clone(),
                    addr: to.addr.clone(),
                    generation: to.generation,
                }))
            } else {
                Bytes::new()
            }
        });
    }

    /// Makes `log` a follower's copy (`true`: it takes only shipped entries, and every local
    /// append, a client's or a background pass's, is refused `shard_unavailable`) or the
    /// leader's (`false`).
    pub(crate) fn take_only_shipped(&mut self, log: LogId, on: bool) {
        let _ = self.with_replica_log(log, |l| l.take_only_shipped(on));
    }

    pub(crate) fn is_gated(&self, log: LogId) -> bool {
        self.gates.contains_key(&log)
    }

    /// The replication's commit mark moved: answers below it go, and records below it fan out.
    pub(crate) fn committed(&mut self, log: LogId, up_to: u64) {
        let Some(gate) = self.gates.get_mut(&log) else {
            return;
        };
        if up_to <= gate.committed {
            return;
        }
        gate.committed = up_to;
        if let Some(logs) = self.logs.as_mut() {
            logs.notices.push_back(Notice::Durable { log, up_to });
        }
        self.release(log, up_to);
    }

    /// Quorum publishes ending at or below `up_to` did not reach a majority in time.
    pub(crate) fn timed_out(&mut self, log: LogId, up_to: u64) {
        let Some(gate) = self.gates.get_mut(&log) else {
            return;
        };
        gate.timed_out = gate.timed_out.max(up_to);
        if let Some(logs) = self.logs.as_mut() {
            logs.notices.push_back(Notice::TimedOut { log, up_to });
        }
    }

    /// The mark below which a held publish on `log` was refused `quorum_timeout`.
    pub(crate) fn timed_out_mark(&self, log: LogId) -> u64 {
        self.gates.get(&log).map_or(0, |g| g.timed_out)
    }
}

/// What replication needs to know of a shard's log.
#[derive(Debug, Clone)]
pub(crate) struct LogInfo {
    /// The oldest offset it still holds (retention, or a rebuild, moves it up).
    pub(crate) start: u64,
    /// The next offset it would write.
    pub(crate) end: u64,
    /// Its own durable end (not the commit mark).
    pub(crate) durable: u64,
    /// The replica state file as durably held.
    pub(crate) state: ReplicaState,
    /// Nothing queued or in flight: a truncation may start.
    pub(crate) idle: bool,
    /// From here on the log holds every record (below, compaction may have dropped some).
    pub(crate) complete_from: u64,
}

impl Broker {
    /// The log of shard `shard` of `key`, opening the stream (as declared, or at the default
    /// width) if this node never used it; with whether the log is open yet.
    pub(crate) fn shard_log(
        &mut self,
        now: Instant,
        key: &StreamKey,
        shard: u32,
    ) -> Option<(LogId, bool)> {
        let stream = self.stream_or_create(now, key).ok()?;
        let store = self.streams[stream]
            .shards
            .get(shard as usize)?
            .store
            .as_ref()?;
        let log = store.log;
        let open = self
            .logs
            .as_ref()
            .and_then(|l| l.slot(log))
            .is_some_and(|s| matches!(s.state, LogState::Open));
        Some((log, open))
    }

    pub(crate) fn log_info(&self, log: LogId) -> Option<LogInfo> {
        let slot = self.logs.as_ref()?.slot(log)?;
        if !matches!(slot.state, LogState::Open) {
            return None;
        }
        let shard = slot.log.shard();
        Some(LogInfo {
            start: shard.start_offset(),
            end: shard.next_offset(),
            durable: shard.durable_offset(),
            state: shard.replica_state().clone(),
            idle: shard.is_idle(),
            complete_from: shard.complete_from(),
        })
    }

    /// Runs `f` on the segment log under `log` (a shard's, or a group log's), then lets a
    /// group log take in what it did (replayed entries, events).
    fn with_replica_log<R>(
        &mut self,
        log: LogId,
        f: impl FnOnce(&mut felix_storage::log::ShardLog) -> R,
    ) -> Result<R, String> {
        let logs = self.logs.as_mut().ok_or("no durable storage")?;
        logs.mark_dirty(log);
        let slot = logs.slot_mut(log).ok_or("the log is gone")?;
        let driven = slot.log.driven();
        let out = f(driven.shard_mut());
        driven.after_input();
        Ok(out)
    }

    /// Starts a framed read for shipping; the answer comes as [`Notice::Replica`].
    pub(crate) fn read_framed(
        &mut self,
        log: LogId,
        from: u64,
        max_bytes: usize,
    ) -> Result<ReadTicket, String> {
        self.with_replica_log(log, |l| l.read_framed(from, max_bytes))?
            .map_err(|e| format!("{e:?}"))
    }

    /// Appends entries a leader shipped, and folds their producer marks and commit state into
    /// the shard as a live append would (`ShardState::apply`).
    pub(crate) fn append_framed(
        &mut self,
        now: Instant,
        log: LogId,
        base: u64,
        entries: Bytes,
    ) -> Result<u64, String> {
        // A group, cache or counter log is compacted: a shipment from it may jump over
        // offsets it dropped.
        let gaps = self
            .logs
            .as_ref()
            .and_then(|l| l.slot(log))
            .is_some_and(|s| !matches!(s.owner, Owner::Stream { .. }));
        let (end, appended) = self
            .with_replica_log(log, |l| {
                let end = if gaps {
                    l.append_framed_with_gaps(now, base, entries)?
                } else {
                    l.append_framed(now, base, entries)?
                };
                let mut appended = Vec::new();
                while let Some(a) = l.take_appended() {
                    appended.push(a);
                }
                Ok::<_, felix_storage::log::AppendError>((end, appended))
            })?
            .map_err(|e| format!("{e:?}"))?;
        let owner = self
            .logs
            .as_ref()
            .and_then(|l| l.slot(log))
            .map(|s| s.owner);
        if let Some(Owner::Stream { stream, shard }) = owner {
            let sh = &mut self.streams[stream].shards[shard as usize];
            for a in appended {
                if let Some(ext) = a.ext {
                    sh.state.apply(
                        Some(ext.base),
                        u64::from(ext.count),
                        ext.producer,
                        ext.state.as_deref(),
                    );
                }
            }
        }
        Ok(end)
    }

    /// The log was cut at `offset`: what the shard remembers of records at or above it goes.
    pub(crate) fn truncated(&mut self, log: LogId, offset: u64) {
        let owner = self
            .logs
            .as_ref()
            .and_then(|l| l.slot(log))
            .map(|s| s.owner);
        if let Some(Owner::Stream { stream, shard }) = owner {
            let sh = &mut self.streams[stream].shards[shard as usize];
            sh.state.producers.forget_from(offset);
        }
    }

    /// Cuts the log at `to` (a rejoining follower); the end comes as [`Notice::Replica`].
    pub(crate) fn truncate_log(&mut self, log: LogId, to: u64) -> Result<(), String> {
        self.with_replica_log(log, |l| l.truncate_to(to))?
            .map_err(|e| format!("{e:?}"))
    }

    /// Drops the whole log and starts it again, empty, at `start` (a follower rebuilt from
    /// its leader's log start); the end comes as [`Notice::Replica`], as a cut's does.
    pub(crate) fn restart_log(&mut self, log: LogId, start: u64) -> Result<(), String> {
        self.with_replica_log(log, |l| l.restart_at(start))?
            .map_err(|e| format!("{e:?}"))
    }

    /// The log `log` is led here from now on, or was cut: what is served from it (a group
    /// log's groups, a cache's index, a counter log's sums) is rebuilt by opening it again
    /// once idle; meanwhile requests on it wait as for a log opening. A shard's polls end
    /// empty and a cache's watches end (the client watches again, from its offset).
    pub(crate) fn reload_projection(&mut self, now: Instant, log: LogId) {
        let Some(owner) = self
            .logs
            .as_ref()
            .and_then(|l| l.slot(log))
            .map(|s| s.owner)
        else {
            return;
        };
        match owner {
            Owner::Groups { stream, shard } => self.end_group_polls((stream, shard)),
            Owner::Cache | Owner::Counter => {
                self.on_watch_log_failed(log, "the cache's leader changed; watch again");
            }
            _ => return,
        }
        self.reload_logs.insert(log);
        self.retry_reloads(now);
    }

    /// Opens again the logs waiting for it (`reload_projection`) that are idle now; run
    /// after each turn's log work.
    pub(crate) fn retry_reloads(&mut self, now: Instant) {
        if self.reload_logs.is_empty() {
            return;
        }
        let Some(logs) = self.logs.as_mut() else {
            return;
        };
        let mut reopened = Vec::new();
        self.reload_logs.retain(|&id| {
            let done = logs.reopen(id, now);
            if done {
                reopened.push(logs.slot(id).map(|s| s.owner));
            }
            !done
        });
        for owner in reopened {
            if let Some(Owner::Groups { stream, shard }) = owner {
                self.forget_loaded_groups((stream, shard));
            }
        }
    }

    /// Keeps compaction of `log` to segments ending at or below `below`.
    pub(crate) fn bound_compaction(&mut self, log: LogId, below: u64) {
        let _ = self.with_replica_log(log, |l| l.bound_compaction(Some(below)));
    }

    /// Writes the replica state file; durable when [`Notice::Replica`] says so.
    pub(crate) fn persist_replica_state(
        &mut self,
        log: LogId,
        state: ReplicaState,
    ) -> Result<(), String> {
        self.with_replica_log(log, |l| l.persist_replica_state(state))?
            .map_err(|e| format!("{e:?}"))
    }
}

#[cfg(test)]
mod tests {
    use felix_storage::record::ProducerMark;

    use super::super::producers::ProducerTable;

    #[test]
    fn a_cut_log_forgets_the_producer_batches_above_the_cut() {
        let mut t = ProducerTable::default();
        for (seq, first) in [(0, 0), (1, 2), (2, 4)] {
            let mark = ProducerMark {
                producer: 7,
                sequence: seq,
                digest: seq,
            };
            t.record(mark, Some(first), 2);
        }
        assert_eq!(t.next_sequence(7), Some(3));
        // Cuts fall on entry boundaries: at 4, batch 2 goes and its sequence is next again.
        t.forget_from(4);
        assert_eq!(t.next_sequence(7), Some(2));
        t.forget_from(10);
        assert_eq!(t.next_sequence(7), Some(2));
    }
}
