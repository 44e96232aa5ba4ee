//! When a `leader`-consistency shard's leader tells the cluster its followers are level.
//!
//! A `leader` acknowledgement rests on the leader's own disk, so a follower may take the
//! shard over only if it is known to hold every record the leader acknowledged. The leader
//! says so itself: after `quiet_after` without a new record, with every record durable here
//! and on at least one follower, it asks the control plane to record a quiescence
//! (`Command::Quiesce`, naming its end and the followers level with it), and from the moment
//! it asks it holds the acknowledgement of any later record. A later record makes it ask for
//! a `Command::Resume`; once that is applied the held acknowledgements go. A quiescence and
//! its resumption are ordered by the metadata log, and a resumption makes any quiescence at
//! or below its end stale, so whenever a quiescence stands the leader has acknowledged
//! nothing past it. The cost is one metadata round trip for the first write after a quiet
//! spell, never for a steady stream of writes.

use std::time::{Duration, Instant};

use crate::NodeId;

/// What the leader sees at one look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuietView {
    /// The leader's log end.
    pub end: u64,
    /// Every record below `end` is durable here.
    pub durable_here: bool,
    /// Followers whose copies hold every record below `end` durably.
    pub level: Vec<NodeId>,
    /// The quiescence the metadata records at this generation, by its end.
    pub recorded_quiet: Option<u64>,
    /// The highest resumption the metadata records at this generation.
    pub recorded_resume: Option<u64>,
}

/// What the leader asks the control plane for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuietWish {
    Quiesce { end: u64, level: Vec<NodeId> },
    Resume { end: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Writing, or quiet for less than `quiet_after` since `since` (the log was at `end`).
    Active { end: u64, since: Instant },
    /// Asked for a quiescence at `end`: acknowledgements past it are held.
    Asked { end: u64 },
    /// Asked to resume past `end`: still held until the metadata says so.
    Resuming { end: u64 },
}

/// One led `leader` shard's quiescence, as plain state: looked at on every pass.
#[derive(Debug, Clone)]
pub struct QuietLeader {
    quiet_after: Duration,
    state: State,
}

impl QuietLeader {
    /// A leadership starting at `now` with its log at `end`. One the metadata already says
    /// is quiet (a restart) resumes before acknowledging anything, through [`look`](Self::look).
    pub fn new(now: Instant, end: u64, quiet_after: Duration) -> QuietLeader {
        QuietLeader {
            quiet_after,
            state: State::Active { end, since: now },
        }
    }

    /// Acknowledgements of records past this offset wait.
    pub fn held_past(&self) -> Option<u64> {
        match self.state {
            State::Active { .. } => None,
            State::Asked { end } | State::Resuming { end } => Some(end),
        }
    }

    /// One look at the shard: what to ask the control plane for now (asked again on every
    /// look until the metadata shows it, as the control plane's wishes are).
    pub fn look(&mut self, now: Instant, view: &QuietView) -> Option<QuietWish> {
        // A quiescence on record that this leadership did not ask for (it was asked before
        // a restart) is resumed from like one it asked for.
        if let (State::Active { .. }, Some(end)) = (&self.state, view.recorded_quiet) {
            self.state = State::Asked { end };
        }
        match self.state.clone() {
            State::Active { end, since } => {
                if view.end != end {
                    self.state = State::Active {
                        end: view.end,
                        since: now,
                    };
                    return None;
                }
                let idle = now.saturating_duration_since(since) >= self.quiet_after;
                let fresh = view.recorded_resume.is_none_or(|r| end > r);
                if idle && fresh && view.durable_here && !view.level.is_empty() {
                    self.state = State::Asked { end };
                    return Some(QuietWish::Quiesce {
                        end,
                        level: view.level.clone(),
                    });
                }
                None
            }
            State::Asked { end } if view.end > end => {
                self.state = State::Resuming { end };
                Some(QuietWish::Resume { end })
            }
            State::Asked { end } => {
                if view.recorded_quiet == Some(end) {
                    return None;
                }
                Some(QuietWish::Quiesce {
                    end,
                    level: view.level.clone(),
                })
            }
            State::Resuming { end } => {
                if view.recorded_resume.is_some_and(|r| r >= end) {
                    self.state = State::Active {
                        end: view.end,
                        since: now,
                    };
                    return None;
                }
                Some(QuietWish::Resume { end })
            }
        }
    }

    /// The next time a look may ask for something without a new input.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Active { since, .. } => Some(since + self.quiet_after),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
