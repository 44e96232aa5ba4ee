//! Consumer groups over durable shards: polls (waiting ones included), settles, dead
//! letters and administration, on top of the rules in [`state`] and the shard's group log
//! ([`GroupLog`](felix_storage::group_log::GroupLog)).
//!
//! A poll claims its records at once, so no other poll can take them, then reads their
//! payloads from the shard's log as file operations; its answer leaves as
//! [`Notice::GroupRecords`] naming the poll's waiter id, which the engine routes to the
//! session holding it. A poll that finds nothing waits (up to its `wait_ms`) and is looked
//! at again when the shard releases records, when the group is settled, and when the
//! earliest claim lapses or its own wait ends (the broker's timer).

pub(crate) mod state;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;

use felix_storage::group_log::{DurableGroup, GroupOp, GroupRecord as LogRecord};
use felix_storage::layout;
use felix_storage::log::{ReadBatch, ReadError, ReadTicket};
use felix_storage::ops::LogId;

use super::durable::{LogState, Notice, Owner};
use super::{append_error, Broker, BrokerError, StreamKey};
use state::{Bounds, GroupError, GroupState, Handout, Member, ShardView, Take, Write};

/// Records one poll hands out at most.
pub(crate) const MAX_POLL_RECORDS: usize = 1_000;
/// Payload bytes a poll answers with about at most; the rest go back to the group.
pub(crate) const MAX_POLL_BYTES: usize = 4 << 20;
/// The group-log write an answer waits for: the log, and the offset it must be durable below.
pub(crate) type DurableAt = Option<(LogId, u64)>;

/// Groups one shard holds in memory; a request naming one more is refused.
pub(crate) const MAX_GROUPS_PER_SHARD: usize = 10_000;
/// Longest consumer name.
pub(crate) const MAX_CONSUMER_BYTES: usize = 128;
/// Top-level directory of group logs under the storage root.
pub(crate) use felix_storage::layout::GROUPS_DIR;

/// Consumer-group limits (the `FELIX_GROUP_*` settings). Every one has a default.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupConfig {
    /// Deliveries of one record before it is dead-lettered instead.
    pub max_attempts: u32,
    /// How long a claim stands when the poll does not say (`FELIX_GROUP_VISIBILITY_TIMEOUT_MS`).
    pub visibility_timeout: Duration,
    /// Ceiling on a poll's `visibility_ms`, an extension and a nack's delay
    /// (`FELIX_GROUP_MAX_VISIBILITY_MS`).
    pub max_visibility: Duration,
    /// Ceiling on a poll's `wait_ms` (`FELIX_GROUP_MAX_WAIT_MS`).
    pub max_wait: Duration,
    /// Records a group has handed out and not finished, per shard (`FELIX_GROUP_MAX_IN_FLIGHT`).
    pub max_in_flight: usize,
    /// Polls waiting for work at once across the broker (`FELIX_GROUP_MAX_WAITING_POLLS`),
    /// which bounds the open polls clients can make the broker hold. A poll past it is not
    /// refused: it takes what is there and is answered at once, as one without `wait_ms`.
    pub max_waiting_polls: usize,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            max_attempts: 5,
            visibility_timeout: Duration::from_secs(30),
            max_visibility: Duration::from_secs(12 * 3600),
            max_wait: Duration::from_secs(30),
            max_in_flight: 10_000,
            max_waiting_polls: crate::config::DEFAULT_GROUP_MAX_WAITING_POLLS,
        }
    }
}

/// One record of a poll's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PolledRecord {
    pub(crate) offset: u64,
    pub(crate) payload: Bytes,
    pub(crate) attempts: u32,
    pub(crate) skipped_before: u64,
    pub(crate) publisher: Option<Bytes>,
    pub(crate) time_us: u64,
}

/// Which group a request names.
pub(crate) struct GroupAddr<'a> {
    pub(crate) key: &'a StreamKey,
    pub(crate) shard: u64,
    pub(crate) group: &'a str,
}

/// What a poll asks for, already validated.
pub(crate) struct PollRequest {
    pub(crate) max_records: u64,
    pub(crate) wait: Duration,
    pub(crate) visibility: Option<Duration>,
    pub(crate) member: Option<Member>,
    pub(crate) reclaim: bool,
    /// The connection polling (reclaims are made once per connection).
    pub(crate) conn: u64,
}

/// A settle request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SettleOp {
    Ack,
    /// `attempts` is the client's number as sent: a delivery count is a `u32`, so one
    /// past that range names no claim and is answered `stale_claim`, never truncated.
    Nack {
        delay: Option<Duration>,
        attempts: Option<u64>,
    },
    Extend {
        attempts: u64,
        by: Duration,
    },
    DeadLetter,
    Discard,
    Redrive,
}

/// What a settle did: the write to wait for before answering, and for an extension the
/// time granted.
pub(crate) struct Settled {
    pub(crate) durable_at: Option<(LogId, u64)>,
    pub(crate) granted: Duration,
}

/// `group_describe`'s numbers.
pub(crate) struct Described {
    pub(crate) committed: Option<u64>,
    pub(crate) tail: u64,
    pub(crate) in_flight: u64,
    pub(crate) owed: u64,
    pub(crate) dead_letters: u64,
}

/// Where a seek goes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SeekTo {
    Earliest,
    Latest,
    Offset(u64),
}

/// The groups of one durable shard.
struct ShardGroups {
    log: LogId,
    /// The log's replay has been taken into `groups`.
    loaded: bool,
    recovered: HashMap<String, DurableGroup>,
    groups: HashMap<String, GroupState>,
    /// Polls waiting for work here.
    waiting: Vec<u64>,
}

/// A poll in progress: waiting for work, or reading what it claimed.
struct Poll {
    stream: usize,
    shard: u32,
    group: String,
    deadline: Instant,
    max: usize,
    visibility: Duration,
    conn: u64,
    member: Option<Member>,
    reclaim: bool,
    serving: Option<Serving>,
}

/// Claimed records whose payloads are being read, lowest offset first.
struct Serving {
    want: Vec<Handout>,
    /// Index of the first record not read yet.
    next: usize,
    got: Vec<PolledRecord>,
    bytes: usize,
    reading: bool,
}

impl Serving {
    /// Passes over the claimed offsets below `offset`: they are not in the log.
    fn skip_below(&mut self, offset: u64) {
        while self.want.get(self.next).is_some_and(|h| h.offset < offset) {
            self.next += 1;
        }
    }
}

/// Every group on this broker, and the polls in progress.
#[derive(Default)]
pub(crate) struct Groups {
    cfg: GroupConfig,
    /// Ordered: a timeout serves the waiting polls shard by shard in this order.
    shards: BTreeMap<(usize, u32), ShardGroups>,
    polls: HashMap<u64, Poll>,
    next_waiter: u64,
    reads: HashMap<(LogId, ReadTicket), u64>,
    /// Polls whose read was refused `Busy`, per shard log.
    blocked: HashMap<LogId, Vec<u64>>,
    /// Shards with waiting polls to look at again this turn.
    woken: Vec<(usize, u32)>,
    waiting_count: usize,
    /// Records retention removed before a group reached them.
    pub(crate) skipped: u64,
}

impl Groups {
    pub(crate) fn new(cfg: GroupConfig) -> Groups {
        Groups {
            cfg,
            ..Groups::default()
        }
    }
}

fn group_error(e: GroupError) -> BrokerError {
    match e {
        GroupError::Invalid(m) => BrokerError::invalid(m),
        GroupError::Stale(m) => BrokerError::new(felix_proto::ErrorCode::StaleClaim, m),
    }
}

/// Refuses a request while `log` is opening (it runs again once open) or has failed.
fn log_ready(state: &LogState, log: LogId) -> Result<(), BrokerError> {
    match state {
        LogState::Opening => Err(BrokerError::opening(log)),
        LogState::Failed(e) => Err(BrokerError::storage(e.clone())),
        LogState::Open => Ok(()),
    }
}

/// The directory of a shard's group log.
pub(crate) fn group_log_dir(key: &StreamKey, shard: u32) -> String {
    format!(
        "{GROUPS_DIR}/{}/{}/{}/{shard}",
        layout::escape(&key.tenant),
        layout::escape(&key.namespace),
        layout::escape(&key.stream)
    )
}

impl Broker {
    fn group_bounds(&self) -> Bounds {
        Bounds {
            max_in_flight: self.groups.cfg.max_in_flight.max(1),
            max_attempts: self.groups.cfg.max_attempts.max(1),
        }
    }

    /// The shard's oldest retained and readable tail offsets.
    fn group_view(&self, stream: usize, shard: u32) -> ShardView {
        let sh = &self.streams[stream].shards[shard as usize];
        let store = sh.store.as_ref().expect("groups live on durable shards");
        let oldest = self
            .logs
            .as_ref()
            .and_then(|l| l.slot(store.log))
            .map_or(0, |s| s.log.shard().start_offset());
        ShardView {
            oldest,
            tail: store.released,
        }
    }

    /// The shard a group request names, with its logs open and its groups loaded.
    fn group_shard(
        &mut self,
        now: Instant,
        key: &StreamKey,
        shard: u64,
    ) -> Result<(usize, u32), BrokerError> {
        if self.logs.is_none() {
            return Err(BrokerError::invalid(
                "consumer groups need durable storage, and this broker keeps streams in memory",
            ));
        }
        let shards = self.shard_count(key).unwrap_or(self.cfg.default_shards);
        if shard >= u64::from(shards) {
            return Err(BrokerError::invalid(format!(
                "shard {shard} is out of range: the stream has {shards} shard(s)"
            )));
        }
        let shard = shard as u32;
        let stream = self.stream_or_create(now, key)?;
        let stream_log = self.streams[stream].shards[shard as usize]
            .store
            .as_ref()
            .expect("durable")
            .log;
        let logs = self.logs.as_mut().expect("checked");
        log_ready(&logs.slot(stream_log).expect("live").state, stream_log)?;
        let sg = self.claim_group_log(now, key, (stream, shard));
        if self.reload_logs.contains(&sg) {
            self.retry_reloads(now);
            if self.reload_logs.contains(&sg) {
                // Still busy: tried again after every turn's log work (`retry_reloads`).
                return Err(BrokerError::opening(sg));
            }
        }
        let logs = self.logs.as_mut().expect("checked");
        let slot = logs.slot_mut(sg).expect("live");
        log_ready(&slot.state, sg)?;
        let entry = self.groups.shards.get_mut(&(stream, shard)).expect("added");
        if !entry.loaded {
            entry.loaded = true;
            if let Some(g) = slot.log.group_mut() {
                entry.recovered = g.take_recovered();
            }
        }
        Ok((stream, shard))
    }

    /// The group log of shard `shard` of `key`, claimed (it opens in the background) if
    /// this node never used it: replication keeps a copy of it beside the shard's log.
    pub(crate) fn group_log_of(
        &mut self,
        now: Instant,
        key: &StreamKey,
        shard: u32,
    ) -> Option<LogId> {
        self.logs.as_ref()?;
        let stream = self.stream_or_create(now, key).ok()?;
        if shard as usize >= self.streams[stream].shards.len() {
            return None;
        }
        Some(self.claim_group_log(now, key, (stream, shard)))
    }

    /// The shard's group log, claimed (it opens in the background) on first use.
    fn claim_group_log(&mut self, now: Instant, key: &StreamKey, at: (usize, u32)) -> LogId {
        if let Some(sg) = self.groups.shards.get(&at) {
            return sg.log;
        }
        let (stream, shard) = at;
        let logs = self.logs.as_mut().expect("groups live on durable brokers");
        let log = logs.claim(
            group_log_dir(key, shard),
            Owner::Groups { stream, shard },
            now,
        );
        self.groups.shards.insert(
            at,
            ShardGroups {
                log,
                loaded: false,
                recovered: HashMap::new(),
                groups: HashMap::new(),
                waiting: Vec::new(),
            },
        );
        log
    }

    /// Replication is about to rebuild the groups of shard `at` from its log (it leads the
    /// log from now on, or the log was cut), or its leadership here ended: polls in progress
    /// on the shard end empty, their claims belonging to the state being replaced.
    pub(crate) fn end_group_polls(&mut self, at: (usize, u32)) {
        let mut ended: Vec<u64> = self
            .groups
            .polls
            .iter()
            .filter(|(_, p)| (p.stream, p.shard) == at)
            .map(|(w, _)| *w)
            .collect();
        // In id order, not the hash map's: the answers are queued (and sent) in it.
        ended.sort_unstable();
        for w in ended {
            self.answer_poll(w, Ok(Vec::new()));
        }
    }

    /// The group log of shard `at` was opened again: its groups are read from it anew.
    pub(crate) fn forget_loaded_groups(&mut self, at: (usize, u32)) {
        if let Some(sg) = self.groups.shards.get_mut(&at) {
            sg.loaded = false;
            sg.recovered.clear();
            sg.groups.clear();
        }
    }

    /// Refuses a group the shard does not know yet once it holds [`MAX_GROUPS_PER_SHARD`].
    fn admit_group(&self, stream: usize, shard: u32, group: &str) -> Result<(), BrokerError> {
        let sg = &self.groups.shards[&(stream, shard)];
        let known = sg.groups.contains_key(group) || sg.recovered.contains_key(group);
        if known || sg.groups.len() + sg.recovered.len() < MAX_GROUPS_PER_SHARD {
            Ok(())
        } else {
            Err(BrokerError::new(
                felix_proto::ErrorCode::LimitExceeded,
                format!("this shard holds its limit of {MAX_GROUPS_PER_SHARD} groups"),
            ))
        }
    }

    /// The group's state, built from its log on first use.
    fn group_state(&mut self, stream: usize, shard: u32, group: &str) -> &mut GroupState {
        let tail = self.group_view(stream, shard).tail;
        let sg = self
            .groups
            .shards
            .get_mut(&(stream, shard))
            .expect("group_shard first");
        if !sg.groups.contains_key(group) {
            let d = sg.recovered.remove(group).unwrap_or_default();
            let g = GroupState::recovered(d.cursor, d.dead, d.redriven, tail);
            sg.groups.insert(group.to_owned(), g);
        }
        sg.groups.get_mut(group).expect("inserted")
    }

    /// Records `writes` for `group` in the shard's group log; returns the offset to wait
    /// for, if anything was written.
    fn write_group(
        &mut self,
        now: Instant,
        stream: usize,
        shard: u32,
        group: &str,
        writes: Vec<Write>,
    ) -> Result<Option<(LogId, u64)>, BrokerError> {
        if writes.is_empty() {
            return Ok(None);
        }
        let records: Vec<LogRecord> = writes
            .into_iter()
            .map(|w| {
                let (op, offset) = match w {
                    Write::Cursor(o) => (GroupOp::Cursor, o),
                    Write::Dead(o) => (GroupOp::Dead, o),
                    Write::Discard(o) => (GroupOp::Discard, o),
                    Write::Redrive(o) => (GroupOp::Redrive, o),
                    Write::Done(o) => (GroupOp::Done, o),
                };
                LogRecord {
                    op,
                    group: group.to_owned(),
                    offset,
                }
            })
            .collect();
        self.append_group_records(now, stream, shard, &records)
    }

    fn append_group_records(
        &mut self,
        now: Instant,
        stream: usize,
        shard: u32,
        records: &[LogRecord],
    ) -> Result<Option<(LogId, u64)>, BrokerError> {
        let log = self.groups.shards[&(stream, shard)].log;
        let unix = self
            .logs
            .as_ref()
            .map_or(0, |l| l.unix_ms(now).saturating_mul(1000));
        let logs = self.logs.as_mut().expect("durable");
        let Some(g) = logs.slot_mut(log).and_then(|s| s.log.group_mut()) else {
            return Err(BrokerError::storage("the group log is gone"));
        };
        let end = g.append(now, unix, records).map_err(append_error)?;
        logs.mark_dirty(log);
        Ok(Some((log, end)))
    }

    // ---- requests -----------------------------------------------------------------------

    /// `group_poll`: claims records now and answers through [`Notice::GroupRecords`] with
    /// the returned waiter id, at once or after a wait.
    pub(crate) fn group_poll(
        &mut self,
        now: Instant,
        addr: GroupAddr<'_>,
        req: PollRequest,
    ) -> Result<u64, BrokerError> {
        let (stream, shard) = self.group_shard(now, addr.key, addr.shard)?;
        self.admit_group(stream, shard, addr.group)?;
        let cfg = &self.groups.cfg;
        let visibility = req
            .visibility
            .filter(|v| !v.is_zero())
            .unwrap_or(cfg.visibility_timeout)
            .min(cfg.max_visibility);
        let mut wait = req.wait.min(cfg.max_wait);
        if self.groups.waiting_count >= cfg.max_waiting_polls {
            wait = Duration::ZERO;
        }
        self.groups.next_waiter += 1;
        let waiter = self.groups.next_waiter;
        self.groups.polls.insert(
            waiter,
            Poll {
                stream,
                shard,
                group: addr.group.to_owned(),
                deadline: now + wait,
                max: (req.max_records as usize).clamp(1, MAX_POLL_RECORDS),
                visibility,
                conn: req.conn,
                member: req.member,
                reclaim: req.reclaim,
                serving: None,
            },
        );
        self.try_serve(now, waiter);
        if self
            .groups
            .polls
            .get(&waiter)
            .is_some_and(|p| p.serving.is_none())
        {
            if wait.is_zero() {
                self.answer_poll(waiter, Ok(Vec::new()));
            } else {
                self.groups.waiting_count += 1;
                if let Some(sg) = self.groups.shards.get_mut(&(stream, shard)) {
                    sg.waiting.push(waiter);
                }
            }
        }
        Ok(waiter)
    }

    /// Takes work for a poll; if there is some, claims it and starts reading.
    fn try_serve(&mut self, now: Instant, waiter: u64) {
        let bounds = self.group_bounds();
        let Some(p) = self.groups.polls.get(&waiter) else {
            return;
        };
        if p.serving.is_some() {
            return;
        }
        let (stream, shard, group) = (p.stream, p.shard, p.group.clone());
        // A follower's copy of the group log: its claims could be written nowhere (the
        // leader's log is the group's state), so nothing is handed out here.
        let log = self.groups.shards.get(&(stream, shard)).map(|sg| sg.log);
        let follower = log.is_some_and(|log| {
            self.logs
                .as_ref()
                .and_then(|l| l.slot(log))
                .is_some_and(|s| s.log.shard().only_shipped())
        });
        if follower {
            let why = "this node does not lead the shard's groups; poll again";
            return self.answer_poll(
                waiter,
                Err(BrokerError::new(
                    felix_proto::ErrorCode::ShardUnavailable,
                    why,
                )),
            );
        }
        let member = p.member.clone();
        let (max, visibility, conn, reclaim) = (p.max, p.visibility, p.conn, p.reclaim);
        let view = self.group_view(stream, shard);
        let take = Take {
            max,
            visibility,
            conn,
            member: member.as_ref(),
            reclaim,
        };
        let mut writes = Vec::new();
        let g = self.group_state(stream, shard, &group);
        let before = g.skipped;
        let mut handed = g.take(now, &take, view, bounds, &mut writes);
        let skipped = g.skipped - before;
        self.groups.skipped += skipped;
        if let Err(e) = self.write_group(now, stream, shard, &group, writes) {
            tracing::warn!(error = %e, "a group write failed");
        }
        if handed.is_empty() {
            return;
        }
        handed.sort_by_key(|h| h.offset);
        let p = self.groups.polls.get_mut(&waiter).expect("checked");
        // A reclaiming poll reserves once; later looks are ordinary.
        p.reclaim = false;
        p.serving = Some(Serving {
            want: handed,
            next: 0,
            got: Vec::new(),
            bytes: 0,
            reading: false,
        });
        self.unwait(waiter);
        self.read_next(waiter);
    }

    fn unwait(&mut self, waiter: u64) {
        let Some(p) = self.groups.polls.get(&waiter) else {
            return;
        };
        if let Some(sg) = self.groups.shards.get_mut(&(p.stream, p.shard)) {
            if let Some(i) = sg.waiting.iter().position(|&w| w == waiter) {
                sg.waiting.swap_remove(i);
                self.groups.waiting_count -= 1;
            }
        }
    }

    /// Issues the read for the next run of claimed offsets, or answers once all are read.
    fn read_next(&mut self, waiter: u64) {
        let Some(p) = self.groups.polls.get_mut(&waiter) else {
            return;
        };
        let (stream, shard) = (p.stream, p.shard);
        let s = p.serving.as_mut().expect("serving");
        if s.reading {
            return;
        }
        if s.next >= s.want.len() || s.bytes >= MAX_POLL_BYTES {
            return self.finish_poll(waiter);
        }
        let from = s.want[s.next].offset;
        let run = s.want[s.next..]
            .iter()
            .enumerate()
            .take_while(|(i, h)| h.offset == from + *i as u64)
            .count();
        let log = self.streams[stream].shards[shard as usize]
            .store
            .as_ref()
            .expect("durable")
            .log;
        let logs = self.logs.as_mut().expect("durable");
        let Some(shard_log) = logs.slot_mut(log).and_then(|s| s.log.stream_mut()) else {
            return self.answer_poll(waiter, Err(BrokerError::storage("the shard's log is gone")));
        };
        match shard_log.read(from, run, MAX_POLL_BYTES) {
            Ok(ticket) => {
                logs.mark_dirty(log);
                self.groups.reads.insert((log, ticket), waiter);
                s.reading = true;
            }
            Err(ReadError::Busy) => self.groups.blocked.entry(log).or_default().push(waiter),
            Err(ReadError::Trimmed { oldest, .. }) => {
                // Retention took these since they were claimed: drop them from the answer;
                // their claims lapse and the group then skips them.
                s.skip_below(oldest);
                self.read_next(waiter);
            }
            Err(e) => {
                let why = format!("reading the log failed: {e:?}");
                self.answer_poll(waiter, Err(BrokerError::storage(why)));
            }
        }
    }

    /// A shard log read landed that no subscriber asked for: maybe a poll's.
    pub(super) fn on_group_read(
        &mut self,
        log: LogId,
        ticket: ReadTicket,
        result: Result<ReadBatch, ReadError>,
    ) {
        let Some(waiter) = self.groups.reads.remove(&(log, ticket)) else {
            return;
        };
        let Some(s) = self
            .groups
            .polls
            .get_mut(&waiter)
            .and_then(|p| p.serving.as_mut())
        else {
            return;
        };
        s.reading = false;
        match result {
            Ok(batch) => {
                let before = s.next;
                for stored in batch.batches {
                    for (at, payload) in (stored.first_offset..).zip(stored.payloads) {
                        s.skip_below(at); // missing from the log: left out
                        let Some(h) = s.want.get(s.next) else { break };
                        if h.offset != at {
                            continue;
                        }
                        s.bytes += payload.len();
                        s.got.push(PolledRecord {
                            offset: at,
                            payload,
                            attempts: h.attempts,
                            skipped_before: h.skipped_before,
                            publisher: stored.publisher.clone(),
                            time_us: stored.time_us,
                        });
                        s.next += 1;
                        if s.bytes >= MAX_POLL_BYTES {
                            break;
                        }
                    }
                }
                if s.next == before {
                    // Nothing came back for this offset: leave it out rather than spin.
                    s.next += 1;
                }
            }
            Err(ReadError::Trimmed { oldest, .. }) => {
                s.skip_below(oldest);
            }
            Err(e) => {
                let why = format!("reading the log failed: {e:?}");
                return self.answer_poll(waiter, Err(BrokerError::storage(why)));
            }
        }
        self.read_next(waiter);
    }

    /// Polls refused `Busy` on `log` try again (a read on it just landed).
    pub(super) fn retry_group_reads(&mut self, log: LogId) {
        for waiter in self.groups.blocked.remove(&log).unwrap_or_default() {
            self.read_next(waiter);
        }
    }

    /// Every claimed record is read (or the byte budget is reached): answer, and hand back
    /// what did not fit.
    fn finish_poll(&mut self, waiter: u64) {
        let Some(p) = self.groups.polls.get_mut(&waiter) else {
            return;
        };
        let s = p.serving.take().expect("serving");
        let (stream, shard, group) = (p.stream, p.shard, p.group.clone());
        let got_offsets: Vec<u64> = s.got.iter().map(|r| r.offset).collect();
        let unsent: Vec<Handout> = s
            .want
            .iter()
            .filter(|h| got_offsets.binary_search(&h.offset).is_err())
            .copied()
            .collect();
        if !unsent.is_empty() {
            let g = self.group_state(stream, shard, &group);
            for h in unsent {
                g.hand_back(h.offset);
            }
        }
        self.answer_poll(waiter, Ok(s.got));
    }

    fn answer_poll(&mut self, waiter: u64, result: Result<Vec<PolledRecord>, BrokerError>) {
        self.unwait(waiter);
        self.groups.polls.remove(&waiter);
        if let Some(logs) = self.logs.as_mut() {
            logs.notices
                .push_back(Notice::GroupRecords { waiter, result });
        }
    }

    /// The shard released records: its waiting polls look again this turn.
    pub(super) fn wake_group_polls(&mut self, stream: usize, shard: u32) {
        if self
            .groups
            .shards
            .get(&(stream, shard))
            .is_some_and(|sg| !sg.waiting.is_empty())
        {
            self.groups.woken.push((stream, shard));
        }
    }

    /// Serves the waiting polls of every shard woken this turn (end of [`Broker::flush`]).
    pub(super) fn serve_woken_groups(&mut self, now: Instant) {
        let woken = std::mem::take(&mut self.groups.woken);
        for key in woken {
            let waiting = self
                .groups
                .shards
                .get(&key)
                .map(|sg| sg.waiting.clone())
                .unwrap_or_default();
            for waiter in waiting {
                self.try_serve(now, waiter);
            }
        }
    }

    /// When a waiting poll's wait ends or a claim it could take lapses.
    pub(super) fn groups_timeout(&self) -> Option<Instant> {
        let mut at: Option<Instant> = None;
        for sg in self.groups.shards.values() {
            if sg.waiting.is_empty() {
                continue;
            }
            for w in &sg.waiting {
                if let Some(p) = self.groups.polls.get(w) {
                    at = Some(at.map_or(p.deadline, |a| a.min(p.deadline)));
                    if let Some(d) = sg.groups.get(&p.group).and_then(GroupState::next_deadline) {
                        at = Some(at.map_or(d, |a| a.min(d)));
                    }
                }
            }
        }
        at
    }

    /// Ends the waits that are over (answered empty) and serves polls a lapse made work for.
    pub(super) fn groups_handle_timeout(&mut self, now: Instant) {
        let waiting: Vec<u64> = self
            .groups
            .shards
            .values()
            .flat_map(|sg| sg.waiting.iter().copied())
            .collect();
        for waiter in waiting {
            self.try_serve(now, waiter);
            let over = self
                .groups
                .polls
                .get(&waiter)
                .is_some_and(|p| p.serving.is_none() && p.deadline <= now);
            if over {
                self.answer_poll(waiter, Ok(Vec::new()));
            }
        }
    }

    /// `group_ack`, `group_nack`, `group_extend`, `group_dead_letter`, `group_discard`,
    /// `group_redrive`.
    pub(crate) fn group_settle(
        &mut self,
        now: Instant,
        addr: GroupAddr<'_>,
        offset: u64,
        op: SettleOp,
    ) -> Result<Settled, BrokerError> {
        let (stream, shard) = self.group_shard(now, addr.key, addr.shard)?;
        self.admit_group(stream, shard, addr.group)?;
        let tail = self.group_view(stream, shard).tail;
        let max_visibility = self.groups.cfg.max_visibility;
        let g = self.group_state(stream, shard, addr.group);
        let mut writes = Vec::new();
        let mut granted = Duration::ZERO;
        let r = match op {
            SettleOp::Ack => g.ack(offset, tail, &mut writes),
            SettleOp::Nack { delay, attempts } => {
                let delay = delay.map(|d| d.min(max_visibility));
                g.nack(now, offset, delay, attempts, tail)
            }
            SettleOp::Extend { attempts, by } => {
                granted = by.min(max_visibility);
                g.extend(now, offset, attempts, granted)
            }
            SettleOp::DeadLetter => g.dead_letter(offset, tail, &mut writes),
            SettleOp::Discard => g.discard(offset, &mut writes),
            SettleOp::Redrive => g.redrive(offset, &mut writes),
        };
        r.map_err(group_error)?;
        let durable_at = self.write_group(now, stream, shard, addr.group, writes)?;
        // Something may be owed or room freed: waiting polls look again.
        self.wake_group_polls(stream, shard);
        Ok(Settled {
            durable_at,
            granted,
        })
    }

    /// `group_dead_letters`.
    pub(crate) fn group_dead_letters(
        &mut self,
        now: Instant,
        addr: GroupAddr<'_>,
    ) -> Result<Vec<u64>, BrokerError> {
        let (stream, shard) = self.group_shard(now, addr.key, addr.shard)?;
        self.admit_group(stream, shard, addr.group)?;
        Ok(self.group_state(stream, shard, addr.group).dead_letters())
    }

    /// `group_seek`: the position it stands at, whether it moved, and the write to wait for.
    pub(crate) fn group_seek(
        &mut self,
        now: Instant,
        addr: GroupAddr<'_>,
        to: SeekTo,
        if_new: bool,
    ) -> Result<(u64, bool, DurableAt), BrokerError> {
        let (stream, shard) = self.group_shard(now, addr.key, addr.shard)?;
        self.admit_group(stream, shard, addr.group)?;
        let view = self.group_view(stream, shard);
        let target = match to {
            SeekTo::Earliest => view.oldest,
            SeekTo::Latest => view.tail,
            SeekTo::Offset(o) if (view.oldest..=view.tail).contains(&o) => o,
            SeekTo::Offset(o) => {
                return Err(BrokerError::invalid(format!(
                    "offset {o} is outside the shard's records [{}, {}]",
                    view.oldest, view.tail
                )))
            }
        };
        let g = self.group_state(stream, shard, addr.group);
        if if_new && (g.exists() || g.in_flight() + g.owed() > 0) {
            return Ok((g.cursor(), false, None));
        }
        let mut writes = Vec::new();
        g.seek(target, &mut writes);
        let durable_at = self.write_group(now, stream, shard, addr.group, writes)?;
        self.wake_group_polls(stream, shard);
        Ok((target, true, durable_at))
    }

    /// `group_describe`.
    pub(crate) fn group_describe(
        &mut self,
        now: Instant,
        addr: GroupAddr<'_>,
    ) -> Result<Described, BrokerError> {
        let (stream, shard) = self.group_shard(now, addr.key, addr.shard)?;
        self.admit_group(stream, shard, addr.group)?;
        let tail = self.group_view(stream, shard).tail;
        let g = self.group_state(stream, shard, addr.group);
        g.expire(now);
        Ok(Described {
            committed: g.exists().then_some(g.cursor()),
            tail,
            in_flight: g.in_flight() as u64,
            owed: g.owed() as u64,
            dead_letters: g.dead_letters().len() as u64,
        })
    }

    /// `group_delete`: whether the group existed, and the write to wait for.
    pub(crate) fn group_delete(
        &mut self,
        now: Instant,
        addr: GroupAddr<'_>,
    ) -> Result<(bool, DurableAt), BrokerError> {
        let (stream, shard) = self.group_shard(now, addr.key, addr.shard)?;
        let sg = self
            .groups
            .shards
            .get_mut(&(stream, shard))
            .expect("loaded");
        let recovered = sg.recovered.remove(addr.group);
        let existed = match sg.groups.remove(addr.group) {
            Some(g) => g.exists() || g.in_flight() + g.owed() > 0 || !g.dead_letters().is_empty(),
            None => recovered.is_some_and(|d| d.cursor.is_some() || !d.dead.is_empty()),
        };
        if !existed {
            return Ok((false, None));
        }
        let record = LogRecord {
            op: GroupOp::Delete,
            group: addr.group.to_owned(),
            offset: 0,
        };
        let durable_at = self.append_group_records(now, stream, shard, &[record])?;
        Ok((true, durable_at))
    }

    /// A group log event: opening, durability, failure.
    pub(super) fn on_group_log_event(
        &mut self,
        _now: Instant,
        id: LogId,
        ev: felix_storage::log::LogEvent,
    ) {
        use felix_storage::log::LogEvent;
        let logs = self.logs.as_mut().expect("called with logs");
        match ev {
            LogEvent::Opened { .. } => logs.opened(id, Ok(())),
            // A replicated group log led here counts its own durability toward the commit
            // mark, as a shard's log does (`replicated.rs`).
            LogEvent::Durable { up_to } if self.gates.contains_key(&id) => logs
                .notices
                .push_back(Notice::LocalDurable { log: id, up_to }),
            LogEvent::Durable { up_to } => {
                logs.notices.push_back(Notice::Durable { log: id, up_to })
            }
            LogEvent::Failed(e) => logs.failed(id, e.to_string()),
            LogEvent::Read { .. } | LogEvent::Trimmed { .. } => {}
            LogEvent::Compacted { .. } | LogEvent::CompactionFailed(_) => {}
            LogEvent::Replica(event) => logs.notices.push_back(Notice::Replica { log: id, event }),
        }
    }

    /// Records groups skipped because retention removed them before they were reached.
    pub(crate) fn group_skipped_records(&self) -> u64 {
        self.groups.skipped
    }
}

/// The group features a durable broker serves.
pub(crate) const GROUP_FEATURES: felix_proto::Features = felix_proto::Features(
    felix_proto::Features::CONSUMER_GROUP.0
        | felix_proto::Features::GROUP_DEAD_LETTERS.0
        | felix_proto::Features::GROUP_CONSUMER.0
        | felix_proto::Features::GROUP_SKIPPED.0
        | felix_proto::Features::GROUP_PUBLISHER.0
        | felix_proto::Features::GROUP_CLAIM_CONTROL.0
        | felix_proto::Features::GROUP_ADMIN.0,
);

impl Broker {
    /// Stream `stream` was deleted (`delete.rs`): polls on it are answered `not_found` and
    /// its groups are forgotten. Returns their logs, for the caller to retire.
    pub(super) fn forget_stream_groups(&mut self, stream: usize) -> Vec<LogId> {
        let mut waiters: Vec<u64> = self
            .groups
            .polls
            .iter()
            .filter(|(_, p)| p.stream == stream)
            .map(|(w, _)| *w)
            .collect();
        waiters.sort_unstable();
        for w in waiters {
            let gone = BrokerError::new(felix_proto::ErrorCode::NotFound, "the stream was deleted");
            self.answer_poll(w, Err(gone));
        }
        self.groups.woken.retain(|(s, _)| *s != stream);
        let mut keys: Vec<(usize, u32)> = self
            .groups
            .shards
            .keys()
            .filter(|(s, _)| *s == stream)
            .copied()
            .collect();
        keys.sort_unstable();
        keys.into_iter()
            .filter_map(|k| self.groups.shards.remove(&k))
            .map(|sg| sg.log)
            .collect()
    }
}
