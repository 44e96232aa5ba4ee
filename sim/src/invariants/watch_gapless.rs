//! A cache watch never misses a change silently.
//!
//! A worker in a durable run may keep a prefix watch on the whole cache, resumed from the
//! offset after the last change it saw across lags (`cache_watch_lagged`'s `resume_from`),
//! broker crashes and reconnects. As changes arrive: offsets strictly increase across the
//! whole chain of watches (a resume neither repeats nor reorders), except for the current
//! values a resnapshot delivers below its `resume_offset`; a `resume_from` never names a
//! change already delivered. At the end of the run: every put acknowledged to any client,
//! sent after the watch was first confirmed (and after its last resnapshot), arrived on the
//! watch. Loss is loud or it is a violation.

use std::collections::BTreeSet;
use std::time::Instant;

use bytes::Bytes;

use crate::oracle::{show, Oracle, Violation, WriteOutcome};

pub(crate) const NAME: &str = "watch_gapless";

/// One client's chain of watches, as it saw them.
#[derive(Debug, Default)]
pub(crate) struct WatchView {
    /// The offset of the last change delivered live or by a replay.
    last: Option<u64>,
    /// A resnapshot is delivering current values below this offset.
    snapshot_below: Option<u64>,
    /// Values of the puts seen.
    seen: BTreeSet<Bytes>,
    /// Writes sent before this were possibly before the watch (or collapsed by a
    /// resnapshot): only later ones must arrive.
    pub(crate) since: Option<Instant>,
    pub(crate) changes: u64,
}

impl WatchView {
    /// A watch of the chain was confirmed at `now`.
    pub(crate) fn on_started(&mut self, now: Instant, resume_offset: u64, resnapshot: bool) {
        if self.since.is_none() || resnapshot {
            self.since = Some(now);
        }
        if resnapshot {
            self.snapshot_below = Some(resume_offset);
        }
    }

    /// The chain was broken on purpose (a refused watch): start over from the live end.
    pub(crate) fn restart(&mut self) {
        self.since = None;
        self.snapshot_below = None;
        self.last = None;
    }

    pub(crate) fn on_change(
        &mut self,
        who: &str,
        offset: u64,
        value: Option<&Bytes>,
    ) -> Result<(), Violation> {
        self.changes += 1;
        if let Some(v) = value {
            self.seen.insert(v.clone());
        }
        if let Some(below) = self.snapshot_below {
            if offset < below {
                return Ok(());
            }
            self.snapshot_below = None;
            self.last = None;
        }
        if let Some(last) = self.last {
            if offset <= last {
                return Err(Violation {
                    invariant: NAME,
                    detail: format!(
                        "{who}: change at offset {offset} after {last}: a duplicate or reordering"
                    ),
                });
            }
        }
        self.last = Some(offset);
        Ok(())
    }

    pub(crate) fn on_lagged(&mut self, who: &str, resume_from: u64) -> Result<(), Violation> {
        match self.last {
            Some(last) if resume_from <= last => Err(Violation {
                invariant: NAME,
                detail: format!(
                    "{who}: cache_watch_lagged resume_from {resume_from} repeats delivered offset {last}"
                ),
            }),
            _ => Ok(()),
        }
    }
}

/// At the end of a run: every acknowledged put sent after the chain began was delivered.
/// `live` is false when the client's watch is not up at the end (it is then not judged).
pub(crate) fn check_end(
    oracle: &Oracle,
    who: &str,
    view: &WatchView,
    live: bool,
    start: Instant,
) -> Result<(), Violation> {
    let Some(since) = view.since else {
        return Ok(());
    };
    if !live {
        return Ok(());
    }
    for (key, writes) in &oracle.cache {
        for w in writes {
            let Some(value) = &w.value else { continue };
            if !matches!(w.outcome, WriteOutcome::Acked(_)) || w.sent <= since {
                continue;
            }
            if !view.seen.contains(value) {
                return Err(Violation {
                    invariant: NAME,
                    detail: format!(
                        "{who}: the acknowledged put {key}={} (sent at {:?}) never arrived on the watch, and nothing said it lagged",
                        show(value),
                        w.sent.saturating_duration_since(start)
                    ),
                });
            }
        }
    }
    Ok(())
}
