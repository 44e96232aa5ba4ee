//! Guarded appends: idempotent producers (`publish_idempotent`, the binary 0x0100 frame) and
//! `publish_if`. Both decide at the point the broker assigns offsets, inside one engine
//! turn, so the check and the write cannot be split by another writer.
//!
//! On a durable shard every idempotent batch is stored with its producer mark (id,
//! sequence, payload digest; `docs/storage-format.md`), and recovery hands the marks back
//! (`ShardLog::take_scanned_ext`), so a restarted broker answers a re-send as the one that
//! took it would have. On an in-memory shard the table lives in memory only.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_proto::message::PublishRefusalReason;
use felix_proto::routing::shard_for_key;
use felix_proto::ErrorCode;

use super::durable::Owner;
use super::shard::ShardState;
use super::{Broker, BrokerError, LogState, Published, StreamKey};
use felix_storage::log::ShardLog;
use felix_storage::ops::LogId;
use felix_storage::record::{EntryExt, ProducerMark};

/// Batches remembered per producer per shard: a re-send older than this is `sequence_expired`.
pub(crate) const REMEMBERED_BATCHES: usize = 64;
/// Producers remembered per shard. At the cap a new producer may take the place of the
/// least recently used one only if that one has been idle for
/// [`PRODUCER_IDLE_BEFORE_EVICTION`]; otherwise the new one is refused `limit_exceeded`, so
/// a publisher minting producers cannot push out the dedup state of one that is writing.
pub(crate) const MAX_PRODUCERS_PER_SHARD: usize = 4096;
/// How long a producer must have sent nothing to the shard before a new one may take its
/// place in a full table (it then answers `unknown_producer`). Producers recovered from the
/// log count from the shard's first guarded request after the restart.
pub(crate) const PRODUCER_IDLE_BEFORE_EVICTION: Duration = Duration::from_secs(300);

/// What a guarded publish must satisfy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Guard {
    /// `publish_idempotent`: the producer's next sequence on the shard.
    Sequence { producer: u64, sequence: u64 },
    /// `publish_if`: the batch must start at exactly this offset.
    Offset(u64),
}

/// A guarded publish's outcome.
#[derive(Debug)]
pub(crate) enum Guarded {
    /// Appended now.
    Written(Published),
    /// Already in the log: answered with the first copy's place, nothing appended.
    Duplicate(Published),
    /// Nothing written, for this reason.
    Refused(PublishRefusalReason),
}

/// One batch a producer appended.
#[derive(Debug, Clone, Copy)]
struct Remembered {
    sequence: u64,
    first: Option<u64>,
    count: u64,
    digest: u64,
}

#[derive(Debug, Default)]
struct Producer {
    next: u64,
    recent: VecDeque<Remembered>,
    last_used: u64,
    /// When it last wrote here; `None` for one only recovery has seen.
    touched: Option<Instant>,
}

/// What the table says about a batch.
#[derive(Debug, PartialEq, Eq)]
enum Check {
    Append,
    Duplicate { first: Option<u64>, count: u64 },
    Reused { first: Option<u64>, count: u64 },
    Refuse(PublishRefusalReason),
}

/// Every producer's place on one shard.
#[derive(Debug, Default)]
pub(crate) struct ProducerTable {
    by_id: HashMap<u64, Producer>,
    /// Producer ids by `last_used`, oldest first: eviction takes the first instead of
    /// scanning every producer on each write once the table is full.
    by_use: BTreeMap<u64, u64>,
    clock: u64,
    /// The first guarded request's instant: where recovered producers' idleness counts from.
    live_since: Option<Instant>,
}

impl ProducerTable {
    fn check(&self, producer: u64, sequence: u64, digest: u64) -> Check {
        let Some(p) = self.by_id.get(&producer) else {
            return match sequence {
                0 => Check::Append,
                _ => Check::Refuse(PublishRefusalReason::UnknownProducer),
            };
        };
        if sequence == p.next {
            return Check::Append;
        }
        if sequence > p.next {
            return Check::Refuse(PublishRefusalReason::SequenceGap { expected: p.next });
        }
        match p.recent.iter().find(|r| r.sequence == sequence) {
            Some(r) if r.digest == digest => Check::Duplicate {
                first: r.first,
                count: r.count,
            },
            Some(r) => Check::Reused {
                first: r.first,
                count: r.count,
            },
            None => Check::Refuse(PublishRefusalReason::SequenceExpired),
        }
    }

    /// The producer appended `sequence` at `first` (live, or as recovery read it back).
    pub(super) fn record(&mut self, mark: ProducerMark, first: Option<u64>, count: u64) {
        self.clock += 1;
        let clock = self.clock;
        let p = self.by_id.entry(mark.producer).or_default();
        p.next = mark.sequence + 1;
        self.by_use.remove(&p.last_used);
        p.last_used = clock;
        self.by_use.insert(clock, mark.producer);
        p.recent.push_back(Remembered {
            sequence: mark.sequence,
            first,
            count,
            digest: mark.digest,
        });
        if p.recent.len() > REMEMBERED_BATCHES {
            p.recent.pop_front();
        }
        if self.by_id.len() > MAX_PRODUCERS_PER_SHARD {
            if let Some((_, id)) = self.by_use.pop_first() {
                self.by_id.remove(&id);
            }
        }
    }

    /// The shard's log was cut at `offset` (a follower rejoining a new leader): batches at or
    /// above it are no longer there, so a re-send of one must be appended again, not answered
    /// as a duplicate of a record that is gone.
    pub(super) fn forget_from(&mut self, offset: u64) {
        for p in self.by_id.values_mut() {
            let mut lowest_gone = None;
            p.recent.retain(|r| {
                let gone = r.first.is_some_and(|f| f >= offset);
                if gone {
                    lowest_gone = Some(lowest_gone.map_or(r.sequence, |s: u64| s.min(r.sequence)));
                }
                !gone
            });
            if let Some(s) = lowest_gone {
                p.next = p.next.min(s);
            }
        }
    }

    /// Whether `producer` may write now: one the table knows always may; a new one may
    /// while the table is under its cap, or at it once the least recently used producer
    /// has been idle for [`PRODUCER_IDLE_BEFORE_EVICTION`] (its place is taken on record).
    fn admits(&mut self, producer: u64, now: Instant) -> bool {
        let live_since = *self.live_since.get_or_insert(now);
        if self.by_id.contains_key(&producer) || self.by_id.len() < MAX_PRODUCERS_PER_SHARD {
            return true;
        }
        let Some(lru) = self.by_use.first_key_value().map(|(_, id)| *id) else {
            return true;
        };
        let last = self.by_id[&lru].touched.unwrap_or(live_since);
        now.saturating_duration_since(last) >= PRODUCER_IDLE_BEFORE_EVICTION
    }

    /// Whether the table holds `producer`.
    fn knows(&self, producer: u64) -> bool {
        self.by_id.contains_key(&producer)
    }

    /// Producers remembered.
    fn count(&self) -> usize {
        self.by_id.len()
    }

    /// The least recently used producer and when it last wrote (recovered ones: from the
    /// first guarded request, or `now` before any).
    fn oldest(&self, now: Instant) -> Option<(Instant, u64)> {
        let (_, &id) = self.by_use.first_key_value()?;
        let last = self.by_id[&id]
            .touched
            .unwrap_or(self.live_since.unwrap_or(now));
        Some((last, id))
    }

    /// Forgets `producer` (its tenant needs the place).
    fn forget(&mut self, producer: u64) {
        if let Some(p) = self.by_id.remove(&producer) {
            self.by_use.remove(&p.last_used);
        }
    }

    /// The producer wrote at `now` (after [`ProducerTable::record`]).
    fn touch(&mut self, producer: u64, now: Instant) {
        self.live_since.get_or_insert(now);
        if let Some(p) = self.by_id.get_mut(&producer) {
            p.touched = Some(now);
        }
    }

    #[cfg(test)]
    pub(crate) fn next_sequence(&self, producer: u64) -> Option<u64> {
        self.by_id.get(&producer).map(|p| p.next)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }
}

/// The digest kept with each batch: FNV-1a 64 over every payload's length and bytes, so a
/// re-send is told from a different batch under a reused sequence.
pub(crate) fn payload_digest(payloads: &[Bytes]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for p in payloads {
        feed(&(p.len() as u32).to_le_bytes());
        feed(p);
    }
    h
}

/// splitmix64: spreads a counter over 64 bits.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Broker {
    /// A fresh producer id: 64 bits mixed from the wall clock and a counter, so ids from
    /// one broker never repeat and ids across a restart do not collide (the clock moved).
    pub(crate) fn new_producer_id(&mut self, unix_micros: u64) -> u64 {
        self.producer_ids += 1;
        mix(unix_micros ^ mix(self.producer_ids))
    }

    /// Whether `tenant` may remember one more producer: under its cap, or at it once its
    /// least recently used producer (over all its shards) has been idle for
    /// [`PRODUCER_IDLE_BEFORE_EVICTION`], which is then forgotten to make the place. Only the
    /// tenant's own shards are looked at, so no tenant can push out another's producers.
    /// Runs only for a producer's first batch on a shard, so the walk over the tenant's
    /// streams is not on the path of each write.
    fn tenant_admits(&mut self, now: Instant, tenant: &str) -> bool {
        let mut count = 0;
        let mut oldest: Option<(Instant, usize, u32, u64)> = None;
        for (key, &index) in &self.stream_index {
            if key.tenant != tenant {
                continue;
            }
            for (shard, sh) in self.streams[index].shards.iter().enumerate() {
                let table = &sh.state.producers;
                count += table.count();
                if let Some((last, id)) = table.oldest(now) {
                    // Oldest first; ties by stream and shard, so the choice is reproducible.
                    let candidate = (last, index, shard as u32, id);
                    if oldest.is_none_or(|o| candidate < o) {
                        oldest = Some(candidate);
                    }
                }
            }
        }
        if count < self.cfg.max_producers_per_tenant {
            return true;
        }
        let Some((last, index, shard, id)) = oldest else {
            return true;
        };
        if now.saturating_duration_since(last) < PRODUCER_IDLE_BEFORE_EVICTION {
            return false;
        }
        self.streams[index].shards[shard as usize]
            .state
            .producers
            .forget(id);
        true
    }

    /// The shard a request for `key` goes to: `explicit` wins, else the routing key.
    pub(super) fn route(
        &self,
        key: &StreamKey,
        routing_key: Option<&[u8]>,
        explicit: Option<u32>,
    ) -> Result<u32, BrokerError> {
        let shards = self.shard_count(key).unwrap_or(self.cfg.default_shards);
        match explicit {
            Some(s) if s >= shards => Err(BrokerError::invalid(format!(
                "shard {s} is out of range: the stream has {shards} shard(s)"
            ))),
            Some(s) => Ok(s),
            None => Ok(shard_for_key(routing_key, shards, self.cfg.routing_mapping)),
        }
    }

    /// Makes sure the stream exists and, on a durable shard, that its log is open and what
    /// recovery read back from it is in the shard's tables. Gives the stream's index and
    /// the shard's raw tail (the next offset), `None` for an in-memory shard.
    pub(super) fn prepare_shard(
        &mut self,
        now: Instant,
        key: &StreamKey,
        shard: u32,
    ) -> Result<(usize, Option<u64>), BrokerError> {
        let stream = self.stream_or_create(now, key)?;
        let sh = &mut self.streams[stream].shards[shard as usize];
        let Some(store) = &sh.store else {
            return Ok((stream, None));
        };
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
        let shard_log = slot.log.stream_mut().expect("a stream's log");
        absorb_scanned(shard_log, &mut sh.state);
        Ok((stream, Some(shard_log.next_offset())))
    }

    /// Folds what recovery has read back from a stream log so far (producer marks, commit
    /// state) into its shard's tables, or, for a log no stream has claimed yet, into
    /// tables kept for it until one does. Called as the scan goes, so the log holds at
    /// most one read's worth of them, and what is kept is the tables' size, not the log's.
    pub(super) fn absorb_scanned(&mut self, log: LogId) {
        let Some(logs) = self.logs.as_mut() else {
            return;
        };
        let Some(slot) = logs.slot_mut(log) else {
            return;
        };
        let owner = slot.owner;
        let Some(shard_log) = slot.log.stream_mut() else {
            return;
        };
        let state = match owner {
            Owner::Stream { stream, shard } => {
                let Some(sh) = self
                    .streams
                    .get_mut(stream)
                    .and_then(|s| s.shards.get_mut(shard as usize))
                else {
                    return;
                };
                &mut sh.state
            }
            Owner::Unclaimed => self.recovered.entry(log).or_default(),
            _ => return,
        };
        absorb_scanned(shard_log, state);
    }

    /// Appends `payloads` only if `guard` holds, answering a re-sent idempotent batch with
    /// the first copy's place. `sequence_reused` is whether the client may be told a
    /// sequence was reused (it offered FEATURE_SEQUENCE_REUSED); otherwise a reused one is
    /// answered as a duplicate and not written.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn publish_guarded(
        &mut self,
        now: Instant,
        unix_micros: u64,
        key: &StreamKey,
        (routing_key, explicit): (Option<&[u8]>, Option<u32>),
        payloads: Vec<Bytes>,
        guard: Guard,
        sequence_reused: bool,
    ) -> Result<Guarded, BrokerError> {
        if payloads.is_empty() {
            return Err(BrokerError::invalid("an empty batch"));
        }
        let shard = self.route(key, routing_key, explicit)?;
        let (stream, tail) = self.prepare_shard(now, key, shard)?;
        let log = self.streams[stream].shards[shard as usize]
            .store
            .as_ref()
            .map(|s| s.log);
        let mut mark = None;
        match guard {
            Guard::Offset(expected) => {
                let Some(tail) = tail else {
                    return Err(BrokerError::invalid(
                        "publish_if needs a durable stream: an in-memory one has no offsets",
                    ));
                };
                if expected != tail {
                    return Ok(Guarded::Refused(PublishRefusalReason::OffsetMismatch {
                        tail,
                    }));
                }
            }
            Guard::Sequence { producer, sequence } => {
                let digest = payload_digest(&payloads);
                let known = self.streams[stream].shards[shard as usize]
                    .state
                    .producers
                    .knows(producer);
                if !known && sequence == 0 && !self.tenant_admits(now, &key.tenant) {
                    return Err(BrokerError::new(
                        ErrorCode::LimitExceeded,
                        format!(
                            "tenant {} has {} producers, none idle for {} s: a new producer is \
                             refused",
                            key.tenant,
                            self.cfg.max_producers_per_tenant,
                            PRODUCER_IDLE_BEFORE_EVICTION.as_secs()
                        ),
                    ));
                }
                let table = &mut self.streams[stream].shards[shard as usize].state.producers;
                let earlier = match table.check(producer, sequence, digest) {
                    Check::Append if !table.admits(producer, now) => {
                        return Err(BrokerError::new(
                            ErrorCode::LimitExceeded,
                            format!(
                                "the shard remembers {MAX_PRODUCERS_PER_SHARD} producers, none \
                                 idle for {} s: a new producer is refused",
                                PRODUCER_IDLE_BEFORE_EVICTION.as_secs()
                            ),
                        ))
                    }
                    Check::Append => None,
                    Check::Duplicate { first, count } => Some((first, count)),
                    Check::Reused { .. } if sequence_reused => {
                        return Ok(Guarded::Refused(PublishRefusalReason::SequenceReused))
                    }
                    Check::Reused { first, count } => Some((first, count)),
                    Check::Refuse(reason) => return Ok(Guarded::Refused(reason)),
                };
                if let Some((first, count)) = earlier {
                    return Ok(Guarded::Duplicate(Published {
                        shard,
                        first_offset: first,
                        durable_at: log.zip(first).map(|(log, f)| (log, f + count)),
                    }));
                }
                mark = Some(ProducerMark {
                    producer,
                    sequence,
                    digest,
                });
            }
        }
        let count = payloads.len() as u64;
        let ext = EntryExt {
            producer: mark,
            state: None,
        };
        let published = self.publish_ext(
            now,
            unix_micros,
            key,
            (None, Some(shard)),
            payloads,
            None,
            &ext,
        )?;
        let state = &mut self.streams[stream].shards[shard as usize].state;
        state.apply(published.first_offset, count, mark, None);
        if let Some(mark) = mark {
            state.producers.touch(mark.producer, now);
        }
        Ok(Guarded::Written(published))
    }
}

/// Recovery's entries, folded into a shard's state (or, for a log no stream has claimed
/// yet, into the state kept for it until one does).
fn absorb_scanned(shard_log: &mut ShardLog, state: &mut ShardState) {
    let mut state_changed = false;
    while let Some(ext) = shard_log.take_scanned_ext() {
        state_changed |= state.apply(
            Some(ext.base),
            u64::from(ext.count),
            ext.producer,
            ext.state.as_deref(),
        );
    }
    // Retention keeps what the rebuilt state came from, for the next restart.
    if state_changed {
        shard_log.set_retention_floor(state.commits.oldest_version());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(producer: u64, sequence: u64, digest: u64) -> ProducerMark {
        ProducerMark {
            producer,
            sequence,
            digest,
        }
    }

    #[test]
    fn the_table_appends_in_order_and_answers_resends_gaps_and_strangers() {
        let mut t = ProducerTable::default();
        assert_eq!(t.check(1, 0, 9), Check::Append);
        assert_eq!(
            t.check(1, 3, 9),
            Check::Refuse(PublishRefusalReason::UnknownProducer)
        );
        t.record(mark(1, 0, 9), Some(10), 2);
        assert_eq!(
            t.check(1, 0, 9),
            Check::Duplicate {
                first: Some(10),
                count: 2
            }
        );
        assert_eq!(
            t.check(1, 0, 8),
            Check::Reused {
                first: Some(10),
                count: 2
            }
        );
        assert_eq!(t.check(1, 1, 5), Check::Append);
        assert_eq!(
            t.check(1, 2, 5),
            Check::Refuse(PublishRefusalReason::SequenceGap { expected: 1 })
        );
    }

    #[test]
    fn only_the_last_batches_are_remembered_and_older_ones_expire() {
        let mut t = ProducerTable::default();
        for seq in 0..(REMEMBERED_BATCHES as u64 + 10) {
            t.record(mark(7, seq, seq), Some(seq), 1);
        }
        assert_eq!(
            t.check(7, 0, 0),
            Check::Refuse(PublishRefusalReason::SequenceExpired)
        );
        let last = REMEMBERED_BATCHES as u64 + 9;
        assert!(matches!(t.check(7, last, last), Check::Duplicate { .. }));
        assert!(matches!(t.check(7, 10, 10), Check::Duplicate { .. }));
        assert_eq!(
            t.check(7, 9, 9),
            Check::Refuse(PublishRefusalReason::SequenceExpired)
        );
    }

    #[test]
    fn the_least_recently_used_producer_is_forgotten_past_the_cap() {
        let mut t = ProducerTable::default();
        for p in 0..=(MAX_PRODUCERS_PER_SHARD as u64) {
            t.record(mark(p, 0, 0), Some(p), 1);
        }
        assert_eq!(t.len(), MAX_PRODUCERS_PER_SHARD);
        assert_eq!(
            t.check(0, 1, 0),
            Check::Refuse(PublishRefusalReason::UnknownProducer)
        );
        assert_eq!(t.check(1, 1, 0), Check::Append);
    }

    #[test]
    fn a_producer_that_wrote_again_outlives_one_that_did_not() {
        let mut t = ProducerTable::default();
        let cap = MAX_PRODUCERS_PER_SHARD as u64;
        for p in 0..cap {
            t.record(mark(p, 0, 0), Some(p), 1);
        }
        // Producer 0 was first in but wrote last; producer 1 is now the least recent.
        t.record(mark(0, 1, 0), Some(cap), 1);
        t.record(mark(cap, 0, 0), Some(cap + 1), 1);
        assert_eq!(t.len(), MAX_PRODUCERS_PER_SHARD);
        assert_eq!(t.check(0, 2, 0), Check::Append);
        assert_eq!(
            t.check(1, 1, 0),
            Check::Refuse(PublishRefusalReason::UnknownProducer)
        );
        assert_eq!(t.by_use.len(), t.by_id.len(), "one use entry per producer");
    }

    #[test]
    fn a_full_table_takes_a_new_producer_only_in_place_of_an_idle_one() {
        let t0 = Instant::now();
        let mut t = ProducerTable::default();
        let cap = MAX_PRODUCERS_PER_SHARD as u64;
        for p in 0..cap {
            assert!(t.admits(p, t0));
            t.record(mark(p, 0, 0), Some(p), 1);
            t.touch(p, t0);
        }
        // Producer 0 keeps writing; the others went quiet at t0.
        let busy = t0 + PRODUCER_IDLE_BEFORE_EVICTION - Duration::from_nanos(1);
        t.record(mark(0, 1, 0), Some(cap), 1);
        t.touch(0, busy);
        // One instant short of the idle time, a newcomer would push out producer 1.
        assert!(!t.admits(cap, busy), "no producer is idle long enough yet");
        assert!(t.admits(0, busy), "a known producer always writes");
        assert_eq!(t.len(), MAX_PRODUCERS_PER_SHARD);
        // At the idle time the least recently used (producer 1) gives up its place.
        let idle = t0 + PRODUCER_IDLE_BEFORE_EVICTION;
        assert!(t.admits(cap, idle));
        t.record(mark(cap, 0, 0), Some(cap + 1), 1);
        t.touch(cap, idle);
        assert_eq!(t.len(), MAX_PRODUCERS_PER_SHARD);
        assert_eq!(
            t.check(1, 1, 0),
            Check::Refuse(PublishRefusalReason::UnknownProducer)
        );
        assert_eq!(t.check(0, 2, 0), Check::Append, "the busy one is kept");
        // A flood of newcomers can only take idle places: the busy producer survives it.
        let mut taken = 0;
        for p in cap + 1..3 * cap {
            if t.admits(p, idle) {
                t.record(mark(p, 0, 0), Some(p), 1);
                t.touch(p, idle);
                taken += 1;
            }
        }
        assert_eq!(taken, cap - 2, "every idle place, and no more");
        assert_eq!(t.check(0, 2, 0), Check::Append);
    }

    #[test]
    fn recovered_producers_count_as_busy_from_the_first_request() {
        let t0 = Instant::now();
        let mut t = ProducerTable::default();
        for p in 0..MAX_PRODUCERS_PER_SHARD as u64 {
            t.record(mark(p, 0, 0), Some(p), 1);
        }
        let cap = MAX_PRODUCERS_PER_SHARD as u64;
        assert!(!t.admits(cap, t0), "recovered producers may still re-send");
        assert!(t.admits(cap, t0 + PRODUCER_IDLE_BEFORE_EVICTION));
    }

    #[test]
    fn digests_tell_batches_apart() {
        let a = payload_digest(&[Bytes::from_static(b"ab"), Bytes::from_static(b"c")]);
        let b = payload_digest(&[Bytes::from_static(b"a"), Bytes::from_static(b"bc")]);
        assert_ne!(a, b, "the lengths are part of the digest");
        assert_eq!(a, payload_digest(&[Bytes::from("ab"), Bytes::from("c")]));
    }
}
