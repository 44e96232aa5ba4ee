//! The engine's half of shard replication: it runs the log work the cluster node asks for
//! (`cluster/replicas.rs`) on the broker's logs and feeds the results back, and routes the
//! log notices replication listens to.

use std::time::Instant;

use felix_storage::ops::LogId;

use super::Engine;
use crate::broker::{Broker, CacheKey, LogInfo, StreamKey};
use crate::cluster::Wired;
use crate::cluster::{CopyKind, LogView, ReplicaIo};

/// Rounds of replication work in one call: each round's results can ask for more (an
/// answer read from the tail cache at once), bounded so one turn stays short.
const MAX_REPLICATION_ROUNDS: usize = 8;

impl LogView for Broker {
    fn info(&self, log: LogId) -> Option<LogInfo> {
        self.log_info(log)
    }
}

impl Engine {
    /// Runs replication until it asks for nothing more (bounded).
    pub(super) fn drive_replication(&mut self, now: Instant) {
        let core = &mut self.core;
        let unix_micros = core.unix_micros(now);
        let Some(cluster) = core.router.driver_mut() else {
            return;
        };
        // Streams the cluster deleted go from the broker first: subscriptions end with
        // `stream_deleted`, files are retired, and only then may the name be opened again.
        // Not before the broker's recovery has found every log on disk: a delete replayed at
        // startup must see the old files it is to remove.
        let recovered = core.broker.is_ready();
        for (kind, key) in cluster.deleted_objects().into_iter().filter(|_| recovered) {
            // At start, a name that lives again: only an old life's copies go (a crash cut
            // their retirement short after the re-creation was applied); the new life's stay.
            if let Some(generation) = cluster.old_life_up_to(kind, &key) {
                let replicated = cluster.replication_factor(kind, &key) > 1;
                let old = match kind {
                    felix_cluster::meta::ObjectKind::Stream => {
                        let stream = StreamKey::new(&key.tenant, &key.namespace, &key.name);
                        core.broker
                            .stream_has_copy_at_or_below(&stream, generation, replicated)
                    }
                    felix_cluster::meta::ObjectKind::Cache => {
                        let cache = CacheKey::new(&key.tenant, &key.namespace, &key.name);
                        core.broker
                            .cache_has_copy_at_or_below(&cache, generation, replicated)
                    }
                };
                match old {
                    // A log still opening: asked again on the next turn.
                    None => continue,
                    Some(false) => {
                        cluster.removed_here(kind, &key);
                        continue;
                    }
                    Some(true) => {
                        tracing::warn!(object = %key, generation,
                            "copies of a deleted life found under a name that lives again: retiring them")
                    }
                }
            }
            let outcome = match kind {
                felix_cluster::meta::ObjectKind::Stream => {
                    let stream = StreamKey::new(&key.tenant, &key.namespace, &key.name);
                    core.broker.delete_stream(unix_micros, &stream)
                }
                felix_cluster::meta::ObjectKind::Cache => {
                    let cache = CacheKey::new(&key.tenant, &key.namespace, &key.name);
                    core.broker.delete_cache(unix_micros, &cache)
                }
            };
            match outcome {
                Ok(()) | Err(crate::broker::DeleteRefusal::NotFound) => {
                    cluster.removed_here(kind, &key)
                }
                // A log still opening: tried again on the next turn.
                Err(crate::broker::DeleteRefusal::Unavailable(why)) => {
                    tracing::debug!(stream = %key, %why, "deleted stream not removed yet")
                }
            }
        }
        for _ in 0..MAX_REPLICATION_ROUNDS {
            cluster.drive_replication(now, &core.broker);
            let mut any = false;
            while let Some(io) = cluster.poll_replica_io() {
                any = true;
                let broker = &mut core.broker;
                match io {
                    ReplicaIo::Open { copy } => {
                        let k = &copy.shard.key;
                        let key = StreamKey::new(&k.tenant, &k.namespace, &k.name);
                        // A stream placed at runtime is opened as wide as it was placed.
                        if let Some(w) = cluster.stream_width(&k.tenant, &k.namespace, &k.name) {
                            broker.learn_width(&key, w);
                        }
                        let shard = copy.shard.shard;
                        let cache = CacheKey::on_shard(&k.tenant, &k.namespace, &k.name, shard);
                        let log = match copy.kind {
                            CopyKind::Records => broker
                                .shard_log(now, &key, copy.shard.shard)
                                .map(|(l, _)| l),
                            CopyKind::Groups => broker.group_log_of(now, &key, copy.shard.shard),
                            CopyKind::Values => broker.replica_cache_log(now, &cache, false),
                            CopyKind::Counters => broker.replica_cache_log(now, &cache, true),
                        };
                        if let Some(log) = log {
                            // A copy is a follower's until its leadership here gates it.
                            if !broker.is_gated(log) {
                                broker.take_only_shipped(log, true);
                            }
                            cluster.replica_log(&copy, log);
                        }
                    }
                    ReplicaIo::PersistState { log, state } => {
                        if let Err(e) = broker.persist_replica_state(log, state) {
                            cluster.state_refused(log, e.to_string());
                        }
                    }
                    ReplicaIo::ReadFramed {
                        log,
                        from,
                        max_bytes,
                        purpose,
                    } => match broker.read_framed(log, from, max_bytes) {
                        Ok(ticket) => cluster.read_started(log, ticket, purpose),
                        Err(e) => {
                            tracing::debug!(log = log.0, error = %e, "framed read refused");
                            cluster.read_failed(log, purpose);
                        }
                    },
                    ReplicaIo::Append { log, base, entries } => {
                        let result = broker.append_framed(now, log, base, entries);
                        cluster.replica_appended(log, result);
                    }
                    ReplicaIo::Truncate { log, to } => {
                        if let Err(e) = broker.truncate_log(log, to) {
                            tracing::debug!(log = log.0, error = %e, "truncation refused for now");
                            cluster.truncation_refused(log);
                        }
                    }
                    ReplicaIo::TrimTo { log, start } => broker.trim_log(log, start),
                    ReplicaIo::RestartAt { log, start } => {
                        if let Err(e) = broker.restart_log(log, start) {
                            tracing::debug!(log = log.0, error = %e, "rebuild refused for now");
                            cluster.truncation_refused(log);
                        }
                    }
                    ReplicaIo::Gate { log, committed } => {
                        broker.take_only_shipped(log, false);
                        broker.gate(log, committed);
                        // A projection (groups, a cache's index, its sums) led here from now
                        // on is rebuilt from its log.
                        broker.reload_projection(now, log);
                    }
                    ReplicaIo::Ungate { log } => {
                        broker.ungate(log);
                        broker.take_only_shipped(log, true);
                    }
                    ReplicaIo::BoundCompaction { log, below } => {
                        broker.bound_compaction(log, below)
                    }
                    ReplicaIo::Moved { log, to } => broker.shard_moved(log, &to),
                    ReplicaIo::Committed { log, up_to } => broker.committed(log, up_to),
                    ReplicaIo::TimedOut { log, up_to } => broker.timed_out(log, up_to),
                }
            }
            if !any {
                break;
            }
        }
    }

    /// A gated log's own durability moved: the replication counts it.
    pub(super) fn replica_durable(&mut self, now: Instant, log: LogId, up_to: u64) {
        if let Some(c) = self.core.router.driver_mut() {
            c.local_durable(log, up_to);
        }
        self.drive_replication(now);
    }

    /// A replication event from a log.
    pub(super) fn replica_event(
        &mut self,
        now: Instant,
        log: LogId,
        event: felix_storage::log::ReplicaEvent,
    ) {
        let core = &mut self.core;
        if let felix_storage::log::ReplicaEvent::Truncated { result: Ok(offset) } = &event {
            core.broker.truncated(log, *offset);
            // A projection cannot be cut back: it is read again from the log.
            core.broker.reload_projection(now, log);
        }
        if let Some(c) = core.router.driver_mut() {
            c.replica_event(now, log, event, &core.broker);
        }
        self.drive_replication(now);
    }

    /// An ungated log's durability moved: a follower reports it.
    pub(super) fn follower_durable(&mut self, log: LogId, up_to: u64) {
        let end = self.core.broker.log_info(log).map_or(up_to, |i| i.end);
        if let Some(c) = self.core.router.driver_mut() {
            c.log_durable(log, up_to, end);
        }
    }
}
