//! Graceful drain, the engine's side: [`Engine::drain`] stops new work, and
//! [`Engine::is_drained`] says when every answer owed has been handed to QUIC, so the
//! runtime can then [`Engine::shutdown`] without leaving a request unanswered.
//!
//! The sequence a runtime follows on SIGTERM: `drain`; keep driving the engine (datagrams,
//! timers, file completions) until `is_drained` has held for a short quiet period (peers'
//! acknowledgements arrive, late requests are refused) or a deadline passes; then
//! `shutdown`, which closes every connection with code 0 and syncs the logs.

use std::time::Instant;

use super::Engine;

impl Engine {
    /// Stops taking new work: new connections are refused, a stream's `auth` and every new
    /// request get `draining` [retry], every log is asked to sync now (so answers held for
    /// durability are released without waiting for the periodic fsync). Requests already
    /// being served are answered as usual. Keep polling outputs.
    pub fn drain(&mut self, now: Instant) {
        self.shutting_down = true;
        self.endpoint.set_server_config(None);
        self.core.broker.begin_drain();
        self.core.broker.begin_storage_shutdown();
        self.settle(now);
    }

    /// After [`drain`](Self::drain): no answer is owed — none held for durability, for a log
    /// read or for a log still opening, none unwritten, no stream data waiting for
    /// retransmission.
    pub fn is_drained(&self) -> bool {
        self.core.waiters.is_empty()
            && self.core.value_waiters.is_empty()
            && self.core.stalled.is_empty()
            && self.usage().max_connection_unwritten_bytes == 0
            && self
                .conns
                .values()
                .all(|c| !c.quic.has_pending_retransmits())
    }
}
