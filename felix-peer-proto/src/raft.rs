//! One raft-rs message between control-plane peers, as plain structs.
//!
//! [`RaftMessage`] mirrors every field of raft-rs 0.7.0's `eraftpb::Message` (and of the
//! `Entry`, `Snapshot`, `SnapshotMetadata` and `ConfState` inside it), so felix-cluster
//! converts between the two field by field and nothing is lost. The enum numbers are the
//! proto's. Presence of the nested messages is kept (`Option`), as protobuf keeps it.
//!
//! Body layout, in order (integers big-endian, `bool` one byte 0 or 1, `bytes` a `u32`
//! length then the bytes, `Option` one byte 0 or 1 then the value):
//!
//! ```text
//! msg_type u8 · to u64 · from u64 · term u64 · log_term u64 · index u64 · commit u64 ·
//! commit_term u64 · request_snapshot u64 · reject bool · reject_hint u64 ·
//! deprecated_priority u64 · priority i64 · context bytes ·
//! entries: count u32, each { entry_type u8 · term u64 · index u64 · sync_log bool ·
//!                            data bytes · context bytes } ·
//! snapshot Option{ data bytes · metadata Option{ index u64 · term u64 ·
//!     conf_state Option{ voters, learners, voters_outgoing, learners_next:
//!                        each count u32 then u64s · auto_leave bool } } }
//! ```

use bytes::Bytes;

use crate::error::{PeerDecodeError, PeerEncodeError};
use crate::limits::Limit;
use crate::wire::{put_blob, put_count, Body, Reader};

macro_rules! wire_enum {
    ($(#[$meta:meta])* $name:ident, $field:literal { $( $(#[$doc:meta])* $variant:ident = $n:literal, )* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
        pub enum $name { $( $(#[$doc])* $variant = $n, )* }

        impl $name {
            /// The proto enum number.
            pub fn number(self) -> u8 {
                self as u8
            }

            /// The variant for a proto enum number; `None` for one the proto does not define.
            pub fn from_number(n: u8) -> Option<$name> {
                match n {
                    $( $n => Some($name::$variant), )*
                    _ => None,
                }
            }

            fn read(r: &mut Reader<'_>) -> Result<$name, PeerDecodeError> {
                let n = r.u8($field)?;
                $name::from_number(n).ok_or(PeerDecodeError::InvalidValue { field: $field, value: n.into() })
            }
        }
    };
}

wire_enum! {
    /// `eraftpb::MessageType`, same numbers.
    RaftMessageType, "raft.msg_type" {
        /// `MsgHup`.
        Hup = 0,
        /// `MsgBeat`.
        Beat = 1,
        /// `MsgPropose`.
        Propose = 2,
        /// `MsgAppend`.
        Append = 3,
        /// `MsgAppendResponse`.
        AppendResponse = 4,
        /// `MsgRequestVote`.
        RequestVote = 5,
        /// `MsgRequestVoteResponse`.
        RequestVoteResponse = 6,
        /// `MsgSnapshot`.
        Snapshot = 7,
        /// `MsgHeartbeat`.
        Heartbeat = 8,
        /// `MsgHeartbeatResponse`.
        HeartbeatResponse = 9,
        /// `MsgUnreachable`.
        Unreachable = 10,
        /// `MsgSnapStatus`.
        SnapStatus = 11,
        /// `MsgCheckQuorum`.
        CheckQuorum = 12,
        /// `MsgTransferLeader`.
        TransferLeader = 13,
        /// `MsgTimeoutNow`.
        TimeoutNow = 14,
        /// `MsgReadIndex`.
        ReadIndex = 15,
        /// `MsgReadIndexResp`.
        ReadIndexResp = 16,
        /// `MsgRequestPreVote`.
        RequestPreVote = 17,
        /// `MsgRequestPreVoteResponse`.
        RequestPreVoteResponse = 18,
    }
}

wire_enum! {
    /// `eraftpb::EntryType`, same numbers.
    RaftEntryType, "raft.entry.entry_type" {
        /// `EntryNormal`.
        Normal = 0,
        /// `EntryConfChange`.
        ConfChange = 1,
        /// `EntryConfChangeV2`.
        ConfChangeV2 = 2,
    }
}

/// The proto's zero value.
impl Default for RaftMessageType {
    fn default() -> Self {
        RaftMessageType::Hup
    }
}

/// The proto's zero value.
impl Default for RaftEntryType {
    fn default() -> Self {
        RaftEntryType::Normal
    }
}

#[cfg(feature = "arbitrary")]
pub(crate) fn arbitrary_bytes(u: &mut arbitrary::Unstructured<'_>) -> arbitrary::Result<Bytes> {
    use arbitrary::Arbitrary;
    Ok(Bytes::from(Vec::<u8>::arbitrary(u)?))
}

/// `eraftpb::Entry`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct RaftEntry {
    /// `entry_type`.
    pub entry_type: RaftEntryType,
    /// `term`.
    pub term: u64,
    /// `index`.
    pub index: u64,
    /// `data`, at most [`crate::limits::MAX_ENTRY_DATA_BYTES`].
    #[cfg_attr(feature = "arbitrary", arbitrary(with = arbitrary_bytes))]
    pub data: Bytes,
    /// `context`, at most [`crate::limits::MAX_CONTEXT_BYTES`].
    #[cfg_attr(feature = "arbitrary", arbitrary(with = arbitrary_bytes))]
    pub context: Bytes,
    /// `sync_log` (deprecated in the proto, carried anyway).
    pub sync_log: bool,
}

/// The fewest bytes an entry takes: type, term, index, sync_log, two empty lengths.
const MIN_ENTRY_BYTES: usize = 1 + 8 + 8 + 1 + 4 + 4;

/// `eraftpb::ConfState`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct RaftConfState {
    /// `voters`, at most [`crate::limits::MAX_CONF_NODES`] (as each list below).
    pub voters: Vec<u64>,
    /// `learners`.
    pub learners: Vec<u64>,
    /// `voters_outgoing`.
    pub voters_outgoing: Vec<u64>,
    /// `learners_next`.
    pub learners_next: Vec<u64>,
    /// `auto_leave`.
    pub auto_leave: bool,
}

/// `eraftpb::SnapshotMetadata`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct RaftSnapshotMetadata {
    /// `conf_state`, `None` when the proto field is absent.
    pub conf_state: Option<RaftConfState>,
    /// `index`.
    pub index: u64,
    /// `term`.
    pub term: u64,
}

/// `eraftpb::Snapshot`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct RaftSnapshot {
    /// `data`, at most [`crate::limits::MAX_SNAPSHOT_DATA_BYTES`].
    #[cfg_attr(feature = "arbitrary", arbitrary(with = arbitrary_bytes))]
    pub data: Bytes,
    /// `metadata`, `None` when the proto field is absent.
    pub metadata: Option<RaftSnapshotMetadata>,
}

/// `eraftpb::Message`, every field. `Default` is the proto's all-zero message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct RaftMessage {
    /// `msg_type`.
    pub msg_type: RaftMessageType,
    /// `to`.
    pub to: u64,
    /// `from`.
    pub from: u64,
    /// `term`.
    pub term: u64,
    /// `log_term`.
    pub log_term: u64,
    /// `index`.
    pub index: u64,
    /// `entries`, at most [`crate::limits::MAX_RAFT_ENTRIES`].
    pub entries: Vec<RaftEntry>,
    /// `commit`.
    pub commit: u64,
    /// `commit_term`.
    pub commit_term: u64,
    /// `snapshot`, `None` when the proto field is absent.
    pub snapshot: Option<RaftSnapshot>,
    /// `request_snapshot`.
    pub request_snapshot: u64,
    /// `reject`.
    pub reject: bool,
    /// `reject_hint`.
    pub reject_hint: u64,
    /// `context`, at most [`crate::limits::MAX_CONTEXT_BYTES`].
    #[cfg_attr(feature = "arbitrary", arbitrary(with = arbitrary_bytes))]
    pub context: Bytes,
    /// `deprecated_priority`.
    pub deprecated_priority: u64,
    /// `priority`.
    pub priority: i64,
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_nodes(out: &mut Vec<u8>, ids: &[u64], field: &'static str) -> Result<(), PeerEncodeError> {
    put_count(out, ids.len(), Limit::ConfNodes, field)?;
    for id in ids {
        put_u64(out, *id);
    }
    Ok(())
}

fn read_nodes(r: &mut Reader<'_>, field: &'static str) -> Result<Vec<u64>, PeerDecodeError> {
    let n = r.count(Limit::ConfNodes, 8, field)?;
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        ids.push(r.u64(field)?);
    }
    Ok(ids)
}

impl RaftConfState {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        put_nodes(out, &self.voters, "raft.conf_state.voters")?;
        put_nodes(out, &self.learners, "raft.conf_state.learners")?;
        put_nodes(
            out,
            &self.voters_outgoing,
            "raft.conf_state.voters_outgoing",
        )?;
        put_nodes(out, &self.learners_next, "raft.conf_state.learners_next")?;
        out.push(self.auto_leave.into());
        Ok(())
    }

    fn decode(r: &mut Reader<'_>) -> Result<RaftConfState, PeerDecodeError> {
        Ok(RaftConfState {
            voters: read_nodes(r, "raft.conf_state.voters")?,
            learners: read_nodes(r, "raft.conf_state.learners")?,
            voters_outgoing: read_nodes(r, "raft.conf_state.voters_outgoing")?,
            learners_next: read_nodes(r, "raft.conf_state.learners_next")?,
            auto_leave: r.bool("raft.conf_state.auto_leave")?,
        })
    }
}

impl RaftSnapshot {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        put_blob(out, &self.data, Limit::SnapshotData, "raft.snapshot.data")?;
        match &self.metadata {
            None => out.push(0),
            Some(m) => {
                out.push(1);
                put_u64(out, m.index);
                put_u64(out, m.term);
                match &m.conf_state {
                    None => out.push(0),
                    Some(c) => {
                        out.push(1);
                        c.encode(out)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn decode(r: &mut Reader<'_>) -> Result<RaftSnapshot, PeerDecodeError> {
        let data = r.blob(Limit::SnapshotData, "raft.snapshot.data")?;
        let metadata = if r.bool("raft.snapshot.metadata present")? {
            let index = r.u64("raft.snapshot.metadata.index")?;
            let term = r.u64("raft.snapshot.metadata.term")?;
            let conf_state = if r.bool("raft.snapshot.metadata.conf_state present")? {
                Some(RaftConfState::decode(r)?)
            } else {
                None
            };
            Some(RaftSnapshotMetadata {
                conf_state,
                index,
                term,
            })
        } else {
            None
        };
        Ok(RaftSnapshot { data, metadata })
    }
}

impl Body for RaftMessage {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        out.push(self.msg_type.number());
        for v in [
            self.to,
            self.from,
            self.term,
            self.log_term,
            self.index,
            self.commit,
            self.commit_term,
            self.request_snapshot,
        ] {
            put_u64(out, v);
        }
        out.push(self.reject.into());
        put_u64(out, self.reject_hint);
        put_u64(out, self.deprecated_priority);
        out.extend_from_slice(&self.priority.to_be_bytes());
        put_blob(out, &self.context, Limit::Context, "raft.context")?;
        put_count(out, self.entries.len(), Limit::RaftEntries, "raft.entries")?;
        for e in &self.entries {
            out.push(e.entry_type.number());
            put_u64(out, e.term);
            put_u64(out, e.index);
            out.push(e.sync_log.into());
            put_blob(out, &e.data, Limit::EntryData, "raft.entry.data")?;
            put_blob(out, &e.context, Limit::Context, "raft.entry.context")?;
        }
        match &self.snapshot {
            None => out.push(0),
            Some(s) => {
                out.push(1);
                s.encode(out)?;
            }
        }
        Ok(())
    }

    fn decode(r: &mut Reader<'_>) -> Result<RaftMessage, PeerDecodeError> {
        let msg_type = RaftMessageType::read(r)?;
        let to = r.u64("raft.to")?;
        let from = r.u64("raft.from")?;
        let term = r.u64("raft.term")?;
        let log_term = r.u64("raft.log_term")?;
        let index = r.u64("raft.index")?;
        let commit = r.u64("raft.commit")?;
        let commit_term = r.u64("raft.commit_term")?;
        let request_snapshot = r.u64("raft.request_snapshot")?;
        let reject = r.bool("raft.reject")?;
        let reject_hint = r.u64("raft.reject_hint")?;
        let deprecated_priority = r.u64("raft.deprecated_priority")?;
        let priority = r.i64("raft.priority")?;
        let context = r.blob(Limit::Context, "raft.context")?;
        let n = r.count(Limit::RaftEntries, MIN_ENTRY_BYTES, "raft.entries")?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            entries.push(RaftEntry {
                entry_type: RaftEntryType::read(r)?,
                term: r.u64("raft.entry.term")?,
                index: r.u64("raft.entry.index")?,
                sync_log: r.bool("raft.entry.sync_log")?,
                data: r.blob(Limit::EntryData, "raft.entry.data")?,
                context: r.blob(Limit::Context, "raft.entry.context")?,
            });
        }
        let snapshot = if r.bool("raft.snapshot present")? {
            Some(RaftSnapshot::decode(r)?)
        } else {
            None
        };
        Ok(RaftMessage {
            msg_type,
            to,
            from,
            term,
            log_term,
            index,
            entries,
            commit,
            commit_term,
            snapshot,
            request_snapshot,
            reject,
            reject_hint,
            context,
            deprecated_priority,
            priority,
        })
    }
}
