//! The metadata log on the in-memory disk: start, append, restart, compaction, and a crash at
//! every write step of the compaction and of the start's rotation.

use super::*;
use felix_cluster::control::eraftpb::{Entry, HardState};
use felix_cluster::meta::Metadata;
use felix_cluster::NodeId;
use felix_storage::memfs::{Crash, MemFs};

const VOTERS: [u64; 3] = [1, 2, 3];
/// The storage identity a fresh disk is given in these tests.
const ID: [u8; 16] = [7; 16];

/// Performs the log's ops until it has none; false if the disk died on the way.
fn drive(fs: &mut MemFs, log: &mut MetaLog) -> bool {
    for _ in 0..10_000 {
        let Some(op) = log.poll_op() else {
            return true;
        };
        match fs.execute(op) {
            Some(c) => log.handle_completion(c),
            None => return false,
        }
    }
    panic!("the metadata log never went quiet");
}

fn open(fs: &mut MemFs, compact_bytes: u64) -> (MetaLog, MetaStore) {
    let mut log = MetaLog::open(VOTERS.to_vec(), compact_bytes, ID);
    assert!(drive(fs, &mut log));
    assert_eq!(log.fatal(), None);
    assert!(log.is_open());
    let store = log.take_loaded().expect("loaded once open");
    (log, store)
}

fn entry(index: u64, term: u64) -> Entry {
    Entry {
        index,
        term,
        data: format!("cmd-{index}").into_bytes().into(),
        ..Default::default()
    }
}

fn hs(term: u64, vote: u64, commit: u64) -> HardState {
    HardState {
        term,
        vote,
        commit,
        ..Default::default()
    }
}

/// A store holding entries `from..=to` at `term` and `hard`: as a ready would append them.
fn store_with(from: u64, to: u64, term: u64, hard: HardState) -> MetaStore {
    let mut s = MetaStore::new(VOTERS.to_vec());
    let entries: Vec<Entry> = (from..=to).map(|i| entry(i, term)).collect();
    s.append(&entries);
    s.set_hard_state(hard);
    s
}

fn meta_at(applied: u64) -> Vec<u8> {
    let mut m = Metadata::new(vec![
        NodeId::new("n1"),
        NodeId::new("n2"),
        NodeId::new("n3"),
    ]);
    m.applied = applied;
    m.snapshot()
}

/// What matters of a store: the snapshot point, the entries after it, the hard state.
fn shape(s: &MetaStore) -> ((u64, u64), Vec<(u64, u64)>, HardState) {
    let e = s
        .entries_after_snapshot()
        .iter()
        .map(|e| (e.index, e.term))
        .collect();
    (s.snapshot_point(), e, s.hard_state().clone())
}

fn cluster_files(fs: &MemFs) -> Vec<String> {
    fs.files()
        .keys()
        .filter(|p| p.starts_with("cluster/"))
        .cloned()
        .collect()
}

#[test]
fn a_blank_disk_starts_an_empty_log_and_records_survive_a_restart() {
    let mut fs = MemFs::new();
    let (mut log, store) = open(&mut fs, 1 << 20);
    assert!(store.is_blank(), "nothing on disk: blank");
    assert_eq!(cluster_files(&fs), vec![log_path(1), IDENTITY.to_owned()]);

    let written = store_with(1, 3, 1, hs(1, 2, 2));
    log.append(7, record::log_head(&written));
    assert!(log.poll_done().is_none(), "not durable before the sync");
    assert!(drive(&mut fs, &mut log));
    assert!(matches!(log.poll_done(), Some(Done::Persisted(7))));
    assert_eq!(
        fs.count("sync"),
        3,
        "the identity's sync, the fresh log's and the record's"
    );

    // A power loss keeps what was synced; the restart rotates into generation 2.
    fs.crash(Crash::Power);
    let (_, back) = open(&mut fs, 1 << 20);
    assert!(!back.is_blank());
    assert_eq!(shape(&back), shape(&written));
    assert_eq!(cluster_files(&fs), vec![log_path(2), IDENTITY.to_owned()]);
}

#[test]
fn a_torn_tail_is_dropped_by_the_rotation_and_not_appended_after() {
    let mut fs = MemFs::new();
    let (mut log, _) = open(&mut fs, 1 << 20);
    let first = store_with(1, 2, 1, hs(1, 1, 2));
    log.append(1, record::log_head(&first));
    assert!(drive(&mut fs, &mut log));
    let base = fs.writes;
    // The next record's append is torn after 5 bytes and the machine dies.
    fs.crash_at_step(base, Some(5));
    log.append(2, record::log_head(&store_with(3, 3, 1, hs(1, 1, 3))));
    assert!(!drive(&mut fs, &mut log));
    assert!(matches!(log.poll_done(), Some(Done::Persisted(1))));
    assert!(
        log.poll_done().is_none(),
        "the torn record is not confirmed"
    );
    fs.crash(Crash::Process);
    let (mut log, back) = open(&mut fs, 1 << 20);
    assert_eq!(shape(&back), shape(&first));
    // Appends go to the fresh log; a restart sees them.
    let next = store_with(3, 3, 2, hs(2, 1, 3));
    log.append(3, record::log_head(&next));
    assert!(drive(&mut fs, &mut log));
    let (_, again) = open(&mut fs, 1 << 20);
    let (_, entries, hard) = shape(&again);
    assert_eq!(entries, vec![(1, 1), (2, 1), (3, 2)]);
    assert_eq!(hard, hs(2, 1, 3));
}

/// The limit's edge: one byte under the threshold does not compact, at the threshold it does.
#[test]
fn compaction_starts_when_the_log_reaches_its_threshold() {
    let record = record::log_head(&store_with(1, 1, 1, hs(1, 1, 1)));
    let len = record.len() as u64;
    for (threshold, wants) in [(len + 1, false), (len, true)] {
        let mut fs = MemFs::new();
        let (mut log, _) = open(&mut fs, threshold);
        log.append(1, record.clone());
        assert_eq!(log.log_bytes(), len);
        assert_eq!(log.wants_compaction(), wants, "threshold {threshold}");
        assert!(drive(&mut fs, &mut log));
        assert_eq!(log.wants_compaction(), wants, "threshold {threshold}");
    }
}

/// Writes 1..=5, compacts at 3, appends 6: the whole sequence on one disk. Returns the disk,
/// the write step where the compaction began and where it ended.
fn compaction_run(fs: &mut MemFs) -> (usize, usize, MetaStore) {
    let (mut log, _) = open(fs, 1);
    let store = store_with(1, 5, 1, hs(1, 1, 5));
    log.append(1, record::log_head(&store));
    if !drive(fs, &mut log) {
        return (0, usize::MAX, store);
    }
    assert!(matches!(log.poll_done(), Some(Done::Persisted(1))));
    assert!(log.wants_compaction());
    let c = Compaction::of(&store, 3, meta_at(3)).unwrap();
    let begin = fs.writes;
    log.compact(c);
    let mut after = store.clone();
    after.compact(3, meta_at(3));
    let six = store_with(6, 6, 1, hs(1, 1, 6));
    log.append(2, record::log_head(&six));
    if !drive(fs, &mut log) {
        return (begin, usize::MAX, after);
    }
    let mut compacted = false;
    let mut persisted = false;
    while let Some(d) = log.poll_done() {
        match d {
            Done::Compacted(c) => {
                assert!(
                    !persisted,
                    "the snapshot is confirmed before the later record"
                );
                assert_eq!(c.index, 3);
                compacted = true;
            }
            Done::Persisted(r) => {
                assert_eq!(r, 2);
                persisted = true;
            }
        }
    }
    assert!(compacted && persisted);
    after.append(&[entry(6, 1)]);
    after.set_hard_state(hs(1, 1, 6));
    (begin, fs.writes, after)
}

#[test]
fn compaction_writes_the_snapshot_then_a_fresh_log_and_removes_the_old_one() {
    let mut fs = MemFs::new();
    let (_, _, want) = compaction_run(&mut fs);
    assert_eq!(
        cluster_files(&fs),
        vec![log_path(2), SNAPSHOT.to_owned(), IDENTITY.to_owned()],
        "the temp file was renamed, the old log removed"
    );
    let (_, back) = open(&mut fs, 1);
    assert_eq!(shape(&back), shape(&want));
    assert_eq!(back.snapshot_data(), &meta_at(3)[..]);
    assert_eq!(
        cluster_files(&fs),
        vec![log_path(3), SNAPSHOT.to_owned(), IDENTITY.to_owned()]
    );
}

/// The crash-between-steps sweep: a power loss at every write step of the compaction (and,
/// with a torn append, in the middle of each append). Whatever survives replays to a store
/// holding every entry that was confirmed, and the temp file is never read.
#[test]
fn a_crash_at_any_step_of_the_compaction_replays_to_the_confirmed_state() {
    let mut probe = MemFs::new();
    let (begin, end, _) = compaction_run(&mut probe);
    assert!(
        end > begin + 8,
        "the sequence has its steps: {begin}..{end}"
    );
    for step in begin..end {
        for tear in [None, Some(3)] {
            for how in [
                Crash::Power,
                Crash::Process,
                Crash::PowerReordered(step as u64),
            ] {
                let mut fs = MemFs::new();
                fs.crash_at_step(step, tear);
                let (_, _, _) = compaction_run(&mut fs);
                fs.crash(how);
                let (_, back) = open(&mut fs, 1);
                let ctx = format!("step {step} tear {tear:?} {how:?}");
                let (snap, entries, hard) = shape(&back);
                assert!(snap == (0, 0) || snap == (3, 1), "{ctx}: {snap:?}");
                // Entries 1..=5 were confirmed before the compaction began: each is in the
                // snapshot or in the log, with its term.
                let mut have: Vec<u64> = (1..=snap.0).collect();
                have.extend(entries.iter().map(|e| e.0));
                assert_eq!(&have[..5], &[1, 2, 3, 4, 5], "{ctx}");
                assert!(entries.iter().all(|e| e.1 == 1), "{ctx}");
                assert!(hard.commit >= 5 && hard.term == 1, "{ctx}: {hard:?}");
                if snap.0 == 3 {
                    assert_eq!(back.snapshot_data(), &meta_at(3)[..], "{ctx}");
                }
                let files = cluster_files(&fs);
                assert!(
                    !files.contains(&SNAPSHOT_TMP.to_owned()),
                    "{ctx}: {files:?}"
                );
                assert_eq!(
                    files.iter().filter(|f| f.ends_with(".log")).count(),
                    1,
                    "{ctx}: {files:?}"
                );
            }
        }
    }
}

#[test]
fn a_temp_snapshot_left_by_a_crash_is_ignored_and_removed() {
    let mut fs = MemFs::new();
    let (mut log, _) = open(&mut fs, 1 << 20);
    let store = store_with(1, 2, 1, hs(1, 1, 2));
    log.append(1, record::log_head(&store));
    assert!(drive(&mut fs, &mut log));
    // Half a snapshot that was never renamed in, garbage by any reading.
    fs.plant_file(SNAPSHOT_TMP, b"\x05\x00\x00\x00garbage".to_vec());
    let (_, back) = open(&mut fs, 1 << 20);
    assert_eq!(shape(&back), shape(&store));
    assert!(!cluster_files(&fs).contains(&SNAPSHOT_TMP.to_owned()));
}

#[test]
fn a_corrupt_snapshot_stops_the_start_naming_the_file() {
    let mut fs = MemFs::new();
    let (_, _, _) = compaction_run(&mut fs);
    let mut bad = fs.file(SNAPSHOT).unwrap().to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    fs.put_file(SNAPSHOT, bad);
    let mut log = MetaLog::open(VOTERS.to_vec(), 1, ID);
    drive(&mut fs, &mut log);
    let why = log.fatal().expect("a corrupt snapshot is fatal");
    assert!(why.contains("cluster/meta.snapshot"), "{why}");
    assert!(!log.is_open() && log.take_loaded().is_none());

    // A size no record can have is refused before anything is read.
    fs.put_file(SNAPSHOT, vec![0; record::MAX_RECORD_BYTES + 9]);
    let reads = fs.count("read");
    let mut log = MetaLog::open(VOTERS.to_vec(), 1, ID);
    drive(&mut fs, &mut log);
    assert!(log.fatal().unwrap().contains("more than one record"));
    assert_eq!(fs.count("read"), reads);
}

#[test]
fn a_failed_sync_fails_the_log_and_confirms_nothing() {
    let mut fs = MemFs::new();
    let (mut log, _) = open(&mut fs, 1 << 20);
    fs.inject(|k| matches!(k, FileOpKind::Sync { .. }).then_some(FileErrorKind::NoSpace));
    log.append(1, record::log_head(&store_with(1, 1, 1, hs(1, 1, 1))));
    drive(&mut fs, &mut log);
    assert!(log.poll_done().is_none());
    let why = log.fatal().expect("failed");
    assert!(why.contains("sync cluster/meta-"), "{why}");
}

/// Opens with `candidate` as the identity a fresh disk would get; returns the one in use.
fn identity_after_open(fs: &mut MemFs, candidate: [u8; 16]) -> Result<[u8; 16], String> {
    let mut log = MetaLog::open(VOTERS.to_vec(), 1 << 20, candidate);
    assert!(drive(fs, &mut log));
    match log.fatal() {
        Some(why) => Err(why.to_owned()),
        None => Ok(log.storage_id()),
    }
}

#[test]
fn the_storage_identity_is_kept_across_restarts_and_new_on_a_wiped_disk() {
    let mut fs = MemFs::new();
    assert_eq!(identity_after_open(&mut fs, [1; 16]), Ok([1; 16]));
    assert_eq!(
        fs.file(IDENTITY),
        Some(&b"01010101010101010101010101010101\n"[..])
    );
    // A restart (a new process, so a new candidate) keeps the disk's, even after a power loss.
    fs.crash(Crash::Power);
    assert_eq!(identity_after_open(&mut fs, [2; 16]), Ok([1; 16]));
    // A wiped directory is a new disk.
    let mut wiped = MemFs::new();
    assert_eq!(identity_after_open(&mut wiped, [3; 16]), Ok([3; 16]));
}

#[test]
fn a_crash_while_the_identity_is_written_leaves_none_or_the_whole_one() {
    for step in 0..12 {
        let mut fs = MemFs::new();
        fs.crash_at_step(step, None);
        let mut log = MetaLog::open(VOTERS.to_vec(), 1 << 20, [4; 16]);
        let survived = drive(&mut fs, &mut log);
        fs.crash(Crash::Power);
        let id = identity_after_open(&mut fs, [5; 16]).expect("never a corrupt identity");
        // Before the start finished, nothing was announced: either identity is fine. After,
        // the first one must hold.
        if survived && log.is_open() {
            assert_eq!(id, [4; 16], "step {step}");
        }
        assert!(
            !fs.files().contains_key(IDENTITY_TMP),
            "step {step}: the temp file is removed"
        );
    }
}

#[test]
fn a_corrupt_identity_stops_the_start_naming_the_file() {
    for bad in [&b"0101"[..], &b"+1010101010101010101010101010101\n"[..]] {
        let mut fs = MemFs::new();
        assert!(identity_after_open(&mut fs, [1; 16]).is_ok());
        fs.put_file(IDENTITY, bad.to_vec());
        let why = identity_after_open(&mut fs, [2; 16]).unwrap_err();
        assert!(why.contains("cluster/storage.id is corrupt"), "{why}");
    }
}
