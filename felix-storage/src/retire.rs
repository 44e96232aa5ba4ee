//! Retiring a deleted stream's directories: each a small state machine over file ops that a
//! crash can interrupt anywhere (docs/stream-features.md "Deleting a stream").
//!
//! 1. each directory (`streams/T/N/S`, then `groups/T/N/S`) is renamed to a tombstone beside
//!    it, `.deleted.<µs>.<n>` (`.` never starts an escaped name), and its parent is synced.
//!    Until every rename is durable a new log for the stream waits ([`Retiring::blocking`]);
//! 2. the tombstones are removed depth first: a directory's files and subdirectories go,
//!    then the directory itself, and the parent is synced last. A restart's startup walk
//!    finds a leftover tombstone and runs this step again ([`Retiring::finish`]); anything
//!    already gone (`NotFound`) counts as done.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::layout;
use crate::ops::{
    FileCompletion, FileError, FileErrorKind, FileOp, FileOpKind, FileOutput, LogId, OpId,
};
use crate::table::TableEvent;

/// Retirement jobs take log ids from here up, far above any real log's.
const RETIRE_BASE: u32 = 0xF000_0000;
/// Prefix of a tombstone directory's name.
pub const TOMBSTONE_PREFIX: &str = ".deleted.";

/// True for a directory name that is a stream's tombstone.
pub fn is_tombstone(name: &str) -> bool {
    name.starts_with(TOMBSTONE_PREFIX)
}

/// Ids of the retirement jobs' file ops are `LogId`s at or above [`RETIRE_BASE`].
pub fn is_retire_id(id: LogId) -> bool {
    id.0 >= RETIRE_BASE
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Rename,
    SyncParent,
    Remove,
}

/// One directory to move out of the way: `from` becomes `tomb` beside it.
struct Move {
    from: String,
    parent: String,
    tomb: String,
}

struct Job {
    /// The stream's directory (`streams/T/N/S`): new logs for it wait for this job.
    blocks: String,
    /// Directories still to rename, in order; the first is in progress.
    moves: VecDeque<Move>,
    /// Tombstones whose files go once every rename is durable.
    tombs: Vec<String>,
    stage: Stage,
    next_seq: u32,
    /// Ops in flight in the current stage.
    in_flight: HashMap<OpId, FileOpKind>,
    /// Removal: directories listed and not yet removed, with how many of their entries are
    /// still to go. At zero the directory itself goes. A directory whose entry failed keeps
    /// a count above zero, so it and its ancestors stay for a restart.
    left: HashMap<String, usize>,
}

/// Stream directories being retired, each a small state machine over file ops.
#[derive(Default)]
pub struct Retiring {
    /// Ordered: `blocking` answers the first match, which must not depend on a hash.
    jobs: BTreeMap<LogId, Job>,
    next_id: u32,
    tombstones: u64,
}

impl Retiring {
    fn new_id(&mut self) -> LogId {
        let id = LogId(RETIRE_BASE + self.next_id % (u32::MAX - RETIRE_BASE));
        self.next_id = self.next_id.wrapping_add(1);
        id
    }

    fn op(job: &mut Job, id: LogId, kind: FileOpKind) -> FileOp {
        let op = OpId::new(id, job.next_seq);
        job.next_seq = job.next_seq.wrapping_add(1);
        job.in_flight.insert(op, kind.clone());
        FileOp { id: op, kind }
    }

    /// Starts retiring `dirs` (the stream's directory first, then its groups'), one rename
    /// after another; returns the job's id and its first op.
    pub(crate) fn start(&mut self, dirs: Vec<String>, unix_micros: u64) -> (LogId, FileOp) {
        let moves: VecDeque<Move> = dirs
            .into_iter()
            .map(|from| {
                let parent = from.rsplit_once('/').expect("a stream dir has a parent").0;
                self.tombstones += 1;
                let name = format!("{TOMBSTONE_PREFIX}{unix_micros}.{}", self.tombstones);
                Move {
                    tomb: layout::join(parent, &name),
                    parent: parent.to_owned(),
                    from,
                }
            })
            .collect();
        let id = self.new_id();
        let mut job = Job {
            blocks: moves[0].from.clone(),
            tombs: moves.iter().map(|m| m.tomb.clone()).collect(),
            moves,
            stage: Stage::Rename,
            next_seq: 0,
            in_flight: HashMap::new(),
            left: HashMap::new(),
        };
        let op = Self::next_rename(&mut job, id).expect("one move at least");
        self.jobs.insert(id, job);
        (id, op)
    }

    fn next_rename(job: &mut Job, id: LogId) -> Option<FileOp> {
        let m = job.moves.front()?;
        let kind = FileOpKind::Rename {
            from: m.from.clone(),
            to: m.tomb.clone(),
        };
        job.stage = Stage::Rename;
        Some(Self::op(job, id, kind))
    }

    /// Finishes a tombstone a crash left behind (found by the startup walk).
    pub fn finish(&mut self, tomb: String) -> FileOp {
        let id = self.new_id();
        let mut job = Job {
            blocks: String::new(),
            moves: VecDeque::new(),
            tombs: vec![tomb.clone()],
            stage: Stage::Remove,
            next_seq: 0,
            in_flight: HashMap::new(),
            left: HashMap::new(),
        };
        let op = Self::op(&mut job, id, FileOpKind::ListDir { path: tomb });
        self.jobs.insert(id, job);
        op
    }

    /// The retirement a new log for `dir` must wait for (its renames are not durable yet).
    pub fn blocking(&self, dir: &str) -> Option<LogId> {
        self.jobs
            .iter()
            .find(|(_, j)| j.stage != Stage::Remove && j.blocks == dir)
            .map(|(id, _)| *id)
    }

    /// A retirement op finished: the next ops, and an event once the renames are durable.
    pub fn handle_completion(
        &mut self,
        c: FileCompletion,
        ops: &mut Vec<FileOp>,
        events: &mut Vec<TableEvent>,
    ) {
        let id = c.id.log();
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let Some(kind) = job.in_flight.remove(&c.id) else {
            return;
        };
        let path = kind.path();
        let not_found = matches!(&c.result, Err(e) if e.kind == FileErrorKind::NotFound);
        if let Err(e) = &c.result {
            if !not_found {
                // The tombstone (or the stream dir) stays for a restart to deal with.
                tracing::error!(path, error = %e, "retiring a deleted stream's files failed");
            }
        }
        match job.stage {
            Stage::Rename if c.result.is_ok() => {
                job.stage = Stage::SyncParent;
                let parent = job.moves[0].parent.clone();
                ops.push(Self::op(job, id, FileOpKind::SyncDir { path: parent }));
                return;
            }
            Stage::Rename if !not_found => {
                // Nothing moved: the old files stay where a new log would find them. Wake
                // the waiters anyway; they see the stream as it is on disk.
                events.push(TableEvent::Opened { log: id });
                self.jobs.remove(&id);
                return;
            }
            // Never stored (NotFound), or moved and durable: on to the next directory.
            Stage::Rename | Stage::SyncParent => {
                job.moves.pop_front();
                if let Some(op) = Self::next_rename(job, id) {
                    ops.push(op);
                    return;
                }
                // Every name is gone for good: new logs may take them.
                events.push(TableEvent::Opened { log: id });
                job.stage = Stage::Remove;
                for tomb in job.tombs.clone() {
                    ops.push(Self::op(job, id, FileOpKind::ListDir { path: tomb }));
                }
            }
            Stage::Remove => Self::remove_step(job, id, kind, c.result, ops),
        }
        if job.in_flight.is_empty() && job.stage == Stage::Remove {
            tracing::debug!(tombs = ?job.tombs, "a deleted stream's files are gone");
            self.jobs.remove(&id);
        }
    }

    /// One removal op finished. Directories go depth first: a listing sends out its
    /// entries' removals, and the directory's own `RemoveDir` follows its last one.
    fn remove_step(
        job: &mut Job,
        id: LogId,
        kind: FileOpKind,
        result: Result<FileOutput, FileError>,
        ops: &mut Vec<FileOp>,
    ) {
        // Already gone counts as done: a crash may have got this far before.
        let gone = match &result {
            Ok(_) => true,
            Err(e) => e.kind == FileErrorKind::NotFound,
        };
        match (kind, result) {
            (FileOpKind::ListDir { path }, Ok(FileOutput::Listing(entries))) => {
                if entries.is_empty() {
                    ops.push(Self::op(job, id, FileOpKind::RemoveDir { path }));
                    return;
                }
                job.left.insert(path.clone(), entries.len());
                for e in entries {
                    let child = layout::join(&path, &e.name);
                    let kind = if e.is_dir {
                        FileOpKind::ListDir { path: child }
                    } else {
                        FileOpKind::Remove { path: child }
                    };
                    ops.push(Self::op(job, id, kind));
                }
            }
            (FileOpKind::RemoveDir { path }, _) if gone && job.tombs.contains(&path) => {
                // Last, the tombstone's own name: durable once its parent is synced.
                let (parent, _) = path.rsplit_once('/').expect("a tombstone has a parent");
                let kind = FileOpKind::SyncDir {
                    path: parent.to_owned(),
                };
                ops.push(Self::op(job, id, kind));
            }
            // One entry fewer in the parent, which goes too once it has none left.
            (
                FileOpKind::ListDir { path }
                | FileOpKind::Remove { path }
                | FileOpKind::RemoveDir { path },
                _,
            ) if gone => {
                let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
                let Some(n) = job.left.get_mut(parent) else {
                    return;
                };
                *n -= 1;
                if *n == 0 {
                    let (parent, _) = job.left.remove_entry(parent).expect("counted");
                    ops.push(Self::op(job, id, FileOpKind::RemoveDir { path: parent }));
                }
            }
            // The final sync, or a failure (logged) that leaves this directory and those
            // above it for the next start.
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::memfs::{Crash, MemFs};
    use bytes::Bytes;

    const NS: &str = "streams/t/n";
    const TOMB: &str = "streams/t/n/.deleted.1.1";

    /// A tombstone as a rename leaves it, durable: two shards, one with a nested directory.
    fn tombstone() -> MemFs {
        let mut fs = MemFs::new();
        let mut run = |kind| {
            let done = fs.execute(FileOp { id: OpId(0), kind }).expect("alive");
            assert!(done.result.is_ok(), "{done:?}");
        };
        for dir in ["0", "1/g"] {
            run(FileOpKind::CreateDir {
                path: format!("{TOMB}/{dir}"),
            });
        }
        for file in ["0/a.seg", "0/b.seg", "1/g/c.seg"] {
            let path = format!("{TOMB}/{file}");
            run(FileOpKind::Create { path: path.clone() });
            run(FileOpKind::Append {
                path: path.clone(),
                bytes: Bytes::from_static(b"old"),
            });
            run(FileOpKind::Sync { path });
        }
        for dir in ["0", "1/g"] {
            run(FileOpKind::SyncDir {
                path: format!("{TOMB}/{dir}"),
            });
        }
        fs
    }

    /// What a startup walk does: finishes the tombstone if the namespace still lists it.
    /// Returns every op performed, in order, or `None` if the disk died on the way.
    fn finish_at_startup(fs: &mut MemFs) -> Option<Vec<FileOpKind>> {
        let listed = fs.execute(FileOp {
            id: OpId(0),
            kind: FileOpKind::ListDir { path: NS.into() },
        })?;
        let Ok(FileOutput::Listing(entries)) = listed.result else {
            panic!("{listed:?}");
        };
        let mut done = Vec::new();
        if !entries.iter().any(|e| e.is_dir && is_tombstone(&e.name)) {
            return Some(done);
        }
        let mut retiring = Retiring::default();
        let mut queue = VecDeque::from([retiring.finish(TOMB.into())]);
        while let Some(op) = queue.pop_front() {
            done.push(op.kind.clone());
            let c = fs.execute(op)?;
            let (mut ops, mut events) = (Vec::new(), Vec::new());
            retiring.handle_completion(c, &mut ops, &mut events);
            queue.extend(ops);
        }
        assert!(retiring.jobs.is_empty(), "the job ends with its last op");
        Some(done)
    }

    fn tombstone_gone(fs: &mut MemFs) -> bool {
        let mut list = |path: &str| {
            let kind = FileOpKind::ListDir { path: path.into() };
            fs.execute(FileOp { id: OpId(0), kind })
                .expect("alive")
                .result
        };
        let Ok(FileOutput::Listing(entries)) = list(NS) else {
            panic!("the namespace stays");
        };
        !entries.iter().any(|e| is_tombstone(&e.name))
            && list(TOMB).is_err_and(|e| e.kind == FileErrorKind::NotFound)
    }

    #[test]
    fn directories_go_after_their_contents_and_the_namespace_is_synced_last() {
        let mut fs = tombstone();
        let done = finish_at_startup(&mut fs).expect("no crash");
        let pos = |want: &FileOpKind| done.iter().position(|k| k == want).expect("done");
        let rmdir = |p: &str| FileOpKind::RemoveDir {
            path: format!("{TOMB}{p}"),
        };
        let remove = |p: &str| FileOpKind::Remove {
            path: format!("{TOMB}/{p}"),
        };
        assert!(pos(&remove("1/g/c.seg")) < pos(&rmdir("/1/g")));
        assert!(pos(&rmdir("/1/g")) < pos(&rmdir("/1")));
        assert!(pos(&remove("0/b.seg")) < pos(&rmdir("/0")));
        assert!(pos(&rmdir("/0")) < pos(&rmdir("")));
        assert_eq!(
            done[done.len() - 2..],
            [rmdir(""), FileOpKind::SyncDir { path: NS.into() }]
        );
        // Synced: a power loss now does not bring it back.
        fs.crash(Crash::Power);
        assert!(tombstone_gone(&mut fs));
    }

    #[test]
    fn a_crash_at_any_step_of_the_removal_is_finished_by_the_next_start() {
        let steps = {
            let mut fs = tombstone();
            let before = fs.writes;
            finish_at_startup(&mut fs).expect("no crash");
            fs.writes - before
        };
        for step in 0..steps {
            for crash in [
                Crash::Process,
                Crash::Power,
                Crash::PowerReordered(step as u64),
            ] {
                let mut fs = tombstone();
                fs.crash_at_step(fs.writes + step, None);
                assert!(finish_at_startup(&mut fs).is_none(), "step {step} crashes");
                fs.crash(crash);
                finish_at_startup(&mut fs).expect("no crash");
                fs.crash(Crash::Power);
                assert!(tombstone_gone(&mut fs), "step {step}, {crash:?}");
            }
        }
    }
}
