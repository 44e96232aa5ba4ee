//! Every request is answered or its connection is closed: once faults have healed and the run
//! has been quiet for a while, no request on a live connection may still be waiting.

use std::time::{Duration, Instant};

use crate::oracle::{Oracle, Violation};

pub(crate) const NAME: &str = "requests_answered";

/// Checks at `now` that nothing sent before `now - grace` is still outstanding.
pub(crate) fn check(
    oracle: &Oracle,
    now: Instant,
    grace: Duration,
    start: Instant,
) -> Result<(), Violation> {
    for ((client, gen, stream, id), o) in &oracle.outstanding {
        if o.sent + grace < now {
            return Err(Violation {
                invariant: NAME,
                detail: format!(
                    "client {client} connection {gen} stream {stream} request {id} ({}) sent at {}ms is unanswered at {}ms on a live connection",
                    o.what,
                    o.sent.saturating_duration_since(start).as_millis(),
                    now.saturating_duration_since(start).as_millis()
                ),
            });
        }
    }
    Ok(())
}
