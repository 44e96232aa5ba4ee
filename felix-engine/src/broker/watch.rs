//! Cache watches: each applied write to a key or a key prefix, in the cache log's offset
//! order, on the watch's own event stream.
//!
//! A watch is served from a durable cache (its log gives every change an offset). It has
//! three phases, each optional:
//! 1. **snapshot** (`retained`, or a resume whose history compaction collapsed): the current
//!    value of every matching key as of the applied mark `F` at establishment, read from
//!    the log at the offsets the index names;
//! 2. **replay**: stored changes from the resume offset (or from `F` after a snapshot) up to
//!    the cache's applied mark, read from the log;
//! 3. **live**: once the replay reaches the applied mark the watch joins the log's live
//!    list in the same turn, and every later change is queued to it as the log applies it.
//!
//! The join needs no lock: a change below the mark is in the log (the replay read it), a
//! change at or past it is not applied yet and will be dispatched; a change applied but
//! not yet dispatched when the watch joined is below its `live_from` and skipped. While a
//! watch reads, compaction of its log waits, so offsets it was promised stay readable.
//!
//! A live watch's queue is bounded (`cache_watch_queue_capacity` frames, by default
//! [`DEFAULT_CACHE_WATCH_QUEUE_CAPACITY`](crate::config::DEFAULT_CACHE_WATCH_QUEUE_CAPACITY)).
//! A watch whose queue is full is ended, never thinned: what it has queued is delivered,
//! then `cache_watch_lagged` names the first change it missed.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use bytes::Bytes;
use felix_proto::message::{
    CacheEvent as CacheEventMsg, CacheWatchLagged, ErrorMessage, Message, ShardMoved,
};
use felix_proto::ErrorCode;

use super::cache::{DurableKind, DurableWrite};
use super::{Broker, BrokerError, CacheKey, CursorReason, Delivery, SubscribeError, SubscriberId};
use felix_storage::cache_log::{CacheRecord, Change};
use felix_storage::log::{ReadBatch, ReadError, ReadTicket};
use felix_storage::ops::LogId;

/// A snapshot or replay read asks the log for at most this many records and bytes.
const WATCH_READ_RECORDS: usize = 1024;
const WATCH_READ_BYTES: usize = 1 << 20;
/// A catch-up issues its next read only while it holds fewer frames than this, and fewer
/// bytes than the next constant: what one catching-up watch holds stays near one read.
const WATCH_FRAMES_AHEAD: usize = 256;
const WATCH_BYTES_AHEAD: usize = 1 << 20;

/// Which keys a watch follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WatchFilter {
    Key(String),
    /// Every key starting with it; empty is every key.
    Prefix(String),
}

impl WatchFilter {
    pub(crate) fn matches(&self, key: &[u8]) -> bool {
        match self {
            WatchFilter::Key(k) => k.as_bytes() == key,
            WatchFilter::Prefix(p) => key.starts_with(p.as_bytes()),
        }
    }
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchStart {
    /// Changes applied from now on.
    Live,
    /// Every matching key's current value, then live changes.
    Retained,
    /// Stored changes from this offset, then live ones.
    From(u64),
}

/// What the watch's confirmation says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WatchStarted {
    pub(crate) id: SubscriberId,
    pub(crate) resume_offset: u64,
    pub(crate) resnapshot: bool,
    pub(crate) retained_count: Option<u64>,
}

/// The snapshot and replay still to read before the watch joins live delivery.
struct CatchUp {
    /// Offsets of the snapshot's values still to read, ascending.
    snapshot: VecDeque<u64>,
    /// Where the replay goes on once the snapshot is read.
    next: u64,
    reading: bool,
    frames: VecDeque<Bytes>,
    /// A read failed, or compaction had to pass the watch: this frame ends it, after the
    /// frames held.
    failed: Option<Bytes>,
}

struct Watch {
    log: LogId,
    filter: WatchFilter,
    owner: u64,
    capacity: usize,
    /// On the log's live list.
    live: bool,
    /// Live changes below this were covered by the catch-up.
    live_from: u64,
    catch_up: Option<CatchUp>,
    queue: VecDeque<Bytes>,
    queued_bytes: usize,
    /// `cache_watch_lagged` (or an error): sent after the queue, then the stream ends.
    final_frame: Option<Bytes>,
    ready: bool,
    /// The client's subscription id, when it offered `FEATURE_SHARD_MOVED`: a move ends the
    /// watch with `shard_moved` rather than a coded error.
    moved_signal: Option<u64>,
}

/// Every watch, the live lists per cache log, and the reads in flight.
#[derive(Default)]
pub(crate) struct Watches {
    map: HashMap<SubscriberId, Watch>,
    live: HashMap<LogId, Vec<SubscriberId>>,
    reads: HashMap<(LogId, ReadTicket), SubscriberId>,
    /// Catch-ups refused `Busy`, retried when a read of that log lands.
    blocked: HashMap<LogId, Vec<SubscriberId>>,
}

impl Watches {
    pub(crate) fn contains(&self, id: SubscriberId) -> bool {
        self.map.contains_key(&id)
    }

    /// A ready watch is being named: it may be named again once it has more.
    pub(crate) fn take_ready(&mut self, id: SubscriberId) -> bool {
        match self.map.get_mut(&id) {
            Some(w) => {
                w.ready = false;
                true
            }
            None => false,
        }
    }

    /// Some watch of `log` is reading it (compaction waits). One whose catch-up was ended
    /// reads no more.
    pub(crate) fn reading(&self, log: LogId) -> bool {
        self.map.values().any(|w| {
            w.log == log && !w.live && w.catch_up.as_ref().is_some_and(|cu| cu.failed.is_none())
        })
    }
}

fn frame_of(msg: &Message) -> Bytes {
    let mut out = Vec::new();
    msg.encode_frame_into(&mut out);
    Bytes::from(out)
}

fn change_frame(offset: u64, key: &[u8], value: Option<Bytes>, expiry: Option<u64>) -> Bytes {
    frame_of(&Message::CacheEvent(CacheEventMsg {
        key: String::from_utf8_lossy(key).into_owned(),
        value,
        offset,
        expires_at_millis: expiry,
    }))
}

fn lagged_frame(resume_from: u64) -> Bytes {
    frame_of(&Message::CacheWatchLagged(CacheWatchLagged { resume_from }))
}

fn error_frame(message: &str) -> Bytes {
    frame_of(&Message::Error(ErrorMessage::coded(
        ErrorCode::Storage,
        message,
    )))
}

impl Broker {
    /// Starts a watch on a durable cache (created if it was never written). A cache log
    /// still opening stalls the request (`BrokerError::opening`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn cache_watch(
        &mut self,
        now: Instant,
        unix_micros: u64,
        key: &CacheKey,
        filter: WatchFilter,
        start: WatchStart,
        owner: u64,
    ) -> Result<WatchStarted, SubscribeError> {
        if self.logs.is_none() {
            return Err(BrokerError::invalid(
                "cache watches need durable storage: this broker keeps its caches in memory",
            )
            .into());
        }
        let log = self.durable_log_for(now, key, DurableKind::Cache, DurableWrite::Watch)?;
        let unix_ms = unix_micros / 1000;
        let cache = self.cache_of(log)?;
        let applied = cache.applied_offset();
        let complete = cache.log().complete_from();
        let snapshot = |cache: &felix_storage::cache_log::CacheLog| {
            VecDeque::from(cache.live_offsets(|k| filter.matches(k), unix_ms))
        };
        let (snapshot, next, resnapshot) = match start {
            WatchStart::Live => (VecDeque::new(), applied, false),
            WatchStart::Retained => (snapshot(cache), applied, false),
            WatchStart::From(n) if n > applied => {
                return Err(SubscribeError::Cursor {
                    reason: CursorReason::InFuture,
                    requested: n,
                    available: applied,
                })
            }
            // Compaction collapsed history at `n`: the current values stand in for it.
            WatchStart::From(n) if n < complete => (snapshot(cache), applied, true),
            WatchStart::From(n) => (VecDeque::new(), n, false),
        };
        cache.set_observed(true);
        let retained_count = (start == WatchStart::Retained).then_some(snapshot.len() as u64);
        let joins_now = snapshot.is_empty() && next >= applied;
        let id = SubscriberId(self.next_subscriber);
        self.next_subscriber += 1;
        self.watches.map.insert(
            id,
            Watch {
                log,
                filter,
                owner,
                capacity: self.cfg.cache_watch_queue_capacity,
                live: joins_now,
                live_from: applied,
                catch_up: (!joins_now).then(|| CatchUp {
                    snapshot,
                    next,
                    reading: false,
                    frames: VecDeque::new(),
                    failed: None,
                }),
                queue: VecDeque::new(),
                queued_bytes: 0,
                final_frame: None,
                ready: false,
                moved_signal: None,
            },
        );
        if joins_now {
            self.watches.live.entry(log).or_default().push(id);
        } else {
            self.advance_watch(id);
        }
        Ok(WatchStarted {
            id,
            resume_offset: applied,
            resnapshot,
            retained_count,
        })
    }

    /// The watch's client reads `shard_moved` (it offered `FEATURE_SHARD_MOVED`) and knows
    /// the watch as `subscription_id`.
    pub(crate) fn watch_ends_on_move(&mut self, id: SubscriberId, subscription_id: u64) {
        if let Some(w) = self.watches.map.get_mut(&id) {
            w.moved_signal = Some(subscription_id);
        }
    }

    /// The cache's leadership here ended: every watch of `log` gets what it was offered, then
    /// `shard_moved` naming where the cache went and the first offset it was not offered
    /// (re-watching there from it is gapless), or a coded `not_leader` error for a client that
    /// does not read `shard_moved`. Left attached, a watch would see nothing more from this
    /// node, and no signal.
    pub(crate) fn watches_moved(&mut self, log: LogId, to: &super::replicated::MovedTo) {
        let applied = self
            .logs
            .as_mut()
            .and_then(|l| l.slot_mut(log))
            .and_then(|s| s.log.cache_mut())
            .map(|c| c.applied_offset());
        let mut ids: Vec<SubscriberId> = self
            .watches
            .map
            .iter()
            .filter(|(_, w)| w.log == log && w.final_frame.is_none())
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable_by_key(|id| id.0);
        self.watches.live.remove(&log);
        for id in ids {
            let w = self.watches.map.get_mut(&id).expect("listed");
            let resume_from = match w.catch_up.as_mut() {
                Some(cu) if !w.live => {
                    if cu.failed.is_some() {
                        continue;
                    }
                    cu.snapshot.front().copied().unwrap_or(cu.next)
                }
                // Live: every change applied here was offered (queued or filtered out).
                _ => applied.unwrap_or(w.live_from).max(w.live_from),
            };
            let frame = match w.moved_signal {
                Some(subscription_id) => frame_of(&Message::ShardMoved(ShardMoved {
                    subscription_id,
                    resume_from: Some(resume_from),
                    node_id: to.node_id.clone(),
                    addr: to.addr.clone(),
                    generation: to.generation,
                })),
                None => {
                    let owner = to.node_id.as_deref().unwrap_or("another node");
                    frame_of(&Message::Error(ErrorMessage::coded(
                        ErrorCode::NotLeader,
                        format!(
                            "the cache is led by {owner} now; watch again there from offset \
                             {resume_from}"
                        ),
                    )))
                }
            };
            match w.catch_up.as_mut() {
                Some(cu) if !w.live => cu.failed = Some(frame),
                _ => {
                    w.live = false;
                    w.final_frame = Some(frame);
                }
            }
            if !w.ready {
                w.ready = true;
                self.ready.push_back(id);
            }
        }
    }

    /// Forgets a watch and what it had queued.
    pub(super) fn unwatch(&mut self, id: SubscriberId) {
        let Some(w) = self.watches.map.remove(&id) else {
            return;
        };
        self.event_budget.sub(w.owner, w.queued_bytes);
        if let Some(list) = self.watches.live.get_mut(&w.log) {
            list.retain(|x| *x != id);
        }
        let still_watched = self.watches.map.values().any(|o| o.log == w.log);
        if !still_watched {
            self.watches.live.remove(&w.log);
            if let Some(cache) = self
                .logs
                .as_mut()
                .and_then(|l| l.slot_mut(w.log))
                .and_then(|s| s.log.cache_mut())
            {
                cache.set_observed(false);
            }
        }
    }

    /// The watch's next frame: snapshot and replay first, then live changes, then its
    /// final frame (after which it is gone).
    pub(super) fn next_watch_delivery(&mut self, id: SubscriberId) -> Option<Delivery> {
        let w = self.watches.map.get_mut(&id)?;
        if let Some(cu) = w.catch_up.as_mut() {
            if let Some(frame) = cu.frames.pop_front() {
                self.advance_watch(id);
                return Some(Delivery::Frame(frame));
            }
            if let Some(last) = cu.failed.take() {
                self.unwatch(id);
                return Some(Delivery::Final(last));
            }
            if !w.live {
                self.advance_watch(id);
                let cu = self.watches.map.get_mut(&id)?.catch_up.as_mut()?;
                return cu.frames.pop_front().map(Delivery::Frame);
            }
            w.catch_up = None;
        }
        if let Some(frame) = w.queue.pop_front() {
            w.queued_bytes -= frame.len();
            self.event_budget.sub(w.owner, frame.len());
            return Some(Delivery::Frame(frame));
        }
        let last = w.final_frame.take()?;
        self.unwatch(id);
        Some(Delivery::Final(last))
    }

    /// A cache log applied a write: queue it to every live watch it matches.
    pub(super) fn on_watch_change(&mut self, log: LogId, change: Change) {
        let Some(list) = self.watches.live.get_mut(&log) else {
            return;
        };
        let mut frame: Option<Bytes> = None;
        let mut lagged = Vec::new();
        for &id in list.iter() {
            let Some(w) = self.watches.map.get_mut(&id) else {
                continue;
            };
            if change.offset < w.live_from || !w.filter.matches(&change.key) {
                continue;
            }
            let f = frame.get_or_insert_with(|| {
                change_frame(
                    change.offset,
                    &change.key,
                    change.value.clone(),
                    change.expiry_unix_ms,
                )
            });
            if w.queue.len() >= w.capacity || !self.event_budget.fits(w.owner, f.len()) {
                // Ended, not thinned: sparse offsets would hide a drop.
                w.final_frame = Some(lagged_frame(change.offset));
                w.live = false;
                lagged.push(id);
            } else {
                w.queued_bytes += f.len();
                self.event_budget.add(w.owner, f.len());
                w.queue.push_back(f.clone());
            }
            if !w.ready {
                w.ready = true;
                self.ready.push_back(id);
            }
        }
        if !lagged.is_empty() {
            list.retain(|id| !lagged.contains(id));
        }
    }

    /// Whether compaction of `log` must wait for a watch catching up on it. When a pass is
    /// due, a catch-up whose read-ahead is full and that is not reading (its client has
    /// stopped reading the event stream) no longer holds it: the watch is ended with
    /// `cache_watch_lagged`, after the frames it holds, naming the first offset it has not
    /// read (the next snapshot value, else the replay's next record). Re-watching from
    /// there is gapless, or a resnapshot once the pass has collapsed that history. Without
    /// this, one idle watch would keep its log from ever being compacted.
    pub(super) fn watches_hold_compaction(&mut self, log: LogId) -> bool {
        if !self.watches.reading(log) {
            return false;
        }
        let due = self
            .logs
            .as_mut()
            .and_then(|l| l.slot_mut(log))
            .and_then(|s| s.log.cache_mut())
            .is_some_and(|c| c.compaction_due());
        if !due {
            return true;
        }
        // In id order, so the ready queue's order does not depend on the map's.
        let mut ids: Vec<SubscriberId> = self
            .watches
            .map
            .iter()
            .filter(|(_, w)| w.log == log && !w.live)
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable_by_key(|id| id.0);
        for id in ids {
            let w = self.watches.map.get_mut(&id).expect("listed");
            let Some(cu) = w.catch_up.as_mut() else {
                continue;
            };
            let held_bytes: usize = cu.frames.iter().map(Bytes::len).sum();
            let stalled = !cu.reading
                && cu.failed.is_none()
                && (cu.frames.len() >= WATCH_FRAMES_AHEAD || held_bytes >= WATCH_BYTES_AHEAD);
            if !stalled {
                continue;
            }
            let resume_from = cu.snapshot.front().copied().unwrap_or(cu.next);
            tracing::debug!(
                log = log.0,
                resume_from,
                "an idle watch ends so its log compacts"
            );
            cu.failed = Some(lagged_frame(resume_from));
            if !w.ready {
                w.ready = true;
                self.ready.push_back(id);
            }
        }
        self.watches.reading(log)
    }

    /// A cache log failed: its watches end with an error after what they hold.
    pub(super) fn on_watch_log_failed(&mut self, log: LogId, why: &str) {
        self.end_watches(log, error_frame(&format!("the cache's log failed: {why}")));
    }

    /// The cache was deleted: its watches end after what they hold with a `not_found` error.
    pub(super) fn on_watch_cache_deleted(&mut self, log: LogId) {
        let frame = frame_of(&Message::Error(ErrorMessage::coded(
            ErrorCode::NotFound,
            "the cache was deleted",
        )));
        self.end_watches(log, frame);
    }

    fn end_watches(&mut self, log: LogId, frame: Bytes) {
        let ids: Vec<SubscriberId> = self.watches.live.remove(&log).unwrap_or_default();
        for id in ids {
            if let Some(w) = self.watches.map.get_mut(&id) {
                w.live = false;
                w.final_frame = Some(frame.clone());
                if !w.ready {
                    w.ready = true;
                    self.ready.push_back(id);
                }
            }
        }
    }

    /// Issues the catch-up's next read, or joins live delivery once it has read up to the
    /// cache's applied mark.
    pub(super) fn advance_watch(&mut self, id: SubscriberId) {
        let Some(w) = self.watches.map.get_mut(&id) else {
            return;
        };
        let log = w.log;
        let Some(cu) = w.catch_up.as_mut() else {
            return;
        };
        let held_bytes: usize = cu.frames.iter().map(Bytes::len).sum();
        if w.live
            || cu.reading
            || cu.failed.is_some()
            || cu.frames.len() >= WATCH_FRAMES_AHEAD
            || held_bytes >= WATCH_BYTES_AHEAD
        {
            return;
        }
        let Some(logs) = self.logs.as_mut() else {
            return;
        };
        let Some(cache) = logs.slot_mut(log).and_then(|s| s.log.cache_mut()) else {
            cu.failed = Some(error_frame("the cache's log is gone"));
            return;
        };
        let applied = cache.applied_offset();
        let from = match cu.snapshot.front() {
            Some(&offset) => offset,
            None if cu.next >= applied => {
                // Everything below the mark is read; the log dispatches the rest.
                w.live = true;
                w.live_from = applied;
                self.watches.live.entry(log).or_default().push(id);
                if !w.ready {
                    w.ready = true;
                    self.ready.push_back(id);
                }
                return;
            }
            None => cu.next,
        };
        match cache.scan(from, WATCH_READ_RECORDS, WATCH_READ_BYTES) {
            Ok(ticket) => {
                cu.reading = true;
                self.watches.reads.insert((log, ticket), id);
                logs.mark_dirty(log);
            }
            Err(ReadError::Busy) => self.watches.blocked.entry(log).or_default().push(id),
            Err(e) => {
                cu.failed = Some(error_frame(&format!("reading the cache log failed: {e:?}")));
                if !w.ready {
                    w.ready = true;
                    self.ready.push_back(id);
                }
            }
        }
    }

    /// A catch-up read landed (or a read of a log some catch-up waits on).
    pub(super) fn on_watch_read(
        &mut self,
        log: LogId,
        ticket: ReadTicket,
        result: Result<ReadBatch, ReadError>,
    ) {
        let blocked = self.watches.blocked.remove(&log).unwrap_or_default();
        if let Some(id) = self.watches.reads.remove(&(log, ticket)) {
            self.absorb_watch_read(id, result);
            self.advance_watch(id);
        }
        for id in blocked {
            self.advance_watch(id);
        }
    }

    fn absorb_watch_read(&mut self, id: SubscriberId, result: Result<ReadBatch, ReadError>) {
        let Some(w) = self.watches.map.get_mut(&id) else {
            return;
        };
        let Some(cu) = w.catch_up.as_mut() else {
            return;
        };
        cu.reading = false;
        if !w.ready {
            w.ready = true;
            self.ready.push_back(id);
        }
        let batch = match result {
            Ok(batch) => batch,
            Err(e) => {
                cu.failed = Some(error_frame(&format!("reading the cache log failed: {e:?}")));
                return;
            }
        };
        let records = batch
            .batches
            .into_iter()
            .flat_map(|b| (b.first_offset..).zip(b.payloads));
        if !cu.snapshot.is_empty() {
            for (at, payload) in records {
                while cu.snapshot.front().is_some_and(|&o| o < at) {
                    // Not in the log any more: overwritten after the snapshot was taken,
                    // so the replay from the mark brings its newer value.
                    cu.snapshot.pop_front();
                }
                if cu.snapshot.front() != Some(&at) {
                    continue;
                }
                cu.snapshot.pop_front();
                if let Ok(CacheRecord::Put {
                    key,
                    value,
                    expiry_unix_ms,
                }) = CacheRecord::decode(&payload)
                {
                    cu.frames
                        .push_back(change_frame(at, &key, Some(value), expiry_unix_ms));
                }
            }
            let end = batch.next_offset;
            let before = cu.snapshot.len();
            while cu.snapshot.front().is_some_and(|&o| o < end) {
                cu.snapshot.pop_front();
            }
            if cu.snapshot.len() < before {
                tracing::debug!(
                    missing = before - cu.snapshot.len(),
                    "snapshot offsets not found"
                );
            }
            return;
        }
        let before = cu.next;
        for (at, payload) in records {
            if at < cu.next {
                continue;
            }
            cu.next = at + 1;
            match CacheRecord::decode(&payload) {
                Ok(CacheRecord::Put {
                    key,
                    value,
                    expiry_unix_ms,
                }) if w.filter.matches(&key) => {
                    cu.frames
                        .push_back(change_frame(at, &key, Some(value), expiry_unix_ms));
                }
                Ok(CacheRecord::Delete { key }) if w.filter.matches(&key) => {
                    cu.frames.push_back(change_frame(at, &key, None, None));
                }
                Ok(_) => {}
                Err(why) => {
                    cu.failed = Some(error_frame(&format!("cache record {at} is {why}")));
                    return;
                }
            }
        }
        cu.next = cu.next.max(batch.next_offset);
        if cu.next == before {
            // Nothing readable below the mark: should not happen (the mark is durable);
            // join rather than wait for ever.
            tracing::warn!(next = cu.next, "watch replay made no progress");
            cu.next = u64::MAX;
        }
    }
}
