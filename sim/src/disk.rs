//! The simulated disk: performs the engine's [`FileOp`]s on memory, and on a crash keeps only
//! what a real machine would.
//!
//! Each file keeps its bytes and how many of them the last `Sync` made durable; each directory
//! keeps its live entries and the ones its last `SyncDir` made durable (after
//! FoundationDB's `AsyncFileNonDurable`); a removed directory is held aside until its
//! parent's next `SyncDir`, and a power loss before that may bring it back. Ops complete
//! after a latency the world draws; the effect happens at completion, so an op in flight at
//! a crash may be lost or, for an append, land torn.

use std::collections::BTreeMap;

use bytes::Bytes;
use felix_engine::{
    DirEntry, FileCompletion, FileError, FileErrorKind, FileOp, FileOpKind, FileOutput,
};

use crate::rng::SimRng;

/// Sector size for torn writes: lost sectors read back as zeros.
const SECTOR: usize = 512;

#[derive(Debug, Clone, Default)]
struct SimFile {
    data: Vec<u8>,
    /// Bytes known to be on the device.
    synced: usize,
}

#[derive(Debug, Clone, Default)]
struct SimDir {
    live: BTreeMap<String, u64>,
    durable: BTreeMap<String, u64>,
}

/// How a broker died.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CrashKind {
    /// The process died; the kernel's page cache and directory changes survive.
    Process,
    /// The machine lost power: unsynced bytes and directory changes may be gone, the last
    /// write torn.
    Power,
}

#[derive(Debug, Default)]
pub(crate) struct SimDisk {
    files: BTreeMap<u64, SimFile>,
    next_inode: u64,
    dirs: BTreeMap<String, SimDir>,
    /// Directories removed since their parent's last `SyncDir`, as they were.
    removed_dirs: BTreeMap<String, SimDir>,
    /// Canary: a `Sync` reports success and persists nothing.
    pub(crate) sync_lies: bool,
    pub(crate) ops: u64,
}

fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

fn err(kind: FileErrorKind, what: &str, path: &str) -> FileError {
    FileError::new(kind, format!("{what}: {path}"))
}

impl SimDisk {
    pub(crate) fn new() -> SimDisk {
        let mut d = SimDisk::default();
        d.dirs.insert(String::new(), SimDir::default());
        d
    }

    fn lookup(&self, path: &str) -> Option<u64> {
        let (dir, name) = split(path);
        self.dirs.get(dir)?.live.get(name).copied()
    }

    fn file_mut(&mut self, path: &str) -> Result<&mut SimFile, FileError> {
        let ino = self
            .lookup(path)
            .ok_or_else(|| err(FileErrorKind::NotFound, "no such file", path))?;
        Ok(self.files.get_mut(&ino).expect("live entry has an inode"))
    }

    pub(crate) fn execute(&mut self, op: &FileOp) -> FileCompletion {
        self.ops += 1;
        FileCompletion {
            id: op.id,
            result: self.apply(&op.kind),
        }
    }

    fn apply(&mut self, kind: &FileOpKind) -> Result<FileOutput, FileError> {
        match kind {
            FileOpKind::CreateDir { path } => {
                // Parents are synced as they are created, so directories are durable at once.
                let mut at = path.as_str();
                while !at.is_empty() {
                    self.dirs.entry(at.to_owned()).or_default();
                    // Made again: a new directory, and the parent's entry is synced.
                    self.removed_dirs.remove(at);
                    at = split(at).0;
                }
                Ok(FileOutput::Done)
            }
            FileOpKind::ListDir { path } => {
                let dir = self
                    .dirs
                    .get(path)
                    .ok_or_else(|| err(FileErrorKind::NotFound, "no such directory", path))?;
                let mut entries: Vec<DirEntry> = dir
                    .live
                    .iter()
                    .map(|(name, ino)| DirEntry {
                        name: name.clone(),
                        len: self.files[ino].data.len() as u64,
                        is_dir: false,
                    })
                    .collect();
                for sub in self.dirs.keys() {
                    if !sub.is_empty() && split(sub).0 == path {
                        entries.push(DirEntry {
                            name: split(sub).1.to_owned(),
                            len: 0,
                            is_dir: true,
                        });
                    }
                }
                Ok(FileOutput::Listing(entries))
            }
            FileOpKind::Create { path } => {
                let (dir, name) = split(path);
                if !self.dirs.contains_key(dir) {
                    return Err(err(FileErrorKind::NotFound, "no such directory", dir));
                }
                if let Some(ino) = self.lookup(path) {
                    let f = self.files.get_mut(&ino).expect("inode");
                    f.data.clear();
                    f.synced = 0;
                } else {
                    self.next_inode += 1;
                    self.files.insert(self.next_inode, SimFile::default());
                    let d = self.dirs.get_mut(dir).expect("dir");
                    d.live.insert(name.to_owned(), self.next_inode);
                }
                Ok(FileOutput::Done)
            }
            FileOpKind::Append { path, bytes } => {
                self.file_mut(path)?.data.extend_from_slice(bytes);
                Ok(FileOutput::Done)
            }
            FileOpKind::Read { path, pos, len } => {
                let f = self.file_mut(path)?;
                let start = (*pos as usize).min(f.data.len());
                let end = start.saturating_add(*len as usize).min(f.data.len());
                Ok(FileOutput::Data(Bytes::copy_from_slice(
                    &f.data[start..end],
                )))
            }
            FileOpKind::Sync { path } => {
                let lies = self.sync_lies;
                let f = self.file_mut(path)?;
                if !lies {
                    f.synced = f.data.len();
                }
                Ok(FileOutput::Done)
            }
            FileOpKind::SyncDir { path } => {
                let d = self
                    .dirs
                    .get_mut(path)
                    .ok_or_else(|| err(FileErrorKind::NotFound, "no such directory", path))?;
                d.durable = d.live.clone();
                self.removed_dirs.retain(|sub, _| split(sub).0 != path);
                Ok(FileOutput::Done)
            }
            FileOpKind::Truncate { path, len } => {
                let f = self.file_mut(path)?;
                f.data.truncate(*len as usize);
                f.synced = f.synced.min(f.data.len());
                Ok(FileOutput::Done)
            }
            FileOpKind::Rename { from, to } => {
                let ino = self
                    .lookup(from)
                    .ok_or_else(|| err(FileErrorKind::NotFound, "no such file", from))?;
                let (to_dir, to_name) = split(to);
                if !self.dirs.contains_key(to_dir) {
                    return Err(err(FileErrorKind::NotFound, "no such directory", to_dir));
                }
                let (from_dir, from_name) = split(from);
                self.dirs
                    .get_mut(from_dir)
                    .expect("dir")
                    .live
                    .remove(from_name);
                self.dirs
                    .get_mut(to_dir)
                    .expect("dir")
                    .live
                    .insert(to_name.to_owned(), ino);
                Ok(FileOutput::Done)
            }
            FileOpKind::Remove { path } => {
                let (dir, name) = split(path);
                match self.dirs.get_mut(dir).and_then(|d| d.live.remove(name)) {
                    Some(_) => Ok(FileOutput::Done),
                    None => Err(err(FileErrorKind::NotFound, "no such file", path)),
                }
            }
            FileOpKind::RemoveDir { path } => {
                if path.is_empty() {
                    return Err(err(FileErrorKind::Other, "the root stays", path));
                }
                let dir = self
                    .dirs
                    .get(path)
                    .ok_or_else(|| err(FileErrorKind::NotFound, "no such directory", path))?;
                let has_subdir = self.dirs.keys().any(|sub| split(sub).0 == path);
                if !dir.live.is_empty() || has_subdir {
                    return Err(err(FileErrorKind::Other, "directory not empty", path));
                }
                let dir = self.dirs.remove(path).expect("looked up above");
                self.removed_dirs.insert(path.clone(), dir);
                Ok(FileOutput::Done)
            }
        }
    }

    /// Applies a crash. `in_flight` are the ops handed out and not completed: under a power
    /// loss an append among them may have reached the page cache torn before the end.
    /// Returns a line describing what was lost, for the trace.
    pub(crate) fn crash(
        &mut self,
        kind: CrashKind,
        in_flight: &[FileOp],
        rng: &mut SimRng,
    ) -> String {
        if kind == CrashKind::Process {
            // The kernel writes the page cache back eventually; nothing in flight happened.
            for f in self.files.values_mut() {
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
                if rng.chance(0.5) {
                    let n = rng.below(bytes.len() as u64 + 1) as usize;
                    if let Ok(f) = self.file_mut(path) {
                        f.data.extend_from_slice(&bytes[..n]);
                    }
                }
            }
        }
        let mut lost_bytes = 0usize;
        let mut torn = 0usize;
        for f in self.files.values_mut() {
            let unsynced = f.data.len() - f.synced;
            if unsynced == 0 {
                continue;
            }
            match rng.below(4) {
                // Nothing unsynced reached the device.
                0 => f.data.truncate(f.synced),
                // A prefix did: the last write torn at any byte.
                1 | 2 => {
                    let keep = f.synced + rng.below(unsynced as u64 + 1) as usize;
                    f.data.truncate(keep);
                    torn += 1;
                }
                // The size reached the device, the sectors after the last synced one did not.
                _ => {
                    let from = f.synced.div_ceil(SECTOR) * SECTOR;
                    for b in f.data.iter_mut().skip(from) {
                        *b = 0;
                    }
                    torn += 1;
                }
            }
            lost_bytes += unsynced;
            f.synced = f.data.len();
        }
        let mut dirs_reverted = 0;
        // An unsynced removal is lost like any unsynced directory change. Parents sort
        // first, so a directory only comes back into one that is there.
        for (path, d) in std::mem::take(&mut self.removed_dirs) {
            if self.dirs.contains_key(split(&path).0) && rng.chance(0.5) {
                self.dirs.insert(path, d);
                dirs_reverted += 1;
            }
        }
        for d in self.dirs.values_mut() {
            if d.live != d.durable && rng.chance(0.5) {
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

    fn collect_garbage(&mut self) {
        let live: std::collections::BTreeSet<u64> = self
            .dirs
            .values()
            .flat_map(|d| d.live.values().copied())
            .collect();
        self.files.retain(|ino, _| live.contains(ino));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_engine::OpId;

    fn op(kind: FileOpKind) -> FileOp {
        FileOp { id: OpId(1), kind }
    }

    impl SimDisk {
        fn clone_for_test(&self) -> SimDisk {
            SimDisk {
                files: self.files.clone(),
                next_inode: self.next_inode,
                dirs: self.dirs.clone(),
                removed_dirs: self.removed_dirs.clone(),
                sync_lies: self.sync_lies,
                ops: 0,
            }
        }
    }

    fn data(d: &mut SimDisk, path: &str) -> Vec<u8> {
        let len = u32::MAX;
        match d
            .execute(&op(FileOpKind::Read {
                path: path.into(),
                pos: 0,
                len,
            }))
            .result
        {
            Ok(FileOutput::Data(b)) => b.to_vec(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn power_loss_keeps_synced_bytes_and_drops_unsynced_directory_entries() {
        for seed in 0..32 {
            let mut d = SimDisk::new();
            let mut rng = SimRng::new(seed);
            d.execute(&op(FileOpKind::CreateDir { path: "a".into() }));
            d.execute(&op(FileOpKind::Create { path: "a/f".into() }));
            d.execute(&op(FileOpKind::SyncDir { path: "a".into() }));
            d.execute(&op(FileOpKind::Append {
                path: "a/f".into(),
                bytes: Bytes::from_static(b"synced"),
            }));
            d.execute(&op(FileOpKind::Sync { path: "a/f".into() }));
            d.execute(&op(FileOpKind::Append {
                path: "a/f".into(),
                bytes: Bytes::from_static(b"-unsynced"),
            }));
            d.execute(&op(FileOpKind::Create { path: "a/g".into() }));
            d.crash(CrashKind::Power, &[], &mut rng);
            let f = data(&mut d, "a/f");
            assert!(f.starts_with(b"synced"), "seed {seed}: {f:?}");
            assert!(f.len() <= b"synced-unsynced".len());
        }
    }

    #[test]
    fn a_lying_sync_loses_the_bytes_it_claimed() {
        let mut d = SimDisk::new();
        d.sync_lies = true;
        d.execute(&op(FileOpKind::Create { path: "f".into() }));
        d.execute(&op(FileOpKind::SyncDir {
            path: String::new(),
        }));
        d.execute(&op(FileOpKind::Append {
            path: "f".into(),
            bytes: Bytes::from_static(b"x"),
        }));
        d.execute(&op(FileOpKind::Sync { path: "f".into() }));
        // Seed chosen so the crash drops every unsynced byte.
        let lost = (0..64).any(|s| {
            let mut copy = d.clone_for_test();
            copy.crash(CrashKind::Power, &[], &mut SimRng::new(s));
            data(&mut copy, "f").is_empty()
        });
        assert!(lost);
    }

    #[test]
    fn remove_dir_needs_an_empty_directory_and_a_parent_sync_to_last() {
        let kind = |d: &mut SimDisk, k: FileOpKind| d.execute(&op(k)).result.map_err(|e| e.kind);
        let rmdir = |p: &str| FileOpKind::RemoveDir { path: p.into() };
        let mut kept = 0;
        for seed in 0..32 {
            let mut d = SimDisk::new();
            d.execute(&op(FileOpKind::CreateDir { path: "t/a".into() }));
            d.execute(&op(FileOpKind::Create {
                path: "t/a/f".into(),
            }));
            d.execute(&op(FileOpKind::SyncDir { path: "t/a".into() }));
            assert_eq!(kind(&mut d, rmdir("t")), Err(FileErrorKind::Other));
            assert_eq!(kind(&mut d, rmdir("t/a")), Err(FileErrorKind::Other));
            d.execute(&op(FileOpKind::Remove {
                path: "t/a/f".into(),
            }));
            d.execute(&op(FileOpKind::SyncDir { path: "t/a".into() }));
            assert_eq!(kind(&mut d, rmdir("t/a")), Ok(FileOutput::Done));
            assert_eq!(kind(&mut d, rmdir("t/a")), Err(FileErrorKind::NotFound));
            let mut synced = d.clone_for_test();
            synced.execute(&op(FileOpKind::SyncDir { path: "t".into() }));
            // Not synced into `t`: a power loss may bring the (empty) directory back.
            d.crash(CrashKind::Power, &[], &mut SimRng::new(seed));
            if d.dirs.contains_key("t/a") {
                kept += 1;
                assert!(d.dirs["t/a"].live.is_empty(), "seed {seed}");
            }
            synced.crash(CrashKind::Power, &[], &mut SimRng::new(seed));
            assert!(!synced.dirs.contains_key("t/a"), "seed {seed}");
        }
        assert!(kept > 0 && kept < 32, "{kept} of 32 came back");
    }
}
