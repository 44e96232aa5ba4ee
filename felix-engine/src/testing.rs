//! Test support, behind the `test-support` feature: an in-memory disk that performs the
//! engine's file ops on maps and counts them by kind. Engine tests and the engine fuzz target
//! (felix-conformance) share it; the product path always runs the real file executor.

use std::collections::{BTreeMap, BTreeSet};

use crate::{DirEntry, FileCompletion, FileError, FileErrorKind, FileOp, FileOpKind, FileOutput};
use bytes::Bytes;

#[derive(Default)]
pub struct MemDisk {
    pub files: BTreeMap<String, Vec<u8>>,
    pub dirs: BTreeSet<String>,
    /// Ops performed, by kind name.
    pub counts: BTreeMap<&'static str, usize>,
}

fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(p, _)| p)
}

fn name(kind: &FileOpKind) -> &'static str {
    match kind {
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

impl MemDisk {
    pub fn count(&self, kind: &str) -> usize {
        self.counts.get(kind).copied().unwrap_or(0)
    }

    pub fn execute(&mut self, op: FileOp) -> FileCompletion {
        *self.counts.entry(name(&op.kind)).or_default() += 1;
        let not_found = |p: &str| FileError::new(FileErrorKind::NotFound, format!("{p}: missing"));
        let result = match op.kind {
            FileOpKind::CreateDir { path } => {
                let mut at = path.as_str();
                while !at.is_empty() {
                    self.dirs.insert(at.to_owned());
                    at = parent(at);
                }
                Ok(FileOutput::Done)
            }
            FileOpKind::ListDir { path } => {
                if !path.is_empty() && !self.dirs.contains(&path) {
                    Err(not_found(&path))
                } else {
                    let leaf = |p: &str| p.rsplit('/').next().unwrap().to_owned();
                    let files =
                        self.files
                            .iter()
                            .filter(|(p, _)| parent(p) == path)
                            .map(|(p, d)| DirEntry {
                                name: leaf(p),
                                len: d.len() as u64,
                                is_dir: false,
                            });
                    let dirs = self
                        .dirs
                        .iter()
                        .filter(|d| parent(d) == path)
                        .map(|d| DirEntry {
                            name: leaf(d),
                            len: 0,
                            is_dir: true,
                        });
                    Ok(FileOutput::Listing(files.chain(dirs).collect()))
                }
            }
            FileOpKind::Create { path } => {
                self.files.insert(path, Vec::new());
                Ok(FileOutput::Done)
            }
            FileOpKind::Append { path, bytes } => match self.files.get_mut(&path) {
                Some(f) => {
                    f.extend_from_slice(&bytes);
                    Ok(FileOutput::Done)
                }
                None => Err(not_found(&path)),
            },
            FileOpKind::Read { path, pos, len } => match self.files.get(&path) {
                Some(f) => {
                    let start = (pos as usize).min(f.len());
                    let end = (start + len as usize).min(f.len());
                    Ok(FileOutput::Data(Bytes::copy_from_slice(&f[start..end])))
                }
                None => Err(not_found(&path)),
            },
            FileOpKind::Sync { path } => match self.files.contains_key(&path) {
                true => Ok(FileOutput::Done),
                false => Err(not_found(&path)),
            },
            FileOpKind::SyncDir { .. } => Ok(FileOutput::Done),
            FileOpKind::Truncate { path, len } => match self.files.get_mut(&path) {
                Some(f) => {
                    f.truncate(len as usize);
                    Ok(FileOutput::Done)
                }
                None => Err(not_found(&path)),
            },
            FileOpKind::Rename { from, to } if self.dirs.contains(&from) => {
                // A directory moves with everything under it (a deleted stream's).
                let under = |p: &String| p == &from || p.starts_with(&format!("{from}/"));
                let moved = |p: &str| format!("{to}{}", &p[from.len()..]);
                let dirs: Vec<String> = self.dirs.iter().filter(|d| under(d)).cloned().collect();
                for d in dirs {
                    self.dirs.remove(&d);
                    self.dirs.insert(moved(&d));
                }
                let files: Vec<String> = self.files.keys().filter(|f| under(f)).cloned().collect();
                for f in files {
                    let data = self.files.remove(&f).expect("listed");
                    self.files.insert(moved(&f), data);
                }
                Ok(FileOutput::Done)
            }
            FileOpKind::Rename { from, to } => match self.files.remove(&from) {
                Some(f) => {
                    self.files.insert(to, f);
                    Ok(FileOutput::Done)
                }
                None => Err(not_found(&from)),
            },
            FileOpKind::Remove { path } => match self.files.remove(&path) {
                Some(_) => Ok(FileOutput::Done),
                None => Err(not_found(&path)),
            },
            FileOpKind::RemoveDir { path } => {
                let has_entries = self.files.keys().any(|f| parent(f) == path)
                    || self.dirs.iter().any(|d| parent(d) == path);
                if !self.dirs.contains(&path) {
                    Err(not_found(&path))
                } else if has_entries {
                    Err(FileError::new(
                        FileErrorKind::Other,
                        format!("{path}: directory not empty"),
                    ))
                } else {
                    self.dirs.remove(&path);
                    Ok(FileOutput::Done)
                }
            }
        };
        FileCompletion { id: op.id, result }
    }
}
