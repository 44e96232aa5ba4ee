//! Gaps: a compacted log shipped to a follower whose log stays contiguous through skip
//! entries, reads across the gaps on both sides, truncation at a skip entry's boundaries,
//! and a stream follower that still refuses every gap.

use super::replica_tests::{body, framed, segment_files};
use super::tests::{cfg, Rig};
use super::*;
use crate::memfs::Crash;
use crate::record::{Step, SEGMENT_HEADER_LEN};

/// Offsets a compacted leader keeps in its sealed segments: two of every three dropped.
fn kept(offset: u64) -> bool {
    offset.is_multiple_of(3)
}

/// A leader of `n` one-record entries whose sealed segments are compacted to [`kept`].
fn compacted_leader(c: LogConfig, n: usize) -> Rig {
    let mut rig = Rig::new(c);
    for i in 0..n {
        rig.append(&[&body(i)]);
        if i % 4 == 3 {
            rig.pump();
        }
    }
    rig.pump();
    let keep: Vec<u64> = (0..n as u64).filter(|&o| kept(o)).collect();
    assert!(rig.log.compact(keep));
    rig.pump();
    assert_eq!(rig.compacted, 1);
    assert!(rig.log.segments.len() >= 2);
    rig
}

/// The leader's records: those kept below its active segment, every one from there on.
fn leader_offsets(lead: &Rig) -> Vec<u64> {
    let active = lead.log.segments.last().unwrap().base;
    (0..lead.log.next_offset())
        .filter(|&o| o >= active || kept(o))
        .collect()
}

/// Ships everything on `lead` to `follow` through the gapped append; returns the batches
/// that held fewer records than offsets.
fn ship_gapped(lead: &mut Rig, follow: &mut Rig, max_bytes: usize) -> usize {
    let mut sparse = 0;
    for _ in 0..10_000 {
        let from = follow.log.next_offset();
        let b = framed(lead, from, max_bytes);
        if b.entries.is_empty() {
            return sparse;
        }
        sparse += usize::from(u64::from(b.record_count) < b.end - b.base);
        let end = follow
            .log
            .append_framed_with_gaps(follow.t0, b.base, b.entries)
            .expect("append_framed_with_gaps");
        assert_eq!(end, b.end);
        follow.pump();
    }
    panic!("shipping did not finish");
}

/// Every entry in the rig's segment files: (segment base, entry base, entry end, skip).
fn entries(rig: &Rig) -> Vec<(u64, u64, u64, bool)> {
    let mut out = Vec::new();
    for (_, bytes) in segment_files(rig) {
        let h = crate::record::SegmentHeader::decode(&bytes).unwrap();
        let mut at = SEGMENT_HEADER_LEN as usize;
        while let Step::Entry(m) = crate::record::step(&bytes[at..]) {
            out.push((h.base, m.base, m.end(), m.skip));
            at += m.len as usize;
        }
    }
    out
}

#[test]
fn a_gapped_follower_reads_and_reships_its_skip_entries_like_any_entry() {
    for tail_cache_bytes in [DEFAULT_TAIL_CACHE_BYTES, 0] {
        let c = LogConfig {
            tail_cache_bytes,
            ..cfg(FsyncMode::OnCommit, 400)
        };
        let mut lead = compacted_leader(c.clone(), 60);
        // Record reads walk the leader's gaps, those ending a compacted segment included.
        let want = lead.read_all();
        let offsets: Vec<u64> = want.iter().map(|(o, _)| *o).collect();
        assert_eq!(offsets, leader_offsets(&lead));

        let mut a = Rig::new(c.clone());
        assert!(ship_gapped(&mut lead, &mut a, 300) > 0);
        assert_eq!(a.log.next_offset(), lead.log.next_offset());
        assert_eq!(a.durable, lead.log.next_offset());
        let on_a = entries(&a);
        assert!(on_a.windows(2).all(|w| w[0].2 == w[1].1), "contiguous");
        assert!(on_a.iter().any(|e| e.3));
        assert_eq!(a.read_all(), want, "skip entries read as nothing");

        // A follower of `a` takes its skip entries as entries: the same files, byte for
        // byte, though its batches hold fewer records than they span.
        let mut b = Rig::new(c.clone());
        assert!(ship_gapped(&mut a, &mut b, 300) > 0);
        assert_eq!(segment_files(&a), segment_files(&b));
        let b = b.reopen(Crash::Power);
        assert_eq!(b.opened.map(|o| o.1), Some(lead.log.next_offset()));
        let mut b = b;
        assert_eq!(b.read_all(), want);
    }
}

#[test]
fn a_gapped_batch_may_start_past_the_end_and_jump_but_never_overlap() {
    let c = cfg(FsyncMode::OnCommit, 1 << 20);
    let mut lead = compacted_leader(cfg(FsyncMode::OnCommit, 400), 60);
    // From 1, inside a gap: the batch starts at 3.
    let b = framed(&mut lead, 1, 1 << 20);
    assert_eq!(b.base, 3);
    let mut f = Rig::new(c);
    assert_eq!(
        f.log.append_framed_with_gaps(f.t0, 2, b.entries.clone()),
        Err(AppendError::NotContiguous {
            expected: 2,
            got: 3
        }),
        "the first entry starts at the base given"
    );
    assert_eq!(
        f.log
            .append_framed_with_gaps(f.t0, b.base, b.entries.clone()),
        Ok(b.end)
    );
    f.pump();
    assert_eq!(
        f.log.append_framed_with_gaps(f.t0, 3, b.entries.clone()),
        Err(AppendError::NotContiguous {
            expected: b.end,
            got: 3
        }),
        "what it holds is not taken again"
    );
    // The jump at the start became a skip entry of its own, stamped as the entry after it.
    let e = entries(&f);
    assert_eq!(e[0], (0, 0, 3, true));
    assert_eq!(e[1], (0, 3, 4, false));
    let page = f.read(0, 1, 1 << 20);
    assert_eq!(page.batches[0].first_offset, 3);
    assert_eq!(page.batches[0].time_us, 1_003);
    assert!(f.log.take_appended().is_some_and(|a| a.meta.base == 3));
}

#[test]
fn a_stream_follower_still_refuses_a_gap_and_a_skip_entry() {
    let c = cfg(FsyncMode::OnCommit, 400);
    let mut lead = compacted_leader(c.clone(), 60);
    let mut f = Rig::new(c.clone());
    let ops_before = f.ops_seen.len();
    // 0 is kept, 1 and 2 are not: the batch jumps from 0 to 3.
    let b = framed(&mut lead, 0, 1 << 20);
    assert_eq!(b.base, 0);
    assert_eq!(
        f.log.append_framed(f.t0, 0, b.entries.clone()),
        Err(AppendError::NotContiguous {
            expected: 1,
            got: 3
        })
    );
    // A batch that starts past the follower's end.
    let late = framed(&mut lead, 1, 1 << 20);
    assert_eq!(
        f.log.append_framed(f.t0, late.base, late.entries.clone()),
        Err(AppendError::NotContiguous {
            expected: 0,
            got: 3
        })
    );
    f.pump();
    assert_eq!(f.log.next_offset(), 0);
    assert_eq!(f.ops_seen.len(), ops_before, "nothing was written");
    assert!(f.log.take_appended().is_none());

    // A gapped follower takes both; the skip entry it writes, shipped on, is a gap too.
    let mut g = Rig::new(c);
    assert_eq!(
        g.log.append_framed_with_gaps(g.t0, 0, b.entries.clone()),
        Ok(b.end)
    );
    g.pump();
    let one = framed(&mut g, 0, 1);
    assert_eq!(f.log.append_framed(f.t0, 0, one.entries), Ok(1));
    f.pump();
    let skip = framed(&mut g, 1, 1);
    assert_eq!((skip.base, skip.end, skip.record_count), (1, 3, 0));
    assert_eq!(
        f.log.append_framed(f.t0, 1, skip.entries),
        Err(AppendError::NotContiguous {
            expected: 1,
            got: 3
        })
    );
    assert_eq!(f.log.next_offset(), 1);
}

#[test]
fn truncate_to_cuts_a_gapped_follower_at_its_skip_entries_boundaries() {
    for tail_cache_bytes in [DEFAULT_TAIL_CACHE_BYTES, 0] {
        let c = LogConfig {
            tail_cache_bytes,
            ..cfg(FsyncMode::OnCommit, 400)
        };
        let mut lead = compacted_leader(c.clone(), 60);
        let want = lead.read_all();
        let mut f = Rig::new(c.clone());
        ship_gapped(&mut lead, &mut f, 1 << 20);
        // A skip entry inside a segment, not its first, so no index point has it: the tail
        // cache finds it, or (without one) a scan of entry headers.
        let (_, base, end, _) = *entries(&f)
            .iter()
            .find(|e| e.3 && e.1 > e.0 + 3 && e.2 < f.log.next_offset())
            .expect("a skip entry inside a segment");
        assert!(end - base >= 2);
        let inside = match f.log.truncate_to(base + 1) {
            Err(e) => {
                assert!(tail_cache_bytes > 0, "known at once from the tail cache");
                Err(e)
            }
            Ok(()) => {
                assert_eq!(tail_cache_bytes, 0, "found by a scan");
                f.pump();
                f.truncated.pop().expect("reported")
            }
        };
        assert_eq!(
            inside,
            Err(TruncateError::NotBoundary {
                offset: base + 1,
                entry_base: base,
                entry_end: end
            })
        );
        // Just after the skip entry: the log ends with it.
        f.log.truncate_to(end).unwrap();
        f.pump();
        assert_eq!(f.truncated.pop(), Some(Ok(end)));
        assert_eq!(f.log.next_offset(), end);
        ship_gapped(&mut lead, &mut f, 1 << 20);
        assert_eq!(f.read_all(), want);
        // At its start: the skip entry goes, and shipping from inside the leader's gap
        // writes it again.
        f.log.truncate_to(base).unwrap();
        f.pump();
        assert_eq!(f.truncated.pop(), Some(Ok(base)));
        assert_eq!(f.log.next_offset(), base);
        ship_gapped(&mut lead, &mut f, 1 << 20);
        assert_eq!(f.log.next_offset(), lead.log.next_offset());
        assert!(entries(&f)
            .iter()
            .any(|e| (e.1, e.2, e.3) == (base, end, true)));
        let mut f = f.reopen(Crash::Power);
        assert_eq!(f.read_all(), want);
    }
}
