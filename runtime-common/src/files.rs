//! The file executor: performs the engine's [`FileOp`]s on real files under the storage root.
//!
//! Nothing here knows about tokio: [`FileExecutor::execute`] is a plain blocking call, so any
//! runtime runs it on its own blocking pool (tokio's `spawn_blocking` in `driver.rs`,
//! `smol::unblock` elsewhere). Ops may run concurrently: the engine never has two in flight
//! whose order matters (an append and a sync of the same file may run at once; the log
//! counts on the sync only for writes that completed before it was issued), so the executor
//! keeps no queue; it only keeps open handles so an append, a sync or a read does not reopen
//! its file.
//!
//! Appends go around the page cache (`O_DIRECT`) where the file system allows it: a log
//! writes each byte once and reads it back rarely, and a buffered write pays the kernel's
//! per-page bookkeeping twice (in `write` and again in the sync's writeback). Direct writes
//! must be whole blocks at block offsets, so each append rewrites the file's partial last
//! block (kept in memory) followed by the new bytes, zero-padded to [`DIRECT_IO_BLOCK`]: a
//! file being appended to may end with less than one block of zeros, which the engine's
//! recovery knows as write padding (`docs/storage-format.md`). The padding is cut when the
//! executor lets go of the file (a rename, a full handle cache, the executor dropped).
//! Where `O_DIRECT` is refused (tmpfs, some network file systems) appends are buffered, and
//! after a sync what it covered is dropped from the page cache except the newest
//! [`DEFAULT_CACHE_BEHIND_BYTES`].

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
/// rest is dropped behind the writer (see `Handle::drop_behind`). Readers of the newest
/// data (catch-up close to the tail) keep hitting memory.
pub const DEFAULT_CACHE_BEHIND_BYTES: u64 = 32 << 20;
/// Overrides [`DEFAULT_CACHE_BEHIND_BYTES`] (read by `felix_runtime_common::config`): a byte
/// count, or `off` to keep everything.
pub const CACHE_BEHIND_VAR: &str = "FELIX_DURABLE_CACHE_BEHIND_BYTES";
/// The block direct appends are aligned and padded to. 4096 covers devices with 512- and
/// 4096-byte logical blocks; a file system that wants more refuses the first write, and the
/// executor falls back to buffered appends. The engine's recovery knows padding shorter
/// than this (`WRITE_PADDING_BLOCK` in felix-engine's storage).
pub const DIRECT_IO_BLOCK: usize = 4096;
/// Turns direct appends off (read by `felix_runtime_common::config`): `false` buffers every
/// append, as on a file system without `O_DIRECT`.
pub const DIRECT_IO_VAR: &str = "FELIX_DURABLE_DIRECT_IO";
/// Aligned write buffers kept for reuse between direct appends (one per append running at
/// once is all that is ever needed; more are freed).
const MAX_POOLED_BUFFERS: usize = 8;

/// Performs file ops under one storage root, keeping handles to the files it appends to,
/// syncs and reads.
#[derive(Debug)]
pub struct FileExecutor {
    root: PathBuf,
    handles: Mutex<HashMap<String, Arc<Handle>>>,
    /// After a sync, pages more than this far behind the file's end are advised out of the
    /// page cache (`None`: never). See [`Handle::drop_behind`] and [`CACHE_BEHIND_VAR`].
    drop_behind: Option<u64>,
    /// Appends go around the page cache; cleared for good once the file system refuses.
    direct: AtomicBool,
    /// Scratch buffers for direct appends, reused.
    buffers: Mutex<Vec<Vec<u8>>>,
    counters: Counters,
}

/// An open file, and how far from its start the page cache has been told to let go.
#[derive(Debug)]
struct Handle {
    /// Read + append (buffered); reads, syncs and buffered appends use it.
    file: File,
    dropped: AtomicU64,
    /// The direct-append side, opened by the first append.
    direct: Mutex<Option<Direct>>,
    /// Where the file ends for the log while direct appends may have padded it on disk
    /// ([`NO_PADDING`] otherwise), for reads and listings that must not see the padding.
    end: AtomicU64,
}

/// [`Handle::end`] when no direct append has padded the file.
const NO_PADDING: u64 = u64::MAX;

/// A file appended to around the page cache.
#[derive(Debug)]
struct Direct {
    /// Opened with `O_DIRECT`, written at explicit positions.
    file: File,
    /// Where the next append starts; the file on disk may be longer by the padding.
    len: u64,
    /// The file's partial last block (`len % DIRECT_IO_BLOCK` bytes), rewritten by the next
    /// append because a direct write cannot start inside a block.
    tail: Vec<u8>,
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
    direct_appends: AtomicU64,
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
    /// Appends written around the page cache (`O_DIRECT`); the rest were buffered.
    pub direct_appends: u64,
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
            direct: AtomicBool::new(cfg!(target_os = "linux")),
            buffers: Mutex::new(Vec::new()),
            counters: Counters::default(),
        }
    }

    /// Turns direct appends on (the default on Linux) or off. See [`DIRECT_IO_VAR`].
    pub fn with_direct_io(self, on: bool) -> FileExecutor {
        self.direct
            .store(on && cfg!(target_os = "linux"), Ordering::Relaxed);
        self
    }

    /// Whether appends still go around the page cache.
    pub fn direct_io(&self) -> bool {
        self.direct.load(Ordering::Relaxed)
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
            direct_appends: get(&c.direct_appends),
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
            FileOpKind::ListDir { path } => {
                let mut listing = list(&self.resolve(path)?)?;
                // Files being appended to are as long as the log has made them.
                if let FileOutput::Listing(entries) = &mut listing {
                    let handles = self.handles.lock().expect("handle cache");
                    for e in entries.iter_mut().filter(|e| !e.is_dir) {
                        let key = match path.trim_end_matches('/') {
                            "" | "." => e.name.clone(),
                            dir => format!("{dir}/{}", e.name),
                        };
                        if let Some(h) = handles.get(&key) {
                            e.len = e.len.min(h.end.load(Ordering::Acquire));
                        }
                    }
                }
                Ok(listing)
            }
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
                if self.direct_io() && self.append_direct(&h, path, bytes)? {
                    self.counters.direct_appends.fetch_add(1, Ordering::Relaxed);
                    return Ok(FileOutput::Done);
                }
                // `O_APPEND` puts every write at the end; a short write is retried by
                // `write_all` and anything less than all of it is an error.
                (&h.file).write_all(bytes)?;
                Ok(FileOutput::Done)
            }
            FileOpKind::Read { path, pos, len } => {
                let h = self.handle(path)?;
                // Never the padding: a read past the end stops there, as on any file.
                let end = h.end.load(Ordering::Acquire);
                let len = u64::from(*len).min(end.saturating_sub(*pos)) as usize;
                Ok(FileOutput::Data(read_at(&h.file, *pos, len)?))
            }
            FileOpKind::Sync { path } => {
                let h = self.handle(path)?;
                // Direct appends left nothing in the page cache to drop. (`fdatasync` on
                // the buffered handle covers them: it is the same file.)
                let keep = self.drop_behind.filter(|_| !h.is_direct());
                // Measured before the sync: everything below it is on the device after.
                let synced = match keep {
                    Some(_) => h.file.metadata()?.len(),
                    None => 0,
                };
                h.file.sync_data()?;
                if let Some(keep) = keep {
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
                // The next direct append starts from the file as cut.
                let mut direct = h.direct.lock().expect("direct state");
                *direct = None;
                h.end.store(NO_PADDING, Ordering::Release);
                h.file.set_len(*len)?;
                drop(direct);
                h.dropped.fetch_min(*len / PAGE * PAGE, Ordering::Relaxed);
                Ok(FileOutput::Done)
            }
            FileOpKind::Rename { from, to } => {
                // A renamed file is finished (a compaction output): it goes in without padding.
                if let Some(h) = self.forget(from) {
                    h.trim()?;
                }
                self.forget(to);
                fs::rename(self.resolve(from)?, self.resolve(to)?)?;
                Ok(FileOutput::Done)
            }
            FileOpKind::Remove { path } => {
                self.forget(path);
                fs::remove_file(self.resolve(path)?)?;
                Ok(FileOutput::Done)
            }
            FileOpKind::RemoveDir { path } => {
                let dir = self.resolve(path)?;
                // "" or "." is the root itself, which is the operator's, not the engine's.
                if dir == self.root {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "the storage root is not removed",
                    ));
                }
                // Never recursive: a directory that still has entries is refused
                // (ENOTEMPTY, answered as `Other`), so nothing unlisted goes with it.
                fs::remove_dir(dir)?;
                Ok(FileOutput::Done)
            }
            // An op added to the vocabulary after this executor: refused, never guessed at.
            other => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("this executor does not perform {}", other.name()),
            )),
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
            direct: Mutex::new(None),
            end: AtomicU64::new(NO_PADDING),
        });
        let mut handles = self.handles.lock().expect("handle cache");
        if handles.len() >= MAX_OPEN_FILES {
            // A file reopened later is taken to end where it ends on disk, so padding goes
            // first; a file whose padding cannot be cut stays open.
            handles.retain(|_, h| h.trim().is_err());
        }
        handles.insert(path.to_owned(), file.clone());
        Ok(file)
    }

    /// Drops a cached handle before the file is replaced, renamed or removed.
    fn forget(&self, path: &str) -> Option<Arc<Handle>> {
        self.handles.lock().expect("handle cache").remove(path)
    }

    /// Appends `bytes` around the page cache. `false`: the file system refused `O_DIRECT`
    /// (nothing was written), and from now on this executor buffers its appends.
    fn append_direct(&self, h: &Handle, path: &str, bytes: &[u8]) -> io::Result<bool> {
        let mut direct = h.direct.lock().expect("direct state");
        if direct.is_none() {
            match Direct::open(&self.resolve(path)?, &h.file) {
                Ok(d) => {
                    h.end.store(d.len, Ordering::Release);
                    *direct = Some(d);
                }
                Err(e) if refuses_direct_io(&e) => {
                    self.direct.store(false, Ordering::Relaxed);
                    return Ok(false);
                }
                Err(e) => return Err(e),
            }
        }
        let d = direct.as_mut().expect("opened above");
        let mut buf = self
            .buffers
            .lock()
            .expect("buffer pool")
            .pop()
            .unwrap_or_default();
        let result = d.append(bytes, &mut buf);
        h.end.store(d.len, Ordering::Release);
        let mut pool = self.buffers.lock().expect("buffer pool");
        if pool.len() < MAX_POOLED_BUFFERS {
            pool.push(buf);
        }
        drop(pool);
        match result {
            Ok(()) => Ok(true),
            // Refused at the first write (alignment the device does not take): the file is
            // as it was, bar padding from earlier direct appends, which is cut first.
            Err(e) if refuses_direct_io(&e) => {
                let d = direct.take().expect("opened above");
                h.file.set_len(d.len)?;
                h.end.store(NO_PADDING, Ordering::Release);
                self.direct.store(false, Ordering::Relaxed);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

impl Drop for FileExecutor {
    /// Cuts the padding of every file still open, so a clean stop leaves none behind.
    /// (After a crash the engine's recovery reads past it.)
    fn drop(&mut self) {
        if let Ok(handles) = self.handles.get_mut() {
            for h in handles.values() {
                let _ = h.trim();
            }
        }
    }
}

impl Direct {
    /// The direct side of `file` (opened at `path`), which ends on disk where it ends for
    /// the log: a fresh file, one recovery has cut, or one whose padding was trimmed.
    fn open(path: &Path, file: &File) -> io::Result<Direct> {
        let len = file.metadata()?.len();
        let partial = len % DIRECT_IO_BLOCK as u64;
        let tail = read_at(file, len - partial, partial as usize)?.to_vec();
        Ok(Direct {
            file: open_direct(path)?,
            len,
            tail,
        })
    }

    /// Writes the partial last block and `bytes` as whole blocks, zero-padded, from an
    /// aligned region of `scratch`.
    fn append(&mut self, bytes: &[u8], scratch: &mut Vec<u8>) -> io::Result<()> {
        let block = DIRECT_IO_BLOCK;
        let used = self.tail.len() + bytes.len();
        let padded = used.div_ceil(block) * block;
        if scratch.len() < padded + block {
            scratch.resize((padded + block).next_power_of_two(), 0);
        }
        let start = scratch.as_ptr().align_offset(block);
        let out = &mut scratch[start..start + padded];
        out[..self.tail.len()].copy_from_slice(&self.tail);
        out[self.tail.len()..used].copy_from_slice(bytes);
        out[used..].fill(0);
        let at = self.len - self.tail.len() as u64;
        write_all_at(&self.file, out, at)?;
        self.len += bytes.len() as u64;
        let partial = (self.len % block as u64) as usize;
        self.tail.clear();
        self.tail.extend_from_slice(&out[used - partial..used]);
        Ok(())
    }
}

impl Handle {
    fn is_direct(&self) -> bool {
        self.end.load(Ordering::Acquire) != NO_PADDING
    }

    /// Cuts the padding direct appends left past the file's end, and forgets the direct
    /// side: whoever appends next starts from the file as it is on disk.
    fn trim(&self) -> io::Result<()> {
        let mut direct = self.direct.lock().expect("direct state");
        if let Some(d) = direct.as_ref() {
            // Longer by the padding, or by blocks of a failed write past the end.
            if self.file.metadata()?.len() != d.len {
                self.file.set_len(d.len)?;
            }
        }
        *direct = None;
        self.end.store(NO_PADDING, Ordering::Release);
        Ok(())
    }
}

#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path) -> io::Result<File> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

/// The file system or device does not do direct I/O, or not with this alignment.
fn refuses_direct_io(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Unsupported || e.raw_os_error() == Some(22) // EINVAL
}

#[cfg(unix)]
fn write_all_at(file: &File, buf: &[u8], pos: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(buf, pos)
}

#[cfg(not(unix))]
fn write_all_at(_file: &File, _buf: &[u8], _pos: u64) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
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

#[cfg(target_os = "linux")]
fn advise_dont_need(file: &File, from: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(from), Ok(len)) = (i64::try_from(from), i64::try_from(len)) else {
        return;
    };
    // SAFETY: the fd is open for the call's duration (borrowed from `file`) and the call
    // only advises the kernel; it touches no memory of ours. Failure is harmless.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), from, len, libc::POSIX_FADV_DONTNEED);
    }
}

#[cfg(not(target_os = "linux"))]
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
    let path = kind.path();
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
        // (While the executor holds the file, direct appends may have padded it on disk.)
        drop(x);
        assert_eq!(fs::read(root.join("a/t")).unwrap(), b"q");
        fs::remove_dir_all(&root).unwrap();
    }

    fn append(x: &FileExecutor, path: &str, bytes: &[u8]) {
        let bytes = Bytes::copy_from_slice(bytes);
        let path = path.to_owned();
        run(x, FileOpKind::Append { path, bytes }).unwrap();
    }

    fn listed_len(x: &FileExecutor, name: &str) -> u64 {
        let Ok(FileOutput::Listing(entries)) = run(x, FileOpKind::ListDir { path: ".".into() })
        else {
            panic!("a listing");
        };
        entries.iter().find(|e| e.name == name).expect("listed").len
    }

    /// Distinct non-zero bytes, so padding cannot pass for data.
    fn pattern(seed: usize, n: usize) -> Vec<u8> {
        (0..n).map(|j| ((seed * 31 + j) % 251) as u8 | 1).collect()
    }

    #[test]
    fn direct_appends_pad_whole_blocks_on_disk_and_the_log_never_sees_the_padding() {
        let root = temp_root("direct");
        let x = FileExecutor::new(&root);
        assert!(x.direct_io(), "on by default");
        run(&x, FileOpKind::Create { path: "f".into() }).unwrap();
        let mut written = Vec::new();
        for (i, n) in [32usize, 5000, 100, 4096, 9000].into_iter().enumerate() {
            let chunk = pattern(i, n);
            written.extend_from_slice(&chunk);
            append(&x, "f", &chunk);
            if !x.direct_io() {
                eprintln!("skipped: the file system under {root:?} refuses O_DIRECT");
                return;
            }
            let disk = fs::read(root.join("f")).unwrap();
            let blocks = written.len().div_ceil(DIRECT_IO_BLOCK) * DIRECT_IO_BLOCK;
            assert_eq!(
                disk.len(),
                blocks,
                "whole blocks after {} bytes",
                written.len()
            );
            assert_eq!(&disk[..written.len()], &written[..]);
            assert!(
                disk[written.len()..].iter().all(|&b| b == 0),
                "zero padding"
            );
            let all = FileOpKind::Read {
                path: "f".into(),
                pos: 0,
                len: 1 << 20,
            };
            assert_eq!(
                run(&x, all).unwrap(),
                FileOutput::Data(written.clone().into())
            );
            assert_eq!(listed_len(&x, "f"), written.len() as u64);
        }
        run(&x, FileOpKind::Sync { path: "f".into() }).unwrap();
        assert_eq!(x.stats().direct_appends, 5);

        // A cut and an append go on from the cut, with no padding between.
        let cut = 5010;
        run(
            &x,
            FileOpKind::Truncate {
                path: "f".into(),
                len: cut,
            },
        )
        .unwrap();
        written.truncate(cut as usize);
        append(&x, "f", b"zz");
        written.extend_from_slice(b"zz");
        drop(x);
        assert_eq!(
            fs::read(root.join("f")).unwrap(),
            written,
            "a dropped executor leaves no padding"
        );
        // Another executor carries on where the file ends.
        let x = FileExecutor::new(&root);
        append(&x, "f", b"next");
        written.extend_from_slice(b"next");
        drop(x);
        assert_eq!(fs::read(root.join("f")).unwrap(), written);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn files_let_go_by_a_full_handle_cache_or_a_rename_lose_their_padding() {
        let root = temp_root("direct-evict");
        let x = FileExecutor::new(&root);
        let name = |i: usize| format!("f{i}");
        for i in 0..=MAX_OPEN_FILES {
            run(&x, FileOpKind::Create { path: name(i) }).unwrap();
            append(&x, &name(i), b"abc");
            if !x.direct_io() {
                eprintln!("skipped: the file system under {root:?} refuses O_DIRECT");
                return;
            }
        }
        // The 513th handle pushed the first 512 out, each cut to its end on the way.
        assert_eq!(fs::metadata(root.join(name(0))).unwrap().len(), 3);
        let last = root.join(name(MAX_OPEN_FILES));
        assert_eq!(fs::metadata(&last).unwrap().len(), DIRECT_IO_BLOCK as u64);
        // Reopened, the file grows from its end, not from after the old padding.
        append(&x, &name(0), b"def");
        let rename = FileOpKind::Rename {
            from: name(MAX_OPEN_FILES),
            to: "renamed".into(),
        };
        run(&x, rename).unwrap();
        assert_eq!(fs::read(root.join("renamed")).unwrap(), b"abc");
        drop(x);
        assert_eq!(fs::read(root.join(name(0))).unwrap(), b"abcdef");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn with_direct_io_off_appends_are_buffered_and_unpadded() {
        let root = temp_root("buffered");
        let x = FileExecutor::new(&root).with_direct_io(false);
        run(&x, FileOpKind::Create { path: "f".into() }).unwrap();
        append(&x, "f", &pattern(1, 100));
        assert_eq!(fs::metadata(root.join("f")).unwrap().len(), 100);
        assert_eq!(x.stats().direct_appends, 0);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn syncs_drop_what_they_covered_from_the_page_cache_behind_a_window() {
        let root = temp_root("drop");
        // Only buffered appends leave pages behind to drop.
        let mut x = FileExecutor::new(&root).with_direct_io(false);
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
    fn remove_dir_takes_only_an_empty_directory() {
        let root = temp_root("rmdir");
        let x = FileExecutor::new(&root);
        let s = |v: &str| v.to_owned();
        let rmdir = |p: &str| run(&x, FileOpKind::RemoveDir { path: s(p) });
        run(&x, FileOpKind::CreateDir { path: s("t/a/b") }).unwrap();
        run(&x, FileOpKind::Create { path: s("t/a/f") }).unwrap();
        append(&x, "t/a/f", b"data");

        // A file or a subdirectory inside keeps it, and nothing inside is touched.
        let e = rmdir("t/a").unwrap_err();
        assert_eq!(e.kind, FileErrorKind::Other, "{}", e.message);
        assert!(e.message.contains("t/a"), "{}", e.message);
        run(&x, FileOpKind::Remove { path: s("t/a/f") }).unwrap();
        assert_eq!(rmdir("t/a").unwrap_err().kind, FileErrorKind::Other);
        assert!(root.join("t/a/b").is_dir());

        // Children first, then the directory itself; its parent stays.
        rmdir("t/a/b").unwrap();
        rmdir("t/a").unwrap();
        assert!(!root.join("t/a").exists());
        assert!(root.join("t").is_dir());
        run(&x, FileOpKind::SyncDir { path: s("t") }).unwrap();

        assert_eq!(rmdir("t/a").unwrap_err().kind, FileErrorKind::NotFound);
        assert_eq!(rmdir("nope/x").unwrap_err().kind, FileErrorKind::NotFound);
        // A file is not a directory; the root is never removed.
        run(&x, FileOpKind::Create { path: s("t/g") }).unwrap();
        assert_eq!(rmdir("t/g").unwrap_err().kind, FileErrorKind::Other);
        assert!(root.join("t/g").is_file());
        run(&x, FileOpKind::Remove { path: s("t/g") }).unwrap();
        rmdir("t").unwrap();
        for path in ["", "."] {
            assert_eq!(
                rmdir(path).unwrap_err().kind,
                FileErrorKind::Other,
                "{path:?}"
            );
        }
        assert!(root.is_dir());
        drop(x);
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
