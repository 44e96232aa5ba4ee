//! The metadata log on disk: one append-only file of checksummed records.
//!
//! Each `Ready` that carries entries or a new hard state becomes one record, appended and
//! synced before raft is told it is durable. Replay applies records in order: an entries
//! record replaces any entries at or after its first index (a new leader's log overwriting an
//! unconfirmed tail), a hard-state record replaces the hard state. A torn or corrupt tail ends
//! the replay; it was never confirmed, so nobody was promised it.
//!
//! A snapshot record (kind 3) holds the whole state machine at an index: it is what a
//! snapshot file contains (one such record), and what the log holds when a leader sent this
//! node a snapshot. Replay is the snapshot file, then each log file in order: entries at or
//! below the snapshot's index are already in it and are skipped, and an older snapshot
//! record never replaces a newer one.
//!
//! Record: `u32 body_len | u32 crc32c(body) | body`, little-endian; body: `u8 kind | …`.
//! Snapshot body: `u8 3 | u64 index | u64 term | u32 n | n × u64 voter | u32 len | data`.

use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Snapshot, SnapshotMetadata};

use super::store::MetaStore;

/// The largest record replay accepts: bounds what a corrupt length can make us allocate.
pub const MAX_RECORD_BYTES: usize = 16 << 20;

const KIND_ENTRIES: u8 = 1;
const KIND_HARD_STATE: u8 = 2;
const KIND_SNAPSHOT: u8 = 3;
const HEADER: usize = 8;
/// Entries per record when a whole log is rewritten, so no record nears the replay bound.
const HEAD_CHUNK_BYTES: usize = 1 << 20;

/// Encodes one record holding `entries` (possibly none) and then `hard_state` (if any).
pub(crate) fn encode(entries: &[Entry], hard_state: Option<&HardState>, out: &mut Vec<u8>) {
    if !entries.is_empty() {
        let mut body = vec![KIND_ENTRIES];
        body.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for e in entries {
            body.push(e.entry_type as u8);
            body.extend_from_slice(&e.term.to_le_bytes());
            body.extend_from_slice(&e.index.to_le_bytes());
            put_bytes(&mut body, &e.data);
            put_bytes(&mut body, &e.context);
        }
        frame(&body, out);
    }
    if let Some(hs) = hard_state {
        let mut body = vec![KIND_HARD_STATE];
        body.extend_from_slice(&hs.term.to_le_bytes());
        body.extend_from_slice(&hs.vote.to_le_bytes());
        body.extend_from_slice(&hs.commit.to_le_bytes());
        frame(&body, out);
    }
}

/// Encodes one snapshot record.
pub(crate) fn encode_snapshot(snap: &Snapshot, out: &mut Vec<u8>) {
    let m = snap.get_metadata();
    let voters = &m.get_conf_state().voters;
    let mut body = Vec::with_capacity(snap.data.len() + 32 + voters.len() * 8);
    body.push(KIND_SNAPSHOT);
    body.extend_from_slice(&m.index.to_le_bytes());
    body.extend_from_slice(&m.term.to_le_bytes());
    body.extend_from_slice(&(voters.len() as u32).to_le_bytes());
    for v in voters {
        body.extend_from_slice(&v.to_le_bytes());
    }
    put_bytes(&mut body, &snap.data);
    frame(&body, out);
}

/// The snapshot file for `store`'s snapshot: one snapshot record. `None` before any.
pub fn snapshot_file(store: &MetaStore) -> Option<Vec<u8>> {
    if store.snapshot_point().0 == 0 {
        return None;
    }
    let mut out = Vec::new();
    encode_snapshot(&raft::Storage::snapshot(store, 0, 0).ok()?, &mut out);
    Some(out)
}

/// A fresh log's first records: everything `store` holds after its snapshot (the entries,
/// in records of bounded size, then the hard state). Empty for a blank store.
pub fn log_head(store: &MetaStore) -> Vec<u8> {
    let mut out = Vec::new();
    let entries = store.entries_after_snapshot();
    let mut from = 0;
    while from < entries.len() {
        let mut to = from;
        let mut bytes = 0;
        while to < entries.len() && (to == from || bytes < HEAD_CHUNK_BYTES) {
            bytes += 25 + entries[to].data.len() + entries[to].context.len();
            to += 1;
        }
        encode(&entries[from..to], None, &mut out);
        from = to;
    }
    if *store.hard_state() != HardState::default() {
        encode(&[], Some(store.hard_state()), &mut out);
    }
    out
}

fn put_bytes(body: &mut Vec<u8>, b: &[u8]) {
    body.extend_from_slice(&(b.len() as u32).to_le_bytes());
    body.extend_from_slice(b);
}

fn frame(body: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    out.extend_from_slice(body);
}

/// What replay found.
#[derive(Debug)]
pub struct Replayed {
    pub store: MetaStore,
    /// Bytes of whole, valid records: the file is cut back to this before appending.
    pub valid_len: usize,
    /// Why replay stopped before the end, if it did.
    pub torn: Option<String>,
}

/// Rebuilds the store from one log file's bytes.
pub fn replay(voters: Vec<u64>, bytes: &[u8]) -> Replayed {
    let mut r = Replayer::new(voters);
    let (valid_len, torn) = r.log(bytes);
    Replayed {
        store: r.finish(),
        valid_len,
        torn,
    }
}

/// Replay over several files: the snapshot file (if any), then each log file in order.
#[derive(Debug)]
pub struct Replayer {
    store: MetaStore,
}

impl Replayer {
    pub fn new(voters: Vec<u64>) -> Replayer {
        Replayer {
            store: MetaStore::new(voters),
        }
    }

    /// A snapshot file: exactly one whole snapshot record. It was renamed into place only
    /// after it was synced, so anything else is corruption, not a torn write.
    pub fn snapshot_file(&mut self, bytes: &[u8]) -> Result<(), String> {
        let (body, len) = record_at(bytes)?;
        if len != bytes.len() {
            return Err(format!(
                "{} bytes after the snapshot record",
                bytes.len() - len
            ));
        }
        if body.first() != Some(&KIND_SNAPSHOT) {
            return Err("not a snapshot record".into());
        }
        apply(&mut self.store, body)
    }

    /// One log file; returns the bytes of whole valid records and why replay stopped short.
    pub fn log(&mut self, bytes: &[u8]) -> (usize, Option<String>) {
        let mut at = 0;
        let torn = loop {
            if at == bytes.len() {
                break None;
            }
            match record_at(&bytes[at..]) {
                Ok((body, len)) => match apply(&mut self.store, body) {
                    Ok(()) => at += len,
                    Err(e) => break Some(format!("record at byte {at}: {e}")),
                },
                Err(e) => break Some(format!("record at byte {at}: {e}")),
            }
        };
        (at, torn)
    }

    /// The store, its hard state kept consistent with what survived: the commit is at least
    /// the snapshot's index (an old log's hard state may predate it) and at most the last
    /// entry (raft-rs refuses to start otherwise).
    pub fn finish(mut self) -> MetaStore {
        let (index, term) = self.store.snapshot_point();
        let mut hs = self.store.hard_state().clone();
        if hs != HardState::default() || index > 0 {
            hs.commit = hs.commit.max(index).min(self.store.last_index_now());
            hs.term = hs.term.max(term);
            self.store.set_hard_state(hs);
        }
        self.store
    }
}

fn record_at(b: &[u8]) -> Result<(&[u8], usize), String> {
    if b.len() < HEADER {
        return Err("torn header".into());
    }
    let len = u32::from_le_bytes(b[0..4].try_into().unwrap()) as usize;
    if len > MAX_RECORD_BYTES {
        return Err(format!("length {len} over {MAX_RECORD_BYTES}"));
    }
    let crc = u32::from_le_bytes(b[4..8].try_into().unwrap());
    let body = b.get(HEADER..HEADER + len).ok_or("torn body")?;
    if crc32c::crc32c(body) != crc {
        return Err("checksum mismatch".into());
    }
    Ok((body, HEADER + len))
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("record body too short".into());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

fn apply(store: &mut MetaStore, body: &[u8]) -> Result<(), String> {
    let mut r = Reader(body);
    match r.u8()? {
        KIND_ENTRIES => {
            let n = r.u32()? as usize;
            // Each entry takes at least 25 bytes, so a count the body cannot hold is refused
            // before anything is allocated for it.
            if n > body.len() / 25 {
                return Err(format!("{n} entries cannot fit in {} bytes", body.len()));
            }
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                let mut e = Entry::default();
                e.entry_type = match r.u8()? {
                    0 => EntryType::EntryNormal,
                    1 => EntryType::EntryConfChange,
                    2 => EntryType::EntryConfChangeV2,
                    t => return Err(format!("entry type {t}")),
                };
                e.term = r.u64()?;
                e.index = r.u64()?;
                e.data = r.bytes()?.to_vec().into();
                e.context = r.bytes()?.to_vec().into();
                entries.push(e);
            }
            if entries.windows(2).any(|w| w[1].index != w[0].index + 1) {
                return Err("entries are not contiguous".into());
            }
            if entries.first().is_some_and(|e| e.index == 0) {
                return Err("entries start at 0".into());
            }
            // What a snapshot already covers (an old log replayed after a newer snapshot).
            let covered = store.snapshot_point().0;
            entries.retain(|e| e.index > covered);
            if let Some(first) = entries.first() {
                let last = store.last_index_now();
                if first.index > last + 1 {
                    return Err(format!("entries start at {} after {last}", first.index));
                }
            }
            store.append(&entries);
        }
        KIND_HARD_STATE => {
            let mut hs = HardState::default();
            hs.term = r.u64()?;
            hs.vote = r.u64()?;
            hs.commit = r.u64()?;
            store.set_hard_state(hs);
        }
        KIND_SNAPSHOT => {
            let mut meta = SnapshotMetadata::default();
            meta.index = r.u64()?;
            meta.term = r.u64()?;
            let n = r.u32()? as usize;
            if n > body.len() / 8 {
                return Err(format!("{n} voters cannot fit in {} bytes", body.len()));
            }
            let mut conf = ConfState::default();
            for _ in 0..n {
                conf.voters.push(r.u64()?);
            }
            meta.set_conf_state(conf);
            let data = r.bytes()?;
            crate::meta::Metadata::restore(data)
                .map_err(|e| format!("snapshot data does not decode: {e}"))?;
            if !r.0.is_empty() {
                return Err("trailing bytes in record".into());
            }
            // A snapshot no newer than the one already held changes nothing.
            if meta.index > store.snapshot_point().0 {
                let mut snap = Snapshot::default();
                snap.data = data.to_vec().into();
                snap.set_metadata(meta);
                store.apply_snapshot(&snap);
            }
        }
        k => return Err(format!("record kind {k}")),
    }
    if !r.0.is_empty() {
        return Err("trailing bytes in record".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
        let mut e = Entry::default();
        e.index = index;
        e.term = term;
        e.data = data.to_vec().into();
        e
    }

    fn hs(term: u64, vote: u64, commit: u64) -> HardState {
        let mut h = HardState::default();
        h.term = term;
        h.vote = vote;
        h.commit = commit;
        h
    }

    #[test]
    fn replay_rebuilds_entries_and_hard_state_and_a_later_leader_overwrites_a_tail() {
        let mut log = Vec::new();
        encode(
            &[entry(1, 1, b"a"), entry(2, 1, b"b"), entry(3, 1, b"c")],
            Some(&hs(1, 1, 1)),
            &mut log,
        );
        encode(
            &[entry(3, 2, b"C"), entry(4, 2, b"d")],
            Some(&hs(2, 3, 3)),
            &mut log,
        );
        let r = replay(vec![1, 2, 3], &log);
        assert_eq!(r.torn, None);
        assert_eq!(r.valid_len, log.len());
        let e = r.store.entries_after_snapshot();
        let got: Vec<(u64, u64, &[u8])> =
            e.iter().map(|e| (e.index, e.term, &e.data[..])).collect();
        assert_eq!(
            got,
            vec![(1, 1, &b"a"[..]), (2, 1, b"b"), (3, 2, b"C"), (4, 2, b"d")]
        );
        assert_eq!(r.store.hard_state(), &hs(2, 3, 3));
    }

    #[test]
    fn every_torn_prefix_replays_the_whole_records_before_it() {
        let mut log = Vec::new();
        encode(&[entry(1, 1, b"first")], None, &mut log);
        let one = log.len();
        encode(&[entry(2, 1, b"second")], Some(&hs(1, 0, 2)), &mut log);
        for cut in 0..log.len() {
            let r = replay(vec![1, 2, 3], &log[..cut]);
            let expect = if cut >= one { one } else { 0 };
            // The hard state record follows the entries record, so it counts only whole.
            assert!(r.valid_len <= cut);
            assert!(r.valid_len >= expect, "cut {cut}: valid {}", r.valid_len);
            assert_eq!(r.torn.is_some(), r.valid_len != cut, "cut {cut}");
        }
    }

    #[test]
    fn a_flipped_bit_or_an_absurd_length_stops_replay_without_allocating_it() {
        let mut log = Vec::new();
        encode(&[entry(1, 1, b"x")], None, &mut log);
        let mut bad = log.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let r = replay(vec![1, 2, 3], &bad);
        assert_eq!(r.valid_len, 0);
        assert!(r.torn.unwrap().contains("checksum"));

        let mut huge = Vec::new();
        huge.extend_from_slice(&((MAX_RECORD_BYTES + 1) as u32).to_le_bytes());
        huge.extend_from_slice(&[0; 4]);
        assert!(replay(vec![1], &huge).torn.unwrap().contains("over"));

        // A valid checksum over a body whose entry count it cannot hold.
        let mut body = vec![KIND_ENTRIES];
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        let mut lie = Vec::new();
        frame(&body, &mut lie);
        assert!(replay(vec![1], &lie).torn.unwrap().contains("cannot fit"));
    }

    fn snap(index: u64, term: u64) -> Snapshot {
        let mut meta = SnapshotMetadata::default();
        meta.index = index;
        meta.term = term;
        let mut cs = ConfState::default();
        cs.voters = vec![1, 2, 3];
        meta.set_conf_state(cs);
        let mut s = Snapshot::default();
        let m = crate::meta::Metadata::new(vec![crate::ids::NodeId::new("n1")]);
        s.data = m.snapshot().into();
        s.set_metadata(meta);
        s
    }

    #[test]
    fn a_snapshot_record_is_exact_bytes_and_replays_to_the_same_store() {
        let s = snap(0x0102, 3);
        let mut out = Vec::new();
        encode_snapshot(&s, &mut out);
        let data = s.data.to_vec();
        let mut body = vec![KIND_SNAPSHOT];
        body.extend_from_slice(&0x0102u64.to_le_bytes());
        body.extend_from_slice(&3u64.to_le_bytes());
        body.extend_from_slice(&3u32.to_le_bytes());
        for v in [1u64, 2, 3] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.extend_from_slice(&(data.len() as u32).to_le_bytes());
        body.extend_from_slice(&data);
        let mut expect = (body.len() as u32).to_le_bytes().to_vec();
        expect.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        expect.extend_from_slice(&body);
        assert_eq!(out, expect);

        let mut r = Replayer::new(vec![1, 2, 3]);
        r.snapshot_file(&out).unwrap();
        let store = r.finish();
        assert_eq!(store.snapshot_point(), (0x0102, 3));
        assert_eq!(store.snapshot_data(), &data[..]);
        assert_eq!(store.hard_state(), &hs(3, 0, 0x0102));
        assert_eq!(
            snapshot_file(&store).unwrap(),
            out,
            "re-encodes to the same bytes"
        );
        assert!(snapshot_file(&MetaStore::new(vec![1])).is_none());
    }

    #[test]
    fn a_snapshot_file_must_be_one_whole_snapshot_record() {
        let mut out = Vec::new();
        encode_snapshot(&snap(5, 1), &mut out);
        for cut in 0..out.len() {
            let mut r = Replayer::new(vec![1, 2, 3]);
            assert!(r.snapshot_file(&out[..cut]).is_err(), "cut {cut}");
        }
        let mut two = out.clone();
        encode(&[entry(6, 1, b"x")], None, &mut two);
        assert!(Replayer::new(vec![1]).snapshot_file(&two).is_err());
        let mut entries = Vec::new();
        encode(&[entry(1, 1, b"x")], None, &mut entries);
        let e = Replayer::new(vec![1]).snapshot_file(&entries).unwrap_err();
        assert!(e.contains("not a snapshot"), "{e}");
        // A snapshot whose data is not metadata is refused whole.
        let mut bad = snap(5, 1);
        bad.data = b"{not json".to_vec().into();
        let mut out = Vec::new();
        encode_snapshot(&bad, &mut out);
        let e = Replayer::new(vec![1]).snapshot_file(&out).unwrap_err();
        assert!(e.contains("does not decode"), "{e}");
    }

    /// A crash after the snapshot was renamed in but before the old log was removed: replay
    /// reads the snapshot, then the old log (whose entries up to the snapshot are skipped and
    /// whose stale hard state cannot pull the commit below it), then the new log.
    #[test]
    fn replay_is_the_snapshot_then_every_log_after_it() {
        let mut old = Vec::new();
        encode(
            &[entry(1, 1, b"a"), entry(2, 1, b"b"), entry(3, 1, b"c")],
            Some(&hs(1, 1, 1)),
            &mut old,
        );
        encode(&[entry(4, 1, b"d")], None, &mut old);
        let mut file = Vec::new();
        encode_snapshot(&snap(3, 1), &mut file);
        let mut r = Replayer::new(vec![1, 2, 3]);
        r.snapshot_file(&file).unwrap();
        assert_eq!(r.log(&old), (old.len(), None));
        let store = r.finish();
        assert_eq!(store.snapshot_point(), (3, 1));
        let idx: Vec<u64> = store
            .entries_after_snapshot()
            .iter()
            .map(|e| e.index)
            .collect();
        assert_eq!(idx, vec![4]);
        assert_eq!(store.hard_state(), &hs(1, 1, 3));

        // The new log as compaction writes it: the head, then a later record.
        let mut new = log_head(&store);
        encode(&[entry(5, 2, b"e")], Some(&hs(2, 2, 5)), &mut new);
        let mut r = Replayer::new(vec![1, 2, 3]);
        r.snapshot_file(&file).unwrap();
        r.log(&old);
        assert_eq!(r.log(&new), (new.len(), None));
        let both = r.finish();
        let mut r = Replayer::new(vec![1, 2, 3]);
        r.snapshot_file(&file).unwrap();
        r.log(&new);
        let new_only = r.finish();
        let got: Vec<(u64, u64)> = both
            .entries_after_snapshot()
            .iter()
            .map(|e| (e.index, e.term))
            .collect();
        assert_eq!(got, vec![(4, 1), (5, 2)]);
        assert_eq!(both.hard_state(), &hs(2, 2, 5));
        assert_eq!(format!("{both:?}"), format!("{new_only:?}"));

        // An older snapshot record in a log never replaces a newer snapshot.
        let mut stale = Vec::new();
        encode_snapshot(&snap(2, 1), &mut stale);
        let mut r = Replayer::new(vec![1, 2, 3]);
        r.snapshot_file(&file).unwrap();
        r.log(&stale);
        assert_eq!(r.finish().snapshot_point(), (3, 1));
    }

    #[test]
    fn a_gap_in_indexes_is_refused() {
        let mut log = Vec::new();
        encode(&[entry(1, 1, b"a")], None, &mut log);
        encode(&[entry(3, 1, b"c")], None, &mut log);
        let r = replay(vec![1], &log);
        assert!(r.torn.unwrap().contains("start at 3"));
        assert_eq!(r.store.last_index_now(), 1);
    }
}
