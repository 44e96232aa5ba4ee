//! Rotation: a plain thread polls the modification time and size of the certificate, key
//! and JWKS files, and when they change (and then hold still for one more look, so a cert
//! written before its key is not taken alone) reads them and hands the result to the drive
//! loop, which feeds `Engine::set_tls_identity` or `Engine::set_jwks`. Established
//! connections and authenticated streams keep what they negotiated; new ones get the new
//! certificate and keys. A file that does not parse, or that the engine refuses, is logged
//! and the old one stays until the file changes again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use futures_channel::mpsc;
use tracing::warn;

use crate::config::Reload;
use crate::control::Control;
use crate::tls;

/// A file's identity for change detection: modification time and length.
type Signature = Option<(SystemTime, u64)>;

fn signature(path: &Path) -> Signature {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// One watched set of files and what to send when they change.
struct Watched {
    paths: Vec<PathBuf>,
    /// What was last applied (or refused).
    seen: Vec<Signature>,
    /// A change seen on the previous look, applied once it holds still.
    pending: Option<Vec<Signature>>,
    /// Reads the files into a control message.
    read: fn(&[PathBuf]) -> Result<Control, String>,
}

impl Watched {
    fn new(paths: Vec<PathBuf>, read: fn(&[PathBuf]) -> Result<Control, String>) -> Watched {
        let seen = paths.iter().map(|p| signature(p)).collect();
        Watched {
            paths,
            seen,
            pending: None,
            read,
        }
    }

    /// Looks once; `Some` when the files changed and held still since the last look. A
    /// change that cannot be used is counted in `refused`.
    fn poll(&mut self, refused: &AtomicU64) -> Option<Control> {
        let now: Vec<Signature> = self.paths.iter().map(|p| signature(p)).collect();
        if now == self.seen {
            self.pending = None;
            return None;
        }
        if self.pending.as_ref() != Some(&now) {
            self.pending = Some(now);
            return None;
        }
        self.pending = None;
        self.seen = now;
        match (self.read)(&self.paths) {
            Ok(control) => Some(control),
            Err(e) => {
                warn!(error = %e, "a changed file could not be used; the old one stays");
                refused.fetch_add(1, Ordering::SeqCst);
                None
            }
        }
    }
}

fn read_tls(paths: &[PathBuf]) -> Result<Control, String> {
    let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let identity =
        tls::from_pem(&read(&paths[0])?, &read(&paths[1])?).map_err(|e| e.to_string())?;
    Ok(Control::TlsIdentity(identity))
}

fn read_jwks(paths: &[PathBuf]) -> Result<Control, String> {
    std::fs::read(&paths[0])
        .map(Control::Jwks)
        .map_err(|e| format!("{}: {e}", paths[0].display()))
}

/// The watching thread; dropping it stops the thread.
#[derive(Debug)]
pub(crate) struct Watcher {
    stop: Arc<AtomicBool>,
    /// Changed files that could not be used (and were not applied).
    refused: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Starts watching what `reload` names; `None` when there is nothing to watch.
    pub(crate) fn spawn(
        reload: &Reload,
        control: mpsc::UnboundedSender<Control>,
    ) -> std::io::Result<Option<Watcher>> {
        let Some(interval) = reload.interval else {
            return Ok(None);
        };
        let mut watched = Vec::new();
        if let Some((cert, key)) = &reload.tls {
            watched.push(Watched::new(vec![cert.clone(), key.clone()], read_tls));
        }
        if let Some(jwks) = &reload.jwks {
            watched.push(Watched::new(vec![jwks.clone()], read_jwks));
        }
        if watched.is_empty() {
            return Ok(None);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let refused = Arc::new(AtomicU64::new(0));
        let counting = refused.clone();
        let thread = std::thread::Builder::new()
            .name("felix-reload".into())
            .spawn(move || watch(watched, interval, control, stopping, &counting))?;
        Ok(Some(Watcher {
            stop,
            refused,
            thread: Some(thread),
        }))
    }

    /// How many changed files could not be used so far.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }
}

fn watch(
    mut watched: Vec<Watched>,
    interval: Duration,
    control: mpsc::UnboundedSender<Control>,
    stop: Arc<AtomicBool>,
    refused: &AtomicU64,
) {
    while !stop.load(Ordering::SeqCst) {
        std::thread::park_timeout(interval);
        for w in &mut watched {
            if let Some(message) = w.poll(refused) {
                if control.unbounded_send(message).is_err() {
                    return; // the broker is gone
                }
            }
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}
