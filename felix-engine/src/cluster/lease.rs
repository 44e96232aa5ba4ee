//! This node's shard leases, as their holder keeps them (docs/replication.md, "Leases").
//!
//! One lease covers every shard the node leads. Every quarter lease the node asks the control
//! plane's leader to renew it; a grant counts from when the request was *sent*, by this node's
//! monotonic clock, and only once this node has applied the metadata as far as the grant says
//! (so a shard moved away before the grant is seen as moved). Writes stop `holder_margin`
//! before the lease ends; the control plane hands a shard on only `regrant_margin` after it
//! ends by its own clock (`felix_cluster::replication::promotion`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use felix_cluster::control::LeaseGrant;
use felix_cluster::replication::lease::LeaseTerms;
use felix_cluster::NodeId;
use felix_peer_proto::PeerMessage;

use super::ClusterNode;

/// Renewals kept waiting for their grant; older ones are forgotten (their grant would
/// anchor earlier than a newer one anyway).
const MAX_RENEWALS_IN_FLIGHT: usize = 8;

pub(super) struct HolderLease {
    terms: LeaseTerms,
    next_seq: u64,
    sent: VecDeque<(u64, Instant)>,
    /// When the latest counted grant's request was sent.
    anchor: Option<Instant>,
    /// A grant that counts once the metadata here reaches its `applied`.
    waiting: Option<(Instant, u64)>,
    next_renewal: Instant,
}

impl HolderLease {
    pub(super) fn new(terms: LeaseTerms, now: Instant) -> HolderLease {
        HolderLease {
            terms,
            next_seq: 1,
            sent: VecDeque::new(),
            anchor: None,
            waiting: None,
            next_renewal: now,
        }
    }

    fn every(&self) -> Duration {
        Duration::from_millis((self.terms.lease_ms / 4).max(1))
    }

    /// The last instant this node may accept a write under its lease.
    pub(crate) fn writable_until(&self) -> Option<Instant> {
        let usable = self.terms.lease_ms - self.terms.holder_margin_ms;
        self.anchor.map(|a| a + Duration::from_millis(usable))
    }

    fn count(&mut self, sent_at: Instant) {
        if self.anchor.is_none_or(|a| sent_at > a) {
            self.anchor = Some(sent_at);
        }
    }

    pub(super) fn poll_timeout(&self) -> Instant {
        self.next_renewal
    }
}

impl ClusterNode {
    /// This node may accept writes on the shards it leads now.
    pub(crate) fn lease_valid(&self, now: Instant) -> bool {
        if self.canary == crate::config::ReplicationCanary::ServePastLease {
            return self.lease.writable_until().is_some();
        }
        self.lease.writable_until().is_some_and(|until| now < until)
    }

    /// Renews the lease when due: with the control plane's leader, which may be this node.
    pub(super) fn renew_lease(&mut self, now: Instant) {
        if now < self.lease.next_renewal {
            return;
        }
        self.lease.next_renewal = now + self.lease.every();
        let Some(leader) = self.control.as_ref().and_then(|c| c.leader()).cloned() else {
            return;
        };
        let seq = self.lease.next_seq;
        self.lease.next_seq += 1;
        self.lease.sent.push_back((seq, now));
        while self.lease.sent.len() > MAX_RENEWALS_IN_FLIGHT {
            self.lease.sent.pop_front();
        }
        if leader == self.me {
            // Granted as `ControlOutput::LeaseGranted` once raft confirms the leadership.
            let me = self.me.clone();
            if let Some(c) = self.control.as_mut() {
                c.lease_renewed(now, &me, seq);
            }
            return;
        }
        let renew = PeerMessage::LeaseRenew(felix_peer_proto::LeaseRenew {
            node: self.me.0.clone(),
            seq,
            storage_id: self.storage_hex(),
        });
        self.net.send(leader.as_str(), &renew);
    }

    /// A peer asks this node, as the control plane's leader, to renew its lease.
    pub(super) fn on_lease_renew(
        &mut self,
        now: Instant,
        from: &str,
        renew: felix_peer_proto::LeaseRenew,
    ) {
        // A renewal counts only for the node the link authenticated.
        if renew.node != from {
            return;
        }
        let node = NodeId::new(from);
        if let Some(c) = self.control.as_mut() {
            c.lease_renewed(now, &node, renew.seq);
        }
    }

    /// The control plane granted `node`'s renewal `seq`: answered, or counted when it is
    /// this node's own.
    pub(super) fn grant_lease(&mut self, node: &NodeId, seq: u64, grant: LeaseGrant) {
        if *node == self.me {
            self.lease_granted(seq, grant);
            return;
        }
        let answer = PeerMessage::LeaseGrant(felix_peer_proto::LeaseGrant {
            seq,
            term: grant.term,
            lease_ms: self.lease.terms.lease_ms as u32,
            applied: grant.applied,
        });
        self.net.reply(node.as_str(), &answer);
    }

    pub(super) fn on_lease_grant(&mut self, grant: felix_peer_proto::LeaseGrant) {
        let g = LeaseGrant {
            term: grant.term,
            applied: grant.applied,
        };
        self.lease_granted(grant.seq, g);
    }

    fn lease_granted(&mut self, seq: u64, grant: LeaseGrant) {
        let Some(i) = self.lease.sent.iter().position(|&(s, _)| s == seq) else {
            return;
        };
        let (_, sent_at) = self.lease.sent[i];
        self.lease.sent.drain(..=i);
        if self.meta().applied >= grant.applied {
            // Requests waiting for a lease go on (they re-check it against their own time).
            self.lease.count(sent_at);
            self.metadata_changed = true;
        } else if self.lease.waiting.is_none_or(|(t, _)| sent_at > t) {
            self.lease.waiting = Some((sent_at, grant.applied));
        }
    }

    /// Metadata was applied: a grant waiting for it may count now.
    pub(super) fn lease_metadata_applied(&mut self) {
        if let Some((sent_at, applied)) = self.lease.waiting {
            if self.meta().applied >= applied {
                self.lease.waiting = None;
                self.lease.count(sent_at);
                self.metadata_changed = true;
            }
        }
    }
}
