//! Every request is answered or its connection is closed: once faults have healed and the run
//! has been quiet for a while, no request may still be waiting on a connection the broker
//! kept talking on long after the request was sent.
//!
//! "Live" is judged from the broker's side: a connection the broker forgot (it restarted, or
//! reaped the connection) is closed even while its client, whose RTT estimate a stall or a
//! clock jump inflated, still waits out an idle timeout of several PTOs (RFC 9000 §10.1).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::oracle::{Oracle, Violation};

pub(crate) const NAME: &str = "requests_answered";

/// Checks at `now` that nothing sent before `now - grace` is still outstanding on a
/// connection whose broker was heard (`heard[(client, gen)]`) at least `grace / 2` after it.
pub(crate) fn check(
    oracle: &Oracle,
    now: Instant,
    grace: Duration,
    start: Instant,
    heard: &BTreeMap<(usize, u64), Instant>,
) -> Result<(), Violation> {
    for ((client, gen, stream, id), o) in &oracle.outstanding {
        let broker_alive = heard
            .get(&(*client, *gen))
            .is_some_and(|at| *at > o.sent + grace / 2);
        if o.sent + grace < now && broker_alive {
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
