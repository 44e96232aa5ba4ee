//! [`GroupLog`]: the durable part of a shard's consumer groups, as a [`ShardLog`] of
//! small records beside the shard's own log.
//!
//! Every group on the shard shares one log. A record names its group and says one thing:
//! the group's cursor moved, a record became a dead letter, a dead letter was discarded or
//! redriven, a redriven record was finished, or the group was deleted. Replaying the log in
//! order on open rebuilds each group's cursor, dead letters and redriven records; the
//! in-flight claims are deliberately not recorded (see docs/groups.md).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};

use super::cache_log::garbage_heavy;
use super::driven::Driven;
use super::log::{AppendError, Batch, LogConfig, LogEvent, ShardLog, StorageError};
use super::ops::LogId;
use super::record::{self, DecodedEntry};

/// Version byte at the start of every group record.
const GROUP_RECORD_VERSION: u8 = 1;
/// version, op, group length, offset.
const GROUP_RECORD_FIXED: usize = 12;
/// Longest group name a record carries (names are checked far below this).
pub const MAX_GROUP_NAME_BYTES: usize = u16::MAX as usize;

/// What one group record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupOp {
    Cursor = 1,
    Dead = 2,
    Discard = 3,
    Redrive = 4,
    Done = 5,
    Delete = 6,
}

impl GroupOp {
    fn from_u8(b: u8) -> Option<GroupOp> {
        Some(match b {
            1 => GroupOp::Cursor,
            2 => GroupOp::Dead,
            3 => GroupOp::Discard,
            4 => GroupOp::Redrive,
            5 => GroupOp::Done,
            6 => GroupOp::Delete,
            _ => return None,
        })
    }
}

/// One record: `op` on `group` at `offset` (0 for a delete).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRecord {
    pub op: GroupOp,
    pub group: String,
    pub offset: u64,
}

impl GroupRecord {
    pub fn encode(&self) -> Bytes {
        debug_assert!(self.group.len() <= MAX_GROUP_NAME_BYTES);
        let mut b = BytesMut::with_capacity(GROUP_RECORD_FIXED + self.group.len());
        b.put_u8(GROUP_RECORD_VERSION);
        b.put_u8(self.op as u8);
        b.put_u16_le(self.group.len() as u16);
        b.put_u64_le(self.offset);
        b.put_slice(self.group.as_bytes());
        b.freeze()
    }

    pub fn decode(payload: &[u8]) -> Result<GroupRecord, &'static str> {
        if payload.len() < GROUP_RECORD_FIXED {
            return Err("a group record shorter than its header");
        }
        if payload[0] != GROUP_RECORD_VERSION {
            return Err("an unknown group record version");
        }
        let op = GroupOp::from_u8(payload[1]).ok_or("an unknown group op")?;
        let len = u16::from_le_bytes([payload[2], payload[3]]) as usize;
        if payload.len() != GROUP_RECORD_FIXED + len {
            return Err("a group name that does not fill its record");
        }
        let offset = record::u64_at(payload, 4);
        let group = std::str::from_utf8(&payload[GROUP_RECORD_FIXED..])
            .map_err(|_| "a group name that is not UTF-8")?
            .to_owned();
        Ok(GroupRecord { op, group, offset })
    }
}

/// A group as its log left it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DurableGroup {
    pub cursor: Option<u64>,
    pub dead: BTreeSet<u64>,
    pub redriven: BTreeSet<u64>,
}

impl DurableGroup {
    fn apply(&mut self, op: GroupOp, offset: u64) {
        match op {
            // A seek may move it back, so the newest record wins.
            GroupOp::Cursor => self.cursor = Some(offset),
            GroupOp::Dead => {
                self.redriven.remove(&offset);
                self.dead.insert(offset);
            }
            GroupOp::Discard => {
                self.dead.remove(&offset);
            }
            GroupOp::Redrive => {
                self.dead.remove(&offset);
                self.redriven.insert(offset);
            }
            GroupOp::Done => {
                self.redriven.remove(&offset);
            }
            GroupOp::Delete => *self = DurableGroup::default(),
        }
    }
}

/// Segments of a group log roll at this size (or the configured one, if smaller), so
/// compaction, which rewrites sealed segments only, has something to work on early.
pub const GROUP_SEGMENT_MAX_BYTES: u64 = 4 << 20;
/// What one kept record costs on disk after compaction, about (entry header + record).
const LIVE_RECORD_BYTES: u64 = 32 + GROUP_RECORD_FIXED as u64 + 16;

/// Where each live record of a group sits in the log: its newest cursor record, and the
/// record listing each dead letter and each redrive still owed.
#[derive(Debug, Default)]
struct LiveAt {
    cursor: Option<u64>,
    dead: HashMap<u64, u64>,
    redriven: HashMap<u64, u64>,
}

impl LiveAt {
    fn apply(&mut self, op: GroupOp, offset: u64, at: u64) {
        match op {
            GroupOp::Cursor => self.cursor = Some(at),
            GroupOp::Dead => {
                self.redriven.remove(&offset);
                self.dead.insert(offset, at);
            }
            GroupOp::Discard => {
                self.dead.remove(&offset);
            }
            GroupOp::Redrive => {
                self.dead.remove(&offset);
                self.redriven.insert(offset, at);
            }
            GroupOp::Done => {
                self.redriven.remove(&offset);
            }
            GroupOp::Delete => *self = LiveAt::default(),
        }
    }

    fn count(&self) -> usize {
        usize::from(self.cursor.is_some()) + self.dead.len() + self.redriven.len()
    }
}

/// The group log of one shard. [`Driven`] like [`ShardLog`]; its events are the shard log's.
#[derive(Debug)]
pub struct GroupLog {
    log: ShardLog,
    /// Filled by replay while opening; taken once by the broker.
    recovered: HashMap<String, DurableGroup>,
    /// Log offsets of the records still meaning something, for compaction.
    live: HashMap<String, LiveAt>,
    events: VecDeque<LogEvent>,
    /// Replay met a record it cannot read: the open is reported as failed.
    corrupt: Option<StorageError>,
}

impl GroupLog {
    pub fn open(id: LogId, dir: String, cfg: LogConfig, now: Instant) -> GroupLog {
        let mut g = GroupLog {
            log: ShardLog::open_replaying(id, dir, cfg, now),
            recovered: HashMap::new(),
            live: HashMap::new(),
            events: VecDeque::new(),
            corrupt: None,
        };
        g.absorb();
        g
    }

    pub fn log(&self) -> &ShardLog {
        &self.log
    }

    /// Every group the log holds, as replay left them (empty after the first call).
    pub fn take_recovered(&mut self) -> HashMap<String, DurableGroup> {
        std::mem::take(&mut self.recovered)
    }

    #[must_use]
    pub fn poll_event(&mut self) -> Option<LogEvent> {
        self.events.pop_front()
    }

    /// Appends records as one entry and returns the offset every one of them is durable
    /// below once [`LogEvent::Durable`] passes it.
    pub fn append(
        &mut self,
        now: Instant,
        unix_micros: u64,
        records: &[GroupRecord],
    ) -> Result<u64, AppendError> {
        let payloads: Vec<Bytes> = records.iter().map(GroupRecord::encode).collect();
        let batch = Batch {
            time_us: unix_micros,
            publisher: None,
            payloads: &payloads,
        };
        let first = self.log.append(now, batch);
        if let Ok(first) = first {
            for (i, r) in records.iter().enumerate() {
                self.note_live(r, first + i as u64);
            }
            self.compact_if_due();
        }
        self.absorb();
        first.map(|f| f + payloads.len() as u64)
    }

    /// Appends entries a leader's group log shipped (its `read_framed`), as a follower does:
    /// with [`ShardLog::append_framed_with_gaps`], since a compacted log's offsets jump.
    /// Their records are folded in as recovery's are: into the live records, and into what
    /// [`GroupLog::take_recovered`] hands out next. Returns the log's new next offset.
    pub fn append_shipped(
        &mut self,
        now: Instant,
        base: u64,
        entries: Bytes,
    ) -> Result<u64, AppendError> {
        let r = self.log.append_framed_with_gaps(now, base, entries);
        self.absorb();
        r
    }

    fn note_live(&mut self, r: &GroupRecord, at: u64) {
        if r.op == GroupOp::Delete {
            self.live.remove(&r.group);
        } else {
            let live = match self.live.get_mut(&r.group) {
                Some(l) => l,
                None => self.live.entry(r.group.clone()).or_default(),
            };
            live.apply(r.op, r.offset, at);
        }
    }

    /// Records still meaning something: a cursor per group, listed dead letters, owed
    /// redrives.
    pub fn live_records(&self) -> usize {
        self.live.values().map(LiveAt::count).sum()
    }

    /// Starts a compaction pass when the log is garbage-heavy by the cache logs' rule
    /// ([`garbage_heavy`]) over what its live records need: the sealed segments are
    /// rewritten with only the live records, at their own offsets.
    pub fn compact_if_due(&mut self) -> bool {
        let live = self.live_records() as u64 * LIVE_RECORD_BYTES;
        if !self.log.is_open() || !garbage_heavy(&self.log, live) {
            return false;
        }
        let mut keep: Vec<u64> = self
            .live
            .values()
            .flat_map(|l| {
                l.cursor
                    .into_iter()
                    .chain(l.dead.values().copied())
                    .chain(l.redriven.values().copied())
            })
            .collect();
        keep.sort_unstable();
        self.log.compact(keep)
    }

    fn absorb(&mut self) {
        while let Some(entry) = self.log.take_replayed() {
            self.replay(entry);
        }
        // A shipped entry's records come through `take_replayed`; its metadata is not needed.
        while self.log.take_appended().is_some() {}
        while let Some(ev) = self.log.poll_event() {
            let ev = match ev {
                LogEvent::Opened { .. } if self.corrupt.is_some() => {
                    LogEvent::Failed(self.corrupt.take().expect("checked"))
                }
                other => other,
            };
            self.events.push_back(ev);
        }
    }

    fn replay(&mut self, entry: DecodedEntry) {
        for (i, payload) in entry.payloads.iter().enumerate() {
            match GroupRecord::decode(payload) {
                Ok(r) => {
                    self.note_live(&r, entry.base + i as u64);
                    self.recovered
                        .entry(r.group)
                        .or_default()
                        .apply(r.op, r.offset);
                }
                Err(why) => {
                    self.corrupt.get_or_insert(StorageError::Corrupt {
                        path: self.log.dir().to_owned(),
                        pos: 0,
                        what: format!("record {} is {why}", entry.base + i as u64),
                    });
                }
            }
        }
    }
}

impl Driven for GroupLog {
    fn shard_mut(&mut self) -> &mut ShardLog {
        &mut self.log
    }

    fn after_input(&mut self) {
        self.absorb();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache_log::COMPACT_MIN_BYTES;
    use crate::log::FsyncMode;
    use crate::memfs::{Crash, MemFs};

    const DIR: &str = "groups/t/ns/s/0";

    /// Drives a group log over memfs until it has nothing left to do.
    fn pump(fs: &mut MemFs, g: &mut GroupLog, compacted: &mut usize) {
        for _ in 0..100_000 {
            let Some(op) = g.poll_op() else {
                while let Some(ev) = g.poll_event() {
                    if let LogEvent::Compacted { .. } = ev {
                        *compacted += 1;
                    }
                }
                return;
            };
            if let Some(c) = fs.execute(op) {
                g.handle_completion(c);
            }
        }
        panic!("the group log did not settle");
    }

    fn record(op: GroupOp, group: &str, offset: u64) -> GroupRecord {
        GroupRecord {
            op,
            group: group.into(),
            offset,
        }
    }

    /// A group log with small segments opened on an empty disk, and the passes counted.
    fn opened() -> (Instant, LogConfig, MemFs, GroupLog, usize) {
        let cfg = LogConfig {
            fsync: FsyncMode::None,
            segment_max_bytes: 64 << 10,
            ..LogConfig::default()
        };
        let t0 = Instant::now();
        let mut fs = MemFs::new();
        let mut compacted = 0;
        let mut g = GroupLog::open(LogId(3), DIR.into(), cfg.clone(), t0);
        pump(&mut fs, &mut g, &mut compacted);
        (t0, cfg, fs, g, compacted)
    }

    #[test]
    fn compaction_stays_below_its_bound() {
        let (t0, _, mut fs, mut g, mut compacted) = opened();
        // A follower that holds nothing yet: no segment may be compacted.
        g.log.bound_compaction(Some(0));
        let append = |g: &mut GroupLog, fs: &mut MemFs, compacted: &mut usize, n: u64| {
            for i in 0..n {
                g.append(t0, 1, &[record(GroupOp::Cursor, "a", i)]).unwrap();
                if i % 64 == 0 {
                    pump(fs, g, compacted);
                }
            }
            pump(fs, g, compacted);
        };
        append(&mut g, &mut fs, &mut compacted, 30_000);
        assert_eq!(compacted, 0, "garbage-heavy, but bounded at 0");
        assert_eq!(g.log.complete_from(), 0);
        // Followers hold 10,000: only segments ending there go.
        g.log.bound_compaction(Some(10_000));
        append(&mut g, &mut fs, &mut compacted, 64);
        assert!(compacted >= 1, "a pass ran");
        let complete = g.log.complete_from();
        assert!(
            complete > 0 && complete <= 10_000,
            "compacted up to {complete}"
        );
    }

    #[test]
    fn a_busy_log_is_compacted_to_its_live_records_and_replays_the_same() {
        let (t0, cfg, mut fs, mut g, mut compacted) = opened();
        g.append(
            t0,
            1,
            &[record(GroupOp::Dead, "a", 7), record(GroupOp::Dead, "a", 8)],
        )
        .unwrap();
        g.append(
            t0,
            1,
            &[
                record(GroupOp::Redrive, "a", 8),
                record(GroupOp::Dead, "b", 1),
            ],
        )
        .unwrap();
        g.append(t0, 1, &[record(GroupOp::Cursor, "gone", 5)])
            .unwrap();
        g.append(t0, 1, &[record(GroupOp::Delete, "gone", 0)])
            .unwrap();
        for i in 0..30_000u64 {
            g.append(t0, 1, &[record(GroupOp::Cursor, "a", i)]).unwrap();
            if i % 64 == 0 {
                pump(&mut fs, &mut g, &mut compacted);
            }
        }
        pump(&mut fs, &mut g, &mut compacted);
        assert!(compacted >= 1, "a pass ran");
        assert!(
            g.log().total_bytes() < COMPACT_MIN_BYTES,
            "{} bytes left",
            g.log().total_bytes()
        );
        assert_eq!(
            g.live_records(),
            4,
            "a's cursor, dead 7, redriven 8, b's dead 1"
        );

        let mut again = GroupLog::open(LogId(4), DIR.into(), cfg, t0);
        pump(&mut fs, &mut again, &mut compacted);
        let groups = again.take_recovered();
        let a = &groups["a"];
        assert_eq!(a.cursor, Some(29_999));
        assert_eq!(a.dead.iter().copied().collect::<Vec<_>>(), vec![7]);
        assert_eq!(a.redriven.iter().copied().collect::<Vec<_>>(), vec![8]);
        assert_eq!(
            groups["b"].dead.iter().copied().collect::<Vec<_>>(),
            vec![1]
        );
        assert!(groups
            .get("gone")
            .is_none_or(|d| *d == DurableGroup::default()));
    }

    #[test]
    fn a_follower_fed_a_compacted_group_log_rebuilds_its_leaders_groups() {
        let cfg = LogConfig {
            fsync: FsyncMode::OnCommit,
            segment_max_bytes: 64 << 10,
            ..LogConfig::default()
        };
        let t0 = Instant::now();
        let mut compacted = 0;
        let mut fs = MemFs::new();
        let mut lead = GroupLog::open(LogId(3), DIR.into(), cfg.clone(), t0);
        pump(&mut fs, &mut lead, &mut compacted);
        // Records compaction drops that undo earlier ones: a discard, a finished redrive,
        // a deleted group.
        let early = [
            record(GroupOp::Dead, "a", 7),
            record(GroupOp::Dead, "a", 8),
            record(GroupOp::Dead, "a", 9),
            record(GroupOp::Discard, "a", 9),
            record(GroupOp::Redrive, "a", 8),
            record(GroupOp::Redrive, "a", 7),
            record(GroupOp::Done, "a", 7),
            record(GroupOp::Cursor, "gone", 5),
            record(GroupOp::Delete, "gone", 0),
            record(GroupOp::Dead, "b", 1),
            record(GroupOp::Dead, "a", 10),
        ];
        lead.append(t0, 1, &early).unwrap();
        for i in 0..24_000u64 {
            lead.append(t0, 1, &[record(GroupOp::Cursor, "a", i)])
                .unwrap();
            if i % 64 == 0 {
                pump(&mut fs, &mut lead, &mut compacted);
            }
        }
        pump(&mut fs, &mut lead, &mut compacted);
        assert!(compacted >= 1, "a pass ran");
        let lead_next = lead.log().next_offset();
        let live = lead.live_records();
        assert_eq!(live, 4, "a's cursor, dead 10, redriven 8, b's dead 1");
        fs.crash(Crash::Process);
        let mut again = GroupLog::open(LogId(4), DIR.into(), cfg.clone(), t0);
        pump(&mut fs, &mut again, &mut compacted);
        let want = again.take_recovered();
        assert!(!want.contains_key("gone"));
        assert_eq!(want["a"].cursor, Some(23_999));
        let mut shipper = crate::test_bench::Shipper::on(fs, cfg.clone(), DIR);

        let mut follow = (
            MemFs::new(),
            GroupLog::open(LogId(5), DIR.into(), cfg.clone(), t0),
        );
        pump(&mut follow.0, &mut follow.1, &mut compacted);
        assert!(follow.1.take_recovered().is_empty());
        let in_gaps = crate::test_bench::ship(
            &mut shipper,
            &mut follow,
            64 << 10,
            |f| f.1.log().next_offset(),
            |f, base, entries| {
                let end =
                    f.1.append_shipped(t0, base, entries)
                        .expect("append_shipped");
                pump(&mut f.0, &mut f.1, &mut 0);
                end
            },
        );
        assert!(in_gaps > 0, "some reads began in a gap");
        let (mut fs, mut follow) = follow;
        assert_eq!(follow.log().next_offset(), lead_next);
        assert_eq!(follow.log().durable_offset(), lead_next);
        assert_eq!(follow.live_records(), live);
        assert_eq!(follow.take_recovered(), want);

        fs.crash(Crash::Power);
        let mut follow = GroupLog::open(LogId(6), DIR.into(), cfg, t0);
        pump(&mut fs, &mut follow, &mut compacted);
        assert_eq!(follow.log().next_offset(), lead_next);
        assert_eq!(follow.live_records(), live);
        assert_eq!(follow.take_recovered(), want);
    }

    #[test]
    fn a_group_record_round_trips_and_damage_is_refused() {
        let r = GroupRecord {
            op: GroupOp::Redrive,
            group: "billing/é".into(),
            offset: 1 << 40,
        };
        let bytes = r.encode();
        assert_eq!(GroupRecord::decode(&bytes), Ok(r));
        assert!(GroupRecord::decode(&bytes[..bytes.len() - 1]).is_err());
        let mut bad = bytes.to_vec();
        bad[1] = 9;
        assert!(GroupRecord::decode(&bad).is_err());
    }

    #[test]
    fn replay_rebuilds_cursor_dead_letters_and_redrives() {
        let mut g = DurableGroup::default();
        for (op, off) in [
            (GroupOp::Cursor, 3),
            (GroupOp::Dead, 1),
            (GroupOp::Dead, 2),
            (GroupOp::Cursor, 7),
            (GroupOp::Redrive, 1),
            (GroupOp::Discard, 2),
            (GroupOp::Dead, 5),
        ] {
            g.apply(op, off);
        }
        assert_eq!(g.cursor, Some(7));
        assert_eq!(g.dead.iter().copied().collect::<Vec<_>>(), vec![5]);
        assert_eq!(g.redriven.iter().copied().collect::<Vec<_>>(), vec![1]);
        g.apply(GroupOp::Done, 1);
        assert!(g.redriven.is_empty());
        g.apply(GroupOp::Delete, 0);
        assert_eq!(g, DurableGroup::default());
    }
}
