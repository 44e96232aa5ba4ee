//! Replication against the memfs: framed reads shipped from a leader log and appended on
//! a follower, truncation with crashes at every op, and the replica state file.

use bytes::Bytes;

use super::tests::{cfg, Rig, DIR};
use super::*;
use crate::memfs::{Crash, MemFs};
use crate::record::{EntryExt, ProducerMark};
use crate::replica_state::{Epoch, ReplicaState, ReplicaStateError, REPLICA_STATE_FILE};

pub(super) fn body(i: usize) -> Vec<u8> {
    format!("record-{i:04}-{}", "x".repeat(i % 13)).into_bytes()
}

/// A leader with `n` batches of 1 to 3 records; every fifth carries a producer mark.
fn leader(log_cfg: LogConfig, n: usize) -> Rig {
    let mut rig = Rig::new(log_cfg);
    for i in 0..n {
        let payloads: Vec<Bytes> = (0..1 + i % 3)
            .map(|k| Bytes::from(body(i * 3 + k)))
            .collect();
        let batch = Batch {
            time_us: 5_000 + i as u64,
            publisher: Some(b"pub"),
            payloads: &payloads,
        };
        if i % 5 == 0 {
            let ext = EntryExt {
                producer: Some(ProducerMark {
                    producer: 77,
                    sequence: i as u64,
                    digest: 0xd1,
                }),
                state: None,
            };
            rig.log.append_ext(rig.t0, batch, &ext).expect("append");
        } else {
            rig.log.append(rig.t0, batch).expect("append");
        }
        rig.appended.extend(payloads);
        if i % 4 == 3 {
            rig.pump();
        }
    }
    rig.pump();
    rig
}

pub(super) fn framed(rig: &mut Rig, from: u64, max_bytes: usize) -> FramedBatch {
    let ticket = rig.log.read_framed(from, max_bytes).expect("read_framed");
    rig.pump();
    rig.framed
        .remove(&ticket)
        .expect("answered")
        .expect("framed read ok")
}

/// Appends `count` one-record entries of `payload` in this turn (one write once pumped).
fn append_unnamed(rig: &mut Rig, payload: &Bytes, count: usize) {
    for _ in 0..count {
        let batch = Batch {
            time_us: 1,
            publisher: None,
            payloads: std::slice::from_ref(payload),
        };
        rig.log.append(rig.t0, batch).unwrap();
    }
}

fn reads_issued(rig: &Rig) -> usize {
    rig.ops_seen
        .iter()
        .filter(|k| matches!(k, FileOpKind::Read { .. }))
        .count()
}

/// Ships everything durable on `leader` to `follower`, `max_bytes` at a time.
fn ship(leader: &mut Rig, follower: &mut Rig, max_bytes: usize) -> usize {
    for rounds in 0..10_000 {
        let from = follower.log.next_offset();
        let b = framed(leader, from, max_bytes);
        if b.entries.is_empty() {
            assert_eq!((b.base, b.end, b.record_count), (from, from, 0));
            return rounds;
        }
        assert_eq!(b.base, from);
        assert_eq!(u64::from(b.record_count), b.end - b.base);
        let end = follower
            .log
            .append_framed(follower.t0, b.base, b.entries.clone())
            .expect("append_framed");
        assert_eq!(end, b.end);
        follower.pump();
    }
    panic!("shipping did not finish");
}

pub(super) fn segment_files(rig: &Rig) -> Vec<(String, Vec<u8>)> {
    rig.fs
        .files()
        .into_iter()
        .filter(|(p, _)| p.ends_with(".seg"))
        .map(|(p, b)| (p, b.to_vec()))
        .collect()
}

#[test]
fn shipped_entries_make_the_follower_byte_for_byte_the_leader() {
    for tail_cache_bytes in [DEFAULT_TAIL_CACHE_BYTES, 0] {
        let c = LogConfig {
            tail_cache_bytes,
            ..cfg(FsyncMode::OnCommit, 400)
        };
        let mut lead = leader(c.clone(), 60);
        let mut follow = Rig::new(c);
        let reads_before = reads_issued(&lead);
        let rounds = ship(&mut lead, &mut follow, 700);
        let file_reads = reads_issued(&lead) - reads_before;
        if tail_cache_bytes == 0 {
            assert!(
                file_reads >= rounds,
                "{file_reads} reads for {rounds} rounds"
            );
        } else {
            assert_eq!(file_reads, 0, "the tail cache answers alone");
        }
        assert!(rounds > 5, "several rounds: {rounds}");
        assert!(lead.log.segment_count() >= 4);
        assert_eq!(segment_files(&lead), segment_files(&follow));
        assert_eq!(follow.log.next_offset(), lead.log.next_offset());
        assert_eq!(
            follow.durable,
            lead.log.next_offset(),
            "durable covers them"
        );
        assert_eq!(follow.log.durable_offset(), lead.log.next_offset());

        // The engine sees every entry, with its producer mark, as recovery would show it.
        let mut metas = Vec::new();
        while let Some(e) = follow.log.take_appended() {
            metas.push(e);
        }
        assert_eq!(metas.len(), 60);
        let marks: Vec<u64> = metas
            .iter()
            .filter_map(|e| e.ext.as_ref()?.producer.map(|m| m.sequence))
            .collect();
        assert_eq!(marks, (0..60).step_by(5).collect::<Vec<u64>>());
        let reopened = follow.reopen(Crash::Power);
        let mut scanned = reopened;
        let mut rec_marks = Vec::new();
        while let Some(x) = scanned.log.take_scanned_ext() {
            rec_marks.push(x.producer.unwrap().sequence);
        }
        assert_eq!(rec_marks, marks, "the same marks recovery finds");
        // Records keep the leader's append times.
        let page = scanned.read(0, 3, 1 << 20);
        assert_eq!(page.batches[0].time_us, 5_000);
        assert_eq!(page.batches[1].time_us, 5_001);
    }
}

#[test]
fn a_framed_read_from_the_tail_cache_shares_the_written_bytes() {
    let mut lead = leader(cfg(FsyncMode::OnCommit, 1 << 20), 3);
    let before = reads_issued(&lead);
    let ticket = lead.log.read_framed(0, 1 << 20).unwrap();
    // Queued before the call returned: no file op.
    lead.collect();
    assert_eq!(reads_issued(&lead), before);
    let b = lead.framed.remove(&ticket).unwrap().unwrap();
    let t = &lead.log.tail[0];
    assert_eq!(
        b.entries.as_ptr(),
        t.bytes.as_ptr(),
        "a slice of the write, not a copy"
    );
    let seg = lead.fs.file(&Rig::seg_path(0)).unwrap();
    let at = SEGMENT_HEADER_LEN_USIZE;
    // The three batches went out as one write: all three entries, as the file holds them.
    assert_eq!(&seg[at..], &b.entries[..]);
    assert_eq!((b.base, b.end, b.record_count), (0, 6, 6));
}

const SEGMENT_HEADER_LEN_USIZE: usize = crate::record::SEGMENT_HEADER_LEN as usize;

#[test]
fn max_bytes_is_honoured_at_its_edge_and_one_entry_always_goes() {
    for tail_cache_bytes in [DEFAULT_TAIL_CACHE_BYTES, 0] {
        let mut rig = Rig::new(LogConfig {
            tail_cache_bytes,
            ..cfg(FsyncMode::OnCommit, 1 << 20)
        });
        // Three one-record entries appended in one turn: one write.
        let p = Bytes::from_static(b"0123456789");
        append_unnamed(&mut rig, &p, 3);
        rig.pump();
        let len = crate::record::entry_len(b"", &[&p[..]]);
        for (max, entries) in [
            (3 * len, 3),
            (2 * len + len - 1, 2),
            (2 * len, 2),
            (2 * len - 1, 1),
            (len, 1),
            (1, 1),
            (0, 1),
        ] {
            let b = framed(&mut rig, 0, max);
            assert_eq!(
                b.entries.len(),
                entries * len,
                "max {max} cache {tail_cache_bytes}"
            );
            assert_eq!(b.end, entries as u64);
        }
        // From the second entry, and from past the end.
        let b = framed(&mut rig, 1, len);
        assert_eq!((b.base, b.end), (1, 2));
        let b = framed(&mut rig, 3, len);
        assert!(b.entries.is_empty() && b.base == 3 && b.end == 3);
    }
}

#[test]
fn a_framed_read_from_late_in_one_write_stops_at_the_next_write() {
    // Sim canary seed 2 (debug): the next write's first entry lies at the start of its own
    // buffer, below where the first entry sits in its buffer; measuring across the two
    // overflowed.
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    append_unnamed(&mut rig, &Bytes::from_static(b"0123456789"), 3);
    rig.pump();
    append_unnamed(&mut rig, &Bytes::from_static(b"x"), 1);
    rig.pump();
    let b = framed(&mut rig, 2, 1 << 20);
    assert_eq!((b.base, b.end), (2, 3), "one write per framed read");
    let b = framed(&mut rig, 3, 1 << 20);
    assert_eq!((b.base, b.end), (3, 4));
}

#[test]
fn a_framed_read_ships_only_durable_entries() {
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    rig.append(&[b"one"]);
    rig.pump();
    rig.append(&[b"two"]);
    // Run the write, not the sync after it.
    for _ in 0..10 {
        if rig.log.written_offset == 2 {
            break;
        }
        rig.step();
    }
    assert_eq!((rig.log.written_offset, rig.log.synced_offset()), (2, 1));
    let b = framed(&mut rig, 0, 1 << 20);
    // `framed` pumped the sync too, but the answer was fixed when asked.
    assert_eq!((b.base, b.end), (0, 1));
    let b = framed(&mut rig, 1, 1 << 20);
    assert_eq!((b.base, b.end), (1, 2));
}

#[test]
fn a_leader_shipping_before_its_sync_reads_what_is_written_and_hears_of_each_write() {
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    rig.log.ship_before_sync(true);
    rig.append(&[b"one"]);
    rig.pump();
    rig.append(&[b"two"]);
    for _ in 0..10 {
        if rig.log.written_offset == 2 {
            break;
        }
        rig.step();
    }
    assert_eq!((rig.log.written_offset, rig.log.synced_offset()), (2, 1));
    assert_eq!(rig.written, [1, 2], "each write, as it lands");
    // Not synced yet, and shipped all the same.
    let b = framed(&mut rig, 1, 1 << 20);
    assert_eq!((b.base, b.end), (1, 2));
    // Off again, as a leader stepping down: synced only.
    rig.log.ship_before_sync(false);
    rig.append(&[b"three"]);
    for _ in 0..10 {
        if rig.log.written_offset == 3 {
            break;
        }
        rig.step();
    }
    assert!(rig.log.synced_offset() < 3);
    let b = framed(&mut rig, 2, 1 << 20);
    assert_eq!(
        (b.end, b.record_count),
        (2, 0),
        "only what is synced: nothing yet"
    );
}

#[test]
fn a_mid_entry_start_ships_the_whole_entry_and_a_follower_off_the_boundary_refuses_it() {
    let mut lead = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    lead.append(&[b"a", b"b", b"c"]);
    lead.append(&[b"d"]);
    lead.pump();
    let b = framed(&mut lead, 1, 1 << 20);
    // (Two writes: the rig polls after each append, so the tail stops after the first.)
    assert_eq!((b.base, b.end, b.record_count), (0, 3, 3));
    // A follower that diverged: one record where the leader's entry holds three.
    let mut follow = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    follow.append(&[b"z"]);
    follow.pump();
    assert_eq!(
        follow
            .log
            .append_framed(follow.t0, b.base, b.entries.clone()),
        Err(AppendError::NotContiguous {
            expected: 1,
            got: 0
        })
    );
    // Cut back to a boundary both share, then the batch goes on.
    follow.log.truncate_to(0).unwrap();
    follow.pump();
    assert_eq!(follow.truncated, vec![Ok(0)]);
    assert_eq!(follow.log.append_framed(follow.t0, 0, b.entries), Ok(3));
    follow.pump();
    ship(&mut lead, &mut follow, 1 << 20);
    assert_eq!(follow.log.next_offset(), 4);
    assert_eq!(segment_files(&lead), segment_files(&follow));
}

#[test]
fn damaged_cut_short_or_gapped_entries_are_refused_whole() {
    let lead = leader(cfg(FsyncMode::OnCommit, 1 << 20), 6);
    // One write per pump: read the first four batches' worth from the file.
    let mut file = lead
        .fs
        .file(&Rig::seg_path(0))
        .unwrap()
        .to_vec()
        .split_off(SEGMENT_HEADER_LEN_USIZE);
    let mut follow = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    let ops_before = follow.ops_seen.len();
    let first_len = crate::record::u32_at(&file, 0) as usize + 8;
    for i in [0, 5, 12, first_len - 1, first_len + 3, file.len() - 1] {
        let mut bad = file.clone();
        bad[i] ^= 0x40;
        let got = follow.log.append_framed(follow.t0, 0, Bytes::from(bad));
        assert!(
            matches!(got, Err(AppendError::Damaged { .. })),
            "flip at {i}: {got:?}"
        );
    }
    let got = follow.log.append_framed(
        follow.t0,
        0,
        Bytes::copy_from_slice(&file[..file.len() - 1]),
    );
    assert!(matches!(got, Err(AppendError::Damaged { .. })), "{got:?}");
    // The second entry left out: a gap.
    let second_len = crate::record::u32_at(&file, first_len) as usize + 8;
    let mut gapped = file[..first_len].to_vec();
    gapped.extend_from_slice(&file[first_len + second_len..]);
    assert_eq!(
        follow.log.append_framed(follow.t0, 0, Bytes::from(gapped)),
        Err(AppendError::NotContiguous {
            expected: 1,
            got: 1 + 2
        })
    );
    assert_eq!(
        follow
            .log
            .append_framed(follow.t0, 3, Bytes::from(file.clone())),
        Err(AppendError::NotContiguous {
            expected: 0,
            got: 3
        })
    );
    assert_eq!(
        follow.log.append_framed(follow.t0, 0, Bytes::new()),
        Err(AppendError::Empty)
    );
    follow.collect();
    assert_eq!(follow.ops_seen.len(), ops_before, "nothing was written");
    assert_eq!(follow.log.next_offset(), 0);
    assert!(follow.log.take_appended().is_none());
    // The bytes as they are go in.
    let end = follow
        .log
        .append_framed(follow.t0, 0, Bytes::from(std::mem::take(&mut file)))
        .unwrap();
    assert_eq!(end, lead.log.next_offset());
    follow.pump();
    assert_eq!(segment_files(&lead), segment_files(&follow));
}

/// A log of 40 one-to-three-record entries over several 400-byte segments, all durable.
fn truncatable() -> Rig {
    truncatable_with(0)
}

fn truncatable_with(tail_cache_bytes: usize) -> Rig {
    leader(
        LogConfig {
            tail_cache_bytes,
            ..cfg(FsyncMode::OnCommit, 400)
        },
        40,
    )
}

/// Entry bases of the leader's workload (1 + i % 3 records each).
fn entry_bases(n: usize) -> Vec<u64> {
    let mut at = 0;
    (0..n)
        .map(|i| {
            let b = at;
            at += 1 + (i % 3) as u64;
            b
        })
        .collect()
}

#[test]
fn truncate_refuses_outside_the_log_off_a_boundary_or_while_busy() {
    let mut rig = truncatable();
    let next = rig.log.next_offset();
    assert_eq!(
        rig.log.truncate_to(next + 1),
        Err(TruncateError::OutOfRange {
            offset: next + 1,
            start: 0,
            next
        })
    );
    // Entry 1 holds offsets 1 and 2: 2 is inside it. Found by the scan read.
    rig.log.truncate_to(2).unwrap();
    rig.pump();
    assert_eq!(
        rig.truncated,
        vec![Err(TruncateError::NotBoundary {
            offset: 2,
            entry_base: 1,
            entry_end: 3
        })]
    );
    assert_eq!(rig.log.next_offset(), next, "nothing changed");
    // With the tail cache the refusal comes at once.
    let mut cached = truncatable_with(DEFAULT_TAIL_CACHE_BYTES);
    assert_eq!(
        cached.log.truncate_to(2),
        Err(TruncateError::NotBoundary {
            offset: 2,
            entry_base: 1,
            entry_end: 3
        })
    );
    cached.collect();
    assert!(cached.truncated.is_empty());
    rig.append(&[b"pending"]);
    assert_eq!(rig.log.truncate_to(0), Err(TruncateError::Busy));
    rig.pump();
    let t = rig.log.read(0, 1, 1).unwrap();
    assert_eq!(
        rig.log.truncate_to(0),
        Err(TruncateError::Busy),
        "a read is out"
    );
    rig.pump();
    assert!(rig.reads.remove(&t).is_some());
    // While one runs, appends and reads wait.
    rig.log.truncate_to(1).unwrap();
    assert_eq!(
        rig.log.append(
            rig.t0,
            Batch {
                time_us: 0,
                publisher: None,
                payloads: &[Bytes::from_static(b"x")]
            }
        ),
        Err(AppendError::Truncating)
    );
    assert_eq!(rig.log.read(0, 1, 1), Err(ReadError::Busy));
    rig.pump();
    assert_eq!(rig.truncated.last(), Some(&Ok(1)));
    assert_eq!(rig.log.next_offset(), 1);
    // At the end: nothing to do, reported at once.
    rig.log.truncate_to(1).unwrap();
    rig.collect();
    assert_eq!(rig.truncated.last(), Some(&Ok(1)));
}

#[test]
fn truncate_then_different_records_survive_a_crash_and_reopen() {
    let bases = entry_bases(40);
    let rig = truncatable();
    let segs_before = rig.log.segment_count();
    assert!(segs_before >= 4, "{segs_before}");
    // A cut inside an older segment, at an entry no index point names, a segment base, the
    // first offset.
    let segment_base = rig.log.segments[2].base;
    let cuts = [bases[17], segment_base, bases[5], 0];
    // Without a tail cache every cut but a segment base needs the scan read; with one, the
    // cache knows where each entry starts.
    for (cut, tail) in cuts
        .iter()
        .flat_map(|&c| [(c, 0), (c, DEFAULT_TAIL_CACHE_BYTES)])
    {
        let mut rig = truncatable_with(tail);
        let old = rig.read_all();
        let reads = reads_issued(&rig);
        rig.log.truncate_to(cut).unwrap();
        rig.pump();
        assert_eq!(rig.truncated, vec![Ok(cut)], "cut {cut}");
        let scanned = reads_issued(&rig) > reads;
        assert_eq!(
            scanned,
            tail == 0 && cut != segment_base && cut != 0,
            "cut {cut}"
        );
        assert_eq!(rig.log.next_offset(), cut);
        assert!(rig.log.segment_count() < segs_before || cut > bases[30]);
        rig.appended.truncate(cut as usize);
        let got = rig.read_all();
        assert_eq!(got[..], old[..cut as usize]);
        for i in 0..6 {
            rig.append(&[format!("new-{i}").as_bytes()]);
        }
        rig.pump();
        let mut rig = rig.reopen(Crash::Power);
        assert_eq!(rig.opened.map(|o| o.1), Some(cut + 6), "cut {cut}");
        let got = rig.read_all();
        assert_eq!(got[..cut as usize], old[..cut as usize]);
        let tail: Vec<Vec<u8>> = got[cut as usize..]
            .iter()
            .map(|(_, p)| p.to_vec())
            .collect();
        let want: Vec<Vec<u8>> = (0..6).map(|i| format!("new-{i}").into_bytes()).collect();
        assert_eq!(tail, want);
    }
}

#[test]
fn a_crash_at_every_step_of_a_truncation_leaves_a_prefix_that_is_cut_again() {
    let bases = entry_bases(40);
    let cut = bases[11];
    let mut rig = truncatable();
    let old = rig.read_all();
    let base = rig.fs.writes;
    rig.log.truncate_to(cut).unwrap();
    rig.pump();
    let steps = rig.fs.writes - base;
    assert!(
        steps >= 6,
        "unlinks, directory syncs, the cut and its sync: {steps}"
    );
    for k in 0..=steps {
        for crash in [
            Crash::Process,
            Crash::Power,
            Crash::PowerZeroed,
            Crash::PowerReordered(k as u64 + 1),
            Crash::PowerReordered(k as u64 + 91),
        ] {
            let what = format!("step {k} {crash:?}");
            let mut rig = truncatable();
            rig.fs.crash_at_step(base + k, None);
            rig.log.truncate_to(cut).unwrap();
            rig.pump();
            let mut rig = rig.reopen(crash);
            assert!(rig.failed.is_none(), "{what}: {:?}", rig.failed);
            let (_, next, _) = rig.opened.unwrap();
            assert!(next >= cut, "{what}: recovered {next}");
            let got = rig.read_all();
            assert_eq!(got[..], old[..next as usize], "{what}");
            // The rejoin cuts again, and different records follow.
            rig.log.truncate_to(cut).unwrap();
            rig.pump();
            assert_eq!(rig.truncated, vec![Ok(cut)], "{what}");
            rig.appended = rig.appended[..0].to_vec();
            rig.appended
                .extend(old[..cut as usize].iter().map(|(_, p)| p.clone()));
            rig.append(&[b"after"]);
            rig.pump();
            let mut rig = rig.reopen(Crash::Power);
            assert_eq!(rig.opened.map(|o| o.1), Some(cut + 1), "{what}");
            let got = rig.read_all();
            assert_eq!(&got[cut as usize].1[..], b"after", "{what}");
        }
    }
}

fn state(fence: u64, commit: u64, epochs: &[(u64, u64)]) -> ReplicaState {
    ReplicaState {
        fence_generation: fence,
        commit,
        log_start: 0,
        epochs: epochs
            .iter()
            .map(|&(generation, start_offset)| Epoch {
                generation,
                start_offset,
            })
            .collect(),
    }
}

#[test]
fn the_replica_state_is_loaded_at_open_and_a_damaged_file_refuses() {
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    assert_eq!(rig.log.replica_state(), &ReplicaState::default(), "missing");
    let s = state(3, 10, &[(1, 0), (3, 7)]);
    rig.log.persist_replica_state(s.clone()).unwrap();
    assert_eq!(
        rig.log.replica_state(),
        &ReplicaState::default(),
        "not yet durable"
    );
    rig.pump();
    assert_eq!(rig.states, vec![s.clone()]);
    assert_eq!(rig.log.replica_state(), &s);
    assert_eq!(
        rig.log.persist_replica_state(state(2, 10, &[])),
        Err(ReplicaStateError::FenceBack { from: 3, to: 2 })
    );
    assert_eq!(
        rig.log.persist_replica_state(state(3, 9, &[])),
        Err(ReplicaStateError::CommitBack { from: 10, to: 9 })
    );
    let rig = rig.reopen(Crash::Power);
    assert_eq!(rig.log.replica_state(), &s);

    let path = format!("{DIR}/{REPLICA_STATE_FILE}");
    for damage in 0..3 {
        let mut fs: MemFs = rig_fs(&rig);
        let mut b = fs.file(&path).unwrap().to_vec();
        match damage {
            0 => b[9] ^= 1,
            1 => b.truncate(b.len() - 1),
            _ => b.iter_mut().for_each(|x| *x = 0),
        }
        fs.put_file(&path, b);
        let bad = Rig::on(fs, cfg(FsyncMode::OnCommit, 1 << 20));
        match &bad.failed {
            Some(StorageError::Corrupt { path: p, .. }) => assert_eq!(p, &path),
            other => panic!("damage {damage}: {other:?}"),
        }
        assert!(bad.opened.is_none());
    }
}

fn rig_fs(rig: &Rig) -> MemFs {
    let mut fs = MemFs::new();
    for (path, bytes) in rig.fs.files() {
        fs.plant_file(&path, bytes.to_vec());
    }
    fs
}

#[test]
fn a_crash_at_every_step_of_a_state_write_leaves_the_old_state_or_the_new() {
    let old = state(4, 100, &[(2, 0), (4, 60)]);
    let new = state(5, 180, &[(2, 0), (4, 60), (5, 170)]);
    let build = || {
        let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
        rig.append(&[b"r"]);
        rig.log.persist_replica_state(old.clone()).unwrap();
        rig.pump();
        rig
    };
    let mut rig = build();
    let base = rig.fs.writes;
    rig.log.persist_replica_state(new.clone()).unwrap();
    rig.pump();
    let steps = rig.fs.writes - base;
    assert_eq!(steps, 5, "create, write, sync, rename, sync the directory");
    let (mut saw_old, mut saw_new) = (false, false);
    for k in 0..=steps {
        for tear in [None, Some(0), Some(7), Some(30)] {
            for crash in [
                Crash::Process,
                Crash::Power,
                Crash::PowerKeeping(5),
                Crash::PowerZeroed,
                Crash::PowerReordered(k as u64 + 3),
            ] {
                let what = format!("step {k} tear {tear:?} {crash:?}");
                let mut rig = build();
                rig.fs.crash_at_step(base + k, tear);
                rig.log.persist_replica_state(new.clone()).unwrap();
                rig.pump();
                let rig = rig.reopen(crash);
                assert!(rig.failed.is_none(), "{what}: {:?}", rig.failed);
                let got = rig.log.replica_state();
                if got == &old {
                    saw_old = true;
                } else {
                    assert_eq!(got, &new, "{what}");
                    saw_new = true;
                }
                // The leftover temporary file is gone after the open.
                assert!(!rig.files().iter().any(|f| f.ends_with(".tmp")), "{what}");
            }
        }
    }
    assert!(saw_old && saw_new);
}

#[test]
fn states_asked_for_while_one_is_written_coalesce_to_the_newest() {
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    rig.log.persist_replica_state(state(1, 1, &[])).unwrap();
    rig.collect();
    rig.log.persist_replica_state(state(1, 2, &[])).unwrap();
    rig.log.persist_replica_state(state(1, 3, &[])).unwrap();
    rig.pump();
    assert_eq!(rig.states, vec![state(1, 1, &[]), state(1, 3, &[])]);
    assert_eq!(rig.log.replica_state(), &state(1, 3, &[]));
}

#[test]
fn a_log_restarted_past_its_end_holds_only_what_follows_even_across_a_crash() {
    for start in [0, 23, 500] {
        let mut rig = truncatable();
        let segs = rig.log.segment_count();
        assert!(segs >= 4, "{segs}");
        rig.append(&[b"pending"]);
        assert_eq!(rig.log.restart_at(start), Err(TruncateError::Busy));
        rig.pump();
        rig.log.restart_at(start).unwrap();
        assert_eq!(rig.log.truncate_to(start), Err(TruncateError::Busy));
        rig.pump();
        assert_eq!(rig.truncated, vec![Ok(start)], "start {start}");
        assert_eq!(
            (rig.log.start_offset(), rig.log.next_offset()),
            (start, start)
        );
        assert_eq!(rig.log.segment_count(), 1);
        assert_eq!(segment_files(&rig).len(), 1, "the old segments are gone");
        // The rig counts offsets by what it appended.
        rig.appended = vec![Bytes::new(); start as usize];
        rig.append(&[b"after-0", b"after-1"]);
        rig.pump();
        let mut rig = rig.reopen(Crash::Power);
        assert_eq!(rig.opened.map(|o| o.1), Some(start + 2), "start {start}");
        assert_eq!(rig.log.start_offset(), start);
        let got: Vec<(u64, Vec<u8>)> = rig
            .read_all()
            .into_iter()
            .map(|(o, p)| (o, p.to_vec()))
            .collect();
        assert_eq!(
            got,
            vec![
                (start, b"after-0".to_vec()),
                (start + 1, b"after-1".to_vec())
            ]
        );
    }
}

#[test]
fn a_crash_at_every_step_of_a_restart_leaves_a_prefix_or_an_empty_log() {
    let start = 500;
    let mut rig = truncatable();
    let old = rig.read_all();
    let base = rig.fs.writes;
    rig.log.restart_at(start).unwrap();
    rig.pump();
    let steps = rig.fs.writes - base;
    for k in 0..=steps {
        for crash in [
            Crash::Process,
            Crash::Power,
            Crash::PowerReordered(k as u64 + 1),
        ] {
            let what = format!("step {k} {crash:?}");
            let mut rig = truncatable();
            rig.fs.crash_at_step(base + k, None);
            rig.log.restart_at(start).unwrap();
            rig.pump();
            let mut rig = rig.reopen(crash);
            assert!(rig.failed.is_none(), "{what}: {:?}", rig.failed);
            let (_, next, _) = rig.opened.unwrap();
            let got = rig.read_all();
            if next == start {
                assert!(got.is_empty(), "{what}");
            } else {
                assert_eq!(got[..], old[..next as usize], "{what}");
            }
            // The follower asks again and is told to start over: the restart runs again.
            rig.log.restart_at(start).unwrap();
            rig.pump();
            assert_eq!(rig.truncated, vec![Ok(start)], "{what}");
            assert_eq!(rig.log.next_offset(), start, "{what}");
        }
    }
}

#[test]
fn a_log_taking_only_shipped_entries_refuses_local_appends() {
    let c = cfg(FsyncMode::OnCommit, 400);
    let mut lead = leader(c.clone(), 6);
    let mut follow = Rig::new(c);
    follow.log.take_only_shipped(true);
    let payload = Bytes::from_static(b"local");
    let batch = Batch {
        time_us: 1,
        publisher: None,
        payloads: std::slice::from_ref(&payload),
    };
    assert_eq!(
        follow.log.append(follow.t0, batch),
        Err(AppendError::ShippedOnly)
    );
    assert_eq!(
        follow.log.next_offset(),
        0,
        "nothing was assigned an offset"
    );
    // What the leader ships still lands.
    ship(&mut lead, &mut follow, 700);
    assert_eq!(follow.log.next_offset(), lead.log.next_offset());
    // Leading again, it writes its own.
    follow.log.take_only_shipped(false);
    let at = follow.log.append(follow.t0, batch).expect("append");
    assert_eq!(at, lead.log.next_offset());
}
