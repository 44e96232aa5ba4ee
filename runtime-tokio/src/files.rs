//! The file executor: performs the engine's [`FileOp`]s on real files under the storage root.
//!
//! Nothing here knows about tokio: [`FileExecutor::execute`] is a plain blocking call, so any
//! runtime runs it on its own blocking pool (tokio's `spawn_blocking` in [`crate::driver`],
//! `smol::unblock` elsewhere). Ops may run concurrently: the engine never has two in flight
//! whose order matters (an append and a sync of the same file may run at once; the log
//! counts on the sync only for writes that completed before it was issued), so the executor
//! keeps no queue; it only keeps open handles so an append, a sync or a read does not reopen
//! its file. Appends write straight from the op's buffer. After a sync, what it covered is
//! dropped from the page cache except the newest [`DEFAULT_CACHE_BEHIND_BYTES`].

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use felix_engine::{
    DirEntry, FileCompletion, FileError, FileErrorKind, FileOp, FileOpKind, FileOutput,
};

/// Open file handles kept at most; past it the cache starts over (logs touch few files).
pub const MAX_OPEN_FILES: usize = 512;
/// The page size drop-behind reasons in (advice about part of a page is ignored anyway).
const PAGE: u64 = 4096;
/// How much of a file's synced end stays in the page cache after each sync by default; the
/// rest is dropped behind the writer (see [`Handle::drop_behind`]). Readers of the newest
/// data (catch-up close to the tail) keep hitting memory.
pub const DEFAULT_CACHE_BEHIND_BYTES: u64 = 32 << 20;
/// Overrides [`DEFAULT_CACHE_BEHIND_BYTES`] (read by `felix_runtime_common::config`): a byte
/// count, or `off` to keep everything.
pub const CACHE_BEHIND_VAR: &str = "FELIX_DURABLE_CACHE_BEHIND_BYTES";

/// Performs file ops under one storage root, keeping handles to the files it appends to,
/// syncs and reads.
#[derive(Debug)]
pub struct FileExecutor {
    root: PathBuf,
    handles: Mutex<HashMap<String, Arc<Handle>>>,
    /// After a sync, pages more than this far behind the file's end are advised out of the
    /// page cache (`None`: never). See [`Handle::drop_behind`] and [`CACHE_BEHIND_VAR`].
    drop_behind: Option<u64>,
    counters: Counters,
}

/// An open file, and how far from its start the page cache has been told to let go.
#[derive(Debug)]
struct Handle {
    file: File,
    dropped: AtomicU64,
}

#[derive(Debug, Default)]
struct Counters {
    ops: AtomicU64,
    appends: AtomicU64,
    appended_bytes: AtomicU64,
    append_micros: AtomicU64,
    syncs: AtomicU64,
    sync_micros: AtomicU64,
    reads: AtomicU64,
    failures: AtomicU64,
}

/// What an executor has done since it was made (for logs and benchmarks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileStats {
    /// Ops performed, of every kind.
    pub ops: u64,
    pub appends: u64,
    pub appended_bytes: u64,
    /// Time spent in those appends.
    pub append_micros: u64,
    /// File syncs (`fdatasync`); directory syncs are not counted.
    pub syncs: u64,
    /// Time spent in those syncs.
    pub sync_micros: u64,
    pub reads: u64,
    /// Ops that failed.
    pub failures: u64,
}

impl FileExecutor {
    /// An executor for `root` (which must exist) with the default drop-behind.
    pub fn new(root: impl Into<PathBuf>) -> FileExecutor {
        FileExecutor::with_drop_behind(root, Some(DEFAULT_CACHE_BEHIND_BYTES))
    }

    /// An executor for `root` that keeps `drop_behind` bytes of each file's synced end in
    /// the page cache (`None`: keeps everything). The configuration layer reads
    /// [`CACHE_BEHIND_VAR`] (`durable.cache_behind_bytes`).
    pub fn with_drop_behind(root: impl Into<PathBuf>, drop_behind: Option<u64>) -> FileExecutor {
        FileExecutor {
            root: root.into(),
            handles: Mutex::new(HashMap::new()),
            drop_behind,
            counters: Counters::default(),
        }
    }

    /// Counters since the executor was made.
    pub fn stats(&self) -> FileStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FileStats {
            ops: get(&c.ops),
            appends: get(&c.appends),
            appended_bytes: get(&c.appended_bytes),
            append_micros: get(&c.append_micros),
            syncs: get(&c.syncs),
            sync_micros: get(&c.sync_micros),
            reads: get(&c.reads),
            failures: get(&c.failures),
        }
    }

    /// The storage root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Performs one op, blocking, and answers it.
    pub fn execute(&self, op: FileOp) -> FileCompletion {
        let FileOp { id, kind } = op;
        let c = &self.counters;
        c.ops.fetch_add(1, Ordering::Relaxed);
        let began = std::time::Instant::now();
        let result = self.run(&kind).map_err(|e| file_error(&kind, e));
        match &kind {
            FileOpKind::Append { bytes, .. } => {
                c.appends.fetch_add(1, Ordering::Relaxed);
                c.appended_bytes
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                c.append_micros
                    .fetch_add(began.elapsed().as_micros() as u64, Ordering::Relaxed);
            }
            FileOpKind::Sync { .. } => {
                c.syncs.fetch_add(1, Ordering::Relaxed);
                c.sync_micros
                    .fetch_add(began.elapsed().as_micros() as u64, Ordering::Relaxed);
            }
            FileOpKind::Read { .. } => {
                c.reads.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        if result.is_err() {
            c.failures.fetch_add(1, Ordering::Relaxed);
        }
        FileCompletion { id, result }
    }

    fn run(&self, kind: &FileOpKind) -> io::Result<FileOutput> {
        match kind {
            FileOpKind::CreateDir { path } => {
                create_dir_durably(&self.root, &self.resolve(path)?)?;
                Ok(FileOutput::Done)
            }
            FileOpKind::ListDir { path } => list(&self.resolve(path)?),
            FileOpKind::Create { path } => {
                self.forget(path);
                OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(self.resolve(path)?)?;
                Ok(FileOutput::Done)
            }
            FileOpKind::Append { path, bytes } => {
                let h = self.handle(path)?;
                // `O_APPEND` puts every write at the end; a short write is retried by
                // `write_all` and anything less than all of it is an error.
                (&h.file).write_all(bytes)?;
                Ok(FileOutput::Done)
            }
            FileOpKind::Read { path, pos, len } => {
                let h = self.handle(path)?;
                Ok(FileOutput::Data(read_at(&h.file, *pos, *len as usize)?))
            }
            FileOpKind::Sync { path } => {
                let h = self.handle(path)?;
                // Measured before the sync: everything below it is on the device after.
                let synced = match self.drop_behind {
                    Some(_) => h.file.metadata()?.len(),
                    None => 0,
                };
                h.file.sync_data()?;
                if let Some(keep) = self.drop_behind {
                    h.drop_behind(synced.saturating_sub(keep));
                }
                Ok(FileOutput::Done)
            }
            FileOpKind::SyncDir { path } => {
                File::open(self.resolve(path)?)?.sync_all()?;
                Ok(FileOutput::Done)
            }
            FileOpKind::Truncate { path, len } => {
                let h = self.handle(path)?;
                h.file.set_len(*len)?;
                h.dropped.fetch_min(*len / PAGE * PAGE, Ordering::Relaxed);
                Ok(FileOutput::Done)
            }
            FileOpKind::Rename { from, to } => {
                self.forget(from);
                self.forget(to);
                fs::rename(self.resolve(from)?, self.resolve(to)?)?;
                Ok(FileOutput::Done)
            }
            FileOpKind::Remove { path } => {
                self.forget(path);
                fs::remove_file(self.resolve(path)?)?;
                Ok(FileOutput::Done)
            }
        }
    }

    /// `root/path`, refusing anything that could leave the root.
    fn resolve(&self, path: &str) -> io::Result<PathBuf> {
        resolve(&self.root, path)
    }

    /// An open handle (read + append) to an existing file.
    fn handle(&self, path: &str) -> io::Result<Arc<Handle>> {
        if let Some(f) = self.handles.lock().expect("handle cache").get(path) {
            return Ok(f.clone());
        }
        let file = Arc::new(Handle {
            file: OpenOptions::new()
                .read(true)
                .append(true)
                .open(self.resolve(path)?)?,
            dropped: AtomicU64::new(0),
        });
        let mut handles = self.handles.lock().expect("handle cache");
        if handles.len() >= MAX_OPEN_FILES {
            handles.clear();
        }
        handles.insert(path.to_owned(), file.clone());
        Ok(file)
    }

    /// Drops a cached handle before the file is replaced, renamed or removed.
    fn forget(&self, path: &str) {
        self.handles.lock().expect("handle cache").remove(path);
    }
}

impl Handle {
    /// Advises the kernel to drop the file's cached pages below `up_to` (whole pages, from
    /// where the last call stopped). They are clean, since a sync covered them.
    ///
    /// Why: a buffered write that needs a fresh page-cache page costs far more than one
    /// that reuses a recently freed page (on this project's VMs about 1-2.5 ns per byte
    /// against 0.2-0.4: free memory is handed back to the host and faulted in again), and a
    /// log only ever grows its files. Dropping what is safely on the device behind the
    /// writer keeps the page cache recycling the same pages.
    fn drop_behind(&self, up_to: u64) {
        let up_to = up_to / PAGE * PAGE;
        let from = self.dropped.load(Ordering::Relaxed);
        if up_to > from {
            advise_dont_need(&self.file, from, up_to - from);
            self.dropped.fetch_max(up_to, Ordering::Relaxed);
        }
    }
}

#[cfg(all(target_os = "linux", not(target_arch = "s390x")))]
fn advise_dont_need(file: &File, from: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // std has no binding and this crate no libc dependency; glibc and musl both export it.
    unsafe extern "C" {
        fn posix_fadvise(fd: i32, offset: i64, len: i64, advice: i32) -> i32;
    }
    const POSIX_FADV_DONTNEED: i32 = 4;
    let (Ok(from), Ok(len)) = (i64::try_from(from), i64::try_from(len)) else {
        return;
    };
    // SAFETY: the fd is open for the call's duration (borrowed from `file`) and the call
    // only advises the kernel; it touches no memory of ours. Failure is harmless.
    unsafe {
        posix_fadvise(file.as_raw_fd(), from, len, POSIX_FADV_DONTNEED);
    }
}

#[cfg(not(all(target_os = "linux", not(target_arch = "s390x"))))]
fn advise_dont_need(_file: &File, _from: u64, _len: u64) {}

/// Performs one op under `root` without keeping handles (for one-off use; a runtime keeps
/// a [`FileExecutor`]).
pub fn execute(root: &Path, op: FileOp) -> FileCompletion {
    FileExecutor::new(root).execute(op)
}

fn resolve(root: &Path, path: &str) -> io::Result<PathBuf> {
    let rel = Path::new(path);
    let safe = rel
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if !safe {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "path leaves the storage root",
        ));
    }
    Ok(root.join(rel))
}

/// `create_dir_all`, then an fsync of the parent of every directory it created, so the new
/// entries survive a power loss.
fn create_dir_durably(root: &Path, dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut at = dir;
    while !at.exists() && at != root {
        missing.push(at.to_path_buf());
        match at.parent() {
            Some(p) => at = p,
            None => break,
        }
    }
    fs::create_dir_all(dir)?;
    // Deepest last created first; each parent's entry for its new child must be durable.
    for created in missing.iter().rev() {
        if let Some(parent) = created.parent() {
            File::open(parent)?.sync_all()?;
        }
    }
    Ok(())
}

fn list(dir: &Path) -> io::Result<FileOutput> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        let Ok(name) = entry.file_name().into_string() else {
            continue; // not a name the engine wrote
        };
        if meta.is_file() {
            entries.push(dir_entry(name, meta.len(), false));
        } else if meta.is_dir() {
            entries.push(dir_entry(name, 0, true));
        }
    }
    Ok(FileOutput::Listing(entries))
}

fn dir_entry(name: String, len: u64, is_dir: bool) -> DirEntry {
    DirEntry { name, len, is_dir }
}

/// Reads up to `len` bytes at `pos`; fewer only at the end of the file.
fn read_at(file: &File, pos: u64, len: usize) -> io::Result<Bytes> {
    let mut buf = BytesMut::zeroed(len);
    let mut done = 0;
    while done < len {
        match read_at_once(file, &mut buf[done..], pos + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    buf.truncate(done);
    Ok(buf.freeze())
}

#[cfg(unix)]
fn read_at_once(file: &File, buf: &mut [u8], pos: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    file.read_at(buf, pos)
}

#[cfg(windows)]
fn read_at_once(file: &File, buf: &mut [u8], pos: u64) -> io::Result<usize> {
    use std::os::windows::fs::FileExt;
    file.seek_read(buf, pos)
}

fn file_error(kind: &FileOpKind, e: io::Error) -> FileError {
    let class = match e.raw_os_error() {
        _ if e.kind() == io::ErrorKind::NotFound => FileErrorKind::NotFound,
        // ENOSPC, EDQUOT
        Some(28) | Some(122) => FileErrorKind::NoSpace,
        _ => FileErrorKind::Other,
    };
    let path = match kind {
        FileOpKind::CreateDir { path }
        | FileOpKind::ListDir { path }
        | FileOpKind::Create { path }
        | FileOpKind::Append { path, .. }
        | FileOpKind::Read { path, .. }
        | FileOpKind::Sync { path }
        | FileOpKind::SyncDir { path }
        | FileOpKind::Truncate { path, .. }
        | FileOpKind::Remove { path } => path,
        FileOpKind::Rename { from, .. } => from,
    };
    FileError::new(class, format!("{path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_engine::{LogId, OpId};

    fn temp_root(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("felix-files-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn run(x: &FileExecutor, kind: FileOpKind) -> Result<FileOutput, FileError> {
        let c = x.execute(FileOp {
            id: OpId(u64::from(LogId(3).0) << 32 | 9),
            kind,
        });
        assert_eq!(c.id.log(), LogId(3), "the completion carries the op's id");
        c.result
    }

    #[test]
    fn every_op_on_real_files() {
        let root = temp_root("ops");
        let x = FileExecutor::new(&root);
        let s = |v: &str| v.to_owned();
        run(&x, FileOpKind::CreateDir { path: s("a/b/c") }).unwrap();
        run(&x, FileOpKind::CreateDir { path: s("a/b/c") }).expect("exists is fine");
        run(
            &x,
            FileOpKind::Create {
                path: s("a/b/c/f.seg"),
            },
        )
        .unwrap();
        for chunk in [&b"hello "[..], b"world"] {
            let bytes = Bytes::copy_from_slice(chunk);
            run(
                &x,
                FileOpKind::Append {
                    path: s("a/b/c/f.seg"),
                    bytes,
                },
            )
            .unwrap();
        }
        run(
            &x,
            FileOpKind::Sync {
                path: s("a/b/c/f.seg"),
            },
        )
        .unwrap();
        run(&x, FileOpKind::SyncDir { path: s("a/b/c") }).unwrap();
        let read = |pos, len| {
            run(
                &x,
                FileOpKind::Read {
                    path: s("a/b/c/f.seg"),
                    pos,
                    len,
                },
            )
        };
        assert_eq!(
            read(6, 100).unwrap(),
            FileOutput::Data(Bytes::from_static(b"world"))
        );
        assert_eq!(
            read(0, 5).unwrap(),
            FileOutput::Data(Bytes::from_static(b"hello"))
        );

        let FileOutput::Listing(mut entries) =
            run(&x, FileOpKind::ListDir { path: s("a/b") }).unwrap()
        else {
            panic!("a listing");
        };
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(
            entries,
            [DirEntry {
                name: s("c"),
                len: 0,
                is_dir: true
            }]
        );
        let FileOutput::Listing(entries) =
            run(&x, FileOpKind::ListDir { path: s("a/b/c") }).unwrap()
        else {
            panic!("a listing");
        };
        assert_eq!(
            entries,
            [DirEntry {
                name: s("f.seg"),
                len: 11,
                is_dir: false
            }]
        );

        run(
            &x,
            FileOpKind::Truncate {
                path: s("a/b/c/f.seg"),
                len: 5,
            },
        )
        .unwrap();
        assert_eq!(
            read(0, 100).unwrap(),
            FileOutput::Data(Bytes::from_static(b"hello"))
        );
        run(
            &x,
            FileOpKind::Rename {
                from: s("a/b/c/f.seg"),
                to: s("a/b/c/g.seg"),
            },
        )
        .unwrap();
        assert_eq!(fs::read(root.join("a/b/c/g.seg")).unwrap(), b"hello");
        // A handle cached for the old name does not outlive the rename.
        let e = read(0, 1).unwrap_err();
        assert_eq!(e.kind, FileErrorKind::NotFound);
        assert!(e.message.contains("a/b/c/f.seg"), "{}", e.message);
        run(
            &x,
            FileOpKind::Remove {
                path: s("a/b/c/g.seg"),
            },
        )
        .unwrap();
        let e = run(
            &x,
            FileOpKind::Remove {
                path: s("a/b/c/g.seg"),
            },
        )
        .unwrap_err();
        assert_eq!(e.kind, FileErrorKind::NotFound);
        let e = run(&x, FileOpKind::ListDir { path: s("nope") }).unwrap_err();
        assert_eq!(e.kind, FileErrorKind::NotFound);
        // Create truncates an existing file.
        run(&x, FileOpKind::Create { path: s("a/t") }).unwrap();
        run(
            &x,
            FileOpKind::Append {
                path: s("a/t"),
                bytes: Bytes::from_static(b"xyz"),
            },
        )
        .unwrap();
        run(&x, FileOpKind::Create { path: s("a/t") }).unwrap();
        run(
            &x,
            FileOpKind::Append {
                path: s("a/t"),
                bytes: Bytes::from_static(b"q"),
            },
        )
        .unwrap();
        assert_eq!(fs::read(root.join("a/t")).unwrap(), b"q");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn syncs_drop_what_they_covered_from_the_page_cache_behind_a_window() {
        let root = temp_root("drop");
        let mut x = FileExecutor::new(&root);
        x.drop_behind = Some(8192);
        let f = || "f".to_owned();
        run(&x, FileOpKind::Create { path: f() }).unwrap();
        let mut written = Vec::new();
        for i in 0..3u8 {
            let chunk = vec![i; 8192 + 100];
            written.extend_from_slice(&chunk);
            let bytes = Bytes::from(chunk);
            run(&x, FileOpKind::Append { path: f(), bytes }).unwrap();
        }
        let dropped = || x.handle("f").unwrap().dropped.load(Ordering::Relaxed);
        assert_eq!(dropped(), 0, "nothing before a sync");
        run(&x, FileOpKind::Sync { path: f() }).unwrap();
        // 24876 bytes synced, the last 8192 kept: whole pages below 16684.
        assert_eq!(dropped(), 16384);
        // Dropped pages are only uncached: every byte reads back.
        let all = run(
            &x,
            FileOpKind::Read {
                path: f(),
                pos: 0,
                len: 1 << 20,
            },
        )
        .unwrap();
        assert_eq!(all, FileOutput::Data(Bytes::from(written)));
        run(
            &x,
            FileOpKind::Truncate {
                path: f(),
                len: 5000,
            },
        )
        .unwrap();
        assert_eq!(
            dropped(),
            4096,
            "a cut file is dropped no further than its end"
        );
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn paths_cannot_leave_the_root() {
        let root = temp_root("escape");
        let x = FileExecutor::new(&root);
        for path in ["../x", "/etc/passwd", "a/../../x"] {
            let e = run(&x, FileOpKind::Create { path: path.into() }).unwrap_err();
            assert_eq!(e.kind, FileErrorKind::Other, "{path}");
        }
        // Appending to a file that does not exist is an error, not a create.
        let e = run(
            &x,
            FileOpKind::Append {
                path: "missing".into(),
                bytes: Bytes::from_static(b"x"),
            },
        )
        .unwrap_err();
        assert_eq!(e.kind, FileErrorKind::NotFound);
        assert!(!root.join("missing").exists());
        fs::remove_dir_all(&root).unwrap();
    }
}
