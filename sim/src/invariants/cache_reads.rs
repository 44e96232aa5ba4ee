//! A cache read returns the last acknowledged write or a later one, never an expired value.
//!
//! Each key has one writer with at most one write in flight, so its writes are totally
//! ordered. A read sent at `sent` and answered at `answered` may return any write from the
//! last one acknowledged before `sent` onwards that was sent before `answered` and not
//! refused, or a write whose outcome its client never learned (it may land at any time).
//! A value is certainly expired when the read was sent later than its write's acknowledgement
//! plus its TTL (the broker stamped it no later than that). Absent is allowed when no write
//! was acknowledged before the read, or a candidate is a delete, or could have expired.

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::oracle::{show, Oracle, Violation, WriteOutcome};

pub(crate) const NAME: &str = "cache_reads";

/// TTLs travel in milliseconds and expiries are stored in whole milliseconds.
const SLOP: Duration = Duration::from_millis(2);

pub(crate) fn check_get(
    oracle: &mut Oracle,
    key: &str,
    value: Option<&Bytes>,
    sent: Instant,
    answered: Instant,
    start: Instant,
) -> Result<(), Violation> {
    oracle.cache_reads_checked += 1;
    let writes = oracle.cache.get(key).map(Vec::as_slice).unwrap_or(&[]);
    let last_acked = writes
        .iter()
        .rposition(|w| matches!(w.outcome, WriteOutcome::Acked(at) if at < sent));
    let candidates: Vec<_> = writes
        .iter()
        .enumerate()
        .filter(|(i, w)| {
            w.sent < answered
                && match w.outcome {
                    WriteOutcome::Refused => false,
                    WriteOutcome::Unknown => true,
                    _ => last_acked.is_none_or(|k| *i >= k),
                }
        })
        .map(|(_, w)| w)
        .collect();
    let ms = |t: Instant| t.saturating_duration_since(start).as_millis();
    let ok = match value {
        Some(v) => candidates.iter().any(|w| {
            w.value.as_ref() == Some(v)
                && match (w.outcome, w.ttl) {
                    (WriteOutcome::Acked(at), Some(ttl)) => sent <= at + ttl + SLOP,
                    _ => true,
                }
        }),
        None => {
            last_acked.is_none()
                || candidates.iter().any(|w| {
                    w.value.is_none() || w.ttl.is_some_and(|ttl| w.sent + ttl <= answered + SLOP)
                })
        }
    };
    if ok {
        return Ok(());
    }
    let history: Vec<String> = writes
        .iter()
        .map(|w| {
            format!(
                "{}@{}ms ttl={:?} {:?}",
                w.value.as_ref().map_or("<delete>".to_owned(), |v| show(v)),
                ms(w.sent),
                w.ttl.map(|t| t.as_millis()),
                match w.outcome {
                    WriteOutcome::Acked(at) => format!("acked@{}ms", ms(at)),
                    other => format!("{other:?}"),
                }
            )
        })
        .collect();
    Err(Violation {
        invariant: NAME,
        detail: format!(
            "get {key} sent@{}ms answered@{}ms returned {}; writes: [{}]",
            ms(sent),
            ms(answered),
            value.map_or("<absent>".to_owned(), |v| show(v)),
            history.join(", ")
        ),
    })
}
