//! One shard as one type, and the one fold that rebuilds its state from its log.
//!
//! Every entry a shard's log holds may carry, besides its records, an idempotent producer's
//! mark and an atomic commit's state changes. [`ShardState::apply`] is the only way either
//! reaches the shard's tables: a live append applies the entry it just wrote, recovery
//! applies each entry its scan read back, and a follower replaying a leader's log will apply
//! what it receives. One fold, so the three cannot disagree about what a log means.

use bytes::Bytes;
use felix_storage::record::ProducerMark;

use super::commit::StateTable;
use super::durable::ShardStore;
use super::producers::ProducerTable;
use super::SubscriberId;

/// What a shard's log entries fold into.
#[derive(Debug, Default)]
pub(crate) struct ShardState {
    /// Idempotent producers' places on this shard (`producers.rs`).
    pub(super) producers: ProducerTable,
    /// The state atomic commits wrote on this shard (`commit.rs`).
    pub(super) commits: StateTable,
}

impl ShardState {
    /// Folds one log entry in: `count` records from offset `base` (`None` on a shard without
    /// offsets), with the producer mark and the commit block it carried. Says whether the
    /// commit state changed (retention must then keep what it was rebuilt from).
    pub(super) fn apply(
        &mut self,
        base: Option<u64>,
        count: u64,
        producer: Option<ProducerMark>,
        commit_block: Option<&[u8]>,
    ) -> bool {
        if let Some(mark) = producer {
            self.producers.record(mark, base, count);
        }
        match (commit_block, base) {
            (Some(block), Some(offset)) => {
                self.commits.apply_block(offset, block);
                true
            }
            _ => false,
        }
    }
}

#[derive(Default)]
pub(super) struct OpenBatch {
    pub(super) base_seq: u64,
    pub(super) payloads: Vec<Bytes>,
    /// One append time per payload, only on shards that store times.
    pub(super) times: Vec<u64>,
    pub(super) publisher: Option<Box<str>>,
    pub(super) bytes: usize,
}

/// One shard of a stream: its records' place (offsets, the log), who subscribes, the batch
/// being filled, and the state its log's entries fold into.
pub(super) struct Shard {
    /// Offsets (and stored record times) go on the wire: durable storage turns this on.
    pub(super) has_offsets: bool,
    /// Durable shards: the log and the records waiting to be durable before they fan out.
    pub(super) store: Option<ShardStore>,
    /// Sequence number the next record gets; its offset where offsets are on.
    pub(super) next_seq: u64,
    pub(super) subscribers: Vec<SubscriberId>,
    pub(super) open: OpenBatch,
    /// Listed in `Broker::dirty` (its open batch is non-empty).
    pub(super) dirty: bool,
    /// What the log's entries fold into (see [`ShardState::apply`]).
    pub(super) state: ShardState,
}

impl Shard {
    pub(super) fn new() -> Shard {
        Shard {
            has_offsets: false,
            store: None,
            next_seq: 0,
            subscribers: Vec::new(),
            open: OpenBatch::default(),
            dirty: false,
            state: ShardState::default(),
        }
    }
}
