//! Replicating a shard's log: a follower asks to be fed and reports what it holds, the leader
//! ships its log's entries as stored, a promoted leader fences the replica set and fetches the
//! most advanced tail; and the lease renewals that let a node lead at all.
//!
//! Entries travel as the leader's segment holds them (headers and CRCs included): this crate
//! never looks inside them, and the follower checks every CRC before it appends. Every
//! shard-scoped message names the generation its sender acts at, so a deposed leader's
//! shipments are refused at decode by a node that knows a newer one.

use bytes::Bytes;

use crate::error::{PeerDecodeError, PeerEncodeError};
use crate::limits::Limit;
use crate::scope::ShardScope;
use crate::wire::{put_blob, put_count, put_string, Body, Reader, Scoped};

#[cfg(feature = "arbitrary")]
use crate::raft::arbitrary_bytes;

/// From `start` on, a log was written by the leader of `generation`. A copy lists its epochs
/// oldest first, generations strictly rising and starts never falling, at most
/// [`crate::limits::MAX_EPOCHS`]. The codec carries the list as sent: the order is a fact
/// about a log, so the engine that compares it with its own checks it, as every offset here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Epoch {
    /// The shard generation whose leader wrote from `start`.
    pub generation: u64,
    /// The first offset written at that generation.
    pub start: u64,
}

const EPOCH_LEN: usize = 16;

fn put_epochs(
    out: &mut Vec<u8>,
    epochs: &[Epoch],
    field: &'static str,
) -> Result<(), PeerEncodeError> {
    put_count(out, epochs.len(), Limit::Epochs, field)?;
    for e in epochs {
        out.extend_from_slice(&e.generation.to_be_bytes());
        out.extend_from_slice(&e.start.to_be_bytes());
    }
    Ok(())
}

fn epochs(r: &mut Reader<'_>, field: &'static str) -> Result<Vec<Epoch>, PeerDecodeError> {
    let n = r.count(Limit::Epochs, EPOCH_LEN, field)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(Epoch {
            generation: r.u64(field)?,
            start: r.u64(field)?,
        });
    }
    Ok(out)
}

fn put_u64s(out: &mut Vec<u8>, values: &[u64]) {
    for v in values {
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// A follower asks the shard's leader to be fed, describing its copy.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Follow {
    pub scope: ShardScope,
    /// The disk the copy lives on; the leader counts only the one the metadata names.
    pub storage_id: String,
    pub epochs: Vec<Epoch>,
    /// The offset the follower would write next.
    pub end: u64,
    pub durable_end: u64,
    /// The commit mark the follower has persisted.
    pub commit: u64,
}

impl Scoped for Follow {
    fn scope(&self) -> &ShardScope {
        &self.scope
    }
}

impl Body for Follow {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        self.scope.encode(out)?;
        put_string(out, &self.storage_id, "follow.storage_id")?;
        put_epochs(out, &self.epochs, "follow.epochs")?;
        put_u64s(out, &[self.end, self.durable_end, self.commit]);
        Ok(())
    }

    fn decode(r: &mut Reader<'_>) -> Result<Follow, PeerDecodeError> {
        Ok(Follow {
            scope: ShardScope::decode(r)?,
            storage_id: r.string("follow.storage_id")?,
            epochs: epochs(r, "follow.epochs")?,
            end: r.u64("follow.end")?,
            durable_end: r.u64("follow.durable_end")?,
            commit: r.u64("follow.commit")?,
        })
    }
}

/// The leader's answer to [`Follow`]: cut the copy at `truncate_to`, then be fed from there;
/// or, with `rebuild`, drop the whole copy and start the log again, empty, at `truncate_to`
/// (the leader's log start), because nothing the copy holds can be fed from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct FollowFrom {
    pub scope: ShardScope,
    pub truncate_to: u64,
    pub leader_end: u64,
    pub commit: u64,
    /// The leader's epochs, so the follower's describe what it will hold.
    pub epochs: Vec<Epoch>,
    pub rebuild: bool,
}

impl Scoped for FollowFrom {
    fn scope(&self) -> &ShardScope {
        &self.scope
    }
}

impl Body for FollowFrom {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        self.scope.encode(out)?;
        put_u64s(out, &[self.truncate_to, self.leader_end, self.commit]);
        put_epochs(out, &self.epochs, "follow_from.epochs")?;
        out.push(u8::from(self.rebuild));
        Ok(())
    }

    fn decode(r: &mut Reader<'_>) -> Result<FollowFrom, PeerDecodeError> {
        Ok(FollowFrom {
            scope: ShardScope::decode(r)?,
            truncate_to: r.u64("follow_from.truncate_to")?,
            leader_end: r.u64("follow_from.leader_end")?,
            commit: r.u64("follow_from.commit")?,
            epochs: epochs(r, "follow_from.epochs")?,
            rebuild: r.bool("follow_from.rebuild")?,
        })
    }
}

/// Entries shipped from the leader's log, starting at `base_offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Replicate {
    pub scope: ShardScope,
    pub base_offset: u64,
    pub record_count: u32,
    /// The leader's commit mark.
    pub commit: u64,
    /// Whole entries as the leader's segment holds them, at most
    /// [`crate::limits::MAX_REPLICATED_BYTES`]; empty with a count of 0 to carry `commit` only.
    #[cfg_attr(feature = "arbitrary", arbitrary(with = arbitrary_bytes))]
    pub entries: Bytes,
}

impl Scoped for Replicate {
    fn scope(&self) -> &ShardScope {
        &self.scope
    }
}

impl Body for Replicate {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        self.scope.encode(out)?;
        out.extend_from_slice(&self.base_offset.to_be_bytes());
        out.extend_from_slice(&self.record_count.to_be_bytes());
        out.extend_from_slice(&self.commit.to_be_bytes());
        put_blob(
            out,
            &self.entries,
            Limit::ReplicatedBytes,
            "replicate.entries",
        )
    }

    fn decode(r: &mut Reader<'_>) -> Result<Replicate, PeerDecodeError> {
        Ok(Replicate {
            scope: ShardScope::decode(r)?,
            base_offset: r.u64("replicate.base_offset")?,
            record_count: r.u32("replicate.record_count")?,
            commit: r.u64("replicate.commit")?,
            entries: r.blob(Limit::ReplicatedBytes, "replicate.entries")?,
        })
    }
}

/// A follower's report: what it has received and made durable.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ReplicaReport {
    pub scope: ShardScope,
    pub storage_id: String,
    pub end: u64,
    pub durable_end: u64,
}

impl Scoped for ReplicaReport {
    fn scope(&self) -> &ShardScope {
        &self.scope
    }
}

impl Body for ReplicaReport {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        self.scope.encode(out)?;
        put_string(out, &self.storage_id, "replica_report.storage_id")?;
        put_u64s(out, &[self.end, self.durable_end]);
        Ok(())
    }

    fn decode(r: &mut Reader<'_>) -> Result<ReplicaReport, PeerDecodeError> {
        Ok(ReplicaReport {
            scope: ShardScope::decode(r)?,
            storage_id: r.string("replica_report.storage_id")?,
            end: r.u64("replica_report.end")?,
            durable_end: r.u64("replica_report.durable_end")?,
        })
    }
}

/// The leader's log starts at `start` now (its retention cut there): a follower starts its
/// copy at the same offset, so no copy holds what its leader dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct LogStart {
    pub scope: ShardScope,
    pub start: u64,
}

impl Scoped for LogStart {
    fn scope(&self) -> &ShardScope {
        &self.scope
    }
}

impl Body for LogStart {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        self.scope.encode(out)?;
        put_u64s(out, &[self.start]);
        Ok(())
    }

    fn decode(r: &mut Reader<'_>) -> Result<LogStart, PeerDecodeError> {
        Ok(LogStart {
            scope: ShardScope::decode(r)?,
            start: r.u64("log_start.start")?,
        })
    }
}

/// A promoted leader asks a replica to persist the new generation (the scope's) and to refuse
/// every leader below it from then on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Fence {
    pub scope: ShardScope,
    pub leader_storage_id: String,
}

impl Scoped for Fence {
    fn scope(&self) -> &ShardScope {
        &self.scope
    }
}

impl Body for Fence {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        self.scope.encode(out)?;
        put_string(out, &self.leader_storage_id, "fence.leader_storage_id")
    }

    fn decode(r: &mut Reader<'_>) -> Result<Fence, PeerDecodeError> {
        Ok(Fence {
            scope: ShardScope::decode(r)?,
            leader_storage_id: r.string("fence.leader_storage_id")?,
        })
    }
}

/// A replica took the fence: how far its copy reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct FenceAnswer {
    pub scope: ShardScope,
    pub storage_id: String,
    /// The generation its last record was written at (0 for an empty copy).
    pub last_generation: u64,
    pub end: u64,
    pub durable_end: u64,
    pub commit: u64,
    pub epochs: Vec<Epoch>,
}

impl Scoped for FenceAnswer {
    fn scope(&self) -> &ShardScope {
        &self.scope
    }
}

impl Body for FenceAnswer {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        self.scope.encode(out)?;
        put_string(out, &self.storage_id, "fence_answer.storage_id")?;
        put_u64s(
            out,
            &[
                self.last_generation,
                self.end,
                self.durable_end,
                self.commit,
            ],
        );
        put_epochs(out, &self.epochs, "fence_answer.epochs")
    }

    fn decode(r: &mut Reader<'_>) -> Result<FenceAnswer, PeerDecodeError> {
        Ok(FenceAnswer {
            scope: ShardScope::decode(r)?,
            storage_id: r.string("fence_answer.storage_id")?,
            last_generation: r.u64("fence_answer.last_generation")?,
            end: r.u64("fence_answer.end")?,
            durable_end: r.u64("fence_answer.durable_end")?,
            commit: r.u64("fence_answer.commit")?,
            epochs: epochs(r, "fence_answer.epochs")?,
        })
    }
}

/// A promoted leader asks the replica with the most advanced copy for its entries from `from`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct TailFetch {
    pub scope: ShardScope,
    /// The first offset wanted.
    pub from: u64,
    /// The most entry bytes wanted in the chunk; the answer also stays within
    /// [`crate::limits::MAX_REPLICATED_BYTES`].
    pub max_bytes: u32,
}

impl Scoped for TailFetch {
    fn scope(&self) -> &ShardScope {
        &self.scope
    }
}

impl Body for TailFetch {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        self.scope.encode(out)?;
        out.extend_from_slice(&self.from.to_be_bytes());
        out.extend_from_slice(&self.max_bytes.to_be_bytes());
        Ok(())
    }

    fn decode(r: &mut Reader<'_>) -> Result<TailFetch, PeerDecodeError> {
        Ok(TailFetch {
            scope: ShardScope::decode(r)?,
            from: r.u64("tail_fetch.from")?,
            max_bytes: r.u32("tail_fetch.max_bytes")?,
        })
    }
}

/// Entries answering a [`TailFetch`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct TailChunk {
    pub scope: ShardScope,
    pub base_offset: u64,
    pub record_count: u32,
    /// Whole entries as the replica's segment holds them, at most
    /// [`crate::limits::MAX_REPLICATED_BYTES`].
    #[cfg_attr(feature = "arbitrary", arbitrary(with = arbitrary_bytes))]
    pub entries: Bytes,
    /// The answering replica's end.
    pub end: u64,
    /// This chunk reaches it.
    pub last: bool,
}

impl Scoped for TailChunk {
    fn scope(&self) -> &ShardScope {
        &self.scope
    }
}

impl Body for TailChunk {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        self.scope.encode(out)?;
        out.extend_from_slice(&self.base_offset.to_be_bytes());
        out.extend_from_slice(&self.record_count.to_be_bytes());
        put_blob(
            out,
            &self.entries,
            Limit::ReplicatedBytes,
            "tail_chunk.entries",
        )?;
        out.extend_from_slice(&self.end.to_be_bytes());
        out.push(u8::from(self.last));
        Ok(())
    }

    fn decode(r: &mut Reader<'_>) -> Result<TailChunk, PeerDecodeError> {
        Ok(TailChunk {
            scope: ShardScope::decode(r)?,
            base_offset: r.u64("tail_chunk.base_offset")?,
            record_count: r.u32("tail_chunk.record_count")?,
            entries: r.blob(Limit::ReplicatedBytes, "tail_chunk.entries")?,
            end: r.u64("tail_chunk.end")?,
            last: r.bool("tail_chunk.last")?,
        })
    }
}

/// Why a replication message was not acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[repr(u8)]
pub enum RefusalReason {
    /// The sender's generation is older than the receiver's.
    StaleGeneration = 1,
    /// The receiver is not in the shard's replica set (or the sender is not).
    NotReplica = 2,
    /// The receiver took a fence above the sender's generation.
    Fenced = 3,
    /// The receiver stopped this shard rather than rewrite committed records.
    Halted = 4,
    /// The sender's storage identity is not the one the metadata names.
    UnknownStorage = 5,
    /// The receiver's copy is not open (yet).
    NotOpen = 6,
}

impl RefusalReason {
    fn from_u8(v: u8) -> Option<RefusalReason> {
        Some(match v {
            1 => RefusalReason::StaleGeneration,
            2 => RefusalReason::NotReplica,
            3 => RefusalReason::Fenced,
            4 => RefusalReason::Halted,
            5 => RefusalReason::UnknownStorage,
            6 => RefusalReason::NotOpen,
            _ => return None,
        })
    }
}

/// A replication message was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ReplicationRefused {
    pub scope: ShardScope,
    pub reason: RefusalReason,
    /// The refusing node's generation for the shard.
    pub current_generation: u64,
    pub detail: String,
}

impl Scoped for ReplicationRefused {
    fn scope(&self) -> &ShardScope {
        &self.scope
    }
}

impl Body for ReplicationRefused {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        self.scope.encode(out)?;
        out.push(self.reason as u8);
        out.extend_from_slice(&self.current_generation.to_be_bytes());
        put_string(out, &self.detail, "replication_refused.detail")
    }

    fn decode(r: &mut Reader<'_>) -> Result<ReplicationRefused, PeerDecodeError> {
        let scope = ShardScope::decode(r)?;
        let raw = r.u8("replication_refused.reason")?;
        let reason = RefusalReason::from_u8(raw).ok_or(PeerDecodeError::InvalidValue {
            field: "replication_refused.reason",
            value: u64::from(raw),
        })?;
        Ok(ReplicationRefused {
            scope,
            reason,
            current_generation: r.u64("replication_refused.current_generation")?,
            detail: r.string("replication_refused.detail")?,
        })
    }
}

/// A node asks the control plane's leader to renew its shard leases.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct LeaseRenew {
    pub node: String,
    /// Chosen by the node; the grant carries it back.
    pub seq: u64,
    pub storage_id: String,
}

impl Body for LeaseRenew {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        put_string(out, &self.node, "lease_renew.node")?;
        out.extend_from_slice(&self.seq.to_be_bytes());
        put_string(out, &self.storage_id, "lease_renew.storage_id")
    }

    fn decode(r: &mut Reader<'_>) -> Result<LeaseRenew, PeerDecodeError> {
        Ok(LeaseRenew {
            node: r.string("lease_renew.node")?,
            seq: r.u64("lease_renew.seq")?,
            storage_id: r.string("lease_renew.storage_id")?,
        })
    }
}

/// The control plane's leader renewed a node's leases.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct LeaseGrant {
    pub seq: u64,
    /// The granting leader's raft term.
    pub term: u64,
    pub lease_ms: u32,
    /// The node counts the lease only once it has applied the metadata this far.
    pub applied: u64,
}

impl Body for LeaseGrant {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.term.to_be_bytes());
        out.extend_from_slice(&self.lease_ms.to_be_bytes());
        out.extend_from_slice(&self.applied.to_be_bytes());
        Ok(())
    }

    fn decode(r: &mut Reader<'_>) -> Result<LeaseGrant, PeerDecodeError> {
        Ok(LeaseGrant {
            seq: r.u64("lease_grant.seq")?,
            term: r.u64("lease_grant.term")?,
            lease_ms: r.u32("lease_grant.lease_ms")?,
            applied: r.u64("lease_grant.applied")?,
        })
    }
}
