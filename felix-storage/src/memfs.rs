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

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;

use super::ops::{
    DirEntry, FileCompletion, FileError, FileErrorKind, FileOp, FileOpKind, FileOutput,
};

#[derive(Debug, Clone, Default)]
struct MemFile {
    data: Vec<u8>,
    durable: Vec<u8>,
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

type Fault = Box<dyn FnMut(&FileOpKind) -> Option<FileErrorKind>>;

#[derive(Default)]
pub struct MemFs {
    files: HashMap<u64, MemFile>,
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
        let mut fs = MemFs::default();
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
        }
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
        f.data = bytes.clone();
        f.durable = bytes;
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
                    self.files.get_mut(&inode).expect("inode").data.clear();
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
                f.durable = f.data.clone();
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
                self.files
                    .get_mut(&inode)
                    .expect("inode")
                    .data
                    .truncate(len as usize);
                Ok(FileOutput::Done)
            }
            FileOpKind::Rename { from, to } => {
                let inode = self
                    .lookup(&from)
                    .ok_or_else(|| err(NotFound, "no file", &from))?;
                let (fdir, fname) = split(&from);
                let (tdir, tname) = split(&to);
                self.dirs.get_mut(fdir).expect("dir").live.remove(fname);
                let d = self
                    .dirs
                    .get_mut(tdir)
                    .ok_or_else(|| err(NotFound, "no dir", &to))?;
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
}
