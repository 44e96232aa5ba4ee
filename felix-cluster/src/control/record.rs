//! The metadata log on disk: one append-only file of checksummed records.
//!
//! Each `Ready` that carries entries or a new hard state becomes one record, appended and
//! synced before raft is told it is durable. Replay applies records in order: an entries
//! record replaces any entries at or after its first index (a new leader's log overwriting an
//! unconfirmed tail), a hard-state record replaces the hard state. A torn or corrupt tail ends
//! the replay; it was never confirmed, so nobody was promised it.
//!
//! Record: `u32 body_len | u32 crc32c(body) | body`, little-endian; body: `u8 kind | …`.

use raft::eraftpb::{Entry, EntryType, HardState};

use super::store::MetaStore;

/// The largest record replay accepts: bounds what a corrupt length can make us allocate.
pub const MAX_RECORD_BYTES: usize = 16 << 20;

const KIND_ENTRIES: u8 = 1;
const KIND_HARD_STATE: u8 = 2;
const HEADER: usize = 8;

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

/// Rebuilds the store from the log file's bytes.
pub fn replay(voters: Vec<u64>, bytes: &[u8]) -> Replayed {
    let mut store = MetaStore::new(voters);
    let mut at = 0;
    let torn = loop {
        if at == bytes.len() {
            break None;
        }
        match record_at(&bytes[at..]) {
            Ok((body, len)) => match apply(&mut store, body) {
                Ok(()) => at += len,
                Err(e) => break Some(format!("record at byte {at}: {e}")),
            },
            Err(e) => break Some(format!("record at byte {at}: {e}")),
        }
    };
    Replayed {
        store,
        valid_len: at,
        torn,
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
            if let Some(first) = entries.first() {
                let last = store.last_index_now();
                if first.index > last + 1 || first.index == 0 {
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
