//! Each subscriber sees records in order with no duplicate, and a gap only when signalled.
//!
//! With offsets on the wire (durable streams) every event's offset is the one after the
//! previous (from the `subscribed` start), so replay joins live with no gap or duplicate; a
//! gap is legal only through `subscription_lagged`, whose `resume_from` must not skip
//! anything unseen. Without offsets (in memory, where a full queue drops batches silently by
//! design) each publisher's sequence numbers must still strictly increase.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::oracle::{parse_payload, show, Violation};

pub(crate) const NAME: &str = "subscriber_order";

/// One subscription as its subscriber saw it.
#[derive(Debug, Clone)]
pub(crate) struct SubscriberView {
    pub(crate) shard: u32,
    /// The next offset due, when the stream has offsets.
    pub(crate) next_offset: Option<u64>,
    last_seq: BTreeMap<String, u64>,
    pub(crate) seen: u64,
}

impl SubscriberView {
    pub(crate) fn new(shard: u32, start_offset: Option<u64>) -> SubscriberView {
        SubscriberView {
            shard,
            next_offset: start_offset,
            last_seq: BTreeMap::new(),
            seen: 0,
        }
    }

    pub(crate) fn on_event(
        &mut self,
        who: &str,
        offset: Option<u64>,
        payload: &Bytes,
    ) -> Result<(), Violation> {
        self.seen += 1;
        match (self.next_offset, offset) {
            (Some(want), Some(got)) if want != got => {
                let what = if got > want {
                    "a gap"
                } else {
                    "a duplicate or reordering"
                };
                return Err(Violation {
                    invariant: NAME,
                    detail: format!(
                        "{who} (shard {}): expected offset {want}, got {got} ({}): {what} with no signal",
                        self.shard,
                        show(payload)
                    ),
                });
            }
            (Some(_), None) => {
                return Err(Violation {
                    invariant: NAME,
                    detail: format!("{who}: an event without an offset on a stream with offsets"),
                })
            }
            _ => {}
        }
        if let Some(got) = offset {
            self.next_offset = Some(got + 1);
        }
        if let Some((publisher, seq)) = parse_payload(payload) {
            if let Some(prev) = self.last_seq.insert(publisher.to_owned(), seq) {
                if seq <= prev {
                    return Err(Violation {
                        invariant: NAME,
                        detail: format!(
                            "{who} (shard {}): publisher {publisher} seq {seq} after {prev}",
                            self.shard
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// `subscription_lagged`: the broker dropped records from `resume_from` on; it must not
    /// claim to resume past records this subscriber has not seen.
    pub(crate) fn on_lagged(&mut self, who: &str, resume_from: u64) -> Result<(), Violation> {
        if let Some(next) = self.next_offset {
            if resume_from > next {
                return Err(Violation {
                    invariant: NAME,
                    detail: format!(
                        "{who} (shard {}): lagged with resume_from {resume_from} but offset {next} was never delivered",
                        self.shard
                    ),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_duplicates_and_reordering_fail_a_signalled_lag_passes() {
        let p = |s: &str| Bytes::from(s.to_owned());
        let mut v = SubscriberView::new(0, Some(10));
        assert!(v.on_event("s", Some(10), &p("a:1|")).is_ok());
        assert!(v.on_event("s", Some(12), &p("a:2|")).is_err());
        let mut v = SubscriberView::new(0, Some(10));
        v.on_event("s", Some(10), &p("a:1|")).unwrap();
        assert!(v.on_event("s", Some(10), &p("a:1|")).is_err());
        // A lag may resume at or before the next undelivered offset, never after it.
        assert!(v.on_lagged("s", 11).is_ok());
        assert!(v.on_lagged("s", 12).is_err());
        // Without offsets, each publisher's numbers must rise.
        let mut m = SubscriberView::new(0, None);
        m.on_event("s", None, &p("a:1|")).unwrap();
        m.on_event("s", None, &p("b:7|")).unwrap();
        m.on_event("s", None, &p("a:3|")).unwrap();
        assert!(m.on_event("s", None, &p("a:2|")).is_err());
    }
}
