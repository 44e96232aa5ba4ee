//! raft-rs's `Storage` over the metadata log held in memory.
//!
//! The driver appends to it when raft hands over a `Ready` (before the bytes are durable, as
//! `advance_append_async` requires), and writes the same entries to disk as records; raft is
//! told they are durable only when the caller confirms the write (`persisted`).

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, StorageError};

/// The log, its hard state and the snapshot it starts after.
#[derive(Debug, Clone)]
pub struct MetaStore {
    hard_state: HardState,
    conf_state: ConfState,
    /// Index and term of the last entry the snapshot covers (0, 0 before any).
    snapshot_index: u64,
    snapshot_term: u64,
    snapshot_data: Vec<u8>,
    /// Entries after the snapshot, contiguous from `snapshot_index + 1`.
    entries: Vec<Entry>,
}

impl MetaStore {
    /// A store for a fixed voter set.
    pub fn new(voters: Vec<u64>) -> MetaStore {
        let mut conf_state = ConfState::default();
        conf_state.voters = voters;
        MetaStore {
            hard_state: HardState::default(),
            conf_state,
            snapshot_index: 0,
            snapshot_term: 0,
            snapshot_data: Vec::new(),
            entries: Vec::new(),
        }
    }

    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    pub fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    pub fn last_index_now(&self) -> u64 {
        self.entries.last().map_or(self.snapshot_index, |e| e.index)
    }

    /// True when nothing was ever written: no term, no entries, no snapshot.
    pub fn is_blank(&self) -> bool {
        self.hard_state.term == 0 && self.entries.is_empty() && self.snapshot_index == 0
    }

    /// Appends entries, replacing any at or after the first one's index (a new leader's log
    /// wins over an unconfirmed tail).
    pub fn append(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first() else {
            return;
        };
        let keep = first.index.saturating_sub(self.snapshot_index + 1) as usize;
        self.entries.truncate(keep.min(self.entries.len()));
        self.entries.extend_from_slice(entries);
    }

    /// Starts the log after a snapshot: one received from the leader, one replayed, or this
    /// node's own compaction. Entries after it survive only if the log agrees with it at its
    /// index (then they follow it); otherwise they belong to a log the snapshot replaced.
    pub fn apply_snapshot(&mut self, snap: &Snapshot) {
        let m = snap.get_metadata();
        let agrees = self.term_at(m.index) == Some(m.term);
        self.snapshot_index = m.index;
        self.snapshot_term = m.term;
        self.snapshot_data = snap.data.to_vec();
        self.conf_state = m.get_conf_state().clone();
        if agrees {
            self.entries.retain(|e| e.index > m.index);
        } else {
            self.entries.clear();
        }
        if self.hard_state.commit < m.index {
            self.hard_state.commit = m.index;
        }
        if self.hard_state.term < m.term {
            self.hard_state.term = m.term;
        }
    }

    fn term_at(&self, index: u64) -> Option<u64> {
        if index == self.snapshot_index {
            return Some(self.snapshot_term);
        }
        let i = index.checked_sub(self.snapshot_index + 1)? as usize;
        self.entries.get(i).map(|e| e.term)
    }

    /// Drops the entries up to `index` (applied here, so committed), which `data` (the
    /// state machine at `index`) now stands for. `false`, changing nothing, when `index` is
    /// not after the snapshot or not in the log.
    pub fn compact(&mut self, index: u64, data: Vec<u8>) -> bool {
        if index <= self.snapshot_index {
            return false;
        }
        let Some(term) = self.term_at(index) else {
            return false;
        };
        let mut meta = SnapshotMetadata::default();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(self.conf_state.clone());
        let mut snap = Snapshot::default();
        snap.data = data.into();
        snap.set_metadata(meta);
        self.apply_snapshot(&snap);
        true
    }

    /// The state machine at the snapshot's index (empty before any).
    pub fn snapshot_data(&self) -> &[u8] {
        &self.snapshot_data
    }

    pub fn entries_after_snapshot(&self) -> &[Entry] {
        &self.entries
    }

    pub fn snapshot_point(&self) -> (u64, u64) {
        (self.snapshot_index, self.snapshot_term)
    }
}

impl raft::Storage for MetaStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState {
            hard_state: self.hard_state.clone(),
            conf_state: self.conf_state.clone(),
        })
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low <= self.snapshot_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last_index_now() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let from = (low - self.snapshot_index - 1) as usize;
        let to = (high - self.snapshot_index - 1) as usize;
        let mut out: Vec<Entry> = self.entries[from..to].to_vec();
        // raft-rs's own size rule: always at least one entry.
        raft::util::limit_size(&mut out, max_size.into());
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.snapshot_index {
            return Ok(self.snapshot_term);
        }
        if idx < self.snapshot_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        let i = (idx - self.snapshot_index - 1) as usize;
        self.entries
            .get(i)
            .map(|e| e.term)
            .ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.snapshot_index + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last_index_now())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if request_index > self.snapshot_index {
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        let mut meta = SnapshotMetadata::default();
        meta.index = self.snapshot_index;
        meta.term = self.snapshot_term;
        meta.set_conf_state(self.conf_state.clone());
        let mut snap = Snapshot::default();
        snap.data = self.snapshot_data.clone().into();
        snap.set_metadata(meta);
        Ok(snap)
    }
}
