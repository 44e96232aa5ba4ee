//! CacheLog against memfs: visibility after durability, the rebuilt index, TTL across
//! restarts, and compaction (offsets kept, garbage dropped, crash-safe at every step).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::layout;
use crate::log::FsyncMode;
use crate::memfs::{Crash, MemFs};
use crate::ops::FileOpKind;
use crate::test_bench::{cfg, settle, Bench};

const DIR: &str = "caches/t/ns/c/0";

struct Rig {
    bench: Bench,
    cache: CacheLog,
    durable: u64,
    opened: Option<(usize, u64)>,
    failed: Option<StorageError>,
    values: HashMap<ReadTicket, Result<Option<CachedValue>, ReadError>>,
    compacted: Vec<(u64, u64)>,
    pending_gets: Vec<(ReadTicket, String)>,
    applied: Vec<Change>,
    scanned: HashMap<ReadTicket, Result<crate::log::ReadBatch, ReadError>>,
}

impl Rig {
    fn on(fs: MemFs, cfg: LogConfig) -> Rig {
        let (bench, cache) = Bench::open(fs, cfg, |cfg, t0| {
            CacheLog::open(LogId(9), DIR.into(), cfg, t0)
        });
        let mut rig = Rig {
            bench,
            cache,
            durable: 0,
            opened: None,
            failed: None,
            values: HashMap::new(),
            compacted: Vec::new(),
            pending_gets: Vec::new(),
            applied: Vec::new(),
            scanned: HashMap::new(),
        };
        rig.pump();
        rig
    }

    fn collect(&mut self) {
        self.bench.take_ops(&mut self.cache);
        while let Some(e) = self.cache.poll_event() {
            match e {
                CacheEvent::Opened { keys, next_offset } => self.opened = Some((keys, next_offset)),
                CacheEvent::Durable { up_to } => self.durable = up_to,
                CacheEvent::Value { ticket, result } => {
                    self.values.insert(ticket, result);
                }
                CacheEvent::Compacted {
                    bytes_before,
                    bytes_after,
                } => self.compacted.push((bytes_before, bytes_after)),
                CacheEvent::CompactionFailed(e) | CacheEvent::Failed(e) => self.failed = Some(e),
                CacheEvent::Applied(change) => self.applied.push(change),
                CacheEvent::Scanned { ticket, result } => {
                    self.scanned.insert(ticket, result);
                }
                // A cache log shipping for replication: not driven here.
                CacheEvent::Replica(_) => {}
            }
        }
    }

    fn step(&mut self) -> bool {
        self.collect();
        if !self.bench.run_one(&mut self.cache) {
            return false;
        }
        self.collect();
        true
    }

    fn pump(&mut self) {
        settle("the cache", || self.step());
    }

    fn put(&mut self, key: &str, value: &str, expiry: Option<u64>) -> u64 {
        let v = Bytes::copy_from_slice(value.as_bytes());
        let off = self
            .cache
            .put(self.bench.t0, 5_000_000, key.as_bytes(), v, expiry)
            .expect("put");
        self.collect();
        off
    }

    fn del(&mut self, key: &str) -> Option<u64> {
        let off = self
            .cache
            .delete(self.bench.t0, 5_000_000, key.as_bytes())
            .expect("delete");
        self.collect();
        off
    }

    fn get_at(&mut self, key: &str, unix_ms: u64) -> Option<CachedValue> {
        match self.cache.get(key.as_bytes(), unix_ms).expect("get") {
            Lookup::Absent => None,
            Lookup::Pending(t) => {
                self.pump();
                self.values.remove(&t).expect("answered").expect("read ok")
            }
        }
    }

    fn get(&mut self, key: &str) -> Option<String> {
        self.get_at(key, 0)
            .map(|v| String::from_utf8(v.value.to_vec()).unwrap())
    }

    /// Every key's (offset, value) as seen at `unix_ms`.
    fn snapshot(&mut self, keys: &[String], unix_ms: u64) -> BTreeMap<String, (u64, Bytes)> {
        let mut out = BTreeMap::new();
        for k in keys {
            if let Some(v) = self.get_at(k, unix_ms) {
                out.insert(k.clone(), (v.offset, v.value));
            }
        }
        out
    }

    fn reopen(self, crash: Crash) -> Rig {
        let (fs, cfg) = self.bench.crashed(crash);
        Rig::on(fs, cfg)
    }
}

#[test]
fn records_round_trip_and_refuse_nonsense() {
    for r in [
        CacheRecord::Put {
            key: Bytes::from_static(b"k"),
            value: Bytes::from_static(b"value"),
            expiry_unix_ms: Some(42),
        },
        CacheRecord::Put {
            key: Bytes::from_static(b""),
            value: Bytes::new(),
            expiry_unix_ms: None,
        },
        CacheRecord::Delete {
            key: Bytes::from_static(b"gone"),
        },
    ] {
        assert_eq!(CacheRecord::decode(&r.encode()), Ok(r));
    }
    let put = CacheRecord::Put {
        key: Bytes::from_static(b"k"),
        value: Bytes::from_static(b"v"),
        expiry_unix_ms: None,
    }
    .encode();
    let mut bad = put.to_vec();
    bad[0] = 2;
    assert!(
        CacheRecord::decode(&Bytes::from(bad)).is_err(),
        "unknown version"
    );
    let mut bad = put.to_vec();
    bad[2] = 200;
    assert!(
        CacheRecord::decode(&Bytes::from(bad)).is_err(),
        "key past the end"
    );
    assert!(CacheRecord::decode(&put.slice(..5)).is_err());
}

#[test]
fn a_write_is_visible_once_durable_and_survives_a_restart() {
    let mut rig = Rig::on(MemFs::new(), cfg(1 << 20));
    assert_eq!(rig.opened, Some((0, 0)));
    let off = rig.put("a", "one", None);
    assert_eq!(rig.get("a"), None, "not durable yet, not visible");
    rig.pump();
    assert!(rig.durable > off);
    assert_eq!(rig.get("a").as_deref(), Some("one"));
    rig.put("a", "two", None);
    rig.put("b", "bee", None);
    rig.pump();
    assert_eq!(rig.del("b"), Some(3));
    assert_eq!(rig.del("never"), None, "deleting nothing writes nothing");
    rig.pump();
    assert_eq!(rig.get("b"), None);
    assert_eq!(rig.cache.len(), 1);

    let mut rig = rig.reopen(Crash::Power);
    assert_eq!(rig.opened, Some((1, 4)));
    let v = rig.get_at("a", 0).unwrap();
    assert_eq!((v.offset, &v.value[..]), (1, &b"two"[..]));
    assert_eq!(rig.get("b"), None);
}

#[test]
fn sync_now_puts_every_written_value_on_the_device_whatever_the_mode() {
    for fsync in [
        FsyncMode::None,
        FsyncMode::Periodic(Duration::from_secs(3600)),
    ] {
        let mut rig = Rig::on(
            MemFs::new(),
            LogConfig {
                fsync,
                ..cfg(1 << 20)
            },
        );
        rig.put("a", "one", None);
        rig.put("b", "two", Some(u64::MAX));
        rig.pump();
        assert_eq!(rig.durable, 2, "{fsync:?}: durable once written");
        assert_eq!(
            rig.cache.log().synced_offset(),
            0,
            "{fsync:?}: not synced yet"
        );
        assert!(!rig.cache.log().is_idle(), "{fsync:?}: a stop would wait");
        rig.cache.sync_now();
        rig.pump();
        assert_eq!(rig.cache.log().synced_offset(), 2, "{fsync:?}");
        assert!(rig.cache.log().is_idle(), "{fsync:?}");
        // Power loss keeps both: the sync reached the device.
        let mut rig = rig.reopen(Crash::Power);
        assert_eq!(rig.opened, Some((2, 2)), "{fsync:?}");
        assert_eq!(rig.get("a").as_deref(), Some("one"), "{fsync:?}");
        assert_eq!(rig.get("b").as_deref(), Some("two"), "{fsync:?}");
    }
}

#[test]
fn an_expiry_is_absolute_and_holds_across_a_restart() {
    let mut rig = Rig::on(MemFs::new(), cfg(1 << 20));
    rig.put("session", "token", Some(10_000));
    rig.put("forever", "x", None);
    rig.pump();
    assert!(rig.get_at("session", 9_999).is_some());
    let mut rig = rig.reopen(Crash::Power);
    let v = rig.get_at("session", 9_999).unwrap();
    assert_eq!(v.expiry_unix_ms, Some(10_000));
    assert_eq!(
        rig.get_at("session", 10_000),
        None,
        "expired at its instant"
    );
    // The expiry pass writes its delete: the expiry is a change in the log from then on.
    assert_eq!(rig.cache.expiring(), 1);
    let next = rig.cache.log().next_offset();
    assert_eq!(rig.cache.expire_due(rig.bench.t0, 10_000_000, 16), Ok(1));
    assert_eq!(
        rig.cache.expire_due(rig.bench.t0, 10_000_000, 16),
        Ok(0),
        "once"
    );
    rig.pump();
    assert_eq!(rig.cache.log().next_offset(), next + 1);
    assert_eq!(rig.cache.expiring(), 0);
    assert_eq!(rig.get_at("session", 9_999), None, "and deleted");
    let mut rig = rig.reopen(Crash::Power);
    assert_eq!(rig.get_at("session", 0), None, "deleted for good");
    assert!(rig.get_at("forever", u64::MAX).is_some());
    // A delete of an expired key writes nothing.
    rig.put("old", "x", Some(1));
    rig.pump();
    assert_eq!(rig.cache.delete(rig.bench.t0, 2_000, b"old").unwrap(), None);
}

/// Writes a history with plenty of garbage across many small segments. Keys are k00..k19.
fn history(rig: &mut Rig) -> Vec<String> {
    let keys: Vec<String> = (0..20).map(|i| format!("k{i:02}")).collect();
    for round in 0..6 {
        for (i, k) in keys.iter().enumerate() {
            let expiry = (i % 5 == 4).then_some(if round == 5 { 900 } else { 100_000 });
            rig.put(k, &format!("{k}-v{round}-{}", "x".repeat(i)), expiry);
        }
        rig.pump();
    }
    for k in keys.iter().step_by(7) {
        rig.del(k);
    }
    // A few writes after, so the active segment holds live data too.
    rig.put("k01", "late", None);
    rig.pump();
    keys
}

#[test]
fn compaction_keeps_offsets_and_drops_superseded_deleted_and_expired_records() {
    let mut rig = Rig::on(MemFs::new(), cfg(600));
    let keys = history(&mut rig);
    let files_before = rig.bench.fs.list(DIR).len();
    let bytes_before = rig.cache.log().total_bytes();
    let before = rig.snapshot(&keys, 1_000);
    // Deleted (k00, k07, k14) and expired (k04, k09, k14, k19: expiry 900 < 1000) are gone.
    assert!(!before.contains_key("k00") && !before.contains_key("k04"));
    assert_eq!(before.len(), 14);
    assert!(files_before > 10);

    assert!(rig.cache.compact(1_000));
    rig.pump();
    assert!(rig.failed.is_none(), "{:?}", rig.failed);
    assert_eq!(rig.compacted.len(), 1);
    let after = rig.snapshot(&keys, 1_000);
    assert_eq!(before, after, "same values at the same offsets");
    assert!(rig.cache.log().total_bytes() < bytes_before / 3);
    assert!(rig.bench.fs.list(DIR).len() < files_before);
    assert!(rig.bench.fs.list(DIR).iter().all(|n| n.ends_with(".seg")));

    // The sealed files now hold exactly the live records, at their own offsets.
    let (sealed, active_base) = stored_offsets(&rig.bench.fs);
    let mut live: Vec<u64> = after
        .values()
        .map(|(o, _)| *o)
        .filter(|&o| o < active_base)
        .collect();
    live.sort_unstable();
    assert_eq!(sealed, live);

    // A restart rebuilds the same index from the compacted files.
    let mut rig = rig.reopen(Crash::Power);
    assert!(rig.failed.is_none(), "{:?}", rig.failed);
    assert_eq!(rig.snapshot(&keys, 1_000), before);
    // New writes continue the offset space.
    let next = rig.cache.log().next_offset();
    assert_eq!(rig.put("k02", "new", None), next);
}

/// Offsets of every record in the sealed segment files (scanned straight from the bytes),
/// and the active segment's base.
fn stored_offsets(fs: &MemFs) -> (Vec<u64>, u64) {
    let names = fs.list(DIR);
    let bases: Vec<u64> = names
        .iter()
        .map(|n| match layout::parse_name(n) {
            layout::FileName::Segment(b) => b,
            other => panic!("{n}: {other:?}"),
        })
        .collect();
    let active = *bases.last().unwrap();
    let mut offsets = Vec::new();
    for (name, base) in names.iter().zip(&bases) {
        if *base == active {
            continue;
        }
        let bytes = fs.file(&format!("{DIR}/{name}")).unwrap();
        let h = record::SegmentHeader::decode(bytes).unwrap();
        assert!(h.compacted_end.is_some(), "{name} was rewritten");
        let mut at = record::SEGMENT_HEADER_LEN as usize;
        while let record::Step::Entry(m) = record::step(&bytes[at..]) {
            offsets.extend(m.base..m.end());
            at += m.len as usize;
        }
        assert_eq!(at, bytes.len());
    }
    (offsets, active)
}

#[test]
fn writes_and_gets_go_on_during_compaction() {
    let mut rig = Rig::on(
        MemFs::new(),
        LogConfig {
            tail_cache_bytes: 0, // gets read the files, so some hit the swap
            ..cfg(600)
        },
    );
    let keys = history(&mut rig);
    let mut expect = rig.snapshot(&keys, 1_000);
    assert!(rig.cache.compact(1_000));
    assert!(!rig.cache.compact(1_000), "one pass at a time");
    let mut i = 0;
    while rig.step() {
        i += 1;
        if i % 3 == 0 {
            let k = &keys[i % keys.len()];
            let off = rig.put(k, &format!("during-{i}"), None);
            expect.insert(k.clone(), (off, Bytes::from(format!("during-{i}"))));
        }
        if i % 5 == 0 {
            // A get issued mid-pass is parked over the swap and still answers correctly.
            let k = keys[(i * 3) % keys.len()].clone();
            if let Lookup::Pending(t) = rig.cache.get(k.as_bytes(), 1_000).unwrap() {
                rig.collect();
                rig.pending_gets.push((t, k));
            }
        }
        assert!(i < 100_000);
    }
    assert_eq!(rig.compacted.len(), 1);
    for (t, k) in std::mem::take(&mut rig.pending_gets) {
        let v = rig.values.remove(&t).unwrap().unwrap().unwrap();
        // The value is the one current when the get was issued or a later one.
        assert!(v.value.starts_with(k.as_bytes()) || v.value.starts_with(b"during"));
    }
    assert_eq!(rig.snapshot(&keys, 1_000), expect);
    let mut rig = rig.reopen(Crash::Power);
    assert_eq!(rig.snapshot(&keys, 1_000), expect);
}

/// Builds the history, then crashes at write step `k` of a compaction pass.
fn crash_in_compaction(k: usize, tear: Option<usize>, crash: Crash) -> bool {
    let mut rig = Rig::on(MemFs::new(), cfg(600));
    let keys = history(&mut rig);
    let before = rig.snapshot(&keys, 1_000);
    let base = rig.bench.fs.writes;
    rig.bench.fs.crash_at_step(base + k, tear);
    assert!(rig.cache.compact(1_000));
    rig.pump();
    let crashed = rig.bench.fs.is_dead();
    let what = format!("compaction step {k} tear {tear:?} {crash:?}");

    let mut rig = rig.reopen(crash);
    assert!(rig.failed.is_none(), "{what}: {:?}", rig.failed);
    assert_eq!(rig.snapshot(&keys, 1_000), before, "{what}");
    assert!(
        rig.bench.fs.list(DIR).iter().all(|n| n.ends_with(".seg")),
        "{what}: leftovers {:?}",
        rig.bench.fs.list(DIR)
    );
    // A pass after the crash finishes the job.
    assert!(rig.cache.compact(1_000), "{what}");
    rig.pump();
    assert!(rig.failed.is_none(), "{what}: {:?}", rig.failed);
    assert_eq!(rig.snapshot(&keys, 1_000), before, "{what}");
    crashed
}

#[test]
fn a_crash_at_every_step_of_a_compaction_replays_to_the_same_cache() {
    // Count the pass's write steps once.
    let mut rig = Rig::on(MemFs::new(), cfg(600));
    history(&mut rig);
    rig.bench.ops_seen.clear();
    assert!(rig.cache.compact(1_000));
    rig.pump();
    let steps: Vec<FileOpKind> = rig
        .bench
        .ops_seen
        .into_iter()
        .filter(|k| k.is_write())
        .collect();
    let names: Vec<&str> = steps.iter().map(|k| k.name()).collect();
    // Temporary files written and synced, renamed, the directory synced, then the rest.
    let first_rename = names.iter().position(|n| *n == "rename").unwrap();
    let first_remove = names.iter().position(|n| *n == "remove").unwrap();
    assert!(names[..first_rename]
        .iter()
        .all(|n| ["create", "append", "sync"].contains(n)));
    assert!(names[first_rename..first_remove].contains(&"sync_dir"));
    assert_eq!(names.last(), Some(&"sync_dir"));

    for (k, op) in steps.iter().enumerate() {
        let tears = match op {
            FileOpKind::Append { bytes, .. } => {
                vec![Some(0), Some(40), Some(bytes.len() / 2), None]
            }
            _ => vec![None],
        };
        for tear in tears {
            for crash in [
                Crash::Process,
                Crash::Power,
                Crash::PowerZeroed,
                Crash::PowerReordered(k as u64 + 1),
                Crash::PowerReordered(k as u64 + 1000),
            ] {
                assert!(crash_in_compaction(k, tear, crash));
            }
        }
    }
    assert!(!crash_in_compaction(steps.len(), None, Crash::Power));
}

#[test]
fn observed_writes_are_reported_in_offset_order_once_durable_and_versions_count_staged_writes() {
    let mut rig = Rig::on(MemFs::new(), cfg(1 << 20));
    rig.put("before", "unseen", None);
    rig.pump();
    rig.cache.set_observed(true);
    let a = rig.put("a", "1", Some(77));
    // Accepted, not durable: the version already counts it, a get does not see it yet.
    assert_eq!(rig.cache.current_version(b"a", 0), Some(a));
    assert_eq!(rig.cache.durable_version(b"a", 0), None);
    assert!(
        rig.applied.is_empty(),
        "nothing reported before it is durable"
    );
    let d = rig.del("before").expect("present");
    rig.pump();
    assert_eq!(rig.cache.applied_offset(), d + 1);
    assert_eq!(
        rig.applied,
        vec![
            Change {
                offset: a,
                key: Bytes::from_static(b"a"),
                value: Some(Bytes::from_static(b"1")),
                expiry_unix_ms: Some(77),
            },
            Change {
                offset: d,
                key: Bytes::from_static(b"before"),
                value: None,
                expiry_unix_ms: None,
            },
        ]
    );
    assert_eq!(rig.cache.durable_version(b"a", 0), Some(a));
    assert_eq!(rig.cache.durable_version(b"a", 77), None, "expired");
    assert_eq!(rig.cache.live_offsets(|k| k.starts_with(b"a"), 0), vec![a]);
    // A scan reads the stored records from an offset, deletes included.
    let t = rig.cache.scan(0, 16, 1 << 20).unwrap();
    rig.pump();
    let batch = rig.scanned.remove(&t).unwrap().unwrap();
    assert_eq!(batch.record_count(), 3);
    rig.cache.set_observed(false);
    rig.put("a", "2", None);
    rig.pump();
    assert_eq!(rig.applied.len(), 2, "not reported while unobserved");
}

/// Every entry in `fs`'s segments under DIR: (base, end, skip), after checking that each
/// segment is plain (a follower never holds a compacted one it did not compact itself).
fn follower_entries(fs: &MemFs) -> Vec<(u64, u64, bool)> {
    let mut out = Vec::new();
    for name in fs.list(DIR) {
        let bytes = fs.file(&format!("{DIR}/{name}")).unwrap();
        let h = record::SegmentHeader::decode(bytes).unwrap();
        assert_eq!(h.compacted_end, None, "{name}");
        let mut at = record::SEGMENT_HEADER_LEN as usize;
        while let record::Step::Entry(m) = record::step(&bytes[at..]) {
            out.push((m.base, m.end(), m.skip));
            at += m.len as usize;
        }
        assert_eq!(at, bytes.len());
    }
    out
}

#[test]
fn a_follower_fed_a_compacted_cache_log_answers_every_key_as_its_leader_does() {
    let mut lead = Rig::on(MemFs::new(), cfg(600));
    let keys = history(&mut lead);
    assert!(lead.cache.compact(1_000));
    lead.pump();
    assert!(lead.failed.is_none(), "{:?}", lead.failed);
    let want = lead.snapshot(&keys, 1_000);
    assert_eq!(want.len(), 14);
    let lead_next = lead.cache.log().next_offset();
    let (lead_len, lead_live, lead_expiring) = (
        lead.cache.len(),
        lead.cache.live_bytes(),
        lead.cache.expiring(),
    );
    let (fs, lead_cfg) = lead.bench.crashed(Crash::Process);
    let mut shipper = crate::test_bench::Shipper::on(fs, lead_cfg, DIR);
    assert_eq!(shipper.next_offset(), lead_next);

    // One entry per read (every read after a dropped record starts in a gap), then whole
    // segments per read.
    for max_bytes in [1, 1 << 20] {
        let mut follow = Rig::on(MemFs::new(), cfg(600));
        let first = shipper.framed(0, max_bytes);
        assert!(
            first.base > 0,
            "offset 0 was overwritten, so compacted away"
        );
        let end = follow
            .cache
            .append_shipped(follow.bench.t0, first.base, first.entries)
            .unwrap();
        assert_eq!(end, first.end);
        assert!(follow.cache.is_empty(), "visible once durable, not before");
        follow.pump();
        // A compacted segment holds one put per live key.
        assert_eq!(follow.cache.len(), first.record_count as usize);

        let in_gaps = crate::test_bench::ship(
            &mut shipper,
            &mut follow,
            max_bytes,
            |f| f.cache.log().next_offset(),
            |f, base, entries| {
                let end = f
                    .cache
                    .append_shipped(f.bench.t0, base, entries)
                    .expect("append_shipped");
                f.pump();
                end
            },
        );
        assert!(in_gaps > 0, "some reads began in a gap");
        assert!(follow.failed.is_none(), "{:?}", follow.failed);
        assert_eq!(follow.cache.log().next_offset(), lead_next);
        assert_eq!(follow.durable, lead_next);
        assert_eq!(follow.snapshot(&keys, 1_000), want, "max_bytes {max_bytes}");
        assert_eq!(
            (
                follow.cache.len(),
                follow.cache.live_bytes(),
                follow.cache.expiring()
            ),
            (lead_len, lead_live, lead_expiring)
        );
        // Its own log is contiguous, the leader's gaps filled with skip entries.
        let entries = follower_entries(&follow.bench.fs);
        assert_eq!(entries.first().map(|e| e.0), Some(0));
        assert!(entries.windows(2).all(|w| w[0].1 == w[1].0));
        assert_eq!(entries.last().map(|e| e.1), Some(lead_next));
        assert!(entries.iter().any(|e| e.2), "skip entries were written");

        // A power loss and a restart: recovery scans the skip entries and rebuilds the same
        // index.
        let mut follow = follow.reopen(Crash::Power);
        assert!(follow.failed.is_none(), "{:?}", follow.failed);
        assert_eq!(follow.opened, Some((lead_len, lead_next)));
        assert_eq!(follow.snapshot(&keys, 1_000), want);
        assert_eq!(
            (follow.cache.live_bytes(), follow.cache.expiring()),
            (lead_live, lead_expiring)
        );

        // The follower's own compaction keeps nothing of its skip entries: its sealed
        // files hold exactly the live records, as the leader's do.
        assert!(follow.cache.compact(1_000));
        follow.pump();
        assert!(follow.failed.is_none(), "{:?}", follow.failed);
        assert_eq!(follow.snapshot(&keys, 1_000), want);
        let (sealed, active_base) = stored_offsets(&follow.bench.fs);
        let live: Vec<u64> = want
            .values()
            .map(|(o, _)| *o)
            .filter(|&o| o < active_base)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(sealed, live);
        assert_eq!(follow.put("k02", "after", None), lead_next);
    }
}
