//! The replica state file: one small file per shard log directory holding what log
//! replication must not forget across a restart: the fence generation, the commit offset
//! and the epoch history.
//!
//! This module is the format and a small writer state machine; the log drives it
//! ([`crate::log::ShardLog::persist_replica_state`]) and loads it during recovery. A new
//! state is written to a temporary file, synced, renamed over the old one and the directory
//! synced, each one file op, so a crash leaves the old state or the new one, never a mix.
//! `docs/storage-format.md`, "Replica state file", is the normative description.

use bytes::{BufMut, Bytes, BytesMut};

use crate::layout;
use crate::ops::{FileError, FileOpKind, FileOutput};
use crate::record::{u32_at, u64_at};

/// The file's name in a shard log directory.
pub const REPLICA_STATE_FILE: &str = "replica.state";
/// Where a new state is written before it is renamed in; a leftover is removed at open.
pub const REPLICA_STATE_TMP: &str = "replica.state.tmp";
pub const REPLICA_STATE_MAGIC: [u8; 4] = *b"FXRS";
pub const REPLICA_STATE_VERSION: u16 = 2;
/// Epochs a state holds at most. A format bound rather than a setting: a reader must take
/// whatever a writer with another setting wrote, so both sides share this constant.
pub const MAX_REPLICA_EPOCHS: usize = 4096;
/// Fixed part: magic, version, reserved, fence, commit, log start, epoch count; then the CRC.
const FIXED_LEN: usize = 36;
/// Version 1's fixed part, read still: no log start (it reads as 0).
const FIXED_LEN_V1: usize = 28;
const EPOCH_LEN: usize = 16;
const CRC_LEN: usize = 4;
/// The largest file a valid state can be.
pub const MAX_REPLICA_STATE_BYTES: usize = FIXED_LEN + MAX_REPLICA_EPOCHS * EPOCH_LEN + CRC_LEN;

/// One leadership epoch: from `start_offset` on, the log was written by the leader of
/// `generation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Epoch {
    pub generation: u64,
    pub start_offset: u64,
}

/// What the file holds. A missing file is the default: fence 0, commit 0, no epochs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplicaState {
    pub fence_generation: u64,
    pub commit: u64,
    /// Ascending: generations strictly, start offsets never going back.
    pub epochs: Vec<Epoch>,
    /// Where the copy's leader last said its log starts (its retention cut there): the copy
    /// serves nothing below it, across restarts too, though a segment that straddles it may
    /// still hold older records (`ShardLog::trim_to`). 0: never told.
    pub log_start: u64,
}

/// Why a state was refused: by `persist_replica_state` (nothing is written) or at open (the
/// file is damaged; the log does not open).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaStateError {
    /// The log is not open (or failed).
    NotOpen,
    /// The fence generation would move back from `from` to `to`.
    FenceBack { from: u64, to: u64 },
    /// The commit offset would move back from `from` to `to`.
    CommitBack { from: u64, to: u64 },
    /// More than [`MAX_REPLICA_EPOCHS`] epochs.
    TooManyEpochs(usize),
    /// Epochs out of order (generations must rise, start offsets must not fall).
    EpochOrder,
    /// The file's bytes are wrong.
    Damaged(&'static str),
}

impl std::fmt::Display for ReplicaStateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplicaStateError::NotOpen => f.write_str("the log is not open"),
            ReplicaStateError::FenceBack { from, to } => {
                write!(
                    f,
                    "the fence generation may not move back from {from} to {to}"
                )
            }
            ReplicaStateError::CommitBack { from, to } => {
                write!(f, "the commit offset may not move back from {from} to {to}")
            }
            ReplicaStateError::TooManyEpochs(n) => {
                write!(f, "{n} epochs (at most {MAX_REPLICA_EPOCHS})")
            }
            ReplicaStateError::EpochOrder => f.write_str("epochs are out of order"),
            ReplicaStateError::Damaged(why) => write!(f, "replica state file: {why}"),
        }
    }
}

impl ReplicaState {
    fn check_epochs(&self) -> Result<(), ReplicaStateError> {
        if self.epochs.len() > MAX_REPLICA_EPOCHS {
            return Err(ReplicaStateError::TooManyEpochs(self.epochs.len()));
        }
        let ordered = self
            .epochs
            .windows(2)
            .all(|w| w[0].generation < w[1].generation && w[0].start_offset <= w[1].start_offset);
        if !ordered {
            return Err(ReplicaStateError::EpochOrder);
        }
        Ok(())
    }

    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(FIXED_LEN + self.epochs.len() * EPOCH_LEN + 4);
        b.put_slice(&REPLICA_STATE_MAGIC);
        b.put_u16_le(REPLICA_STATE_VERSION);
        b.put_u16_le(0);
        b.put_u64_le(self.fence_generation);
        b.put_u64_le(self.commit);
        b.put_u64_le(self.log_start);
        b.put_u32_le(self.epochs.len() as u32);
        for e in &self.epochs {
            b.put_u64_le(e.generation);
            b.put_u64_le(e.start_offset);
        }
        let crc = crc32c::crc32c(&b);
        b.put_u32_le(crc);
        b.freeze()
    }

    /// Decodes a whole file. Anything but a valid state of a known version is refused.
    pub fn decode(b: &[u8]) -> Result<ReplicaState, ReplicaStateError> {
        use ReplicaStateError::Damaged;
        if b.len() < FIXED_LEN_V1 + CRC_LEN {
            return Err(Damaged("cut short"));
        }
        if b[0..4] != REPLICA_STATE_MAGIC {
            return Err(Damaged("wrong magic"));
        }
        let body = &b[..b.len() - CRC_LEN];
        if crc32c::crc32c(body) != u32_at(b, b.len() - CRC_LEN) {
            return Err(Damaged("checksum mismatch"));
        }
        let (fixed, log_start) = match u16::from_le_bytes([b[4], b[5]]) {
            1 => (FIXED_LEN_V1, 0),
            REPLICA_STATE_VERSION if b.len() >= FIXED_LEN + CRC_LEN => (FIXED_LEN, u64_at(b, 24)),
            REPLICA_STATE_VERSION => return Err(Damaged("cut short")),
            _ => return Err(Damaged("unknown version")),
        };
        if b[6..8] != [0, 0] {
            return Err(Damaged("reserved bytes are not zero"));
        }
        let count = u32_at(b, fixed - 4) as usize;
        if count > MAX_REPLICA_EPOCHS {
            return Err(Damaged("too many epochs"));
        }
        if body.len() != fixed + count * EPOCH_LEN {
            return Err(Damaged("length does not match the epoch count"));
        }
        let epochs = (0..count)
            .map(|i| {
                let at = fixed + i * EPOCH_LEN;
                Epoch {
                    generation: u64_at(b, at),
                    start_offset: u64_at(b, at + 8),
                }
            })
            .collect();
        let state = ReplicaState {
            fence_generation: u64_at(b, 8),
            commit: u64_at(b, 16),
            epochs,
            log_start,
        };
        state
            .check_epochs()
            .map_err(|_| Damaged("epochs out of order"))?;
        Ok(state)
    }
}

/// One step of writing a new state, in crash-safe order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Create,
    Write,
    Sync,
    Rename,
    SyncDir,
}

/// The writer: what is on disk, what was accepted, and the write in progress (one at a
/// time; a state accepted meanwhile waits, and a newer one replaces it).
#[derive(Debug, Default)]
pub(crate) struct StateFile {
    durable: ReplicaState,
    /// The newest accepted state: what a new one may not go back from.
    latest: ReplicaState,
    waiting: Option<ReplicaState>,
    writing: Option<(ReplicaState, Bytes, Step)>,
    busy: bool,
}

impl StateFile {
    /// The state recovery read.
    pub(crate) fn loaded(state: ReplicaState) -> StateFile {
        StateFile {
            durable: state.clone(),
            latest: state,
            ..StateFile::default()
        }
    }

    pub(crate) fn durable(&self) -> &ReplicaState {
        &self.durable
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.writing.is_none() && self.waiting.is_none()
    }

    /// Accepts `state` to be written, unless it goes back from the newest accepted one.
    pub(crate) fn accept(&mut self, state: ReplicaState) -> Result<(), ReplicaStateError> {
        if state.fence_generation < self.latest.fence_generation {
            return Err(ReplicaStateError::FenceBack {
                from: self.latest.fence_generation,
                to: state.fence_generation,
            });
        }
        if state.commit < self.latest.commit {
            return Err(ReplicaStateError::CommitBack {
                from: self.latest.commit,
                to: state.commit,
            });
        }
        state.check_epochs()?;
        self.latest = state.clone();
        self.waiting = Some(state);
        Ok(())
    }

    /// The next op to issue, if one is due and none is in flight.
    pub(crate) fn next_op(&mut self, dir: &str) -> Option<FileOpKind> {
        if self.busy {
            return None;
        }
        if self.writing.is_none() {
            let state = self.waiting.take()?;
            let bytes = state.encode();
            self.writing = Some((state, bytes, Step::Create));
        }
        let (_, bytes, step) = self.writing.as_ref().expect("set above");
        let tmp = layout::join(dir, REPLICA_STATE_TMP);
        let kind = match step {
            Step::Create => FileOpKind::Create { path: tmp },
            Step::Write => FileOpKind::Append {
                path: tmp,
                bytes: bytes.clone(),
            },
            Step::Sync => FileOpKind::Sync { path: tmp },
            Step::Rename => FileOpKind::Rename {
                from: tmp,
                to: layout::join(dir, REPLICA_STATE_FILE),
            },
            Step::SyncDir => FileOpKind::SyncDir {
                path: dir.to_owned(),
            },
        };
        self.busy = true;
        Some(kind)
    }

    /// The op in flight finished. `Ok(Some(state))` when that state is now durable; an
    /// error names the op that failed.
    pub(crate) fn complete(
        &mut self,
        dir: &str,
        result: Result<FileOutput, FileError>,
    ) -> Result<Option<ReplicaState>, (FileOpKind, FileError)> {
        self.busy = false;
        let Some((state, bytes, step)) = self.writing.take() else {
            return Ok(None);
        };
        if let Err(e) = result {
            let path = layout::join(dir, REPLICA_STATE_TMP);
            let kind = match step {
                Step::Create => FileOpKind::Create { path },
                Step::Write => FileOpKind::Append { path, bytes },
                Step::Sync => FileOpKind::Sync { path },
                Step::Rename => FileOpKind::Rename {
                    from: path,
                    to: layout::join(dir, REPLICA_STATE_FILE),
                },
                Step::SyncDir => FileOpKind::SyncDir {
                    path: dir.to_owned(),
                },
            };
            return Err((kind, e));
        }
        let next = match step {
            Step::Create => Step::Write,
            Step::Write => Step::Sync,
            Step::Sync => Step::Rename,
            Step::Rename => Step::SyncDir,
            Step::SyncDir => {
                self.durable = state.clone();
                return Ok(Some(state));
            }
        };
        self.writing = Some((state, bytes, next));
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ReplicaState {
        ReplicaState {
            fence_generation: 9,
            commit: 1234,
            log_start: 640,
            epochs: vec![
                Epoch {
                    generation: 1,
                    start_offset: 0,
                },
                Epoch {
                    generation: 4,
                    start_offset: 1000,
                },
            ],
        }
    }

    #[test]
    fn a_state_round_trips_and_every_flipped_byte_or_cut_is_refused() {
        let b = sample().encode();
        assert_eq!(b.len(), FIXED_LEN + 2 * EPOCH_LEN + CRC_LEN);
        assert_eq!(ReplicaState::decode(&b), Ok(sample()));
        for i in 0..b.len() {
            let mut bad = b.to_vec();
            bad[i] ^= 0x01;
            assert!(ReplicaState::decode(&bad).is_err(), "flip at {i}");
        }
        for cut in 0..b.len() {
            assert!(ReplicaState::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        assert!(
            ReplicaState::decode(&[0u8; 40]).is_err(),
            "zeros are not a state"
        );
    }

    #[test]
    fn a_version_1_file_reads_with_no_log_start() {
        // Version 1, exactly as it was written: no log start field.
        let mut b = BytesMut::new();
        b.put_slice(&REPLICA_STATE_MAGIC);
        b.put_u16_le(1);
        b.put_u16_le(0);
        b.put_u64_le(9);
        b.put_u64_le(1234);
        b.put_u32_le(1);
        b.put_u64_le(4);
        b.put_u64_le(1000);
        let crc = crc32c::crc32c(&b);
        b.put_u32_le(crc);
        let want = ReplicaState {
            fence_generation: 9,
            commit: 1234,
            epochs: vec![Epoch {
                generation: 4,
                start_offset: 1000,
            }],
            log_start: 0,
        };
        assert_eq!(ReplicaState::decode(&b), Ok(want));
        // What is written now is version 2, with the log start.
        assert_eq!(&sample().encode()[4..6], &[2, 0]);
        assert_eq!(u64_at(&sample().encode(), 24), 640);
    }

    #[test]
    fn the_epoch_limit_holds_at_its_edge_and_order_is_checked() {
        let epochs = |n: usize| {
            (0..n as u64)
                .map(|g| Epoch {
                    generation: g,
                    start_offset: g * 10,
                })
                .collect::<Vec<_>>()
        };
        let mut f = StateFile::default();
        let full = ReplicaState {
            epochs: epochs(MAX_REPLICA_EPOCHS),
            ..ReplicaState::default()
        };
        assert_eq!(full.encode().len(), MAX_REPLICA_STATE_BYTES);
        assert_eq!(ReplicaState::decode(&full.encode()), Ok(full.clone()));
        assert_eq!(f.accept(full), Ok(()));
        let over = ReplicaState {
            epochs: epochs(MAX_REPLICA_EPOCHS + 1),
            ..ReplicaState::default()
        };
        assert_eq!(
            f.accept(over.clone()),
            Err(ReplicaStateError::TooManyEpochs(MAX_REPLICA_EPOCHS + 1))
        );
        assert!(ReplicaState::decode(&over.encode()).is_err());
        let mut unordered = sample();
        unordered.epochs.swap(0, 1);
        assert_eq!(f.accept(unordered), Err(ReplicaStateError::EpochOrder));
    }

    #[test]
    fn neither_the_fence_nor_the_commit_moves_back() {
        let mut f = StateFile::loaded(sample());
        let mut s = sample();
        s.fence_generation = 8;
        assert_eq!(
            f.accept(s),
            Err(ReplicaStateError::FenceBack { from: 9, to: 8 })
        );
        let mut s = sample();
        s.commit = 1233;
        assert_eq!(
            f.accept(s),
            Err(ReplicaStateError::CommitBack {
                from: 1234,
                to: 1233
            })
        );
        // Equal is fine (epochs may change on their own), and the bar is the newest
        // accepted state, durable or not.
        assert_eq!(f.accept(sample()), Ok(()));
        let mut up = sample();
        up.commit = 2000;
        assert_eq!(f.accept(up), Ok(()));
        let mut s = sample();
        s.commit = 1500;
        assert!(matches!(
            f.accept(s),
            Err(ReplicaStateError::CommitBack { from: 2000, .. })
        ));
    }
}
