//! Test support: an in-memory filesystem that executes [`FileOp`]s, with crashes.
//!
//! Each file keeps what was written and what the last sync made durable; each directory
//! keeps its live entries and the entries its last sync made durable. A removed directory
//! is kept aside until its parent is synced, and a power loss before that brings it back.
//! A crash is injected at a chosen write step (optionally tearing that step's append at a
//! chosen byte), after which the filesystem swallows every op, and then [`MemFs::crash`]
//! decides what a reboot finds: everything (a process crash: the page cache survives), only
//! synced state (power loss), synced state plus a prefix of the unsynced bytes (partial
//! writeback), or the unsynced sectors zeroed (the size reached the disk, the data did not).
//! [`MemFs::crash_drawn`] instead draws what a crash loses from a caller's [`Dice`] (the
//! simulator's seeded stream), tearing appends that were still in flight.
//!
//! It is the one in-memory disk of the workspace: storage and engine tests, the engine fuzz
//! target and the simulator all run on it. It counts the ops it performs by kind, and can
//! play a disk whose fsync lies ([`MemFs::sync_lies`]), a canary for the durability checks.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::ops::{
    DirEntry, FileCompletion, FileError, FileErrorKind, FileOp, FileOpKind, FileOutput,
};

/// Sector size for [`Crash::PowerZeroed`] and drawn crashes: lost sectors read as zeros.
const SECTOR: usize = 512;

#[derive(Debug, Clone, Default)]
struct MemFile {
    data: Vec<u8>,
    durable: Vec<u8>,
    /// How many leading bytes of `data` a drawn crash keeps for sure. Unlike `durable`, it
    /// follows a truncation or a re-create at once (the simulator's model of the device).
    synced: usize,
}

#[derive(Debug, Clone, Default)]
struct MemDir {
    live: BTreeMap<String, u64>,
    durable: BTreeMap<String, u64>,
}

/// What survives a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crash {
    /// The process died; the kernel kept every write and every directory change.
    Process,
    /// Power loss: only synced bytes and synced directory entries survive.
    Power,
    /// Power loss that still wrote back the first `n` unsynced bytes of every file.
    PowerKeeping(usize),
    /// Power loss after file sizes reached the disk but unsynced sectors did not: the file
    /// keeps its length, and every sector past the last synced one reads as zeros.
    PowerZeroed,
    /// Power loss where the device kept an arbitrary subset of the unsynced directory
    /// changes (chosen by the seed), each name independently: a later unlink may survive
    /// while an earlier rename is lost. Only a directory sync between them orders them.
    PowerReordered(u64),
}

/// What a crash drawn by [`MemFs::crash_drawn`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrawnCrash {
    /// The process died; the kernel writes its page cache back, so nothing is lost.
    Process,
    /// Power loss: unsynced bytes and directory changes may be gone, appends in flight torn.
    Power,
}

/// The randomness a drawn crash takes its choices from. The simulator passes its seeded
/// stream, so a run's crashes repeat with its seed.
pub trait Dice {
    /// Uniform in `0..n` (`n` > 0).
    fn below(&mut self, n: u64) -> u64;
    /// True with probability `p`.
    fn chance(&mut self, p: f64) -> bool;
}

type Fault = Box<dyn FnMut(&FileOpKind) -> Option<FileErrorKind>>;

pub struct MemFs {
    /// By inode; ordered, so a drawn crash visits files in a repeatable order.
    files: BTreeMap<u64, MemFile>,
    next_inode: u64,
    /// Existing directories (a create is durable at once: `CreateDir` syncs its parents).
    dir_set: BTreeSet<String>,
    dirs: BTreeMap<String, MemDir>,
    /// Directories removed since their parent's last sync, as they were: like an unlinked
    /// file's entry, the removal is undone by a power loss until that sync.
    removed_dirs: BTreeMap<String, MemDir>,
    /// Write steps (ops that change the filesystem) executed so far.
    pub writes: usize,
    crash_at: Option<usize>,
    tear: Option<usize>,
    dead: bool,
    fault: Option<Fault>,
    /// Canary: a `Sync` reports success and makes nothing durable.
    pub sync_lies: bool,
    /// Ops performed, by [`FileOpKind::name`].
    counts: BTreeMap<&'static str, usize>,
    ops: u64,
}

impl Default for MemFs {
    /// An empty filesystem (with its root directory).
    fn default() -> MemFs {
        MemFs::new()
    }
}

fn split(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

fn err(kind: FileErrorKind, what: &str, path: &str) -> FileError {
    FileError::new(kind, format!("{what}: {path}"))
}

impl MemFs {
    pub fn new() -> MemFs {
        let mut fs = MemFs {
            files: BTreeMap::new(),
            next_inode: 0,
            dir_set: BTreeSet::new(),
            dirs: BTreeMap::new(),
            removed_dirs: BTreeMap::new(),
            writes: 0,
            crash_at: None,
            tear: None,
            dead: false,
            fault: None,
            sync_lies: false,
            counts: BTreeMap::new(),
            ops: 0,
        };
        fs.dir_set.insert(String::new());
        fs.dirs.insert(String::new(), MemDir::default());
        fs
    }

    /// The write step numbered `step` (0-based) is where the machine dies; if it is an
    /// append and `tear` is set, only that many of its bytes reach the page cache first.
    pub fn crash_at_step(&mut self, step: usize, tear: Option<usize>) {
        self.crash_at = Some(step);
        self.tear = tear;
    }

    /// Makes matching ops fail with the returned kind.
    pub fn inject(&mut self, fault: impl FnMut(&FileOpKind) -> Option<FileErrorKind> + 'static) {
        self.fault = Some(Box::new(fault));
    }

    /// Some file in a directory under `prefix` holds bytes a power loss may take (written
    /// since its last sync).
    pub fn has_unsynced_data_under(&self, prefix: &str) -> bool {
        self.dirs
            .iter()
            .filter(|(path, _)| path.starts_with(prefix))
            .flat_map(|(_, d)| d.live.values())
            .filter_map(|inode| self.files.get(inode))
            .any(|f| f.data != f.durable)
    }

    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// Reboots: applies `how` and makes the filesystem live again.
    pub fn crash(&mut self, how: Crash) {
        self.dead = false;
        self.crash_at = None;
        self.tear = None;
        self.fault = None;
        if how == Crash::Process {
            self.removed_dirs.clear();
            return;
        }
        let mut seed = match how {
            Crash::PowerReordered(seed) => seed | 1,
            _ => 0,
        };
        // Parents sort before their children, so a directory comes back only into a parent
        // that is there (it could not have been removed while it had the child).
        for (path, d) in std::mem::take(&mut self.removed_dirs) {
            if seed != 0 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                if seed % 2 == 0 {
                    continue; // this removal reached the device
                }
            }
            if self.dir_set.contains(split(&path).0) {
                self.dir_set.insert(path.clone());
                self.dirs.insert(path, d);
            }
        }
        for d in self.dirs.values_mut() {
            if seed == 0 {
                d.live = d.durable.clone();
                continue;
            }
            let names: BTreeSet<String> = d.live.keys().chain(d.durable.keys()).cloned().collect();
            let mut kept = BTreeMap::new();
            for name in names {
                let (live, durable) = (d.live.get(&name), d.durable.get(&name));
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let pick = if live != durable && seed % 2 == 0 {
                    live
                } else {
                    durable
                };
                if let Some(&inode) = pick {
                    kept.insert(name, inode);
                }
            }
            d.live = kept;
            d.durable = d.live.clone();
        }
        for f in self.files.values_mut() {
            let synced_prefix = f.data.starts_with(&f.durable);
            f.data = match how {
                Crash::PowerKeeping(n) if synced_prefix => {
                    let keep = (f.durable.len() + n).min(f.data.len());
                    f.data[..keep].to_vec()
                }
                Crash::PowerZeroed if synced_prefix => {
                    let mut d = f.data.clone();
                    let from = f.durable.len().div_ceil(512) * 512;
                    for b in d.iter_mut().skip(from) {
                        *b = 0;
                    }
                    d
                }
                _ => f.durable.clone(),
            };
            f.durable = f.data.clone();
            f.synced = f.data.len();
        }
    }

    /// A crash whose losses `dice` draws, then a reboot. A process crash loses nothing (the
    /// kernel writes its page cache back). A power loss first lets each append of
    /// `in_flight` (ops handed out, not completed) reach the page cache torn, or not at all;
    /// then per file with unsynced bytes keeps none of them, a prefix, or the length with
    /// the unsynced sectors zeroed; then undoes each unsynced directory change or not.
    /// Returns a line saying what was at risk, for a trace.
    pub fn crash_drawn(
        &mut self,
        how: DrawnCrash,
        in_flight: &[FileOp],
        dice: &mut dyn Dice,
    ) -> String {
        self.dead = false;
        self.crash_at = None;
        self.tear = None;
        self.fault = None;
        if how == DrawnCrash::Process {
            for f in self.files.values_mut() {
                f.durable = f.data.clone();
                f.synced = f.data.len();
            }
            for d in self.dirs.values_mut() {
                d.durable = d.live.clone();
            }
            self.removed_dirs.clear();
            self.collect_garbage();
            return "process crash: page cache kept".to_owned();
        }
        for op in in_flight {
            if let FileOpKind::Append { path, bytes } = &op.kind {
                if dice.chance(0.5) {
                    let n = dice.below(bytes.len() as u64 + 1) as usize;
                    if let Some(inode) = self.lookup(path) {
                        let f = self.files.get_mut(&inode).expect("inode");
                        f.data.extend_from_slice(&bytes[..n]);
                    }
                }
            }
        }
        let (mut lost_bytes, mut torn) = (0usize, 0usize);
        for f in self.files.values_mut() {
            let unsynced = f.data.len() - f.synced;
            if unsynced > 0 {
                match dice.below(4) {
                    // Nothing unsynced reached the device.
                    0 => f.data.truncate(f.synced),
                    // A prefix did: the last write torn at any byte.
                    1 | 2 => {
                        let keep = f.synced + dice.below(unsynced as u64 + 1) as usize;
                        f.data.truncate(keep);
                        torn += 1;
                    }
                    // The size reached the device, the sectors past the last synced one
                    // did not.
                    _ => {
                        let from = f.synced.div_ceil(SECTOR) * SECTOR;
                        for b in f.data.iter_mut().skip(from) {
                            *b = 0;
                        }
                        torn += 1;
                    }
                }
                lost_bytes += unsynced;
            }
            f.durable = f.data.clone();
            f.synced = f.data.len();
        }
        let mut dirs_reverted = 0;
        // An unsynced removal is lost like any unsynced directory change. Parents sort
        // first, so a directory only comes back into one that is there.
        for (path, d) in std::mem::take(&mut self.removed_dirs) {
            if self.dir_set.contains(split(&path).0) && dice.chance(0.5) {
                self.dir_set.insert(path.clone());
                self.dirs.insert(path, d);
                dirs_reverted += 1;
            }
        }
        for d in self.dirs.values_mut() {
            if d.live != d.durable && dice.chance(0.5) {
                d.live = d.durable.clone();
                dirs_reverted += 1;
            } else {
                d.durable = d.live.clone();
            }
        }
        self.collect_garbage();
        format!(
            "power loss: {lost_bytes} unsynced bytes at risk, {torn} files torn, {dirs_reverted} directories reverted"
        )
    }

    /// Drops files no entry names (only safe once every directory is durable as it is).
    fn collect_garbage(&mut self) {
        let named: BTreeSet<u64> = self
            .dirs
            .values()
            .flat_map(|d| d.live.values().copied())
            .collect();
        self.files.retain(|inode, _| named.contains(inode));
    }

    /// Ops performed so far of the kind [`FileOpKind::name`] calls `kind`.
    pub fn count(&self, kind: &str) -> usize {
        self.counts.get(kind).copied().unwrap_or(0)
    }

    /// Ops performed so far, of every kind.
    pub fn ops(&self) -> u64 {
        self.ops
    }

    fn lookup(&self, path: &str) -> Option<u64> {
        let (dir, name) = split(path);
        self.dirs.get(dir)?.live.get(name).copied()
    }

    /// A file's current bytes.
    pub fn file(&self, path: &str) -> Option<&[u8]> {
        self.lookup(path).map(|i| &self.files[&i].data[..])
    }

    /// Replaces a file's bytes as if the disk had them (for corruption tests).
    pub fn put_file(&mut self, path: &str, bytes: Vec<u8>) {
        let inode = self.lookup(path).expect("file exists");
        let f = self.files.get_mut(&inode).expect("inode");
        f.synced = bytes.len();
        f.data = bytes.clone();
        f.durable = bytes;
    }

    /// Every file by path, with its current bytes.
    pub fn files(&self) -> BTreeMap<String, &[u8]> {
        let mut out = BTreeMap::new();
        for (dir, d) in &self.dirs {
            for (name, inode) in &d.live {
                let path = if dir.is_empty() {
                    name.clone()
                } else {
                    format!("{dir}/{name}")
                };
                out.insert(path, &self.files[inode].data[..]);
            }
        }
        out
    }

    /// Every directory (the root is `""`).
    pub fn dirs(&self) -> &BTreeSet<String> {
        &self.dir_set
    }

    pub fn has_dir(&self, path: &str) -> bool {
        self.dir_set.contains(path)
    }

    /// Makes a directory and its parents, at once and durably (for tests that build a disk
    /// a crash could have left).
    pub fn plant_dir(&mut self, path: &str) {
        let kind = FileOpKind::CreateDir { path: path.into() };
        self.apply(kind).expect("a directory can always be made");
    }

    /// Writes a file (and its directories) at once and durably, replacing any.
    pub fn plant_file(&mut self, path: &str, bytes: Vec<u8>) {
        let (dir, name) = split(path);
        self.plant_dir(dir);
        if self.lookup(path).is_none() {
            let inode = self.next_inode;
            self.next_inode += 1;
            self.files.insert(inode, MemFile::default());
            let d = self.dirs.get_mut(dir).expect("planted");
            d.live.insert(name.to_owned(), inode);
            d.durable.insert(name.to_owned(), inode);
        }
        self.put_file(path, bytes);
    }

    /// Unlinks, at once and durably, every file whose path `keep` refuses.
    pub fn retain_files(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let gone: Vec<String> = self.files().into_keys().filter(|p| !keep(p)).collect();
        for path in gone {
            self.delete(&path);
        }
    }

    /// Drops, at once and durably, every directory (but the root) whose path `keep`
    /// refuses, with the files in it.
    pub fn retain_dirs(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let gone: Vec<String> = self
            .dir_set
            .iter()
            .filter(|p| !p.is_empty() && !keep(p))
            .cloned()
            .collect();
        for path in gone {
            self.dir_set.remove(&path);
            self.dirs.remove(&path);
            self.removed_dirs.remove(&path);
        }
    }

    /// Names of the files in a directory, sorted.
    pub fn list(&self, dir: &str) -> Vec<String> {
        self.dirs
            .get(dir)
            .map(|d| d.live.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Unlinks a file at once and durably (for tests that build damaged directories).
    pub fn delete(&mut self, path: &str) {
        let (dir, name) = split(path);
        let d = self.dirs.get_mut(dir).expect("dir");
        d.live.remove(name);
        d.durable.remove(name);
    }

    /// Runs one op. `None` when the machine is dead (the op never completes).
    pub fn execute(&mut self, op: FileOp) -> Option<FileCompletion> {
        if self.dead {
            return None;
        }
        if op.kind.is_write() {
            if self.crash_at == Some(self.writes) {
                self.dead = true;
                if let (FileOpKind::Append { path, bytes }, Some(n)) = (&op.kind, self.tear) {
                    if let Some(inode) = self.lookup(path) {
                        let f = self.files.get_mut(&inode).expect("inode");
                        f.data.extend_from_slice(&bytes[..n.min(bytes.len())]);
                    }
                }
                return None;
            }
            self.writes += 1;
        }
        self.ops += 1;
        *self.counts.entry(op.kind.name()).or_default() += 1;
        if let Some(kind) = self.fault.as_mut().and_then(|f| f(&op.kind)) {
            return Some(FileCompletion {
                id: op.id,
                result: Err(err(kind, "injected", op.kind.path())),
            });
        }
        let result = self.apply(op.kind);
        Some(FileCompletion { id: op.id, result })
    }

    fn apply(&mut self, kind: FileOpKind) -> Result<FileOutput, FileError> {
        use FileErrorKind::NotFound;
        match kind {
            FileOpKind::CreateDir { path } => {
                let mut at = String::new();
                for part in path.split('/') {
                    at = if at.is_empty() {
                        part.to_owned()
                    } else {
                        format!("{at}/{part}")
                    };
                    // A directory made again is a new one, and its parent's entry is synced.
                    if self.dir_set.insert(at.clone()) {
                        self.removed_dirs.remove(&at);
                    }
                    self.dirs.entry(at.clone()).or_default();
                }
                Ok(FileOutput::Done)
            }
            FileOpKind::ListDir { path } => {
                let d = self
                    .dirs
                    .get(&path)
                    .ok_or_else(|| err(NotFound, "no dir", &path))?;
                let mut entries: Vec<DirEntry> = d
                    .live
                    .iter()
                    .map(|(name, inode)| DirEntry {
                        name: name.clone(),
                        len: self.files[inode].data.len() as u64,
                        is_dir: false,
                    })
                    .collect();
                let prefix = if path.is_empty() {
                    String::new()
                } else {
                    format!("{path}/")
                };
                for sub in &self.dir_set {
                    if let Some(name) = sub.strip_prefix(&prefix) {
                        if !name.is_empty() && !name.contains('/') {
                            entries.push(DirEntry {
                                name: name.to_owned(),
                                len: 0,
                                is_dir: true,
                            });
                        }
                    }
                }
                Ok(FileOutput::Listing(entries))
            }
            FileOpKind::Create { path } => {
                let (dir, name) = split(&path);
                if let Some(inode) = self.lookup(&path) {
                    let f = self.files.get_mut(&inode).expect("inode");
                    f.data.clear();
                    f.synced = 0;
                    return Ok(FileOutput::Done);
                }
                let d = self
                    .dirs
                    .get_mut(dir)
                    .ok_or_else(|| err(NotFound, "no dir", &path))?;
                let inode = self.next_inode;
                self.next_inode += 1;
                self.files.insert(inode, MemFile::default());
                d.live.insert(name.to_owned(), inode);
                Ok(FileOutput::Done)
            }
            FileOpKind::Append { path, bytes } => {
                let inode = self
                    .lookup(&path)
                    .ok_or_else(|| err(NotFound, "no file", &path))?;
                self.files
                    .get_mut(&inode)
                    .expect("inode")
                    .data
                    .extend_from_slice(&bytes);
                Ok(FileOutput::Done)
            }
            FileOpKind::Read { path, pos, len } => {
                let inode = self
                    .lookup(&path)
                    .ok_or_else(|| err(NotFound, "no file", &path))?;
                let data = &self.files[&inode].data;
                let start = (pos as usize).min(data.len());
                let end = (start + len as usize).min(data.len());
                Ok(FileOutput::Data(Bytes::copy_from_slice(&data[start..end])))
            }
            FileOpKind::Sync { path } => {
                let inode = self
                    .lookup(&path)
                    .ok_or_else(|| err(NotFound, "no file", &path))?;
                let f = self.files.get_mut(&inode).expect("inode");
                if !self.sync_lies {
                    f.durable = f.data.clone();
                    f.synced = f.data.len();
                }
                Ok(FileOutput::Done)
            }
            FileOpKind::SyncDir { path } => {
                let d = self
                    .dirs
                    .get_mut(&path)
                    .ok_or_else(|| err(NotFound, "no dir", &path))?;
                d.durable = d.live.clone();
                // Subdirectories removed from it are gone for good.
                self.removed_dirs.retain(|sub, _| split(sub).0 != path);
                Ok(FileOutput::Done)
            }
            FileOpKind::Truncate { path, len } => {
                let inode = self
                    .lookup(&path)
                    .ok_or_else(|| err(NotFound, "no file", &path))?;
                let f = self.files.get_mut(&inode).expect("inode");
                f.data.truncate(len as usize);
                f.synced = f.synced.min(f.data.len());
                Ok(FileOutput::Done)
            }
            FileOpKind::Rename { from, to } if !from.is_empty() && self.dir_set.contains(&from) => {
                self.rename_dir(&from, &to)
            }
            FileOpKind::Rename { from, to } => {
                let inode = self
                    .lookup(&from)
                    .ok_or_else(|| err(NotFound, "no file", &from))?;
                let (fdir, fname) = split(&from);
                let (tdir, tname) = split(&to);
                if !self.dir_set.contains(tdir) {
                    return Err(err(NotFound, "no dir", &to));
                }
                self.dirs.get_mut(fdir).expect("dir").live.remove(fname);
                let d = self.dirs.get_mut(tdir).expect("in dir_set");
                d.live.insert(tname.to_owned(), inode);
                Ok(FileOutput::Done)
            }
            FileOpKind::Remove { path } => {
                let (dir, name) = split(&path);
                let d = self
                    .dirs
                    .get_mut(dir)
                    .ok_or_else(|| err(NotFound, "no dir", &path))?;
                d.live
                    .remove(name)
                    .map(|_| FileOutput::Done)
                    .ok_or_else(|| err(NotFound, "no file", &path))
            }
            FileOpKind::RemoveDir { path } => {
                if path.is_empty() {
                    return Err(err(FileErrorKind::Other, "the root stays", &path));
                }
                let d = self
                    .dirs
                    .get(&path)
                    .ok_or_else(|| err(NotFound, "no dir", &path))?;
                let prefix = format!("{path}/");
                let has_subdir = self
                    .dir_set
                    .range(prefix.clone()..)
                    .next()
                    .is_some_and(|sub| sub.starts_with(&prefix));
                if !d.live.is_empty() || has_subdir {
                    return Err(err(FileErrorKind::Other, "directory not empty", &path));
                }
                self.dir_set.remove(&path);
                let d = self.dirs.remove(&path).expect("listed above");
                self.removed_dirs.insert(path, d);
                Ok(FileOutput::Done)
            }
        }
    }
}

impl MemFs {
    /// Moves a directory with everything under it. Like a directory's creation, the move
    /// is durable at once: the model keeps unsynced entries for files only.
    fn rename_dir(&mut self, from: &str, to: &str) -> Result<FileOutput, FileError> {
        if !self.dir_set.contains(split(to).0) {
            return Err(err(FileErrorKind::NotFound, "no dir", to));
        }
        if self.dir_set.contains(to) || self.lookup(to).is_some() {
            return Err(err(FileErrorKind::Other, "target exists", to));
        }
        let prefix = format!("{from}/");
        let under = |p: &String| p == from || p.starts_with(&prefix);
        let moved = |p: &str| format!("{to}{}", &p[from.len()..]);
        for path in self
            .dir_set
            .iter()
            .filter(|p| under(p))
            .cloned()
            .collect::<Vec<_>>()
        {
            self.dir_set.remove(&path);
            self.dir_set.insert(moved(&path));
            if let Some(d) = self.dirs.remove(&path) {
                self.dirs.insert(moved(&path), d);
            }
        }
        let removed: Vec<String> = self
            .removed_dirs
            .keys()
            .filter(|p| under(p))
            .cloned()
            .collect();
        for path in removed {
            let d = self.removed_dirs.remove(&path).expect("listed");
            self.removed_dirs.insert(moved(&path), d);
        }
        Ok(FileOutput::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::OpId;

    fn run(fs: &mut MemFs, kind: FileOpKind) -> Option<Result<FileOutput, FileError>> {
        fs.execute(FileOp { id: OpId(0), kind }).map(|c| c.result)
    }

    fn append(path: &str, b: &'static [u8]) -> FileOpKind {
        FileOpKind::Append {
            path: path.into(),
            bytes: Bytes::from_static(b),
        }
    }

    #[test]
    fn power_loss_keeps_only_synced_bytes_and_entries() {
        let mut fs = MemFs::new();
        run(&mut fs, FileOpKind::CreateDir { path: "a/b".into() });
        run(
            &mut fs,
            FileOpKind::Create {
                path: "a/b/f".into(),
            },
        );
        run(&mut fs, append("a/b/f", b"hello"));
        run(
            &mut fs,
            FileOpKind::Sync {
                path: "a/b/f".into(),
            },
        );
        run(&mut fs, append("a/b/f", b" world"));
        // Not durable: the entry was never synced into its directory.
        fs.crash(Crash::Power);
        assert_eq!(fs.file("a/b/f"), None);

        run(
            &mut fs,
            FileOpKind::Create {
                path: "a/b/f".into(),
            },
        );
        run(&mut fs, append("a/b/f", b"hello"));
        run(
            &mut fs,
            FileOpKind::Sync {
                path: "a/b/f".into(),
            },
        );
        run(&mut fs, FileOpKind::SyncDir { path: "a/b".into() });
        run(&mut fs, append("a/b/f", b" world"));
        fs.crash(Crash::PowerKeeping(3));
        assert_eq!(fs.file("a/b/f"), Some(&b"hello wo"[..]));
    }

    #[test]
    fn a_crash_step_swallows_ops_and_can_tear_an_append() {
        let mut fs = MemFs::new();
        run(&mut fs, FileOpKind::CreateDir { path: "d".into() });
        run(&mut fs, FileOpKind::Create { path: "d/f".into() });
        fs.crash_at_step(fs.writes, Some(2));
        assert!(run(&mut fs, append("d/f", b"abcdef")).is_none());
        assert!(fs.is_dead());
        assert!(run(&mut fs, FileOpKind::ListDir { path: "d".into() }).is_none());
        fs.crash(Crash::Process);
        assert_eq!(fs.file("d/f"), Some(&b"ab"[..]));
    }

    #[test]
    fn zeroed_sectors_keep_the_length() {
        let mut fs = MemFs::new();
        run(&mut fs, FileOpKind::CreateDir { path: "d".into() });
        run(&mut fs, FileOpKind::Create { path: "d/f".into() });
        run(&mut fs, FileOpKind::SyncDir { path: "d".into() });
        run(
            &mut fs,
            FileOpKind::Append {
                path: "d/f".into(),
                bytes: Bytes::from(vec![7u8; 100]),
            },
        );
        run(&mut fs, FileOpKind::Sync { path: "d/f".into() });
        run(
            &mut fs,
            FileOpKind::Append {
                path: "d/f".into(),
                bytes: Bytes::from(vec![9u8; 1000]),
            },
        );
        fs.crash(Crash::PowerZeroed);
        let f = fs.file("d/f").unwrap();
        assert_eq!(f.len(), 1100);
        assert!(f[..512].iter().all(|&b| b != 0));
        assert!(f[512..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_rename_replaces_and_is_durable_only_after_a_dir_sync() {
        let mut fs = MemFs::new();
        run(&mut fs, FileOpKind::CreateDir { path: "d".into() });
        for (name, body) in [("d/x", &b"old"[..]), ("d/x.tmp", &b"new"[..])] {
            run(&mut fs, FileOpKind::Create { path: name.into() });
            run(
                &mut fs,
                FileOpKind::Append {
                    path: name.into(),
                    bytes: Bytes::copy_from_slice(body),
                },
            );
            run(&mut fs, FileOpKind::Sync { path: name.into() });
        }
        run(&mut fs, FileOpKind::SyncDir { path: "d".into() });
        run(
            &mut fs,
            FileOpKind::Rename {
                from: "d/x.tmp".into(),
                to: "d/x".into(),
            },
        );
        assert_eq!(fs.file("d/x"), Some(&b"new"[..]));
        fs.crash(Crash::Power);
        assert_eq!(fs.file("d/x"), Some(&b"old"[..]));
        assert_eq!(fs.list("d"), vec!["x".to_string(), "x.tmp".to_string()]);
    }

    #[test]
    fn remove_dir_takes_only_an_empty_directory_and_is_durable_after_a_parent_sync() {
        let mut fs = MemFs::new();
        let rmdir = |fs: &mut MemFs, p: &str| {
            run(fs, FileOpKind::RemoveDir { path: p.into() }).expect("alive")
        };
        let kind = |r: Result<FileOutput, FileError>| r.unwrap_err().kind;
        // A directory holding a file and a subdirectory, its entries durable.
        let prepare = |fs: &mut MemFs| {
            run(
                fs,
                FileOpKind::CreateDir {
                    path: "t/a/b".into(),
                },
            );
            run(
                fs,
                FileOpKind::Create {
                    path: "t/a/f".into(),
                },
            );
            run(fs, FileOpKind::SyncDir { path: "t/a".into() });
        };
        prepare(&mut fs);

        // A file or a subdirectory keeps it.
        assert_eq!(kind(rmdir(&mut fs, "t/a")), FileErrorKind::Other);
        run(
            &mut fs,
            FileOpKind::Remove {
                path: "t/a/f".into(),
            },
        );
        assert_eq!(kind(rmdir(&mut fs, "t/a")), FileErrorKind::Other);
        assert_eq!(rmdir(&mut fs, "t/a/b"), Ok(FileOutput::Done));
        assert_eq!(rmdir(&mut fs, "t/a"), Ok(FileOutput::Done));
        assert_eq!(kind(rmdir(&mut fs, "t/a")), FileErrorKind::NotFound);
        assert_eq!(kind(rmdir(&mut fs, "nope")), FileErrorKind::NotFound);
        assert_eq!(kind(rmdir(&mut fs, "")), FileErrorKind::Other);
        let listed = run(&mut fs, FileOpKind::ListDir { path: "t".into() });
        assert_eq!(listed, Some(Ok(FileOutput::Listing(Vec::new()))));

        // Nothing was synced since: a power loss brings back both directories and the
        // unlinked file, as it does an unsynced unlink anywhere.
        let replay = |crash: Crash, sync_parent: bool| {
            let mut fs = MemFs::new();
            prepare(&mut fs);
            run(
                &mut fs,
                FileOpKind::Remove {
                    path: "t/a/f".into(),
                },
            );
            rmdir(&mut fs, "t/a/b").unwrap();
            rmdir(&mut fs, "t/a").unwrap();
            if sync_parent {
                run(&mut fs, FileOpKind::SyncDir { path: "t".into() });
            }
            fs.crash(crash);
            fs
        };
        let fs = replay(Crash::Power, false);
        assert_eq!(fs.list("t/a"), vec!["f".to_string()]);
        assert!(fs.dir_set.contains("t/a/b"));
        // Synced into `t`, the removal of `t/a` holds; so does everything a process crash
        // leaves in the kernel.
        for (crash, sync) in [(Crash::Power, true), (Crash::Process, false)] {
            let fs = replay(crash, sync);
            assert!(!fs.dir_set.contains("t/a"), "{crash:?}");
            assert!(!fs.dir_set.contains("t/a/b"), "{crash:?}");
            assert!(fs.file("t/a/f").is_none(), "{crash:?}");
        }
        // Reordered: either way, never a child without its parent.
        for seed in 0..16 {
            let fs = replay(Crash::PowerReordered(seed), false);
            if fs.dir_set.contains("t/a/b") {
                assert!(fs.dir_set.contains("t/a"), "seed {seed}");
            }
        }
    }

    /// A seeded stream for drawn crashes (SplitMix64; the simulator passes its own).
    struct Seeded(u64);

    impl Dice for Seeded {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((u128::from(z ^ (z >> 31)) * u128::from(n)) >> 64) as u64
        }
        fn chance(&mut self, p: f64) -> bool {
            (self.below(1 << 53) as f64) / (1u64 << 53) as f64 <= p && p > 0.0
        }
    }

    impl MemFs {
        /// A copy of the state, for trying several crashes on one disk.
        fn clone_for_test(&self) -> MemFs {
            let mut fs = MemFs::new();
            fs.files = self.files.clone();
            fs.next_inode = self.next_inode;
            fs.dir_set = self.dir_set.clone();
            fs.dirs = self.dirs.clone();
            fs.removed_dirs = self.removed_dirs.clone();
            fs.sync_lies = self.sync_lies;
            fs
        }
    }

    fn data(fs: &mut MemFs, path: &str) -> Vec<u8> {
        let read = FileOpKind::Read {
            path: path.into(),
            pos: 0,
            len: u32::MAX,
        };
        match run(fs, read) {
            Some(Ok(FileOutput::Data(b))) => b.to_vec(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_drawn_power_loss_keeps_synced_bytes_and_drops_unsynced_directory_entries() {
        for seed in 0..32 {
            let mut fs = MemFs::new();
            run(&mut fs, FileOpKind::CreateDir { path: "a".into() });
            run(&mut fs, FileOpKind::Create { path: "a/f".into() });
            run(&mut fs, FileOpKind::SyncDir { path: "a".into() });
            run(&mut fs, append("a/f", b"synced"));
            run(&mut fs, FileOpKind::Sync { path: "a/f".into() });
            run(&mut fs, append("a/f", b"-unsynced"));
            run(&mut fs, FileOpKind::Create { path: "a/g".into() });
            fs.crash_drawn(DrawnCrash::Power, &[], &mut Seeded(seed));
            let f = data(&mut fs, "a/f");
            assert!(f.starts_with(b"synced"), "seed {seed}: {f:?}");
            assert!(f.len() <= b"synced-unsynced".len());
        }
    }

    #[test]
    fn a_lying_sync_loses_the_bytes_it_claimed() {
        let mut fs = MemFs::new();
        fs.sync_lies = true;
        run(&mut fs, FileOpKind::Create { path: "f".into() });
        run(
            &mut fs,
            FileOpKind::SyncDir {
                path: String::new(),
            },
        );
        run(&mut fs, append("f", b"x"));
        run(&mut fs, FileOpKind::Sync { path: "f".into() });
        // Some seed has the crash drop every unsynced byte.
        let lost = (0..64).any(|s| {
            let mut copy = fs.clone_for_test();
            copy.crash_drawn(DrawnCrash::Power, &[], &mut Seeded(s));
            data(&mut copy, "f").is_empty()
        });
        assert!(lost);
        // So does a fixed power loss.
        fs.crash(Crash::Power);
        assert_eq!(fs.file("f"), Some(&b""[..]));
    }

    #[test]
    fn a_drawn_remove_dir_needs_an_empty_directory_and_a_parent_sync_to_last() {
        let kind = |fs: &mut MemFs, k: FileOpKind| run(fs, k).expect("alive").map_err(|e| e.kind);
        let rmdir = |p: &str| FileOpKind::RemoveDir { path: p.into() };
        let mut kept = 0;
        for seed in 0..32 {
            let mut fs = MemFs::new();
            run(&mut fs, FileOpKind::CreateDir { path: "t/a".into() });
            run(
                &mut fs,
                FileOpKind::Create {
                    path: "t/a/f".into(),
                },
            );
            run(&mut fs, FileOpKind::SyncDir { path: "t/a".into() });
            assert_eq!(kind(&mut fs, rmdir("t")), Err(FileErrorKind::Other));
            assert_eq!(kind(&mut fs, rmdir("t/a")), Err(FileErrorKind::Other));
            run(
                &mut fs,
                FileOpKind::Remove {
                    path: "t/a/f".into(),
                },
            );
            run(&mut fs, FileOpKind::SyncDir { path: "t/a".into() });
            assert_eq!(kind(&mut fs, rmdir("t/a")), Ok(FileOutput::Done));
            assert_eq!(kind(&mut fs, rmdir("t/a")), Err(FileErrorKind::NotFound));
            let mut synced = fs.clone_for_test();
            run(&mut synced, FileOpKind::SyncDir { path: "t".into() });
            // Not synced into `t`: a power loss may bring the (empty) directory back.
            fs.crash_drawn(DrawnCrash::Power, &[], &mut Seeded(seed));
            if fs.dirs.contains_key("t/a") {
                kept += 1;
                assert!(fs.dirs["t/a"].live.is_empty(), "seed {seed}");
            }
            synced.crash_drawn(DrawnCrash::Power, &[], &mut Seeded(seed));
            assert!(!synced.dirs.contains_key("t/a"), "seed {seed}");
        }
        assert!(kept > 0 && kept < 32, "{kept} of 32 came back");
    }

    #[test]
    fn ops_are_counted_by_kind_and_a_directory_moves_with_its_files() {
        let mut fs = MemFs::new();
        run(
            &mut fs,
            FileOpKind::CreateDir {
                path: "s/x/0".into(),
            },
        );
        run(
            &mut fs,
            FileOpKind::Create {
                path: "s/x/0/f".into(),
            },
        );
        run(&mut fs, append("s/x/0/f", b"abc"));
        run(&mut fs, append("s/x/0/f", b"def"));
        let mv = FileOpKind::Rename {
            from: "s/x".into(),
            to: "s/.gone".into(),
        };
        assert_eq!(run(&mut fs, mv), Some(Ok(FileOutput::Done)));
        assert_eq!(
            (fs.count("append"), fs.count("rename"), fs.ops()),
            (2, 1, 5)
        );
        assert_eq!(fs.file("s/.gone/0/f"), Some(&b"abcdef"[..]));
        assert!(fs.file("s/x/0/f").is_none() && !fs.has_dir("s/x"));
        assert!(fs.has_dir("s/.gone/0"));
        let files: Vec<String> = fs.files().into_keys().collect();
        assert_eq!(files, ["s/.gone/0/f"]);
    }

    #[test]
    fn a_drawn_process_crash_keeps_everything_and_a_power_loss_after_it_too() {
        let mut fs = MemFs::new();
        run(&mut fs, FileOpKind::CreateDir { path: "d".into() });
        run(&mut fs, FileOpKind::Create { path: "d/f".into() });
        run(&mut fs, append("d/f", b"kept"));
        fs.crash_drawn(DrawnCrash::Process, &[], &mut Seeded(1));
        for seed in 0..16 {
            let mut copy = fs.clone_for_test();
            copy.crash_drawn(DrawnCrash::Power, &[], &mut Seeded(seed));
            assert_eq!(copy.file("d/f"), Some(&b"kept"[..]), "seed {seed}");
        }
    }
}
