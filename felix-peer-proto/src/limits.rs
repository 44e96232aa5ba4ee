//! Every bound the peer protocol puts on a length-prefixed field, in one place.
//!
//! These are protocol constants, not knobs: both ends of a link must agree on them, and a
//! sender that exceeds one gets [`crate::PeerEncodeError::OverLimit`] instead of a frame its
//! peer would refuse. The one value a receiver may lower is the frame body limit handed to
//! [`crate::PeerFrameDecoder::new`].

/// Largest frame body (32 MiB): a forwarded client frame at its own 16 MiB limit fits with
/// room for the scope, and a raft snapshot at [`MAX_SNAPSHOT_DATA_BYTES`] fits too.
pub const MAX_FRAME_BODY_BYTES: u32 = 32 * 1024 * 1024;
/// Longest string (cluster and node ids, tenant, namespace, stream or cache name, principal).
/// Client-visible names stop at 255 bytes; principals may be longer.
pub const MAX_STRING_BYTES: usize = 1024;
/// Most entries in one raft message. The driver's `max_size_per_msg` keeps real batches far
/// below this; the bound is what a forged count may cost.
pub const MAX_RAFT_ENTRIES: usize = 1024;
/// Largest `data` of one raft entry (1 MiB): cluster metadata commands are small.
pub const MAX_ENTRY_DATA_BYTES: usize = 1024 * 1024;
/// Largest `context` of a raft entry or message (64 KiB).
pub const MAX_CONTEXT_BYTES: usize = 64 * 1024;
/// Largest raft snapshot `data` (16 MiB): the whole metadata state machine.
pub const MAX_SNAPSHOT_DATA_BYTES: usize = 16 * 1024 * 1024;
/// Most node ids in one list of a raft `ConfState` (voters, learners, …).
pub const MAX_CONF_NODES: usize = 256;
/// Largest forwarded client frame or answer: one felix-proto frame at its default limit,
/// header included.
pub const MAX_FORWARDED_FRAME_BYTES: usize =
    felix_proto::frame::DEFAULT_MAX_FRAME_BYTES as usize + felix_proto::frame::HEADER_LEN;

/// Most epochs a replication message lists (as many as a replica state file holds).
pub const MAX_EPOCHS: usize = 4096;
/// Largest run of log entries one replication message ships (24 MiB): one entry holds one
/// publish batch, which can be a whole client frame (16 MiB), and a shipment always carries
/// at least one entry; still inside a frame body with its epochs.
pub const MAX_REPLICATED_BYTES: usize = 24 * 1024 * 1024;

/// A named limit, as errors report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// [`MAX_FRAME_BODY_BYTES`].
    FrameBody,
    /// [`MAX_STRING_BYTES`].
    String,
    /// [`MAX_RAFT_ENTRIES`].
    RaftEntries,
    /// [`MAX_ENTRY_DATA_BYTES`].
    EntryData,
    /// [`MAX_CONTEXT_BYTES`].
    Context,
    /// [`MAX_SNAPSHOT_DATA_BYTES`].
    SnapshotData,
    /// [`MAX_CONF_NODES`].
    ConfNodes,
    /// [`MAX_FORWARDED_FRAME_BYTES`].
    ForwardedFrame,
    /// [`MAX_EPOCHS`].
    Epochs,
    /// [`MAX_REPLICATED_BYTES`].
    ReplicatedBytes,
}

impl Limit {
    /// Every limit, for tests and documentation.
    pub const ALL: &'static [Limit] = &[
        Limit::FrameBody,
        Limit::String,
        Limit::RaftEntries,
        Limit::EntryData,
        Limit::Context,
        Limit::SnapshotData,
        Limit::ConfNodes,
        Limit::ForwardedFrame,
        Limit::Epochs,
        Limit::ReplicatedBytes,
    ];

    /// The largest value allowed.
    pub const fn max(self) -> usize {
        match self {
            Limit::FrameBody => MAX_FRAME_BODY_BYTES as usize,
            Limit::String => MAX_STRING_BYTES,
            Limit::RaftEntries => MAX_RAFT_ENTRIES,
            Limit::EntryData => MAX_ENTRY_DATA_BYTES,
            Limit::Context => MAX_CONTEXT_BYTES,
            Limit::SnapshotData => MAX_SNAPSHOT_DATA_BYTES,
            Limit::ConfNodes => MAX_CONF_NODES,
            Limit::ForwardedFrame => MAX_FORWARDED_FRAME_BYTES,
            Limit::Epochs => MAX_EPOCHS,
            Limit::ReplicatedBytes => MAX_REPLICATED_BYTES,
        }
    }

    /// The constant's name.
    pub const fn name(self) -> &'static str {
        match self {
            Limit::FrameBody => "MAX_FRAME_BODY_BYTES",
            Limit::String => "MAX_STRING_BYTES",
            Limit::RaftEntries => "MAX_RAFT_ENTRIES",
            Limit::EntryData => "MAX_ENTRY_DATA_BYTES",
            Limit::Context => "MAX_CONTEXT_BYTES",
            Limit::SnapshotData => "MAX_SNAPSHOT_DATA_BYTES",
            Limit::ConfNodes => "MAX_CONF_NODES",
            Limit::ForwardedFrame => "MAX_FORWARDED_FRAME_BYTES",
            Limit::Epochs => "MAX_EPOCHS",
            Limit::ReplicatedBytes => "MAX_REPLICATED_BYTES",
        }
    }
}

// Every length prefix is wide enough for its limit, and every field fits in a frame body.
const _: () = {
    assert!(MAX_STRING_BYTES <= u16::MAX as usize);
    assert!(MAX_SNAPSHOT_DATA_BYTES < MAX_FRAME_BODY_BYTES as usize);
    assert!(MAX_FORWARDED_FRAME_BYTES < MAX_FRAME_BODY_BYTES as usize);
    assert!(MAX_REPLICATED_BYTES + MAX_EPOCHS * 16 < MAX_FRAME_BODY_BYTES as usize);
    assert!(MAX_REPLICATED_BYTES > MAX_FORWARDED_FRAME_BYTES + 1024);
};
