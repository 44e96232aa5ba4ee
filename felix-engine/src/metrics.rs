//! What the engine counts for operators: plain numbers, bumped in place, no I/O.
//!
//! The engine owns one [`Metrics`]; [`crate::Engine::metrics`] hands out a snapshot with the
//! gauges (connections, streams, queue depth, log bytes) filled in at that moment. A runtime
//! turns the snapshot into Prometheus text (`felix_broker_*`); the engine knows nothing of
//! the format. Counters only grow; histograms are fixed buckets so a snapshot is a copy.
//!
//! Increments elsewhere in the engine are single calls into this file, so the code that
//! handles requests stays readable and other modules can add their own (`group_op`).

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use bytes::Bytes;
use felix_proto::error::ErrorCode;

use crate::broker::BrokerStats;
use felix_storage::ops::{FileCompletion, FileOp, FileOpKind, OpId};

/// Plain counters, for logs and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections open now (including closing ones not yet drained).
    pub connections: u64,
    /// Requests this node forwarded to their shard's leader (in a cluster).
    pub forwards: u64,
    /// Forwarded requests this node ran as their shard's leader.
    pub forwards_served: u64,
    /// Virtual sessions open now for other nodes' client sessions (forward channels).
    pub forwarded_sessions: u64,
    /// Forwards waiting on this node for a place in their peer's forward window.
    pub forwards_waiting: u64,
    /// Peer links up now (each pair of nodes has two: one dialed by each side).
    pub peer_links: u64,
    /// Peer messages dropped because their peer's backlog was full.
    pub peer_messages_dropped: u64,
    /// Connections accepted since start.
    pub connections_accepted: u64,
    /// Connection attempts refused (limit reached or shutting down).
    pub connections_refused: u64,
    /// Client bidirectional streams accepted.
    pub streams_accepted: u64,
    /// Felix frames read from clients.
    pub frames_received: u64,
    /// Felix frames handed to QUIC (answers and deliveries).
    pub frames_sent: u64,
    /// Streams that authenticated.
    pub auths_accepted: u64,
    /// `auth` requests refused.
    pub auths_refused: u64,
    /// Publish requests (binary or JSON batches) accepted.
    pub publishes: u64,
    /// Publish requests refused.
    pub publishes_refused: u64,
    /// Records published.
    pub published_records: u64,
    /// Subscriptions granted.
    pub subscriptions: u64,
    /// Event batches a full subscriber queue dropped.
    pub dropped_batches: u64,
    /// Cache requests answered.
    pub cache_requests: u64,
    /// Requests answered `unsupported` or by closing the stream.
    pub unsupported_requests: u64,
    /// File operations handed to the runtime.
    pub file_ops: u64,
    /// Answers held until the log made their records durable, then sent.
    pub answers_after_write: u64,
    /// Records consumer groups skipped because retention removed them first.
    pub group_skipped_records: u64,
}

/// What the engine holds right now: the quantities its limits bound. Walked on demand by
/// [`crate::Engine::usage`], for tests, fuzzing and diagnostics; not for a hot path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Connections open or draining.
    pub connections: usize,
    /// Session (client bidirectional) streams over every connection.
    pub sessions: usize,
    /// The most session streams one connection has open and not authenticated.
    pub max_unauthenticated_per_connection: usize,
    /// The most answers one session holds unwritten (queued or waiting for durability).
    pub max_session_backlog: usize,
    /// Bytes of partly received frames over every connection.
    pub buffered_bytes: usize,
    /// The most such bytes on one connection.
    pub max_connection_buffered_bytes: usize,
    /// The most bytes of answers one connection holds unwritten (queued or held).
    pub max_connection_unwritten_bytes: usize,
    /// Subscriptions over every connection.
    pub subscriptions: usize,
    /// The most subscriptions on one connection.
    pub max_connection_subscriptions: usize,
    /// The most frames one subscriber has queued.
    pub max_subscriber_queue: usize,
    /// The most event bytes queued for one connection's subscribers.
    pub max_connection_event_bytes: usize,
    /// Streams the broker holds.
    pub streams: usize,
}

/// Upper bounds (inclusive, microseconds) of the fsync latency buckets; a last `+Inf`
/// bucket is implied.
pub const FSYNC_MICROS_BUCKETS: [u64; 12] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
];
/// Upper bounds (inclusive) of the group-commit batch size buckets.
pub const GROUP_COMMIT_BUCKETS: [u64; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// A histogram over fixed bucket bounds: per-bucket counts (not cumulative; the last one is
/// `+Inf`), the sum and the count of observations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    /// Upper bounds of the finite buckets.
    pub bounds: &'static [u64],
    /// One count per bound, then one for everything above the last bound.
    pub counts: Vec<u64>,
    /// Sum of every observed value.
    pub sum: u64,
    /// Observations.
    pub count: u64,
}

impl Histogram {
    fn new(bounds: &'static [u64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0,
            count: 0,
        }
    }

    /// Records one value.
    pub fn observe(&mut self, value: u64) {
        let i = self.bounds.partition_point(|&b| b < value);
        self.counts[i] += 1;
        self.sum = self.sum.saturating_add(value);
        self.count += 1;
    }
}

/// The records and payload bytes of one publish, taken before the payloads move on.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PublishTally {
    records: u64,
    bytes: u64,
}

impl PublishTally {
    pub(crate) fn of(payloads: &[Bytes]) -> PublishTally {
        PublishTally {
            records: payloads.len() as u64,
            bytes: payloads.iter().map(|p| p.len() as u64).sum(),
        }
    }
}

/// Error codes a session sent since the connection last collected them (a session has no
/// access to the engine's counters when it encodes an error).
#[derive(Debug, Default)]
pub(crate) struct ErrorTally(Vec<ErrorCode>);

impl ErrorTally {
    pub(crate) fn note(&mut self, code: &ErrorCode) {
        self.0.push(code.clone());
    }
}

/// Everything the engine counts. Counter fields only grow; the fields documented as gauges
/// hold the value at the moment of [`crate::Engine::metrics`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metrics {
    /// Gauge: connections open or draining.
    pub connections_open: u64,
    /// Connections accepted since start.
    pub connections_accepted: u64,
    /// Connection attempts refused (limits, shutdown).
    pub connections_refused: u64,
    /// Gauge: client (session) streams open.
    pub streams_open: u64,
    /// Client streams accepted since start.
    pub streams_accepted: u64,
    /// Gauge: subscriptions open.
    pub subscriptions_open: u64,
    /// Subscriptions granted since start.
    pub subscriptions: u64,
    /// `auth` outcomes: `"ok"` or the refusal's error code.
    pub auth: BTreeMap<String, u64>,
    /// Records published in binary frames.
    pub published_binary_records: u64,
    /// Payload bytes published in binary frames.
    pub published_binary_bytes: u64,
    /// Records published in JSON frames.
    pub published_json_records: u64,
    /// Payload bytes published in JSON frames.
    pub published_json_bytes: u64,
    /// JSON publish frames received, by frame (`publish`, `publish_batch`), accepted or not:
    /// the evidence for how much traffic still uses the JSON path.
    pub json_publishes: BTreeMap<&'static str, u64>,
    /// Publish requests refused.
    pub publishes_refused: u64,
    /// Event batches queued to subscribers (one per subscriber per batch).
    pub deliveries: u64,
    /// Event batches dropped for a subscriber whose queue was full, and their records.
    pub subscriber_dropped_batches: u64,
    /// Records in the dropped batches.
    pub subscriber_dropped_records: u64,
    /// Subscriptions ended with `subscription_lagged`.
    pub subscriptions_lagged: u64,
    /// Gauge: the deepest subscriber queue (frames).
    pub subscriber_queue_depth_max: u64,
    /// Cache operations: `put`, `get_hit`, `get_miss`, `delete`, `expired`.
    pub cache_ops: BTreeMap<&'static str, u64>,
    /// Gauge: cache entries and their bytes (in memory).
    pub cache_entries: u64,
    /// Gauge: bytes of cache keys and values held in memory.
    pub cache_bytes: u64,
    /// Consumer-group operations by name (bumped by the group code through `group_op`).
    pub group_ops: BTreeMap<&'static str, u64>,
    /// Time from handing a file sync to the runtime to its completion, in microseconds.
    pub fsync_micros: Histogram,
    /// Answers released by one durability advance of a log (the group-commit batch).
    pub group_commit_batch: Histogram,
    /// Gauge: bytes in every log's segment files.
    pub log_bytes: u64,
    /// `error` answers (and failed acks) sent, by code.
    pub errors: BTreeMap<String, u64>,
    /// Requests run, by wire `type` (`binary_publish` for a binary publish frame, `unknown`
    /// for a type this broker does not know); a request held for a log or a placement counts
    /// each time it runs. What a conformance fixture records of each scenario.
    pub requests: BTreeMap<&'static str, u64>,
    /// Requests answered with a `not_leader` message naming the shard's owner (a redirect).
    pub redirects: u64,
    /// File operations handed to the runtime.
    pub file_ops: u64,
    /// Gauge, in a cluster: stream and cache shards this node leads.
    pub cluster_shards_led: u64,
    /// Gauge, in a cluster: shards this node holds a replica of and does not lead.
    pub cluster_shards_followed: u64,
    /// Gauge, in a cluster: the metadata log's raft term as this node knows it.
    pub cluster_metadata_term: u64,
    /// Gauge, in a cluster: the last metadata log index applied here.
    pub cluster_metadata_applied: u64,
    /// Gauges, per replicated shard led here (`tenant/namespace/stream#shard`, its group log
    /// as `…#shard/groups`): records the slowest follower lacks durably — what a `leader` ack
    /// can lose at a failover.
    pub replication_lag_records: Vec<(String, u64)>,
    /// Shard leadership changes this node applied.
    pub replication_leader_changes: u64,
    /// Quorum publishes answered `quorum_timeout` on shards led here.
    pub replication_quorum_timeouts: u64,
    /// Bytes of replicated entries appended here (following and catching up).
    pub replication_catch_up_bytes: u64,
    /// Records known acknowledged that no surviving copy held when a new leader opened (a
    /// leader's lost disk, or an operator's abandon): `acknowledged_records_abandoned`.
    pub acknowledged_records_abandoned: u64,
    /// Replica state writes the log refused; each copy decided again instead of waiting for
    /// a write that never came. Nonzero is a bug to report.
    pub replication_states_refused: u64,
    /// Gauge: `leader` shards led here whose quiescence the cluster records (a follower may
    /// take each over without loss; a write there waits for a resumption first).
    pub leader_shards_quiet: u64,
    /// Gauge, on the control plane's leader: shards whose leader lapsed that nobody may take
    /// without giving up records only it holds, so they wait for it (or an abandon).
    pub cluster_shards_awaiting_leader: u64,
    /// Requests this node forwarded to their shard's leader.
    pub forwards_sent: u64,
    /// Forwarded requests this node ran as the leader.
    pub forwards_served: u64,
    /// Gauge: forward channels open here as a leader (one per client session forwarding here).
    pub forwarded_sessions: u64,
    /// Gauge: forwards waiting on this node for a place in their peer's forward window.
    pub forwards_waiting: u64,
    /// Gauge: peer links up.
    pub peer_links: u64,
    /// Peer messages dropped because a down link's backlog was full.
    pub peer_messages_dropped: u64,
    /// Syncs handed out and not yet completed, with the `now` they left at.
    syncs_in_flight: HashMap<OpId, Instant>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            connections_open: 0,
            connections_accepted: 0,
            connections_refused: 0,
            streams_open: 0,
            streams_accepted: 0,
            subscriptions_open: 0,
            subscriptions: 0,
            auth: BTreeMap::new(),
            published_binary_records: 0,
            published_binary_bytes: 0,
            published_json_records: 0,
            published_json_bytes: 0,
            json_publishes: BTreeMap::new(),
            publishes_refused: 0,
            deliveries: 0,
            subscriber_dropped_batches: 0,
            subscriber_dropped_records: 0,
            subscriptions_lagged: 0,
            subscriber_queue_depth_max: 0,
            cache_ops: BTreeMap::new(),
            cache_entries: 0,
            cache_bytes: 0,
            group_ops: BTreeMap::new(),
            fsync_micros: Histogram::new(&FSYNC_MICROS_BUCKETS),
            group_commit_batch: Histogram::new(&GROUP_COMMIT_BUCKETS),
            log_bytes: 0,
            errors: BTreeMap::new(),
            requests: BTreeMap::new(),
            redirects: 0,
            file_ops: 0,
            cluster_shards_led: 0,
            replication_lag_records: Vec::new(),
            replication_leader_changes: 0,
            replication_quorum_timeouts: 0,
            replication_catch_up_bytes: 0,
            acknowledged_records_abandoned: 0,
            replication_states_refused: 0,
            leader_shards_quiet: 0,
            cluster_shards_awaiting_leader: 0,
            cluster_shards_followed: 0,
            cluster_metadata_term: 0,
            cluster_metadata_applied: 0,
            forwards_sent: 0,
            forwards_served: 0,
            forwarded_sessions: 0,
            forwards_waiting: 0,
            peer_links: 0,
            peer_messages_dropped: 0,
            syncs_in_flight: HashMap::new(),
        }
    }
}

impl Metrics {
    pub(crate) fn auth_ok(&mut self) {
        *self.auth.entry("ok".to_owned()).or_default() += 1;
    }

    /// A refused `auth`: counted under its code and among the errors sent.
    pub(crate) fn auth_refused(&mut self, code: ErrorCode) {
        *self.auth.entry(code.as_str().to_owned()).or_default() += 1;
        self.error(&code);
    }

    pub(crate) fn error(&mut self, code: &ErrorCode) {
        *self.errors.entry(code.as_str().to_owned()).or_default() += 1;
    }

    /// Moves a session's error codes into the counters.
    pub(crate) fn absorb(&mut self, tally: &mut ErrorTally) {
        for code in tally.0.drain(..) {
            self.error(&code);
        }
    }

    pub(crate) fn published_binary(&mut self, tally: PublishTally) {
        self.published_binary_records += tally.records;
        self.published_binary_bytes += tally.bytes;
    }

    pub(crate) fn published_json(&mut self, tally: PublishTally) {
        self.published_json_records += tally.records;
        self.published_json_bytes += tally.bytes;
    }

    /// A JSON publish frame arrived (`publish` or `publish_batch`).
    pub(crate) fn json_publish_frame(&mut self, frame: &'static str) {
        *self.json_publishes.entry(frame).or_default() += 1;
    }

    /// A request of wire type `name` is run (`binary_publish` for a binary publish frame).
    pub(crate) fn request(&mut self, name: &str) {
        let name = felix_proto::message::MESSAGE_TYPES
            .iter()
            .chain(&["binary_publish"])
            .find(|t| **t == name)
            .copied()
            .unwrap_or("unknown");
        *self.requests.entry(name).or_default() += 1;
    }

    /// A consumer-group request (`poll`, `ack`, ...) reached its handler.
    pub(crate) fn group_op(&mut self, op: &'static str) {
        *self.group_ops.entry(op).or_default() += 1;
    }

    /// A file op leaves for the runtime; syncs start their clock.
    pub(crate) fn file_op_issued(&mut self, now: Instant, op: &FileOp) {
        if matches!(op.kind, FileOpKind::Sync { .. }) {
            self.syncs_in_flight.insert(op.id, now);
        }
    }

    /// A file op came back; a sync's latency is observed.
    pub(crate) fn file_op_completed(&mut self, now: Instant, completion: &FileCompletion) {
        if let Some(at) = self.syncs_in_flight.remove(&completion.id) {
            let micros = now.saturating_duration_since(at).as_micros();
            self.fsync_micros
                .observe(u64::try_from(micros).unwrap_or(u64::MAX));
        }
    }

    /// A log became durable further and released `answers` held answers.
    pub(crate) fn group_commit(&mut self, answers: usize) {
        if answers > 0 {
            self.group_commit_batch.observe(answers as u64);
        }
    }

    /// The snapshot handed out: the counters without the bookkeeping, with the gauges and
    /// the counts the engine and broker keep in their own stats folded in.
    pub(crate) fn snapshot(
        &self,
        stats: &Stats,
        usage: &Usage,
        broker: &BrokerStats,
        log_bytes: u64,
    ) -> Metrics {
        let mut m = self.clone();
        m.syncs_in_flight = HashMap::new();
        m.connections_open = usage.connections as u64;
        m.connections_accepted = stats.connections_accepted;
        m.connections_refused = stats.connections_refused;
        m.streams_open = usage.sessions as u64;
        m.streams_accepted = stats.streams_accepted;
        m.subscriptions_open = usage.subscriptions as u64;
        m.subscriptions = stats.subscriptions;
        m.publishes_refused = stats.publishes_refused;
        m.forwards_sent = stats.forwards;
        m.forwards_served = stats.forwards_served;
        m.forwarded_sessions = stats.forwarded_sessions;
        m.forwards_waiting = stats.forwards_waiting;
        m.peer_links = stats.peer_links;
        m.peer_messages_dropped = stats.peer_messages_dropped;
        m.deliveries = broker.deliveries;
        m.subscriber_dropped_batches = broker.dropped_batches;
        m.subscriber_dropped_records = broker.dropped_records;
        m.subscriptions_lagged = broker.lagged_subscriptions;
        m.subscriber_queue_depth_max = usage.max_subscriber_queue as u64;
        m.cache_ops = BTreeMap::from([
            ("put", broker.cache_puts),
            ("get_hit", broker.cache_hits),
            ("get_miss", broker.cache_misses),
            ("delete", broker.cache_deletes),
            ("expired", broker.cache_expired),
        ]);
        m.cache_entries = broker.cache_entries;
        m.cache_bytes = broker.cache_bytes;
        m.log_bytes = log_bytes;
        m.file_ops = stats.file_ops;
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_inclusive_upper_bounds() {
        let mut h = Histogram::new(&GROUP_COMMIT_BUCKETS);
        for v in [1, 2, 3, 256, 257] {
            h.observe(v);
        }
        assert_eq!(h.counts[0], 1); // 1
        assert_eq!(h.counts[1], 1); // 2
        assert_eq!(h.counts[2], 1); // 3 ≤ 4
        assert_eq!(h.counts[8], 1); // 256
        assert_eq!(h.counts[9], 1); // +Inf
        assert_eq!((h.count, h.sum), (5, 1 + 2 + 3 + 256 + 257));
    }
}
