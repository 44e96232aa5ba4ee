//! Deleting a stream (an operator action, docs/stream-features.md "Deleting a stream").
//!
//! In memory: every subscription of the stream ends after what was already queued for it —
//! with `stream_deleted` for a client that offered FEATURE_STREAM_DELETED, otherwise its
//! event stream just finishes — and the stream is forgotten, so the next publish or
//! subscribe creates it afresh.
//!
//! On disk the shard logs are retired in steps that a crash can interrupt anywhere:
//! 1. the logs are forgotten — the shards' and their consumer groups' (answers waiting on
//!    them fail, group polls are answered `not_found`; late completions are ignored);
//! 2. `streams/T/N/S` is renamed to a tombstone beside it, `streams/T/N/.deleted.<µs>.<n>`
//!    (one atomic op; `.` never starts an escaped name), and the namespace directory is
//!    synced; then the same for `groups/T/N/S`. From the first rename on the stream is gone
//!    for good: recovery never opens a tombstone. Until both renames are durable a publish,
//!    subscribe or group request that would recreate the stream waits (it is stalled on
//!    the retirement's id and re-run then), so a new log never opens old files;
//! 3. the tombstone is removed depth first: a directory's files and subdirectories go, then
//!    the directory itself (`RemoveDir`), up to the tombstone, after which the namespace
//!    directory is synced. A restart finds a leftover tombstone during its walk and runs
//!    this step again on what is left; anything already gone (`NotFound`) counts as done.

use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::Bytes;
use felix_proto::message::{Message, StreamDeleted};

use super::durable::{Logs, Notice, ShardStore};
use super::{mark_ready, seal, Broker, FanOut, Shard, Stream, StreamKey, SubscriberId};
use crate::session::encode_message;
use felix_storage::layout;
use felix_storage::ops::{
    FileCompletion, FileError, FileErrorKind, FileOp, FileOpKind, FileOutput, LogId, OpId,
};

/// Retirement jobs take log ids from here up, far above any real log's.
const RETIRE_BASE: u32 = 0xF000_0000;
/// Prefix of a tombstone directory's name.
pub(crate) const TOMBSTONE_PREFIX: &str = ".deleted.";

/// Why a stream was not deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeleteRefusal {
    /// No such stream here (never used since start and nothing on disk).
    NotFound,
    /// Not now (a shard log still opening, or the broker draining); try again.
    Unavailable(String),
}

/// True for a directory name that is a stream's tombstone.
pub(crate) fn is_tombstone(name: &str) -> bool {
    name.starts_with(TOMBSTONE_PREFIX)
}

/// Ids of the retirement jobs' file ops are `LogId`s at or above [`RETIRE_BASE`].
pub(crate) fn is_retire_id(id: LogId) -> bool {
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
pub(crate) struct Retiring {
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
    fn start(&mut self, dirs: Vec<String>, unix_micros: u64) -> (LogId, FileOp) {
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
    pub(crate) fn finish(&mut self, tomb: String) -> FileOp {
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
    pub(crate) fn blocking(&self, dir: &str) -> Option<LogId> {
        self.jobs
            .iter()
            .find(|(_, j)| j.stage != Stage::Remove && j.blocks == dir)
            .map(|(id, _)| *id)
    }

    /// A retirement op finished: the next ops, and a notice once the renames are durable.
    pub(crate) fn handle_completion(
        &mut self,
        c: FileCompletion,
        ops: &mut Vec<FileOp>,
        notices: &mut Vec<Notice>,
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
                notices.push(Notice::Opened { log: id });
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
                notices.push(Notice::Opened { log: id });
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

impl Broker {
    /// Deletes a stream: its subscriptions end, its records are gone, and the next publish
    /// or subscribe creates it afresh (offsets from 0, width from the configuration).
    pub(crate) fn delete_stream(
        &mut self,
        unix_micros: u64,
        key: &StreamKey,
    ) -> Result<(), DeleteRefusal> {
        if self.draining {
            return Err(DeleteRefusal::Unavailable("the broker is draining".into()));
        }
        let dir = stream_dir(key);
        let on_disk = self
            .logs
            .as_ref()
            .map(|l| l.logs_under(&format!("{dir}/")))
            .unwrap_or_default();
        let index = self.stream_index.get(key).copied();
        if index.is_none() && on_disk.is_empty() {
            return Err(DeleteRefusal::NotFound);
        }
        if let Some(logs) = self.logs.as_ref() {
            if on_disk.iter().any(|&id| logs.is_opening(id)) {
                return Err(DeleteRefusal::Unavailable(
                    "a shard's log is still opening".into(),
                ));
            }
        }
        let mut group_logs = Vec::new();
        if let Some(index) = index {
            group_logs = self.forget_stream_groups(index);
            self.end_subscriptions(index);
            self.stream_index.remove(key);
            self.dirty.retain(|(s, _)| *s != index);
            // The index stays taken by an empty stream, so nothing reaches the new stream
            // through a stale index (consumer-group state keyed by it). Its shards keep the
            // id of their forgotten log: code holding the old index finds the log gone
            // and answers so, rather than meeting an in-memory shard.
            let shards = self.streams[index].shards.iter().map(dead_shard).collect();
            self.streams[index] = Stream { shards };
        }
        let gone: Vec<LogId> = on_disk.into_iter().chain(group_logs).collect();
        for &id in &gone {
            // Before the log is forgotten, so these answers go out ahead of `Failed`.
            self.fail_page_reads(id, "the stream was deleted");
        }
        if let Some(logs) = self.logs.as_mut() {
            for id in gone {
                self.recovered.remove(&id);
                logs.forget(id);
                // Answers held for durability on it, or requests stalled on it, fail now.
                logs.notices.push_back(Notice::Failed { log: id });
            }
            // Its groups' logs go too, or a recreated stream's groups would find old cursors.
            let groups_dir = parent_dir(&super::groups::group_log_dir(key, 0));
            logs.retire(vec![dir, groups_dir], unix_micros);
        }
        Ok(())
    }

    /// A retirement that a new log for this stream must wait for.
    pub(super) fn stream_delete_pending(&self, key: &StreamKey) -> Option<LogId> {
        self.logs.as_ref()?.retiring_blocks(&stream_dir(key))
    }

    /// Ends every subscription on stream `index` after what is queued for it.
    fn end_subscriptions(&mut self, index: usize) {
        let mut fan = FanOut {
            subscribers: &mut self.subscribers,
            ready: &mut self.ready,
            stats: &mut self.stats,
            budget: &mut self.event_budget,
        };
        // Records already fanned in go out first.
        for sh in &mut self.streams[index].shards {
            sh.dirty = false;
            seal(sh, &mut fan);
        }
        // In id order, not the hash map's: the final frames are queued (and sent) in it.
        let mut ids: Vec<SubscriberId> = self
            .subscribers
            .iter()
            .filter(|(_, s)| s.stream == index && s.final_frame.is_none())
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        for id in ids {
            let Some(sub) = self.subscribers.get_mut(&id) else {
                continue;
            };
            // Replay frames already encoded go out too; the rest of the replay cannot.
            if let Some(cu) = sub.catch_up.take() {
                for f in cu.frames.into_iter().rev() {
                    sub.queued_bytes += f.len();
                    self.event_budget.add(sub.owner, f.len());
                    sub.queue.push_front(f);
                }
            }
            sub.detached = true;
            // An empty final frame finishes the stream with nothing more on it: what a
            // client that did not offer the feature always saw.
            sub.final_frame = Some(if sub.ends_on_delete {
                encode_message(&Message::StreamDeleted(StreamDeleted {
                    subscription_id: sub.subscription_id,
                }))
            } else {
                Bytes::new()
            });
            mark_ready(id, sub, &mut self.ready);
        }
        for sh in &mut self.streams[index].shards {
            sh.subscribers.clear();
        }
    }
}

impl Logs {
    /// Starts retiring a stream directory (the rename to a tombstone).
    fn retire(&mut self, dirs: Vec<String>, unix_micros: u64) {
        let (_, op) = self.retiring.start(dirs, unix_micros);
        self.push_op(op);
    }

    /// Routes a retirement op's completion.
    pub(super) fn retire_completion(&mut self, c: FileCompletion) {
        let (mut ops, mut notices) = (Vec::new(), Vec::new());
        self.retiring.handle_completion(c, &mut ops, &mut notices);
        ops.into_iter().for_each(|op| self.push_op(op));
        self.notices.extend(notices);
    }

    fn retiring_blocks(&self, dir: &str) -> Option<LogId> {
        self.retiring.blocking(dir)
    }
}

/// What a deleted stream's shard leaves behind at its old index.
fn dead_shard(sh: &Shard) -> Shard {
    let mut dead = Shard::new();
    dead.has_offsets = sh.has_offsets;
    dead.store = sh.store.as_ref().map(|s| ShardStore {
        log: s.log,
        unreleased: VecDeque::new(),
        released: s.released,
    });
    dead
}

fn stream_dir(key: &StreamKey) -> String {
    parent_dir(&layout::stream_shard_dir(
        &key.tenant,
        &key.namespace,
        &key.stream,
        0,
    ))
}

fn parent_dir(shard_dir: &str) -> String {
    shard_dir
        .rsplit_once('/')
        .map(|(d, _)| d.to_owned())
        .expect("a shard dir has a parent")
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use felix_storage::memfs::{Crash, MemFs};

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
            let (mut ops, mut notices) = (Vec::new(), Vec::new());
            retiring.handle_completion(c, &mut ops, &mut notices);
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
