//! The event trace: one line per thing that happened, folded into a running SHA-256. Two
//! runs of one seed must produce the same hash; `--verbose` also keeps the lines.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use ring::digest;

/// Kept lines are printed as they happen instead of at the end, so that the engines' own
/// logs (`FELIX_SIM_LOG`) land between the events they belong to.
static LIVE: AtomicBool = AtomicBool::new(false);

/// See [`LIVE`]: a run's kept lines go to stdout as they happen (and `Outcome::trace` is empty).
pub fn print_live() {
    LIVE.store(true, Ordering::Relaxed);
}

/// The node whose engine runs now, plus one (0: none), for tagging the engines' log lines.
static NODE: AtomicUsize = AtomicUsize::new(0);

/// Notes that node `i` (0-based) is about to run, for [`current_node`].
pub(crate) fn set_node(i: usize) {
    NODE.store(i + 1, Ordering::Relaxed);
}

/// The 0-based index of the node whose engine ran last, if any.
pub fn current_node() -> Option<usize> {
    NODE.load(Ordering::Relaxed).checked_sub(1)
}

pub(crate) struct Trace {
    hasher: digest::Context,
    lines: Option<Vec<String>>,
    count: u64,
    line: String,
}

impl Trace {
    pub(crate) fn new(keep_lines: bool) -> Trace {
        Trace {
            hasher: digest::Context::new(&digest::SHA256),
            lines: keep_lines.then(Vec::new),
            count: 0,
            line: String::new(),
        }
    }

    /// Records one event at virtual time `at` (time since the run started).
    pub(crate) fn event(&mut self, at: Duration, what: std::fmt::Arguments<'_>) {
        self.line.clear();
        let _ = write!(self.line, "{:>12.6} {}", at.as_secs_f64(), what);
        self.hasher.update(self.line.as_bytes());
        self.hasher.update(b"\n");
        self.count += 1;
        if let Some(lines) = &mut self.lines {
            if LIVE.load(Ordering::Relaxed) {
                println!("{}", self.line);
            } else {
                lines.push(self.line.clone());
            }
        }
    }

    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// The hash so far, as 16 hex digits (the first 8 bytes of the SHA-256).
    pub(crate) fn hash(&self) -> String {
        let d = self.hasher.clone().finish();
        d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    pub(crate) fn take_lines(&mut self) -> Vec<String> {
        self.lines.take().unwrap_or_default()
    }
}

/// A short stable digest of some bytes, for trace lines about datagrams.
pub(crate) fn short_hash(bytes: &[u8]) -> u32 {
    let mut h = 0x811c_9dc5u32;
    for b in bytes {
        h = (h ^ u32::from(*b)).wrapping_mul(0x0100_0193);
    }
    h
}
