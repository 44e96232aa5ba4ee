//! This node's shard lease as its holder keeps it (docs/replication.md, "Leases").
//!
//! One lease covers every shard the node leads. Every quarter lease the holder asks the control
//! plane's leader to renew it; a grant counts from when the request was *sent*, by this node's
//! monotonic clock (never later than the control plane heard it), and only once this node has
//! applied the metadata as far as the grant says, so a shard moved away before the grant is
//! seen as moved. Writes stop `holder_margin` before the lease ends; the control plane hands a
//! shard on only `regrant_margin` after it ends by its own clock ([`super::lease`]).
//!
//! Plain state in the quinn style: time comes in as an argument, decisions go out through
//! [`LeaseHolder::poll_output`]; the caller sends the renewal (or hands it to its own control
//! plane when it leads it) and routes the grant back.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::lease::LeaseTerms;
use crate::control::LeaseGrant;
use crate::NodeId;

/// Renewals kept waiting for their grant; older ones are forgotten (their grant would anchor
/// earlier than a newer one anyway).
pub const MAX_RENEWALS_IN_FLIGHT: usize = 8;

/// What the holder asks its caller to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderOutput {
    /// Ask `to`, the control plane's leader (possibly this node), to renew the lease; its grant
    /// comes back with the same `seq`.
    Renew { to: NodeId, seq: u64 },
    /// A grant counted (the lease may reach further): writes waiting for it may go on, each
    /// re-checking [`LeaseHolder::may_serve`] at its own time.
    Counted,
}

#[derive(Debug)]
pub struct LeaseHolder {
    terms: LeaseTerms,
    next_seq: u64,
    /// Renewals sent and not yet granted: `(seq, sent at)`, oldest first.
    sent: VecDeque<(u64, Instant)>,
    /// When the latest counted grant's request was sent.
    anchor: Option<Instant>,
    /// A grant that counts once the metadata here reaches its `applied`: `(sent at, applied)`.
    waiting: Option<(Instant, u64)>,
    next_renewal: Instant,
    out: VecDeque<HolderOutput>,
}

impl LeaseHolder {
    /// A holder with no lease yet; its first renewal is due at `now`.
    pub fn new(terms: LeaseTerms, now: Instant) -> LeaseHolder {
        LeaseHolder {
            terms,
            next_seq: 1,
            sent: VecDeque::new(),
            anchor: None,
            waiting: None,
            next_renewal: now,
            out: VecDeque::new(),
        }
    }

    pub fn terms(&self) -> &LeaseTerms {
        &self.terms
    }

    /// A quarter lease: a renewal or two may be lost before the lease runs out.
    fn every(&self) -> Duration {
        Duration::from_millis((self.terms.lease_ms / 4).max(1))
    }

    /// The last instant this node may accept a write under its lease (exclusive).
    pub fn writable_until(&self) -> Option<Instant> {
        let usable = self.terms.lease_ms - self.terms.holder_margin_ms;
        self.anchor.map(|a| a + Duration::from_millis(usable))
    }

    /// Whether this node may accept a write on the shards it leads at `now`.
    pub fn may_serve(&self, now: Instant) -> bool {
        self.writable_until().is_some_and(|until| now < until)
    }

    /// When the next renewal is due.
    pub fn poll_timeout(&self) -> Instant {
        self.next_renewal
    }

    /// Renews when due, with `leader`, the control plane's leader as this node knows it. With
    /// no leader known the turn passes without a request.
    pub fn handle_timeout(&mut self, now: Instant, leader: Option<&NodeId>) {
        if now < self.next_renewal {
            return;
        }
        self.next_renewal = now + self.every();
        let Some(leader) = leader else {
            return;
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        self.sent.push_back((seq, now));
        while self.sent.len() > MAX_RENEWALS_IN_FLIGHT {
            self.sent.pop_front();
        }
        self.out.push_back(HolderOutput::Renew {
            to: leader.clone(),
            seq,
        });
    }

    /// The control plane granted renewal `seq`; this node has applied the metadata up to
    /// `applied_here`. A grant for a request forgotten or already answered counts for nothing;
    /// answering one also forgets every older request (their grants would anchor earlier).
    pub fn granted(&mut self, seq: u64, grant: LeaseGrant, applied_here: u64) {
        let Some(i) = self.sent.iter().position(|&(s, _)| s == seq) else {
            return;
        };
        let (_, sent_at) = self.sent[i];
        self.sent.drain(..=i);
        if applied_here >= grant.applied {
            self.count(sent_at);
        } else if self.waiting.is_none_or(|(t, _)| sent_at > t) {
            self.waiting = Some((sent_at, grant.applied));
        }
    }

    /// Metadata was applied up to `applied_here`: a grant waiting for it may count now.
    pub fn metadata_applied(&mut self, applied_here: u64) {
        if let Some((sent_at, applied)) = self.waiting {
            if applied_here >= applied {
                self.waiting = None;
                self.count(sent_at);
            }
        }
    }

    /// The anchor only moves forward: a late grant for an older request changes nothing, but
    /// still tells the caller to look again (as the engine always did).
    fn count(&mut self, sent_at: Instant) {
        if self.anchor.is_none_or(|a| sent_at > a) {
            self.anchor = Some(sent_at);
        }
        self.out.push_back(HolderOutput::Counted);
    }

    pub fn poll_output(&mut self) -> Option<HolderOutput> {
        self.out.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::super::golden::{self, Block};
    use super::*;

    /// Each case: `lease=L margin=M` (the terms), then events, each at a time in ms from the
    /// holder's creation:
    /// - `tick at=T leader=N|none`: `handle_timeout`;
    /// - `grant seq=S applied=A here=H`: `granted` with this node's applied index `H`;
    /// - `applied here=H`: `metadata_applied`;
    /// - `serve at=T`: prints whether a write may be served then;
    /// - `state`: prints the anchor's `writable_until`, the next renewal and the waiting grant.
    ///
    /// Every event's outputs are printed as they are drained.
    fn run(block: &Block) -> String {
        let base = Instant::now();
        let ms = |t: Instant| t.duration_since(base).as_millis();
        let at = |f: &std::collections::BTreeMap<String, String>| {
            base + Duration::from_millis(golden::num(f, "at"))
        };
        let head = golden::fields(&block.lines[0]);
        let mut terms = LeaseTerms::for_lease(golden::num(&head, "lease"));
        terms.holder_margin_ms = golden::num(&head, "margin");
        let mut h = LeaseHolder::new(terms, base);
        let mut out = Vec::new();
        for line in &block.lines[1..] {
            let f = golden::fields(line);
            let verb = line.split_whitespace().next().unwrap();
            match verb {
                "tick" => {
                    let leader = match f["leader"].as_str() {
                        "none" => None,
                        n => Some(NodeId::new(n)),
                    };
                    h.handle_timeout(at(&f), leader.as_ref());
                }
                "grant" => {
                    let grant = LeaseGrant {
                        term: 1,
                        applied: golden::num(&f, "applied"),
                    };
                    h.granted(golden::num(&f, "seq"), grant, golden::num(&f, "here"));
                }
                "applied" => h.metadata_applied(golden::num(&f, "here")),
                "serve" => out.push(format!(
                    "serve at={} {}",
                    golden::num(&f, "at"),
                    if h.may_serve(at(&f)) { "yes" } else { "no" }
                )),
                "state" => out.push(format!(
                    "until={} next_renewal={} waiting={} in_flight={}",
                    h.writable_until()
                        .map_or("none".into(), |u| ms(u).to_string()),
                    ms(h.poll_timeout()),
                    h.waiting.map_or("none".into(), |(t, a)| format!(
                        "sent@{}/applied@{a}",
                        ms(t)
                    )),
                    h.sent
                        .iter()
                        .map(|(s, _)| s.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                )),
                other => panic!("unknown event {other}"),
            }
            while let Some(o) = h.poll_output() {
                out.push(match o {
                    HolderOutput::Renew { to, seq } => format!("renew to={to} seq={seq}"),
                    HolderOutput::Counted => "counted".to_string(),
                });
            }
        }
        out.join("\n")
    }

    #[test]
    fn holder_golden_file() {
        golden::check("holder.txt", run);
    }
}
