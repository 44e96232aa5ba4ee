//! The broker's data plane as plain state: streams of shards with subscribers, and the cache.
//!
//! No clock, no randomness, no I/O: time arrives as arguments. The engine drives it in four
//! families, in this order within a turn:
//! - commands: [`Broker::publish`], [`Broker::subscribe`], [`Broker::unsubscribe`], the
//!   `cache_*` calls;
//! - [`Broker::flush`] once at the end of every turn: seals each open batch into one encoded
//!   frame per variant in use and queues `Bytes` clones to its subscribers;
//! - outputs: [`Broker::poll_ready`] names each subscriber with something new once, and
//!   [`Broker::next_delivery`] pops its frames while its stream can take them;
//! - timers: [`Broker::poll_timeout`] / [`Broker::handle_timeout`] for the cache sweep.
//!
//! Publishes land in the shard's open batch and coalesce until the turn ends, so under load
//! one frame carries many records and when idle each publish goes out at once.

mod cache;
mod commit;
mod conditional;
mod counters;
mod delete;
mod drain;
pub(crate) mod durable;
mod encode;
mod shard;
pub(crate) use encode::encode_message;
use shard::{Shard, ShardState};
mod expiry;
pub(crate) mod groups;
mod producers;
mod reads;
pub(crate) mod replicated;
pub(crate) mod retention;
#[cfg(test)]
mod stream_ops_tests;
#[cfg(test)]
mod tests;
mod watch;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::time::Instant;

use bytes::Bytes;
use felix_proto::features::Features;
use felix_proto::routing::{shard_for_key, RoutingMapping};
use felix_proto::{ErrorCode, Flags};

use cache::{CacheLimits, CacheStore};
pub(crate) use commit::Committed;
pub(crate) use delete::DeleteRefusal;
pub(crate) use durable::{CacheAnswer, DurableSettings, LogGone, Notice};
use durable::{LogState, Logs, Owner, ShardStore, Unreleased};
use encode::{encode_event_batch, encode_subscription_lagged, BatchView, MAX_PUBLISHER_LEN};
use felix_storage::layout;
use felix_storage::log::{AppendError, Batch};
use felix_storage::ops::LogId;
use felix_storage::record::EntryExt;
pub(crate) use producers::{Guard, Guarded};
pub(crate) use reads::{PageRequest, ReadAnswer, PAGE_FRAME_RESERVE};
pub(crate) use replicated::LogInfo;

use cache::CACHE_SWEEP_MAX_ENTRIES;
pub(crate) use conditional::{Condition, Conditional};
pub(crate) use watch::{WatchFilter, WatchStart};

/// Broker limits and layout. Every limit has a name and a default ([`BrokerConfig::default`]).
#[derive(Debug, Clone)]
pub(crate) struct BrokerConfig {
    /// Shards of a stream created on first use. 0 is read as 1.
    pub(crate) default_shards: u32,
    /// Streams with a declared shard count (0 is read as 1).
    pub(crate) declared_streams: Vec<(StreamKey, u32)>,
    /// Streams with their own retention (a single node's `[[streams]]`; a cluster's come
    /// from its metadata).
    pub(crate) declared_retention: Vec<(StreamKey, retention::StreamRetention)>,
    /// How a routing key picks a shard.
    pub(crate) routing_mapping: RoutingMapping,
    /// Streams this broker will hold; creating one more is refused `overloaded`.
    pub(crate) max_streams: usize,
    /// Sealed batches a subscriber's queue holds by default.
    pub(crate) subscriber_queue_capacity: usize,
    /// Ceiling for a subscribe's `queue_capacity`.
    pub(crate) subscriber_queue_capacity_max: usize,
    /// An open batch is sealed early once it holds this many records...
    pub(crate) event_batch_max_records: usize,
    /// ...or this many payload bytes.
    pub(crate) event_batch_max_bytes: usize,
    pub(crate) cache_max_key_bytes: usize,
    pub(crate) cache_max_value_bytes: usize,
    /// Key plus value bytes across every cache; a put past it is refused `overloaded`.
    pub(crate) cache_max_total_bytes: usize,
    /// Event bytes queued for one owner's (connection's) subscribers together; a batch that
    /// would go past it is dropped for that subscriber, as if its queue were full.
    pub(crate) max_owner_event_bytes: usize,
    /// Change frames a live cache watch may have queued before it ends as lagged.
    pub(crate) cache_watch_queue_capacity: usize,
    /// Committed state (keys plus values) one shard may hold; see `commit.rs`.
    pub(crate) state_max_bytes_per_shard: usize,
    /// Durable caches and counter logs, and what they hold together (`cache.rs`).
    pub(crate) durable_cache_max_logs: usize,
    pub(crate) counter_max_logs: usize,
    pub(crate) durable_cache_max_keys: u64,
    pub(crate) durable_cache_max_total_bytes: u64,
    /// Idempotent producers one tenant's shards remember together (`producers.rs`).
    pub(crate) max_producers_per_tenant: usize,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            default_shards: 1,
            declared_streams: Vec::new(),
            declared_retention: Vec::new(),
            routing_mapping: RoutingMapping::Modulo,
            max_streams: 100_000,
            subscriber_queue_capacity: 512,
            subscriber_queue_capacity_max: 8192,
            event_batch_max_records: 1024,
            event_batch_max_bytes: 1024 * 1024,
            cache_max_key_bytes: 1024,
            cache_max_value_bytes: 1024 * 1024,
            cache_max_total_bytes: 256 * 1024 * 1024,
            max_owner_event_bytes: usize::MAX,
            cache_watch_queue_capacity: crate::config::DEFAULT_CACHE_WATCH_QUEUE_CAPACITY,
            state_max_bytes_per_shard: crate::config::DEFAULT_STATE_MAX_BYTES_PER_SHARD,
            durable_cache_max_logs: crate::config::DEFAULT_DURABLE_CACHE_MAX_LOGS,
            counter_max_logs: crate::config::DEFAULT_COUNTER_MAX_LOGS,
            durable_cache_max_keys: crate::config::DEFAULT_DURABLE_CACHE_MAX_KEYS as u64,
            durable_cache_max_total_bytes: crate::config::DEFAULT_DURABLE_CACHE_MAX_TOTAL_BYTES,
            max_producers_per_tenant: crate::config::DEFAULT_MAX_PRODUCERS_PER_TENANT,
        }
    }
}

/// A stream's identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct StreamKey {
    pub(crate) tenant: String,
    pub(crate) namespace: String,
    pub(crate) stream: String,
}

impl StreamKey {
    pub(crate) fn new(tenant: &str, namespace: &str, stream: &str) -> StreamKey {
        StreamKey {
            tenant: tenant.into(),
            namespace: namespace.into(),
            stream: stream.into(),
        }
    }
}

/// One shard of a cache: its keys are hashed over the cache's shards with the protocol's
/// routing function (`felix_cluster::routing::cache_shard`), each shard its own log and its
/// own map; a broker outside a cluster has one shard per cache.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct CacheKey {
    pub(crate) tenant: String,
    pub(crate) namespace: String,
    pub(crate) cache: String,
    pub(crate) shard: u32,
}

impl CacheKey {
    /// Shard 0 of the cache.
    pub(crate) fn new(tenant: &str, namespace: &str, cache: &str) -> CacheKey {
        CacheKey::on_shard(tenant, namespace, cache, 0)
    }

    pub(crate) fn on_shard(tenant: &str, namespace: &str, cache: &str, shard: u32) -> CacheKey {
        CacheKey {
            tenant: tenant.into(),
            namespace: namespace.into(),
            cache: cache.into(),
            shard,
        }
    }
}

/// The broker's handle on one subscription (not the wire `subscription_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SubscriberId(pub(crate) u64);

/// A refusal with its wire code; `message` is for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BrokerError {
    pub(crate) code: ErrorCode,
    pub(crate) message: String,
    /// The request needs a log that is still opening: re-run it once this log reports
    /// [`Notice::Opened`] (nothing was changed).
    pub(crate) opening: Option<LogId>,
}

impl BrokerError {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> BrokerError {
        BrokerError {
            code,
            message: message.into(),
            opening: None,
        }
    }

    fn opening(log: LogId) -> BrokerError {
        BrokerError {
            code: ErrorCode::ShardUnavailable,
            message: "the shard's log is opening".into(),
            opening: Some(log),
        }
    }

    fn storage(message: impl Into<String>) -> BrokerError {
        BrokerError::new(ErrorCode::Storage, message)
    }
    fn invalid(message: impl Into<String>) -> BrokerError {
        BrokerError::new(ErrorCode::InvalidRequest, message)
    }
}

impl fmt::Display for BrokerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// Where a subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    Latest,
    Earliest,
    Offset(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CursorReason {
    TooOld,
    InFuture,
}

/// Why a subscribe was refused: a coded error, or a `subscribe_cursor_error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SubscribeError {
    Broker(BrokerError),
    Cursor {
        reason: CursorReason,
        requested: u64,
        available: u64,
    },
}

impl From<BrokerError> for SubscribeError {
    fn from(e: BrokerError) -> Self {
        SubscribeError::Broker(e)
    }
}

/// What a subscriber negotiated, as far as its deliveries are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SubscribeOpts {
    /// The wire id the engine gave the subscription (named in `subscription_lagged`).
    pub(crate) subscription_id: u64,
    /// Event-batch modifiers the client offered and this broker advertised; only 0x0020,
    /// 0x2000 and 0x4000 matter here, anything else is ignored.
    pub(crate) event_flags: Flags,
    /// The client offered FEATURE_SUBSCRIPTION_LAGGED.
    pub(crate) lagged_signal: bool,
    /// The client offered FEATURE_STREAM_DELETED.
    pub(crate) deleted_signal: bool,
    /// The client offered FEATURE_SHARD_MOVED.
    pub(crate) moved_signal: bool,
    /// The subscribe's `queue_capacity`, if it sent one.
    pub(crate) queue_capacity: Option<u32>,
    /// Whose event budget its queue counts against (the engine's connection).
    pub(crate) owner: u64,
}

impl SubscribeOpts {
    /// Options for a subscriber that negotiated these flags and features.
    pub(crate) fn negotiated(
        subscription_id: u64,
        flags: Flags,
        features: Features,
        queue_capacity: Option<u32>,
    ) -> SubscribeOpts {
        SubscribeOpts {
            subscription_id,
            event_flags: flags,
            lagged_signal: features.contains(Features::SUBSCRIPTION_LAGGED),
            deleted_signal: features.contains(Features::STREAM_DELETED),
            moved_signal: features.contains(Features::SHARD_MOVED),
            queue_capacity,
            owner: 0,
        }
    }
}

/// A granted subscription. The offsets are `Some` only on a shard with offsets, to a
/// subscriber that negotiated 0x0020; `queue_capacity` only when the subscribe asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Subscribed {
    pub(crate) id: SubscriberId,
    pub(crate) start_offset: Option<u64>,
    pub(crate) live_offset: Option<u64>,
    pub(crate) queue_capacity: Option<u32>,
}

/// A publish's outcome: where it landed, and its first offset on a shard with offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Published {
    pub(crate) shard: u32,
    pub(crate) first_offset: Option<u64>,
    /// On a durable shard: the log, and the offset below which the batch lies. It is
    /// durable once the log's durable offset reaches it ([`Notice::Durable`]).
    pub(crate) durable_at: Option<(LogId, u64)>,
}

/// One frame for a subscriber's event stream (header and payload, ready to write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Delivery {
    Frame(Bytes),
    /// The last frame (`subscription_lagged`): write it, then finish the stream. The
    /// subscription is gone from the broker once this is returned.
    Final(Bytes),
}

/// Plain counters. Bytes are payload bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BrokerStats {
    pub(crate) streams: u64,
    pub(crate) published_records: u64,
    pub(crate) published_bytes: u64,
    /// Sealed batches encoded (one per variant in use).
    pub(crate) frames_encoded: u64,
    /// Batches queued to a subscriber (one per subscriber per batch).
    pub(crate) deliveries: u64,
    /// Batches a full subscriber queue refused, and the records in them.
    pub(crate) dropped_batches: u64,
    pub(crate) dropped_records: u64,
    /// Subscriptions ended with `subscription_lagged`.
    pub(crate) lagged_subscriptions: u64,
    pub(crate) subscribers_open: u64,
    pub(crate) cache_hits: u64,
    pub(crate) cache_misses: u64,
    pub(crate) cache_puts: u64,
    pub(crate) cache_deletes: u64,
    pub(crate) cache_expired: u64,
    pub(crate) cache_entries: u64,
    pub(crate) cache_bytes: u64,
}

/// The modifiers a subscriber can negotiate on event batches. 0x0800 is absent on purpose:
/// no offset here ever holds a non-event, so `skipped_before` is never sent.
const EVENT_MODIFIERS: Flags = Flags(
    Flags::EVENT_BATCH_OFFSETS.0 | Flags::EVENT_BATCH_PUBLISHER.0 | Flags::EVENT_BATCH_TIMESTAMPS.0,
);
const VARIANTS: usize = 8;

/// Index of a modifier set among the 8 variants a sealed batch can be encoded as.
fn variant_index(flags: Flags) -> usize {
    usize::from(flags.contains(Flags::EVENT_BATCH_OFFSETS))
        | usize::from(flags.contains(Flags::EVENT_BATCH_PUBLISHER)) << 1
        | usize::from(flags.contains(Flags::EVENT_BATCH_TIMESTAMPS)) << 2
}

struct Stream {
    shards: Vec<Shard>,
}

struct Subscriber {
    stream: usize,
    shard: u32,
    subscription_id: u64,
    /// Modifiers it negotiated (subset of [`EVENT_MODIFIERS`]).
    wants: Flags,
    /// Ends with `subscription_lagged` at its first drop.
    ends_on_lag: bool,
    /// Ends with `stream_deleted` when its stream is deleted (`delete.rs`).
    ends_on_delete: bool,
    /// Ends with `shard_moved` when its shard's leadership here ends (`replicated.rs`).
    ends_on_move: bool,
    capacity: usize,
    queue: VecDeque<Bytes>,
    /// Bytes in `queue`, counted against its owner's event budget.
    queued_bytes: usize,
    owner: u64,
    final_frame: Option<Bytes>,
    /// No longer on its shard's list (ended by lag); only draining remains.
    detached: bool,
    /// Already in `Broker::ready`.
    ready: bool,
    drops: u64,
    /// Reading stored history before joining live delivery (not on the shard's list yet).
    catch_up: Option<CatchUp>,
}

/// A subscriber replaying the log from `next` until it reaches the shard's released tail,
/// where it joins live delivery in the same turn: no gap and no duplicate.
struct CatchUp {
    log: LogId,
    next: u64,
    reading: bool,
    /// On the shard's list: live frames queue behind the replay frames still held.
    joined: bool,
    frames: VecDeque<Bytes>,
    /// The replay failed: this frame ends the subscription.
    failed: Option<Bytes>,
}

/// Counters and queues `seal` touches besides the shard.
struct FanOut<'a> {
    subscribers: &'a mut HashMap<SubscriberId, Subscriber>,
    ready: &'a mut VecDeque<SubscriberId>,
    stats: &'a mut BrokerStats,
    budget: &'a mut EventBudget,
}

/// Event bytes queued per owner (connection), against one limit for each.
struct EventBudget {
    max: usize,
    by_owner: HashMap<u64, usize>,
}

impl EventBudget {
    fn fits(&self, owner: u64, bytes: usize) -> bool {
        self.by_owner.get(&owner).copied().unwrap_or(0) + bytes <= self.max
    }

    fn add(&mut self, owner: u64, bytes: usize) {
        *self.by_owner.entry(owner).or_default() += bytes;
    }

    fn sub(&mut self, owner: u64, bytes: usize) {
        if let Some(n) = self.by_owner.get_mut(&owner) {
            *n -= bytes;
            if *n == 0 {
                self.by_owner.remove(&owner);
            }
        }
    }
}

pub(crate) struct Broker {
    cfg: BrokerConfig,
    streams: Vec<Stream>,
    stream_index: HashMap<StreamKey, usize>,
    declared: HashMap<StreamKey, u32>,
    /// Streams' own retention bounds (`retention.rs`).
    retention: HashMap<StreamKey, retention::StreamRetention>,
    subscribers: HashMap<SubscriberId, Subscriber>,
    next_subscriber: u64,
    /// Subscribers with new deliveries, each at most once (see `Subscriber::ready`).
    ready: VecDeque<SubscriberId>,
    /// Shards with a non-empty open batch: flush work is proportional to activity.
    dirty: Vec<(usize, u32)>,
    cache: CacheStore,
    stats: BrokerStats,
    /// Durable storage; `None` keeps every stream in memory.
    logs: Option<Logs>,
    /// `now` of the last flush: when log events are left over, the next turn is due then.
    last_flush: Option<Instant>,
    event_budget: EventBudget,
    /// `stream_read` and `offset_for_time` reads in flight (`reads.rs`).
    page_reads: reads::PageReads,
    /// Producer ids handed out so far (`producers.rs`).
    producer_ids: u64,
    /// What recovery read back from stream logs that no stream has claimed yet, folded
    /// (`producers.rs`); a stream that claims the log takes its tables from here.
    recovered: HashMap<LogId, ShardState>,
    /// Cache watches (`watch.rs`); they share subscriber ids and the ready queue.
    watches: watch::Watches,
    /// What the durable caches and counter logs hold, for their limits (`cache.rs`).
    durable_usage: cache::DurableUsage,
    /// Consumer groups (durable shards only).
    groups: groups::Groups,
    /// Stopping: new work is refused (`drain.rs`).
    draining: bool,
    /// When the next durable-cache expiry pass runs (`expiry.rs`); `None` while no cache
    /// holds a key with a TTL.
    cache_expiry: Option<Instant>,
    /// Logs of replicated shards led here: answers wait for their commit mark
    /// (`replicated.rs`).
    gates: std::collections::BTreeMap<LogId, replicated::Gate>,
    /// Group, cache and counter logs to open again once idle (`replicated::reload_projection`).
    reload_logs: std::collections::BTreeSet<LogId>,
    /// Gates of leaderships that ended here, by (log, leadership), kept for the answers they
    /// still owe.
    retired_gates: std::collections::BTreeMap<(LogId, u64), replicated::Gate>,
    /// Per log, how many leaderships it has had here.
    leaderships: std::collections::BTreeMap<LogId, u64>,
}

impl Broker {
    pub(crate) fn new(mut cfg: BrokerConfig) -> Broker {
        cfg.default_shards = cfg.default_shards.max(1);
        cfg.subscriber_queue_capacity_max = cfg.subscriber_queue_capacity_max.max(1);
        cfg.subscriber_queue_capacity = cfg
            .subscriber_queue_capacity
            .clamp(1, cfg.subscriber_queue_capacity_max);
        cfg.event_batch_max_records = cfg.event_batch_max_records.max(1);
        cfg.cache_watch_queue_capacity = cfg.cache_watch_queue_capacity.max(1);
        let declared = cfg
            .declared_streams
            .iter()
            .map(|(k, n)| (k.clone(), (*n).max(1)))
            .collect();
        let retention = cfg.declared_retention.iter().cloned().collect();
        let cfg_max_owner = cfg.max_owner_event_bytes;
        let cache = CacheStore::new(CacheLimits {
            max_key_bytes: cfg.cache_max_key_bytes,
            max_value_bytes: cfg.cache_max_value_bytes,
            max_total_bytes: cfg.cache_max_total_bytes,
        });
        Broker {
            cfg,
            streams: Vec::new(),
            stream_index: HashMap::new(),
            declared,
            retention,
            subscribers: HashMap::new(),
            next_subscriber: 1,
            ready: VecDeque::new(),
            dirty: Vec::new(),
            cache,
            stats: BrokerStats::default(),
            logs: None,
            last_flush: None,
            event_budget: EventBudget {
                max: cfg_max_owner,
                by_owner: HashMap::new(),
            },
            page_reads: reads::PageReads::default(),
            producer_ids: 0,
            recovered: HashMap::new(),
            watches: watch::Watches::default(),
            durable_usage: cache::DurableUsage::default(),
            groups: groups::Groups::default(),
            draining: false,
            cache_expiry: None,
            gates: std::collections::BTreeMap::new(),
            reload_logs: std::collections::BTreeSet::new(),
            retired_gates: std::collections::BTreeMap::new(),
            leaderships: std::collections::BTreeMap::new(),
        }
    }

    /// A broker whose streams are durable: each shard has a log under the storage root.
    /// Startup begins at once: logs already on disk are found and opened through file ops,
    /// and [`Broker::is_ready`] says when that is done.
    pub(crate) fn with_storage(
        cfg: BrokerConfig,
        settings: DurableSettings,
        anchor: crate::clock::UnixAnchor,
    ) -> Broker {
        let mut b = Broker::new(cfg);
        b.groups = groups::Groups::new(settings.groups.clone());
        b.logs = Some(Logs::new(settings, anchor));
        b
    }

    /// A cluster placed `key` with `shards` shards (created through the admin API, or by a
    /// first use elsewhere): a stream not opened here yet is opened that wide, as a declared
    /// one is. One already open keeps its width (the metadata's is the same: both come
    /// from the one placement).
    pub(crate) fn learn_width(&mut self, key: &StreamKey, shards: u32) {
        if !self.stream_index.contains_key(key) {
            self.declared.insert(key.clone(), shards.max(1));
        }
    }

    /// Shards of a stream that exists (was used or declared); `None` for an unknown one.
    pub(crate) fn shard_count(&self, key: &StreamKey) -> Option<u32> {
        match self.stream_index.get(key) {
            Some(&i) => Some(self.streams[i].shards.len() as u32),
            None => self.declared.get(key).copied(),
        }
    }

    /// Appends records to a shard's open batch. `explicit_shard` wins over `routing_key`;
    /// with neither the records go to shard 0. The stream is created on first use.
    /// `publisher` is the publishing principal, carried to subscribers that asked for it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn publish(
        &mut self,
        now: Instant,
        unix_micros: u64,
        key: &StreamKey,
        routing_key: Option<&[u8]>,
        explicit_shard: Option<u32>,
        payloads: Vec<Bytes>,
        publisher: Option<&str>,
    ) -> Result<Published, BrokerError> {
        let ext = EntryExt::NONE;
        let routing = (routing_key, explicit_shard);
        self.publish_ext(now, unix_micros, key, routing, payloads, publisher, &ext)
    }

    /// [`Broker::publish`] of an entry that carries an extension on a durable shard (a
    /// producer mark or a commit's state); `routing` is the routing key and explicit shard.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn publish_ext(
        &mut self,
        now: Instant,
        unix_micros: u64,
        key: &StreamKey,
        (routing_key, explicit_shard): (Option<&[u8]>, Option<u32>),
        payloads: Vec<Bytes>,
        publisher: Option<&str>,
        ext: &EntryExt<'_>,
    ) -> Result<Published, BrokerError> {
        self.refuse_if_draining()?;
        let shards = self.shard_count(key).unwrap_or(self.cfg.default_shards);
        let shard = match explicit_shard {
            Some(s) if s >= shards => {
                return Err(BrokerError::invalid(format!(
                    "shard {s} is out of range: the stream has {shards} shard(s)"
                )))
            }
            Some(s) => s,
            None => shard_for_key(routing_key, shards, self.cfg.routing_mapping),
        };
        let stream = self.stream_or_create(now, key)?;
        let publisher = publisher.filter(|p| p.len() <= MAX_PUBLISHER_LEN);
        let count = payloads.len() as u64;
        let bytes = payloads.iter().map(|p| p.len() as u64).sum::<u64>();

        let sh = &mut self.streams[stream].shards[shard as usize];
        if let Some(store) = &mut sh.store {
            // Durable: the records take their offsets in the log now and fan out once the
            // log reports them durable (`release`), so no subscriber sees a record that a
            // crash could still take back.
            let logs = self.logs.as_mut().expect("durable shards have logs");
            let log = store.log;
            let slot = logs.slot_mut(log).expect("a shard's log exists");
            match &slot.state {
                LogState::Opening => return Err(BrokerError::opening(log)),
                LogState::Failed(e) => {
                    return Err(BrokerError::storage(format!("the shard's log failed: {e}")))
                }
                LogState::Open => {}
            }
            // A replicated shard led here before but not now: a write routed while it was
            // led and run later (it waited for its log) must not land on a follower's copy.
            if self.leaderships.contains_key(&log) && !self.gates.contains_key(&log) {
                return Err(BrokerError::new(
                    ErrorCode::ShardUnavailable,
                    "the shard is no longer led here; retry",
                ));
            }
            if payloads.is_empty() {
                let at = slot.log.shard().next_offset();
                return Ok(Published {
                    shard,
                    first_offset: Some(at),
                    durable_at: Some((log, at)),
                });
            }
            let batch = Batch {
                time_us: unix_micros,
                publisher: publisher.map(str::as_bytes),
                payloads: &payloads,
            };
            let first = slot
                .log
                .stream_mut()
                .expect("a stream's log")
                .append_ext(now, batch, ext)
                .map_err(append_error)?;
            logs.mark_dirty(log);
            self.stats.published_records += count;
            self.stats.published_bytes += bytes;
            store.unreleased.push_back(Unreleased {
                first,
                time_us: unix_micros,
                publisher: publisher.map(Box::from),
                payloads,
            });
            return Ok(Published {
                shard,
                first_offset: Some(first),
                durable_at: Some((log, first + count)),
            });
        }

        self.stats.published_records += count;
        self.stats.published_bytes += bytes;
        let first_seq = sh.next_seq;
        sh.next_seq += count;
        let first_offset = sh.has_offsets.then_some(first_seq);
        if !sh.subscribers.is_empty() {
            let mut fan = FanOut {
                subscribers: &mut self.subscribers,
                ready: &mut self.ready,
                stats: &mut self.stats,
                budget: &mut self.event_budget,
            };
            let limits = (
                self.cfg.event_batch_max_records,
                self.cfg.event_batch_max_bytes,
            );
            fan_in(
                sh,
                first_seq,
                payloads,
                unix_micros,
                publisher,
                limits,
                &mut fan,
            );
            if !sh.open.payloads.is_empty() && !sh.dirty {
                sh.dirty = true;
                self.dirty.push((stream, shard));
            }
        }
        // Else nobody to deliver to, and a later subscriber starts after these records.
        Ok(Published {
            shard,
            first_offset,
            durable_at: None,
        })
    }

    /// Registers a subscriber on one shard. `Latest` is served anywhere; `Earliest` and
    /// `Offset` need stored history, which in-memory shards do not have.
    pub(crate) fn subscribe(
        &mut self,
        now: Instant,
        key: &StreamKey,
        shard: u32,
        start: Start,
        opts: SubscribeOpts,
    ) -> Result<Subscribed, SubscribeError> {
        self.refuse_if_draining()?;
        let shards = self.shard_count(key).unwrap_or(self.cfg.default_shards);
        if shard >= shards {
            return Err(BrokerError::invalid(format!(
                "shard {shard} is out of range: the stream has {shards} shard(s)"
            ))
            .into());
        }
        let stream = self.stream_or_create(now, key)?;
        let sh = &self.streams[stream].shards[shard as usize];
        let cursor = |reason, requested, available| SubscribeError::Cursor {
            reason,
            requested,
            available,
        };
        // `from` is the first offset delivered, `tail` where live delivery takes over.
        let (from, tail, log) = match &sh.store {
            Some(store) => {
                let logs = self.logs.as_ref().expect("durable shards have logs");
                let slot = logs.slot(store.log).expect("a shard's log exists");
                match &slot.state {
                    LogState::Opening => return Err(BrokerError::opening(store.log).into()),
                    LogState::Failed(e) => {
                        return Err(
                            BrokerError::storage(format!("the shard's log failed: {e}")).into()
                        )
                    }
                    LogState::Open => {}
                }
                let tail = store.released;
                let oldest = slot.log.shard().start_offset().min(tail);
                let from = match start {
                    Start::Latest => tail,
                    Start::Earliest => oldest,
                    Start::Offset(n) if n > tail => {
                        return Err(cursor(CursorReason::InFuture, n, tail))
                    }
                    Start::Offset(n) if n < oldest => {
                        return Err(cursor(CursorReason::TooOld, n, oldest))
                    }
                    Start::Offset(n) => n,
                };
                (from, tail, Some(store.log))
            }
            None => {
                let tail = sh.next_seq;
                if !sh.has_offsets && start != Start::Latest {
                    return Err(BrokerError::invalid(
                        "replay needs durable storage: this stream is in memory, subscribe from latest",
                    )
                    .into());
                }
                // With offsets but no stored history, the oldest retained offset is the tail.
                match start {
                    Start::Offset(n) if n > tail => {
                        return Err(cursor(CursorReason::InFuture, n, tail))
                    }
                    Start::Offset(n) if n < tail => {
                        return Err(cursor(CursorReason::TooOld, n, tail))
                    }
                    _ => {}
                }
                (tail, tail, None)
            }
        };

        let max = self.cfg.subscriber_queue_capacity_max;
        let capacity = match opts.queue_capacity {
            Some(asked) => (asked as usize).clamp(1, max),
            None => self.cfg.subscriber_queue_capacity,
        };
        let wants = opts.event_flags.intersection(EVENT_MODIFIERS);
        let offsets_on_wire = sh.has_offsets && wants.contains(Flags::EVENT_BATCH_OFFSETS);
        // History below the tail is replayed from the log before live delivery takes over.
        let catch_up = match log {
            Some(log) if from < tail => Some(CatchUp {
                log,
                next: from,
                reading: false,
                joined: false,
                frames: VecDeque::new(),
                failed: None,
            }),
            _ => None,
        };

        let id = SubscriberId(self.next_subscriber);
        self.next_subscriber += 1;
        let joins_now = catch_up.is_none();
        if joins_now {
            // Records already in the open batch were published before this subscriber joined.
            let mut fan = FanOut {
                subscribers: &mut self.subscribers,
                ready: &mut self.ready,
                stats: &mut self.stats,
                budget: &mut self.event_budget,
            };
            let sh = &mut self.streams[stream].shards[shard as usize];
            seal(sh, &mut fan);
            sh.subscribers.push(id);
        }
        self.subscribers.insert(
            id,
            Subscriber {
                stream,
                shard,
                subscription_id: opts.subscription_id,
                wants,
                ends_on_lag: offsets_on_wire && opts.lagged_signal,
                ends_on_delete: opts.deleted_signal,
                ends_on_move: opts.moved_signal,
                capacity,
                queue: VecDeque::new(),
                queued_bytes: 0,
                owner: opts.owner,
                final_frame: None,
                detached: !joins_now,
                ready: false,
                drops: 0,
                catch_up,
            },
        );
        self.stats.subscribers_open += 1;
        if !joins_now {
            self.advance_catch_up(id);
        }
        Ok(Subscribed {
            id,
            start_offset: offsets_on_wire.then_some(from),
            live_offset: offsets_on_wire.then_some(tail),
            queue_capacity: opts.queue_capacity.map(|_| capacity as u32),
        })
    }

    /// Forgets a subscriber and whatever it had queued. Unknown ids are ignored.
    pub(crate) fn unsubscribe(&mut self, id: SubscriberId) {
        if self.watches.contains(id) {
            return self.unwatch(id);
        }
        let Some(sub) = self.subscribers.remove(&id) else {
            return;
        };
        self.event_budget.sub(sub.owner, sub.queued_bytes);
        self.stats.subscribers_open -= 1;
        if !sub.detached {
            let list = &mut self.streams[sub.stream].shards[sub.shard as usize].subscribers;
            if let Some(pos) = list.iter().position(|s| *s == id) {
                list.swap_remove(pos);
            }
        }
    }

    /// Collects the logs' file ops and acts on their events (durable records fan out,
    /// catch-up reads land), then seals every open batch and queues it to its subscribers.
    /// Call once per turn, and again while [`Broker::has_storage_work`] says so.
    pub(crate) fn flush(&mut self, now: Instant) {
        self.last_flush = Some(now);
        self.process_logs(now);
        self.serve_woken_groups(now);
        let mut fan = FanOut {
            subscribers: &mut self.subscribers,
            ready: &mut self.ready,
            stats: &mut self.stats,
            budget: &mut self.event_budget,
        };
        for (stream, shard) in self.dirty.drain(..) {
            let sh = &mut self.streams[stream].shards[shard as usize];
            sh.dirty = false;
            seal(sh, &mut fan);
        }
    }

    /// A subscriber with deliveries it has not been named for yet.
    #[must_use]
    pub(crate) fn poll_ready(&mut self) -> Option<SubscriberId> {
        while let Some(id) = self.ready.pop_front() {
            if let Some(sub) = self.subscribers.get_mut(&id) {
                sub.ready = false;
                return Some(id);
            }
            if self.watches.take_ready(id) {
                return Some(id);
            }
        }
        None
    }

    /// Pops the subscriber's next frame. Call only when its stream can take the frame.
    #[must_use]
    pub(crate) fn next_delivery(&mut self, id: SubscriberId) -> Option<Delivery> {
        if self.watches.contains(id) {
            return self.next_watch_delivery(id);
        }
        let sub = self.subscribers.get_mut(&id)?;
        if let Some(cu) = sub.catch_up.as_mut() {
            if let Some(frame) = cu.frames.pop_front() {
                // Read ahead while this frame is written.
                self.advance_catch_up(id);
                return Some(Delivery::Frame(frame));
            }
            if let Some(last) = cu.failed.take() {
                self.unsubscribe(id);
                return Some(Delivery::Final(last));
            }
            if !cu.joined {
                self.advance_catch_up(id);
                let sub = self.subscribers.get_mut(&id)?;
                let cu = sub.catch_up.as_mut()?;
                if !cu.joined || !cu.frames.is_empty() {
                    return cu.frames.pop_front().map(Delivery::Frame);
                }
            }
            let sub = self.subscribers.get_mut(&id)?;
            sub.catch_up = None;
        }
        let sub = self.subscribers.get_mut(&id)?;
        if let Some(frame) = sub.queue.pop_front() {
            sub.queued_bytes -= frame.len();
            self.event_budget.sub(sub.owner, frame.len());
            return Some(Delivery::Frame(frame));
        }
        let last = sub.final_frame.take()?;
        self.subscribers.remove(&id);
        self.stats.subscribers_open -= 1;
        Some(Delivery::Final(last))
    }

    /// Batches a subscriber's full queue refused so far.
    #[cfg(test)]
    pub(crate) fn subscriber_drops(&self, id: SubscriberId) -> Option<u64> {
        self.subscribers.get(&id).map(|s| s.drops)
    }

    /// Stores a value. In memory it is done; on a durable cache the answer waits until the
    /// log is durable below the returned offset (the write is visible from then on too).
    pub(crate) fn cache_put(
        &mut self,
        now: Instant,
        unix_micros: u64,
        key: &CacheKey,
        k: &str,
        value: Bytes,
        ttl_ms: Option<u64>,
    ) -> Result<Option<(LogId, u64)>, BrokerError> {
        self.refuse_if_draining()?;
        if self.logs.is_some() {
            return self
                .log_cache_put(now, unix_micros, key, k, value, ttl_ms)
                .map(Some);
        }
        self.cache.put(now, key, k, value, ttl_ms).map(|_| None)
    }

    pub(crate) fn cache_get(
        &mut self,
        now: Instant,
        unix_micros: u64,
        key: &CacheKey,
        k: &str,
    ) -> Result<CacheAnswer, BrokerError> {
        self.refuse_if_draining()?;
        if self.logs.is_some() {
            return self.log_cache_get(now, unix_micros, key, k);
        }
        Ok(CacheAnswer::Now(self.cache.get(now, key, k)))
    }

    /// Removes a key; the answer is the value it held (`None` if absent or expired).
    pub(crate) fn cache_delete(
        &mut self,
        now: Instant,
        unix_micros: u64,
        key: &CacheKey,
        k: &str,
    ) -> Result<CacheAnswer, BrokerError> {
        self.refuse_if_draining()?;
        if self.logs.is_some() {
            return self.log_cache_delete(now, unix_micros, key, k);
        }
        Ok(CacheAnswer::Now(self.cache.delete(now, key, k)))
    }

    /// The next instant [`Broker::handle_timeout`] has work: the cache sweep, a log's
    /// periodic fsync or retention check, or log events a busy turn left unhandled.
    #[must_use]
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let leftover = self.has_storage_work().then_some(self.last_flush).flatten();
        let logs = self.logs.as_ref().and_then(|l| l.poll_timeout());
        [
            self.cache.poll_timeout(),
            logs,
            leftover,
            self.groups_timeout(),
            self.cache_expiry,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Runs what is due: a bounded cache sweep and the logs' timers. `unix_micros` is `now`
    /// on the wall clock (retention by age compares it with stored append times).
    pub(crate) fn handle_timeout(&mut self, now: Instant, unix_micros: u64) {
        if self.cache.poll_timeout().is_some_and(|at| at <= now) {
            self.cache.sweep(now, CACHE_SWEEP_MAX_ENTRIES);
        }
        if let Some(logs) = self.logs.as_mut() {
            logs.handle_timeout(now, unix_micros);
        }
        if self.groups_timeout().is_some_and(|at| at <= now) {
            self.groups_handle_timeout(now);
        }
        self.run_cache_expiry(now, unix_micros);
    }

    /// The most event bytes queued for one owner's subscribers.
    pub(crate) fn max_owner_event_bytes(&self) -> usize {
        self.event_budget
            .by_owner
            .values()
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// The most frames one subscriber has queued (live batches and replayed ones), and the
    /// number of streams held.
    pub(crate) fn queue_usage(&self) -> (usize, usize) {
        let deepest = self
            .subscribers
            .values()
            .map(|s| s.queue.len() + s.catch_up.as_ref().map_or(0, |c| c.frames.len()))
            .max()
            .unwrap_or(0);
        // Deleted streams keep their index (`delete.rs`): count the live ones.
        (deepest, self.stream_index.len())
    }

    pub(crate) fn stats(&self) -> BrokerStats {
        let c = self.cache.counters;
        BrokerStats {
            streams: self.stream_index.len() as u64,
            // Durable caches count into `self.stats`, in-memory ones into the store.
            cache_hits: c.hits + self.stats.cache_hits,
            cache_misses: c.misses + self.stats.cache_misses,
            cache_puts: c.puts + self.stats.cache_puts,
            cache_deletes: c.deletes + self.stats.cache_deletes,
            cache_expired: c.expired,
            cache_entries: self.cache.entries() as u64,
            cache_bytes: self.cache.total_bytes() as u64,
            ..self.stats
        }
    }

    fn stream_or_create(&mut self, now: Instant, key: &StreamKey) -> Result<usize, BrokerError> {
        if let Some(&i) = self.stream_index.get(key) {
            return Ok(i);
        }
        if let Some(retiring) = self.stream_delete_pending(key) {
            // Deleted a moment ago: a new log must not open the old files (`delete.rs`).
            return Err(BrokerError::opening(retiring));
        }
        // Deleted streams keep their index (empty), so count the live ones.
        if self.stream_index.len() >= self.cfg.max_streams {
            return Err(BrokerError::new(
                ErrorCode::Overloaded,
                format!(
                    "this broker holds its limit of {} streams",
                    self.cfg.max_streams
                ),
            ));
        }
        let shards = self
            .declared
            .get(key)
            .copied()
            .unwrap_or(self.cfg.default_shards);
        let index = self.streams.len();
        let mut stream = Stream {
            shards: (0..shards).map(|_| Shard::new()).collect(),
        };
        if let Some(logs) = self.logs.as_mut() {
            for (i, sh) in stream.shards.iter_mut().enumerate() {
                let shard = i as u32;
                let dir = layout::stream_shard_dir(&key.tenant, &key.namespace, &key.stream, shard);
                let log = logs.claim(
                    dir,
                    Owner::Stream {
                        stream: index,
                        shard,
                    },
                    now,
                );
                // What recovery read back before this claim comes first, in log order.
                if let Some(r) = self.recovered.remove(&log) {
                    sh.state = r;
                }
                let slot = logs.slot(log).expect("just claimed");
                // A log found at startup is open already; a new one sets this when it opens.
                let released = match slot.state {
                    LogState::Open => slot.log.durable_offset(),
                    _ => 0,
                };
                sh.has_offsets = true;
                sh.store = Some(ShardStore {
                    log,
                    unreleased: VecDeque::new(),
                    released,
                });
            }
        }
        self.streams.push(stream);
        self.stream_index.insert(key.clone(), index);
        if self.retention.contains_key(key) {
            self.apply_stream_retention(index, key);
        }
        Ok(index)
    }

    #[cfg(test)]
    fn set_offsets_for_test(&mut self, key: &StreamKey, on: bool) {
        let i = self.stream_or_create(Instant::now(), key).unwrap();
        for sh in &mut self.streams[i].shards {
            sh.has_offsets = on;
        }
    }
}

/// Adds records (offsets from `first`) to the shard's open batch, sealing it whenever it
/// reaches a limit or the publisher changes.
fn fan_in(
    sh: &mut Shard,
    first: u64,
    payloads: Vec<Bytes>,
    unix_micros: u64,
    publisher: Option<&str>,
    (max_records, max_bytes): (usize, usize),
    fan: &mut FanOut<'_>,
) {
    for (i, payload) in payloads.into_iter().enumerate() {
        let open = &sh.open;
        let breaks = !open.payloads.is_empty()
            && (open.bytes + payload.len() > max_bytes || open.publisher.as_deref() != publisher);
        if breaks {
            seal(sh, fan);
        }
        if sh.open.payloads.is_empty() {
            sh.open.base_seq = first + i as u64;
            sh.open.publisher = publisher.map(Box::from);
        }
        sh.open.bytes += payload.len();
        sh.open.payloads.push(payload);
        if sh.has_offsets {
            sh.open.times.push(unix_micros);
        }
        if sh.open.payloads.len() >= max_records || sh.open.bytes >= max_bytes {
            seal(sh, fan);
        }
    }
}

pub(crate) fn append_error(e: AppendError) -> BrokerError {
    match e {
        AppendError::NotOpen => BrokerError::storage("the shard's log is not open"),
        AppendError::Failed(e) => BrokerError::storage(format!("the shard's log failed: {e}")),
        AppendError::Empty => BrokerError::invalid("an empty batch"),
        AppendError::PublisherTooLong => BrokerError::invalid("the publisher name is too long"),
        AppendError::TooLarge(n) => BrokerError::new(
            ErrorCode::LimitExceeded,
            format!("a batch of {n} bytes is larger than one log entry may be"),
        ),
        AppendError::Backpressure => BrokerError::new(
            ErrorCode::Overloaded,
            "the shard's log has too many bytes waiting to be written",
        ),
        // Replication's framed appends and truncations; a publish never meets these.
        AppendError::NotContiguous { expected, got } => BrokerError::storage(format!(
            "shipped entries start at {got}, the log's next offset is {expected}"
        )),
        AppendError::Damaged { pos, what } => {
            BrokerError::storage(format!("shipped entries damaged at byte {pos}: {what}"))
        }
        AppendError::Truncating => {
            BrokerError::new(ErrorCode::Overloaded, "the shard's log is being truncated")
        }
        // A follower's copy: the shard is led elsewhere (or by nobody yet).
        AppendError::ShippedOnly => BrokerError::new(
            ErrorCode::ShardUnavailable,
            "this node's copy of the shard is a follower's: it takes only what its leader ships",
        ),
    }
}

/// Seals the shard's open batch: encodes it once per variant its subscribers need and
/// queues the shared `Bytes` to each, dropping the batch for any whose queue is full.
fn seal(sh: &mut Shard, fan: &mut FanOut<'_>) {
    if sh.open.payloads.is_empty() {
        return;
    }
    let batch = std::mem::take(&mut sh.open);
    let view = BatchView {
        base_offset: batch.base_seq,
        publisher: batch.publisher.as_deref(),
        times: &batch.times,
        payloads: &batch.payloads,
    };
    // What this batch can carry; each subscriber gets the part of it that it negotiated.
    let mut available = Flags::NONE;
    if sh.has_offsets {
        available = available.union(Flags::EVENT_BATCH_OFFSETS);
        if batch.times.len() == batch.payloads.len() {
            available = available.union(Flags::EVENT_BATCH_TIMESTAMPS);
        }
    }
    if batch.publisher.is_some() {
        available = available.union(Flags::EVENT_BATCH_PUBLISHER);
    }

    let mut encoded: [Option<Bytes>; VARIANTS] = Default::default();
    let mut lagged = Vec::new();
    for id in &sh.subscribers {
        let sub = fan
            .subscribers
            .get_mut(id)
            .expect("shard lists only live subscribers");
        let flags = sub.wants.intersection(available);
        let slot = &mut encoded[variant_index(flags)];
        let frame = slot.get_or_insert_with(|| {
            fan.stats.frames_encoded += 1;
            encode_event_batch(flags, &view)
        });
        if sub.queue.len() >= sub.capacity || !fan.budget.fits(sub.owner, frame.len()) {
            sub.drops += 1;
            fan.stats.dropped_batches += 1;
            fan.stats.dropped_records += batch.payloads.len() as u64;
            if sub.ends_on_lag {
                // Its queued frames go first, then this, then the stream ends.
                sub.final_frame = Some(encode_subscription_lagged(
                    sub.subscription_id,
                    batch.base_seq,
                ));
                sub.detached = true;
                fan.stats.lagged_subscriptions += 1;
                lagged.push(*id);
                mark_ready(*id, sub, fan.ready);
            }
            continue;
        }
        sub.queued_bytes += frame.len();
        fan.budget.add(sub.owner, frame.len());
        sub.queue.push_back(frame.clone());
        fan.stats.deliveries += 1;
        mark_ready(*id, sub, fan.ready);
    }
    if !lagged.is_empty() {
        sh.subscribers.retain(|id| !lagged.contains(id));
    }
}

impl Broker {
    /// Ends the readers of stream `index` (of one shard, or of all) after what is queued for
    /// them: records already fanned in are sealed and go out, and so do replay frames already
    /// encoded. `last` makes each one's final frame from the first offset it was not offered.
    fn end_readers(
        &mut self,
        index: usize,
        shard: Option<u32>,
        last: impl Fn(&Subscriber, u64) -> Bytes,
    ) {
        let ends = |i: u32| shard.is_none_or(|s| s == i);
        let mut fan = FanOut {
            subscribers: &mut self.subscribers,
            ready: &mut self.ready,
            stats: &mut self.stats,
            budget: &mut self.event_budget,
        };
        for (i, sh) in self.streams[index].shards.iter_mut().enumerate() {
            if ends(i as u32) {
                sh.dirty = false;
                seal(sh, &mut fan);
            }
        }
        // In id order, not the hash map's: the final frames are queued (and sent) in it.
        let mut ids: Vec<SubscriberId> = self
            .subscribers
            .iter()
            .filter(|(_, s)| s.stream == index && ends(s.shard) && s.final_frame.is_none())
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        for id in ids {
            let Some(sub) = self.subscribers.get_mut(&id) else {
                continue;
            };
            let released = self.streams[index].shards[sub.shard as usize]
                .store
                .as_ref()
                .map_or(0, |s| s.released);
            let resume_from = match sub.catch_up.take() {
                Some(cu) => {
                    for f in cu.frames.into_iter().rev() {
                        sub.queued_bytes += f.len();
                        self.event_budget.add(sub.owner, f.len());
                        sub.queue.push_front(f);
                    }
                    // Joined: live frames from the released tail queue behind the replay.
                    if cu.joined {
                        released
                    } else {
                        cu.next
                    }
                }
                None => released,
            };
            sub.detached = true;
            sub.final_frame = Some(last(sub, resume_from));
            mark_ready(id, sub, &mut self.ready);
        }
        for (i, sh) in self.streams[index].shards.iter_mut().enumerate() {
            if ends(i as u32) {
                sh.subscribers.clear();
            }
        }
    }
}

fn mark_ready(id: SubscriberId, sub: &mut Subscriber, ready: &mut VecDeque<SubscriberId>) {
    if !sub.ready {
        sub.ready = true;
        ready.push_back(id);
    }
}
