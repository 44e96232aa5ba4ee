//! The I/O vocabulary between the storage state machines and the runtime's file executor.
//!
//! A log never touches a file: it emits [`FileOp`]s, the runtime performs them on real files
//! under the storage root and hands back one [`FileCompletion`] per op, carrying the op's id.
//! Paths are relative to the storage root (`/`-separated, no `..`, never absolute); the
//! runtime joins them onto `FELIX_DURABLE_STORAGE_DIR`.
//!
//! Ordering contract: the runtime may run ops in any order and concurrently. A log never has
//! two ops in flight whose relative order matters (its writes go out one at a time; a sync
//! may run beside a write, and vouches only for writes that completed before it was issued;
//! renames and removals run alone; it never reads bytes it has not seen written, nor removes
//! or renames over a file it is reading; a directory is removed only after everything in it
//! is gone), so the executor needs no queue of its own.

use bytes::Bytes;
use std::fmt;

/// Identifies one open log among all the logs an engine drives. Chosen by the engine; it
/// only needs to be unique among logs that can have ops in flight at the same time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LogId(pub u32);

/// Names one file operation. The high half is the [`LogId`] of the log that issued it, so an
/// engine routes a completion back with [`OpId::log`] and no table of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u64);

impl OpId {
    pub fn new(log: LogId, seq: u32) -> OpId {
        OpId(u64::from(log.0) << 32 | u64::from(seq))
    }

    /// The log that issued this op.
    pub fn log(self) -> LogId {
        LogId((self.0 >> 32) as u32)
    }
}

/// One thing for the runtime to do to the filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileOp {
    pub id: OpId,
    pub kind: FileOpKind,
}

/// What a [`FileOp`] does. Every path is relative to the storage root.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileOpKind {
    /// Create the directory and any missing parents (`create_dir_all`), then fsync the
    /// parent of every component it created, so the new entries survive a power loss.
    /// Succeeds if the directory already exists.
    CreateDir { path: String },
    /// List a directory: its regular files with their sizes, and its subdirectories
    /// (`is_dir`). Answers [`FileOutput::Listing`]; a missing directory is
    /// [`FileErrorKind::NotFound`]. Other kinds of entry (links, sockets) are left out.
    ListDir { path: String },
    /// Create the file, or truncate it to empty if it exists. The new directory entry is
    /// durable only after a later [`FileOpKind::SyncDir`] of its directory.
    Create { path: String },
    /// Write all of `bytes` at the end of the file (`O_APPEND` semantics). A short write is
    /// an error, never a partial success.
    Append { path: String, bytes: Bytes },
    /// Read up to `len` bytes starting at `pos`. Answers [`FileOutput::Data`], shorter than
    /// `len` only at end of file.
    Read { path: String, pos: u64, len: u32 },
    /// `fdatasync` the file: every byte whose write completed before this op was issued is
    /// on the device when it completes. (A write still running beside it may or may not be.)
    Sync { path: String },
    /// `fsync` the directory, making creates, renames and removals in it durable.
    SyncDir { path: String },
    /// Cut the file to `len` bytes. Like a write, the cut is durable only after a later
    /// [`FileOpKind::Sync`] of the file: a power loss before it may bring the old length back.
    Truncate { path: String, len: u64 },
    /// Atomically rename `from` to `to`, replacing `to` if it exists (same directory).
    Rename { from: String, to: String },
    /// Unlink the file. A missing file is [`FileErrorKind::NotFound`].
    Remove { path: String },
    /// Remove an empty directory (`remove_dir`). A missing one is
    /// [`FileErrorKind::NotFound`]; one that still has entries is an error (`Other`). Like
    /// an unlink, the removal is durable only after a [`FileOpKind::SyncDir`] of its parent.
    RemoveDir { path: String },
}

impl FileOpKind {
    /// True for ops that change the filesystem (everything but reads and listings). The
    /// crash-injecting test layer counts these as the "write steps" a crash can land between.
    pub fn is_write(&self) -> bool {
        !matches!(self, FileOpKind::ListDir { .. } | FileOpKind::Read { .. })
    }

    /// The main path the op touches, for error messages.
    pub fn path(&self) -> &str {
        match self {
            FileOpKind::CreateDir { path }
            | FileOpKind::ListDir { path }
            | FileOpKind::Create { path }
            | FileOpKind::Append { path, .. }
            | FileOpKind::Read { path, .. }
            | FileOpKind::Sync { path }
            | FileOpKind::SyncDir { path }
            | FileOpKind::Truncate { path, .. }
            | FileOpKind::Remove { path }
            | FileOpKind::RemoveDir { path } => path,
            FileOpKind::Rename { from, .. } => from,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            FileOpKind::CreateDir { .. } => "create_dir",
            FileOpKind::ListDir { .. } => "list_dir",
            FileOpKind::Create { .. } => "create",
            FileOpKind::Append { .. } => "append",
            FileOpKind::Read { .. } => "read",
            FileOpKind::Sync { .. } => "sync",
            FileOpKind::SyncDir { .. } => "sync_dir",
            FileOpKind::Truncate { .. } => "truncate",
            FileOpKind::Rename { .. } => "rename",
            FileOpKind::Remove { .. } => "remove",
            FileOpKind::RemoveDir { .. } => "remove_dir",
        }
    }
}

/// The runtime's answer to one [`FileOp`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileCompletion {
    pub id: OpId,
    pub result: Result<FileOutput, FileError>,
}

/// What a successful op produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOutput {
    /// The op had nothing to return.
    Done,
    /// Bytes from a [`FileOpKind::Read`].
    Data(Bytes),
    /// Entries from a [`FileOpKind::ListDir`], in any order.
    Listing(Vec<DirEntry>),
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    /// File size in bytes (0 for a directory).
    pub len: u64,
    /// A subdirectory rather than a regular file.
    pub is_dir: bool,
}

/// Why an op failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    pub kind: FileErrorKind,
    pub message: String,
}

/// The few failure kinds the logs act on differently; everything else is `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileErrorKind {
    NotFound,
    /// The device or quota is full (`ENOSPC`, `EDQUOT`).
    NoSpace,
    Other,
}

impl FileError {
    pub fn new(kind: FileErrorKind, message: impl Into<String>) -> FileError {
        FileError {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_ids_carry_their_log() {
        let id = OpId::new(LogId(7), 0xffff_fffe);
        assert_eq!(id.log(), LogId(7));
        assert_ne!(id, OpId::new(LogId(8), 0xffff_fffe));
    }
}
