//! The copies' outputs as the engine carries them: log work as [`ReplicaIo`] on the broker's
//! logs, events as logs and `/metrics` counts; and the log's values as the copies read them.

use bytes::Bytes;
use felix_cluster::replication::copy::{CopyEvent, CopyIo, CopyState, Framed, LogPos};
use felix_storage::ops::LogId;
use felix_storage::replica_state::{Epoch as StoredEpoch, ReplicaState};
use tracing::{error, info, warn};

use super::{CopyKind, CopyRef, ReadPurpose};
use crate::broker::replicated::MovedTo;
use crate::broker::LogInfo;
use crate::cluster::ClusterNode;

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
    /// Start a follower's copy where its leader's log starts (`ShardLog::trim_to`).
    TrimTo {
        log: LogId,
        start: u64,
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

pub(super) fn copy_state(state: &ReplicaState) -> CopyState {
    CopyState {
        fence_generation: state.fence_generation,
        commit: state.commit,
        epochs: state
            .epochs
            .iter()
            .map(|e| (e.generation, e.start_offset))
            .collect(),
        log_start: state.log_start,
    }
}

fn replica_state(state: CopyState) -> ReplicaState {
    ReplicaState {
        fence_generation: state.fence_generation,
        commit: state.commit,
        epochs: state
            .epochs
            .into_iter()
            .map(|(generation, start_offset)| StoredEpoch {
                generation,
                start_offset,
            })
            .collect(),
        log_start: state.log_start,
    }
}

pub(super) fn log_pos(info: &LogInfo) -> LogPos {
    LogPos {
        start: info.start,
        end: info.end,
        durable: info.durable,
        state: copy_state(&info.state),
        idle: info.idle,
        complete_from: info.complete_from,
    }
}

pub(super) fn framed_batch(
    result: Result<felix_storage::log::FramedBatch, felix_storage::log::ReadError>,
) -> Result<Framed, String> {
    result
        .map(|b| Framed {
            base: b.base,
            end: b.end,
            entries: b.entries,
        })
        .map_err(|e| format!("{e:?}"))
}

impl ClusterNode {
    pub(super) fn replica_io(&self, r: &CopyRef, log: LogId, io: CopyIo) -> ReplicaIo {
        match io {
            CopyIo::Persist(state) => ReplicaIo::PersistState {
                log,
                state: replica_state(state),
            },
            CopyIo::Read {
                from,
                max_bytes,
                purpose,
            } => ReplicaIo::ReadFramed {
                log,
                from,
                max_bytes,
                purpose,
            },
            CopyIo::Append { base, entries } => ReplicaIo::Append { log, base, entries },
            CopyIo::Truncate { to } => ReplicaIo::Truncate { log, to },
            CopyIo::TrimTo { start } => ReplicaIo::TrimTo { log, start },
            CopyIo::RestartAt { start } => ReplicaIo::RestartAt { log, start },
            CopyIo::Gate { committed } => ReplicaIo::Gate { log, committed },
            CopyIo::Ungate => ReplicaIo::Ungate { log },
            CopyIo::BoundCompaction { below } => ReplicaIo::BoundCompaction { log, below },
            CopyIo::Moved { fenced_by } => {
                let to = match fenced_by {
                    Some((node, generation)) => MovedTo {
                        addr: self.member_addr(&node),
                        node_id: Some(node.0),
                        generation,
                    },
                    None => self.moved_to(r),
                };
                ReplicaIo::Moved { log, to }
            }
            CopyIo::Committed { up_to } => ReplicaIo::Committed { log, up_to },
            CopyIo::TimedOut { up_to } => ReplicaIo::TimedOut { log, up_to },
        }
    }

    pub(super) fn copy_event(&mut self, r: &CopyRef, event: CopyEvent) {
        match event {
            CopyEvent::Leading { generation, end } => {
                info!(shard = %r, generation, end, "leading");
                if r.kind == CopyKind::Records {
                    // Only a shard's latest generation is ever asked about.
                    let opened = &mut self.replicas.opened;
                    opened.retain(|(s, _)| *s != r.shard);
                    opened.insert((r.shard.clone(), generation));
                }
                // Requests parked for this shard may go now.
                self.metadata_changed = true;
            }
            CopyEvent::SteppedDown { generation } => {
                info!(shard = %r, generation, "no longer leading");
            }
            CopyEvent::Abandoned {
                generation,
                from,
                to,
            } => {
                let lost = to - from;
                warn!(shard = %r, generation, from, to, lost,
                    "acknowledged records abandoned: no surviving copy holds them");
                self.replicas.stats.acknowledged_abandoned += lost;
            }
            CopyEvent::Halted { agreed, committed } => {
                warn!(shard = %r, agreed, committed, "halted: the leader's log disagrees below this copy's commit");
            }
            CopyEvent::Rebuilding { follower, from } => {
                info!(shard = %r, %follower, from, "rebuilding a follower's copy from this log");
            }
            CopyEvent::NotShipped { to, detail } => {
                warn!(shard = %r, %to, error = %detail, "nothing to ship from there; the follower is told to ask again");
            }
            CopyEvent::NotAppended { adopting, detail } => {
                if adopting {
                    warn!(shard = %r, error = %detail, "adopted tail not appended; fetching again");
                } else {
                    warn!(shard = %r, error = %detail, "shipped entries not appended; asking again");
                }
            }
            CopyEvent::CutFailed { detail } => {
                warn!(shard = %r, error = %detail, "truncation failed; trying again");
            }
            CopyEvent::StateRefused { detail } => {
                error!(shard = %r, error = %detail, "replica state refused by the log; deciding again");
                self.replicas.stats.replica_states_refused += 1;
            }
            CopyEvent::QuorumTimeout => self.replicas.stats.quorum_timeouts += 1,
        }
    }
}
