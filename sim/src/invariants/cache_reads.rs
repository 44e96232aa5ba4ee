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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::Promise;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn stale_and_expired_reads_fail_fresh_ones_pass() {
        let t0 = Instant::now();
        let mut o = Oracle::new(Promise::Memory, 1);
        let v1 = Bytes::from_static(b"v1");
        let v2 = Bytes::from_static(b"v2");
        let i = o.cache_write_sent("k", Some(v1.clone()), None, t0);
        o.cache_write_done("k", i, WriteOutcome::Acked(t0 + ms(5)));
        let j = o.cache_write_sent("k", Some(v2.clone()), Some(ms(100)), t0 + ms(10));
        // In flight: either value may be read.
        assert!(check_get(&mut o, "k", Some(&v1), t0 + ms(11), t0 + ms(12), t0).is_ok());
        assert!(check_get(&mut o, "k", Some(&v2), t0 + ms(11), t0 + ms(12), t0).is_ok());
        o.cache_write_done("k", j, WriteOutcome::Acked(t0 + ms(20)));
        // After v2's ack, v1 is stale.
        let stale = check_get(&mut o, "k", Some(&v1), t0 + ms(30), t0 + ms(31), t0);
        assert_eq!(stale.unwrap_err().invariant, NAME);
        // Past v2's TTL counted from its ack, v2 is expired; absent is right.
        let expired = check_get(&mut o, "k", Some(&v2), t0 + ms(200), t0 + ms(201), t0);
        assert!(expired.is_err());
        assert!(check_get(&mut o, "k", None, t0 + ms(200), t0 + ms(201), t0).is_ok());
        // Before it could have expired, absent is a lost write.
        assert!(check_get(&mut o, "k", None, t0 + ms(30), t0 + ms(31), t0).is_err());
    }

    #[test]
    fn a_write_with_unknown_outcome_may_surface_later() {
        let t0 = Instant::now();
        let mut o = Oracle::new(Promise::Memory, 1);
        let lost = Bytes::from_static(b"lost");
        let i = o.cache_write_sent("k", Some(lost.clone()), None, t0);
        o.cache_write_done("k", i, WriteOutcome::Unknown);
        let j = o.cache_write_sent("k", Some(Bytes::from_static(b"next")), None, t0 + ms(10));
        o.cache_write_done("k", j, WriteOutcome::Acked(t0 + ms(20)));
        assert!(check_get(&mut o, "k", Some(&lost), t0 + ms(30), t0 + ms(31), t0).is_ok());
        let refused = o.cache_write_sent("k", Some(Bytes::from_static(b"no")), None, t0 + ms(40));
        o.cache_write_done("k", refused, WriteOutcome::Refused);
        let read = check_get(
            &mut o,
            "k",
            Some(&Bytes::from_static(b"no")),
            t0 + ms(50),
            t0 + ms(51),
            t0,
        );
        assert!(read.is_err());
    }
}
