//! The metadata log on disk, for a node with durable storage: raft's records as file ops.
//!
//! Under the storage root, `cluster/` holds:
//!
//! ```text
//! cluster/meta.snapshot        the state machine at some index (one snapshot record)
//! cluster/meta.snapshot.tmp    a snapshot being written; never read, removed at start
//! cluster/meta-<gen:020>.log   the records after the snapshot; the highest gen is appended to
//! cluster/storage.id           this disk's identity (32 hex digits): written once, read at start
//! cluster/storage.id.tmp       an identity being written; removed at start
//! ```
//!
//! The storage identity is what the cluster records for this node's disk: the same after a
//! restart, new when the directory was wiped (the metadata then records the node as having
//! rejoined without its disk, and replication counts it for nothing until rebuilt).
//!
//! Nothing here touches a file: like a stream's log it emits [`FileOp`]s and takes their
//! completions, one op at a time, so every write, sync, rename and removal happens in the
//! order it was queued. A `Persist` from the control plane is an append and a sync of the
//! current log; only when the sync completes is the record confirmed (`poll_done`).
//!
//! Start: list `cluster/`, read the snapshot and every log in generation order and replay
//! them (felix-cluster's `record::Replayer`), then rotate: write the snapshot again if the
//! logs held a newer one (sent by a leader), write a fresh log holding everything after the
//! snapshot, and only then remove the old logs. So a torn tail is never appended after, and
//! a crash at any step leaves files that replay to the same state.
//!
//! Compaction, once the current log passes `compact_bytes`: snapshot to the temp file, sync,
//! rename over `meta.snapshot`, sync the directory (the snapshot is durable: the control
//! plane may drop what it covers), then a fresh log with what follows the snapshot, synced,
//! the directory synced, and only then the old log removed.

use std::collections::VecDeque;

use bytes::Bytes;
use felix_cluster::control::record::{self, Replayer};
use felix_cluster::control::store::MetaStore;
use felix_cluster::control::Compaction;
use felix_storage::ops::{
    FileCompletion, FileErrorKind, FileOp, FileOpKind, FileOutput, LogId, OpId,
};

/// The metadata log's ops carry this log id: above every log the storage table numbers,
/// below the retirement jobs' ids.
pub(crate) const METALOG_LOG: LogId = LogId(0xE000_0000);

pub(crate) const DIR: &str = "cluster";
pub(crate) const SNAPSHOT: &str = "cluster/meta.snapshot";
pub(crate) const SNAPSHOT_TMP: &str = "cluster/meta.snapshot.tmp";
pub(crate) const IDENTITY: &str = "cluster/storage.id";
pub(crate) const IDENTITY_TMP: &str = "cluster/storage.id.tmp";
/// 32 hex digits and a newline.
const IDENTITY_LEN: u64 = 33;
/// Bytes asked for per read while replaying.
const READ_CHUNK: u32 = 1 << 20;

pub(crate) fn log_path(generation: u64) -> String {
    format!("{DIR}/{}", log_name(generation))
}

fn log_name(generation: u64) -> String {
    format!("meta-{generation:020}.log")
}

/// `storage.id`'s contents: 32 lowercase or uppercase hex digits and a newline.
fn parse_identity(bytes: &[u8]) -> Option<[u8; 16]> {
    let text = std::str::from_utf8(bytes).ok()?.strip_suffix('\n')?;
    if text.len() != 32 || !text.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

fn parse_log_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("meta-")?.strip_suffix(".log")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// What a completed op means.
#[derive(Debug)]
enum Then {
    Nothing,
    /// `Remove` of something that may already be gone.
    MayBeMissing,
    Listed,
    /// One chunk of the file being read for replay.
    Read,
    /// The storage identity file's contents.
    Identity,
    /// The sync of this ready's record.
    Persisted(u64),
    /// The directory sync after the snapshot's rename.
    SnapshotDurable(Box<Compaction>),
    /// The last step of the start: the control plane may run.
    Opened,
    /// The last step of a compaction.
    Rotated,
}

struct Step {
    kind: FileOpKind,
    then: Then,
}

/// A file read at start, in replay order.
struct ToRead {
    path: String,
    len: u64,
    snapshot: bool,
}

#[derive(Debug, PartialEq, Eq)]
enum Phase {
    Loading,
    Open,
    Failed(String),
}

/// What the log confirms, in order.
#[derive(Debug)]
pub(crate) enum Done {
    /// The record of this ready is durable.
    Persisted(u64),
    /// This compaction's snapshot is durable.
    Compacted(Box<Compaction>),
}

pub(crate) struct MetaLog {
    voters: Vec<u64>,
    compact_bytes: u64,
    phase: Phase,
    steps: VecDeque<Step>,
    in_flight: Option<(OpId, Then)>,
    /// Ops handed out and not yet completed (0 or 1).
    issued: Option<FileOp>,
    next_seq: u32,
    // Start.
    to_read: VecDeque<ToRead>,
    buf: Vec<u8>,
    replayer: Option<Replayer>,
    generations: Vec<u64>,
    loaded: Option<MetaStore>,
    /// This disk's identity: read from `storage.id`, or the candidate given at open, written
    /// there during the start when the file was missing.
    storage_id: [u8; 16],
    identity_on_disk: bool,
    // Running.
    /// The log appends go to (as queued: a compaction's new log once it is queued).
    generation: u64,
    /// Bytes queued for the current log.
    log_bytes: u64,
    compacting: bool,
    done: VecDeque<Done>,
}

impl MetaLog {
    /// Starts by listing `cluster/`. `candidate_id` becomes the disk's storage identity if it
    /// has none yet.
    pub(crate) fn open(voters: Vec<u64>, compact_bytes: u64, candidate_id: [u8; 16]) -> MetaLog {
        let mut log = MetaLog {
            voters,
            compact_bytes: compact_bytes.max(1),
            phase: Phase::Loading,
            steps: VecDeque::new(),
            in_flight: None,
            issued: None,
            next_seq: 0,
            to_read: VecDeque::new(),
            buf: Vec::new(),
            replayer: None,
            generations: Vec::new(),
            loaded: None,
            storage_id: candidate_id,
            identity_on_disk: false,
            generation: 0,
            log_bytes: 0,
            compacting: false,
            done: VecDeque::new(),
        };
        log.push(FileOpKind::ListDir { path: DIR.into() }, Then::Listed);
        log
    }

    fn push(&mut self, kind: FileOpKind, then: Then) {
        self.steps.push_back(Step { kind, then });
    }

    /// The next op to perform; one at a time, in order.
    pub(crate) fn poll_op(&mut self) -> Option<FileOp> {
        if self.in_flight.is_some() || matches!(self.phase, Phase::Failed(_)) {
            return None;
        }
        let step = self.steps.pop_front()?;
        let id = OpId::new(METALOG_LOG, self.next_seq);
        self.next_seq = self.next_seq.wrapping_add(1);
        self.in_flight = Some((id, step.then));
        let op = FileOp {
            id,
            kind: step.kind,
        };
        self.issued = Some(op.clone());
        Some(op)
    }

    pub(crate) fn handle_completion(&mut self, c: FileCompletion) {
        let Some((id, then)) = self.in_flight.take_if(|(id, _)| *id == c.id) else {
            return;
        };
        let op = self.issued.take().filter(|op| op.id == id);
        let what = op.map_or_else(String::new, |op| {
            format!("{} {}", op.kind.name(), op.kind.path())
        });
        let output = match c.result {
            Ok(o) => o,
            Err(e) if e.kind == FileErrorKind::NotFound && matches!(then, Then::MayBeMissing) => {
                FileOutput::Done
            }
            Err(e) if e.kind == FileErrorKind::NotFound && matches!(then, Then::Listed) => {
                // No metadata was ever stored here: a blank node.
                self.start_fresh();
                return;
            }
            Err(e) => {
                self.fail(format!("the metadata log failed: {what}: {e}"));
                return;
            }
        };
        match then {
            Then::Nothing | Then::MayBeMissing => {}
            Then::Listed => self.listed(output),
            Then::Read => self.read(output),
            Then::Identity => self.identity(output),
            Then::Persisted(ready) => self.done.push_back(Done::Persisted(ready)),
            Then::SnapshotDurable(c) => self.done.push_back(Done::Compacted(c)),
            Then::Opened => self.phase = Phase::Open,
            Then::Rotated => self.compacting = false,
        }
    }

    fn fail(&mut self, why: String) {
        tracing::error!(%why, "metadata log");
        self.steps.clear();
        self.phase = Phase::Failed(why);
    }

    fn start_fresh(&mut self) {
        self.push(FileOpKind::CreateDir { path: DIR.into() }, Then::Nothing);
        self.replayer = Some(Replayer::new(self.voters.clone()));
        self.rotate_at_start(0);
    }

    fn listed(&mut self, output: FileOutput) {
        let FileOutput::Listing(entries) = output else {
            return self.fail("the metadata log failed: list cluster/ answered no listing".into());
        };
        let mut snapshot = None;
        let mut logs = Vec::new();
        let mut tmp = false;
        let mut identity = None;
        let mut identity_tmp = false;
        for e in entries.iter().filter(|e| !e.is_dir) {
            if e.name == "storage.id" {
                identity = Some(e.len);
            } else if e.name == "storage.id.tmp" {
                identity_tmp = true;
            } else if e.name == "meta.snapshot" {
                snapshot = Some(e.len);
            } else if e.name == "meta.snapshot.tmp" {
                tmp = true;
            } else if let Some(g) = parse_log_name(&e.name) {
                logs.push((g, e.len));
            }
        }
        logs.sort();
        if identity_tmp {
            // Never renamed in: the identity it held was never announced.
            self.push(
                FileOpKind::Remove {
                    path: IDENTITY_TMP.into(),
                },
                Then::MayBeMissing,
            );
        }
        if let Some(len) = identity {
            if len != IDENTITY_LEN {
                return self.fail(format!(
                    "the storage identity {IDENTITY} is corrupt: {len} bytes, not {IDENTITY_LEN}"
                ));
            }
            self.identity_on_disk = true;
            self.push(
                FileOpKind::Read {
                    path: IDENTITY.into(),
                    pos: 0,
                    len: IDENTITY_LEN as u32,
                },
                Then::Identity,
            );
        }
        if tmp {
            // A snapshot that was never renamed in: whatever it holds, the logs still hold.
            self.push(
                FileOpKind::Remove {
                    path: SNAPSHOT_TMP.into(),
                },
                Then::MayBeMissing,
            );
        }
        if let Some(len) = snapshot {
            // One record, so never more than replay would accept: no corrupt size makes
            // this read grow without bound.
            if len > record::MAX_RECORD_BYTES as u64 + 8 {
                return self.fail(format!(
                    "the metadata snapshot {SNAPSHOT} is corrupt: {len} bytes, more than one \
                     record can hold"
                ));
            }
            self.to_read.push_back(ToRead {
                path: SNAPSHOT.into(),
                len,
                snapshot: true,
            });
        }
        for &(g, len) in &logs {
            self.to_read.push_back(ToRead {
                path: log_path(g),
                len,
                snapshot: false,
            });
        }
        self.generations = logs.iter().map(|(g, _)| *g).collect();
        self.replayer = Some(Replayer::new(self.voters.clone()));
        self.read_next();
    }

    /// Asks for the next chunk of the file being read, or replays it and moves on.
    fn read_next(&mut self) {
        loop {
            let Some(file) = self.to_read.front() else {
                let last = self.generations.last().copied().unwrap_or(0);
                return self.rotate_at_start(last);
            };
            if (self.buf.len() as u64) < file.len {
                let left = file.len - self.buf.len() as u64;
                let kind = FileOpKind::Read {
                    path: file.path.clone(),
                    pos: self.buf.len() as u64,
                    len: left.min(u64::from(READ_CHUNK)) as u32,
                };
                return self.push(kind, Then::Read);
            }
            let file = self.to_read.pop_front().expect("checked");
            let bytes = std::mem::take(&mut self.buf);
            let r = self.replayer.as_mut().expect("replaying");
            if file.snapshot {
                if let Err(e) = r.snapshot_file(&bytes) {
                    return self.fail(format!(
                        "the metadata snapshot {} is corrupt: {e}",
                        file.path
                    ));
                }
            } else if let (_, Some(torn)) = r.log(&bytes) {
                // Never confirmed, so nobody was promised it; the rotation drops it.
                tracing::warn!(file = %file.path, %torn, "metadata log ends in a torn record");
            }
        }
    }

    fn read(&mut self, output: FileOutput) {
        let FileOutput::Data(data) = output else {
            return self.fail("the metadata log failed: a read answered no data".into());
        };
        if data.is_empty() {
            // Shorter than listed: take what is there.
            if let Some(f) = self.to_read.front_mut() {
                f.len = self.buf.len() as u64;
            }
        }
        self.buf.extend_from_slice(&data);
        self.read_next();
    }

    fn identity(&mut self, output: FileOutput) {
        let parsed = match output {
            FileOutput::Data(d) => parse_identity(&d),
            _ => None,
        };
        match parsed {
            Some(id) => self.storage_id = id,
            None => self.fail(format!(
                "the storage identity {IDENTITY} is corrupt: not 32 hex digits and a newline"
            )),
        }
    }

    /// This disk's storage identity (meaningful once open).
    pub(crate) fn storage_id(&self) -> [u8; 16] {
        self.storage_id
    }

    /// Writes what replay found into a fresh log after `last`, then removes the old ones.
    fn rotate_at_start(&mut self, last: u64) {
        if !self.identity_on_disk {
            // Before anything of the metadata is written again: a disk that holds records
            // holds its identity too.
            let mut text: String = self.storage_id.iter().map(|b| format!("{b:02x}")).collect();
            text.push('\n');
            let tmp = IDENTITY_TMP.to_owned();
            self.push(FileOpKind::Create { path: tmp.clone() }, Then::Nothing);
            self.push(
                FileOpKind::Append {
                    path: tmp.clone(),
                    bytes: Bytes::from(text),
                },
                Then::Nothing,
            );
            self.push(FileOpKind::Sync { path: tmp.clone() }, Then::Nothing);
            self.push(
                FileOpKind::Rename {
                    from: tmp,
                    to: IDENTITY.into(),
                },
                Then::Nothing,
            );
            self.identity_on_disk = true;
        }
        let store = self.replayer.take().expect("replaying").finish();
        if let Some(file) = record::snapshot_file(&store) {
            // The logs may hold a snapshot a leader sent, newer than the file: make it the
            // file before the logs that hold it go. Rewriting an equal one is harmless.
            self.write_snapshot(file, Then::Nothing);
        }
        let generation = last + 1;
        let head = record::log_head(&store);
        self.write_log(generation, head);
        let old = std::mem::take(&mut self.generations);
        self.remove_logs(&old, Then::Opened);
        self.loaded = Some(store);
    }

    fn write_snapshot(&mut self, file: Vec<u8>, then: Then) {
        let tmp = SNAPSHOT_TMP.to_owned();
        self.push(FileOpKind::Create { path: tmp.clone() }, Then::Nothing);
        self.push(
            FileOpKind::Append {
                path: tmp.clone(),
                bytes: Bytes::from(file),
            },
            Then::Nothing,
        );
        self.push(FileOpKind::Sync { path: tmp.clone() }, Then::Nothing);
        self.push(
            FileOpKind::Rename {
                from: tmp,
                to: SNAPSHOT.into(),
            },
            Then::Nothing,
        );
        self.push(FileOpKind::SyncDir { path: DIR.into() }, then);
    }

    /// A new log holding `head`, durable with its directory entry; appends go to it next.
    fn write_log(&mut self, generation: u64, head: Vec<u8>) {
        let path = log_path(generation);
        self.push(FileOpKind::Create { path: path.clone() }, Then::Nothing);
        self.log_bytes = head.len() as u64;
        if !head.is_empty() {
            self.push(
                FileOpKind::Append {
                    path: path.clone(),
                    bytes: Bytes::from(head),
                },
                Then::Nothing,
            );
        }
        self.push(FileOpKind::Sync { path }, Then::Nothing);
        self.push(FileOpKind::SyncDir { path: DIR.into() }, Then::Nothing);
        self.generation = generation;
    }

    fn remove_logs(&mut self, generations: &[u64], then: Then) {
        for &g in generations {
            self.push(FileOpKind::Remove { path: log_path(g) }, Then::Nothing);
        }
        self.push(FileOpKind::SyncDir { path: DIR.into() }, then);
    }

    /// The replayed store, once the start's rotation is durable: the control plane's.
    pub(crate) fn take_loaded(&mut self) -> Option<MetaStore> {
        if self.phase == Phase::Open {
            self.loaded.take()
        } else {
            None
        }
    }

    /// Appends a ready's record and syncs it; confirmed through [`MetaLog::poll_done`].
    pub(crate) fn append(&mut self, ready: u64, record: Vec<u8>) {
        let path = log_path(self.generation);
        self.log_bytes += record.len() as u64;
        self.push(
            FileOpKind::Append {
                path: path.clone(),
                bytes: Bytes::from(record),
            },
            Then::Nothing,
        );
        self.push(FileOpKind::Sync { path }, Then::Persisted(ready));
    }

    /// The current log has reached the threshold and no compaction is under way.
    pub(crate) fn wants_compaction(&self) -> bool {
        self.phase == Phase::Open && !self.compacting && self.log_bytes >= self.compact_bytes
    }

    /// Writes `c`'s snapshot, then a fresh log after it, then removes the old log.
    pub(crate) fn compact(&mut self, c: Compaction) {
        self.compacting = true;
        let old = self.generation;
        let file = c.snapshot_file.clone();
        let head = c.head.clone();
        self.write_snapshot(file, Then::SnapshotDurable(Box::new(c)));
        self.write_log(old + 1, head);
        self.remove_logs(&[old], Then::Rotated);
    }

    pub(crate) fn poll_done(&mut self) -> Option<Done> {
        self.done.pop_front()
    }

    /// Start is over: replayed and rotated (or failed: see [`MetaLog::fatal`]).
    pub(crate) fn is_open(&self) -> bool {
        self.phase == Phase::Open
    }

    pub(crate) fn fatal(&self) -> Option<&str> {
        match &self.phase {
            Phase::Failed(why) => Some(why),
            _ => None,
        }
    }

    /// Nothing queued or in flight.
    pub(crate) fn is_idle(&self) -> bool {
        self.in_flight.is_none() && (self.steps.is_empty() || self.fatal().is_some())
    }

    /// Bytes in the current log, as queued.
    #[cfg(test)]
    pub(crate) fn log_bytes(&self) -> u64 {
        self.log_bytes
    }
}

#[cfg(test)]
mod tests;
