//! The per-node context every connection and session shares: the broker, the token
//! verifier, the negotiated capabilities, the subscription routes and the answers held for
//! the logs. It sits below `conn` and `session` (as quinn-proto's `shared.rs` sits below its
//! endpoint and connections), so they reach it without reaching up into the engine.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use felix_auth::Verifier;
use felix_proto::negotiate::BrokerCapabilities;
use felix_proto::routing::RoutingMapping;
use felix_storage::log::ReadTicket;
use felix_storage::ops::LogId;
use quinn_proto::{ConnectionHandle, StreamId};

use crate::broker::{Broker, SubscriberId};
use crate::clock::UnixAnchor;
use crate::metrics::{Metrics, Stats};
use crate::router::Router;

/// Limits the connection and session code reads on every turn.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) auth_timeout: Duration,
    pub(crate) idle_connection_reap: Duration,
    pub(crate) preauth_max_frame_bytes: u32,
    pub(crate) max_frame_bytes: u32,
    /// Unwritten answers per stream before it is no longer read (the publish window).
    pub(crate) stream_answer_backlog: usize,
    pub(crate) read_chunk_bytes: usize,
    pub(crate) max_subscriptions_per_connection: usize,
    pub(crate) preauth_max_streams_per_connection: usize,
    pub(crate) max_connection_buffered_bytes: usize,
    pub(crate) max_buffered_bytes: usize,
    pub(crate) max_connection_unwritten_bytes: usize,
    /// What a cache value not yet read from its log counts for against the above.
    pub(crate) value_reserve: usize,
}

/// What every connection shares: the broker, the verifier, the negotiated capabilities and
/// the subscription routes.
pub(crate) struct Core {
    pub(crate) limits: Limits,
    pub(crate) broker: Broker,
    pub(crate) verifier: Verifier,
    pub(crate) capabilities: BrokerCapabilities,
    /// How keys route to shards, as `stream_shards_view` reports it.
    pub(crate) routing_mapping: RoutingMapping,
    /// Shards of a stream created on first use, as routing answers report it.
    pub(crate) default_shards: u32,
    /// `now` at construction and the Unix time it stood for, in microseconds.
    pub(crate) anchor: UnixAnchor,
    /// Where each subscriber's event stream is.
    pub(crate) routes: BTreeMap<SubscriberId, (ConnectionHandle, StreamId)>,
    /// Session streams holding an answer until a log is durable up to an offset, per log in
    /// offset order (appends register in the order they take offsets).
    pub(crate) waiters: HashMap<LogId, VecDeque<(u64, ConnectionHandle, StreamId)>>,
    /// Session streams whose next request met a log still opening.
    pub(crate) stalled: HashMap<LogId, Vec<(ConnectionHandle, StreamId)>>,
    /// Sessions whose request waits for its stream's placement (cluster, first use), with
    /// the instant it is refused instead.
    pub(crate) awaiting_placement: Vec<(Instant, ConnectionHandle, StreamId)>,
    /// Forwards for a shard this node's metadata does not know yet (or knows at an older
    /// generation), from the peer named, until the given instant.
    pub(crate) forwards_awaiting_metadata: VecDeque<(Instant, String, felix_peer_proto::Forward)>,
    /// Session streams holding a `cache_value` until a log read answers.
    pub(crate) value_waiters: HashMap<(LogId, ReadTicket), (ConnectionHandle, StreamId)>,
    /// Session streams holding a `group_records` until the broker answers the poll.
    pub(crate) group_waiters: HashMap<u64, (ConnectionHandle, StreamId)>,
    pub(crate) next_subscription_id: u64,
    pub(crate) stats: Stats,
    pub(crate) metrics: Metrics,
    /// Bytes of partly received frames over every connection (see `Conn::sync_buffered`).
    pub(crate) buffered_bytes: usize,
    /// Connections holding streams back for a buffer budget.
    pub(crate) starved_conns: BTreeSet<ConnectionHandle>,
    /// Connections open (each one's fair share of the broker's buffer budget).
    pub(crate) open_connections: usize,
    /// What sessions ask about shards, when this node is one of several.
    pub(crate) router: Option<Router>,
    /// A forwarded request is being run (engine/forwarded.rs): it must not be forwarded again.
    pub(crate) forwarding_here: bool,
}

impl Core {
    /// Unix time at `now`, from the anchor the runtime gave at construction.
    pub(crate) fn unix_micros(&self, now: Instant) -> u64 {
        self.anchor.unix_micros(now)
    }

    pub(crate) fn unix_secs(&self, now: Instant) -> u64 {
        self.anchor.unix_secs(now)
    }

    /// A fresh wire `subscription_id`.
    pub(crate) fn next_subscription_id(&mut self) -> u64 {
        self.next_subscription_id += 1;
        self.next_subscription_id
    }

    pub(crate) fn unsubscribe(&mut self, id: SubscriberId) {
        self.routes.remove(&id);
        self.broker.unsubscribe(id);
    }

    /// Remembers that the session on `stream` holds an answer until `log` is durable below
    /// `end`.
    pub(crate) fn wait_durable(
        &mut self,
        log: LogId,
        end: u64,
        ch: ConnectionHandle,
        stream: StreamId,
    ) {
        self.waiters
            .entry(log)
            .or_default()
            .push_back((end, ch, stream));
        if self.broker.is_gated(log) {
            if let Some(r) = self.router.as_mut() {
                r.replica_owes(log, end);
            }
        }
    }

    /// Remembers that the session on `stream` holds a `cache_value` until `log` answers the
    /// read `ticket`.
    pub(crate) fn wait_value(
        &mut self,
        log: LogId,
        ticket: ReadTicket,
        ch: ConnectionHandle,
        stream: StreamId,
    ) {
        self.value_waiters.insert((log, ticket), (ch, stream));
    }

    /// Remembers that the session on `stream` holds a `group_records` for poll `waiter`.
    pub(crate) fn wait_group(&mut self, waiter: u64, ch: ConnectionHandle, stream: StreamId) {
        self.group_waiters.insert(waiter, (ch, stream));
    }

    /// Remembers that the session on `stream` stopped at a request for a stream the cluster
    /// has not placed yet.
    pub(crate) fn wait_placement(
        &mut self,
        deadline: Instant,
        ch: ConnectionHandle,
        stream: StreamId,
    ) {
        self.awaiting_placement.push((deadline, ch, stream));
    }

    /// Remembers that the session on `stream` stopped at a request for a log still opening.
    pub(crate) fn wait_opened(&mut self, log: LogId, ch: ConnectionHandle, stream: StreamId) {
        self.stalled.entry(log).or_default().push((ch, stream));
    }
}
