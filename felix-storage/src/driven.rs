//! [`Driven`]: how the runtime drives any log, written once for them all.
//!
//! A cache, counter or group log keeps its own state over a [`ShardLog`] it owns, and is
//! driven just like that log: file ops come straight from it, and each input (a
//! completion, a timer, a forced sync) goes to it. The one thing a wrapper adds is what it
//! does after an input, [`Driven::after_input`]: take in what the log did.

use std::time::Instant;

use super::log::ShardLog;
use super::ops::{FileCompletion, FileOp};

pub trait Driven {
    /// The segment log underneath.
    fn shard_mut(&mut self) -> &mut ShardLog;
    /// Runs after every input below.
    fn after_input(&mut self);

    #[must_use]
    fn poll_op(&mut self) -> Option<FileOp> {
        ShardLog::poll_op(self.shard_mut())
    }

    fn handle_completion(&mut self, c: FileCompletion) {
        ShardLog::handle_completion(self.shard_mut(), c);
        self.after_input();
    }

    fn handle_timeout(&mut self, now: Instant, unix_micros: u64) {
        ShardLog::handle_timeout(self.shard_mut(), now, unix_micros);
        self.after_input();
    }

    /// Asks for a sync of everything written so far, whatever the fsync mode (a graceful
    /// stop drives the log until [`ShardLog::is_idle`] holds).
    fn sync_now(&mut self) {
        ShardLog::sync_now(self.shard_mut());
        self.after_input();
    }
}

impl Driven for ShardLog {
    fn shard_mut(&mut self) -> &mut ShardLog {
        self
    }

    /// A stream's log has nothing over it: its events wait for the broker to poll them.
    fn after_input(&mut self) {}
}
