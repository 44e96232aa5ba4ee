//! Durable storage as operations: segment logs for durable streams and caches.
//!
//! Nothing here touches a file. A [`log::ShardLog`] (or a [`cache_log::CacheLog`] over one)
//! decides what to write, sync, read, rename and remove, and says so as [`ops::FileOp`]s
//! carrying ids; the runtime performs them under `FELIX_DURABLE_STORAGE_DIR` and feeds each
//! [`ops::FileCompletion`] back. `docs/storage-format.md` describes the bytes and the
//! recovery rules.
//!
//! - `ops`: the file-op vocabulary shared with the runtime's executor;
//! - `driven`: [`driven::Driven`], how every log is driven, written once;
//! - `layout`: directory and file names under the storage root;
//! - `record`: segment header, entry encoding with CRC32C, the entry scanner;
//! - `segment`: one segment's offsets, byte counts and sparse index;
//! - `log`: [`log::ShardLog`], recovery, appends, group commit, reads, retention, compaction;
//! - `cache_log`: [`cache_log::CacheLog`], a key → offset index over a log, with TTL;
//! - `counter_log`: [`counter_log::CounterLog`], a cache's counters as a fold over a log.
//! - `group_log`: [`group_log::GroupLog`], a shard's consumer-group cursors and dead letters;
//! - `table`: [`table::LogTable`], every log by id, completion routing, the startup walk;
//! - `replica_state`: the replica state file (fence, commit, epochs) log replication keeps;
//! - `retire`: [`retire::Retiring`], a deleted stream's directories renamed and removed.

pub mod cache_log;
pub mod counter_log;
pub mod driven;
pub mod group_log;
pub mod layout;
pub mod log;
pub mod ops;
pub mod record;
pub mod replica_state;
pub mod retire;
mod segment;
pub mod table;
mod write_buffers;

/// The one in-memory disk with a crash model, for storage tests, engine tests and the
/// simulator; never on the product path.
#[cfg(any(test, feature = "testing"))]
pub mod memfs;
#[cfg(test)]
pub(crate) mod test_bench;
