//! Deleting a stream (an operator action, docs/stream-features.md "Deleting a stream").
//!
//! In memory: every subscription of the stream ends after what was already queued for it —
//! with `stream_deleted` for a client that offered FEATURE_STREAM_DELETED, otherwise its
//! event stream just finishes — and the stream is forgotten, so the next publish or
//! subscribe creates it afresh.
//!
//! On disk the shard logs are retired in steps that a crash can interrupt anywhere:
//! 1. the logs are forgotten — the shards' and their consumer groups' (answers waiting on
//!    them fail, group polls are answered `not_found`; late completions are ignored);
//! 2. `streams/T/N/S` is renamed to a tombstone beside it, `streams/T/N/.deleted.<µs>.<n>`
//!    (one atomic op; `.` never starts an escaped name), and the namespace directory is
//!    synced; then the same for `groups/T/N/S`. From the first rename on the stream is gone
//!    for good: recovery never opens a tombstone. Until both renames are durable a publish,
//!    subscribe or group request that would recreate the stream waits (it is stalled on
//!    the retirement's id and re-run then), so a new log never opens old files;
//! 3. the tombstone is removed depth first: a directory's files and subdirectories go, then
//!    the directory itself (`RemoveDir`), up to the tombstone, after which the namespace
//!    directory is synced. A restart finds a leftover tombstone during its walk and runs
//!    this step again on what is left; anything already gone (`NotFound`) counts as done.

use std::collections::VecDeque;

use bytes::Bytes;
use felix_proto::message::{Message, StreamDeleted};

use super::durable::{Notice, ShardStore};
use super::encode::encode_message;
use super::{Broker, CacheKey, Shard, Stream, StreamKey};
use felix_storage::layout;
use felix_storage::ops::LogId;

/// Why a stream was not deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeleteRefusal {
    /// No such stream here (never used since start and nothing on disk).
    NotFound,
    /// Not now (a shard log still opening, or the broker draining); try again.
    Unavailable(String),
}

impl Broker {
    /// Deletes a stream: its subscriptions end, its records are gone, and the next publish
    /// or subscribe creates it afresh (offsets from 0, width from the configuration).
    pub(crate) fn delete_stream(
        &mut self,
        unix_micros: u64,
        key: &StreamKey,
    ) -> Result<(), DeleteRefusal> {
        if self.draining {
            return Err(DeleteRefusal::Unavailable("the broker is draining".into()));
        }
        let dir = stream_dir(key);
        let on_disk = self
            .logs
            .as_ref()
            .map(|l| l.logs_under(&format!("{dir}/")))
            .unwrap_or_default();
        let index = self.stream_index.get(key).copied();
        if index.is_none() && on_disk.is_empty() {
            return Err(DeleteRefusal::NotFound);
        }
        if let Some(logs) = self.logs.as_ref() {
            if on_disk.iter().any(|&id| logs.is_opening(id)) {
                return Err(DeleteRefusal::Unavailable(
                    "a shard's log is still opening".into(),
                ));
            }
        }
        let mut group_logs = Vec::new();
        if let Some(index) = index {
            group_logs = self.forget_stream_groups(index);
            self.end_subscriptions(index);
            self.stream_index.remove(key);
            self.dirty.retain(|(s, _)| *s != index);
            // The index stays taken by an empty stream, so nothing reaches the new stream
            // through a stale index (consumer-group state keyed by it). Its shards keep the
            // id of their forgotten log: code holding the old index finds the log gone
            // and answers so, rather than meeting an in-memory shard.
            let shards = self.streams[index].shards.iter().map(dead_shard).collect();
            self.streams[index] = Stream { shards };
        }
        let gone: Vec<LogId> = on_disk.into_iter().chain(group_logs).collect();
        for &id in &gone {
            // Before the log is forgotten, so these answers go out ahead of `Failed`.
            self.fail_page_reads(id, "the stream was deleted");
        }
        if let Some(logs) = self.logs.as_mut() {
            for id in gone {
                self.recovered.remove(&id);
                logs.forget(id);
                // Answers held for durability on it, or requests stalled on it, fail now.
                logs.notices.push_back(Notice::Failed { log: id });
            }
            // Its groups' logs go too, or a recreated stream's groups would find old cursors.
            let groups_dir = parent_dir(&super::groups::group_log_dir(key, 0));
            logs.retire(vec![dir, groups_dir], unix_micros);
        }
        Ok(())
    }

    /// Deletes a cache (the cluster deleted it): its values and counters are gone, its
    /// watches end after what they hold with an `error` (`not_found`), answers
    /// waiting on its logs fail, and its logs' files are retired as a stream's are; a new log
    /// under its name waits until the old directories are renamed away.
    pub(crate) fn delete_cache(
        &mut self,
        unix_micros: u64,
        key: &CacheKey,
    ) -> Result<(), DeleteRefusal> {
        if self.draining {
            return Err(DeleteRefusal::Unavailable("the broker is draining".into()));
        }
        let dirs = cache_dirs(key);
        let on_disk: Vec<LogId> = self.logs.as_ref().map_or_else(Vec::new, |l| {
            dirs.iter()
                .flat_map(|d| l.logs_under(&format!("{d}/")))
                .collect()
        });
        if let Some(logs) = self.logs.as_ref() {
            if on_disk.iter().any(|&id| logs.is_opening(id)) {
                return Err(DeleteRefusal::Unavailable(
                    "a cache's log is still opening".into(),
                ));
            }
        }
        // Every shard's values (`remove_scope` takes the whole cache).
        let in_memory = self.cache.remove_scope(key);
        if !in_memory && on_disk.is_empty() {
            return Err(DeleteRefusal::NotFound);
        }
        for &id in &on_disk {
            self.on_watch_cache_deleted(id);
            self.durable_usage.forget(id);
        }
        if let Some(logs) = self.logs.as_mut() {
            for id in on_disk {
                self.recovered.remove(&id);
                logs.forget(id);
                logs.notices.push_back(Notice::Failed { log: id });
            }
            logs.retire(dirs.to_vec(), unix_micros);
        }
        Ok(())
    }

    /// Whether a log on disk under stream `key`'s name (its shards' or its groups') is of a
    /// life whose generations were at most `generation`, as its replica state records: a
    /// fence or an epoch at or below it; or, when the life placed now is `replicated` (more
    /// than one copy per shard), records with no fence at all (a replicated copy is fenced
    /// before it takes any record, leader or follower, so such a copy is no replicated
    /// life's). A copy fenced above it, or not fenced and empty, is a later life's (or
    /// nothing). A copy of a one-replica life is never fenced: one never fenced with records,
    /// under a name whose current life has one replica, is not told apart (kept).
    /// `None` while one of them is still opening: asked again on a later turn.
    pub(crate) fn stream_has_copy_at_or_below(
        &self,
        key: &StreamKey,
        generation: u64,
        replicated: bool,
    ) -> Option<bool> {
        let groups_dir = parent_dir(&super::groups::group_log_dir(key, 0));
        self.has_copy_at_or_below(&[stream_dir(key), groups_dir], generation, replicated)
    }

    /// As [`Broker::stream_has_copy_at_or_below`], for a cache's values and counters.
    pub(crate) fn cache_has_copy_at_or_below(
        &self,
        key: &CacheKey,
        generation: u64,
        replicated: bool,
    ) -> Option<bool> {
        self.has_copy_at_or_below(&cache_dirs(key), generation, replicated)
    }

    fn has_copy_at_or_below(
        &self,
        dirs: &[String],
        generation: u64,
        replicated: bool,
    ) -> Option<bool> {
        let Some(logs) = self.logs.as_ref() else {
            return Some(false);
        };
        let mut old = false;
        for d in dirs {
            for id in logs.logs_under(&format!("{d}/")) {
                if logs.is_opening(id) {
                    return None;
                }
                // A failed log is no evidence either way: it serves nothing.
                let Some(info) = self.log_info(id) else {
                    continue;
                };
                let st = &info.state;
                old |= (st.fence_generation != 0 && st.fence_generation <= generation)
                    || st.epochs.iter().any(|e| e.generation <= generation)
                    || (replicated && st.fence_generation == 0 && info.end > 0);
            }
        }
        Some(old)
    }

    /// A retirement that a new log for this stream must wait for.
    pub(super) fn stream_delete_pending(&self, key: &StreamKey) -> Option<LogId> {
        self.logs.as_ref()?.retiring_blocks(&stream_dir(key))
    }

    /// Ends every subscription on stream `index` after what is queued for it.
    fn end_subscriptions(&mut self, index: usize) {
        // An empty final frame finishes the stream with nothing more on it: what a client
        // that did not offer the feature always saw.
        self.end_readers(index, None, |sub, _| {
            if sub.ends_on_delete {
                encode_message(&Message::StreamDeleted(StreamDeleted {
                    subscription_id: sub.subscription_id,
                }))
            } else {
                Bytes::new()
            }
        });
    }
}

/// What a deleted stream's shard leaves behind at its old index.
fn dead_shard(sh: &Shard) -> Shard {
    let mut dead = Shard::new();
    dead.has_offsets = sh.has_offsets;
    dead.store = sh.store.as_ref().map(|s| ShardStore {
        log: s.log,
        unreleased: VecDeque::new(),
        released: s.released,
    });
    dead
}

/// The directories of a cache's values and counters logs, every shard's.
fn cache_dirs(key: &CacheKey) -> [String; 2] {
    let (t, n, c) = (&key.tenant, &key.namespace, &key.cache);
    [
        parent_dir(&layout::cache_shard_dir(t, n, c, 0)),
        parent_dir(&layout::counter_shard_dir(t, n, c, 0)),
    ]
}

fn stream_dir(key: &StreamKey) -> String {
    parent_dir(&layout::stream_shard_dir(
        &key.tenant,
        &key.namespace,
        &key.stream,
        0,
    ))
}

pub(super) fn parent_dir(shard_dir: &str) -> String {
    shard_dir
        .rsplit_once('/')
        .map(|(d, _)| d.to_owned())
        .expect("a shard dir has a parent")
}
