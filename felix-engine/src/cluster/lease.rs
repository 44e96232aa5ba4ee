//! This node's shard leases: the wiring of `felix_cluster::replication::holder` (docs/replication.md,
//! "Leases"). The holder decides when to renew and when a grant counts; this file sends its
//! renewals (to a peer, or to this node's own control plane when it leads it), answers peers'
//! renewals as the control plane's leader, and routes grants back.

use std::time::Instant;

use felix_cluster::control::LeaseGrant;
use felix_cluster::replication::holder::HolderOutput;
use felix_cluster::NodeId;
use felix_peer_proto::PeerMessage;

use super::ClusterNode;

impl ClusterNode {
    /// This node may accept writes on the shards it leads now.
    pub(crate) fn lease_valid(&self, now: Instant) -> bool {
        if self.canary == crate::config::ReplicationCanary::ServePastLease {
            return self.lease.writable_until().is_some();
        }
        self.lease.may_serve(now)
    }

    /// Renews the lease when due: with the control plane's leader, which may be this node.
    pub(super) fn renew_lease(&mut self, now: Instant) {
        let leader = self.control.as_ref().and_then(|c| c.leader()).cloned();
        self.lease.handle_timeout(now, leader.as_ref());
        self.drain_lease(now);
    }

    /// Carries out what the holder decided.
    fn drain_lease(&mut self, now: Instant) {
        while let Some(out) = self.lease.poll_output() {
            match out {
                HolderOutput::Renew { to, seq } if to == self.me => {
                    // Granted as `ControlOutput::LeaseGranted` once raft confirms the leadership.
                    let me = self.me.clone();
                    if let Some(c) = self.control.as_mut() {
                        c.lease_renewed(now, &me, seq);
                    }
                }
                HolderOutput::Renew { to, seq } => {
                    let renew = PeerMessage::LeaseRenew(felix_peer_proto::LeaseRenew {
                        node: self.me.0.clone(),
                        seq,
                        storage_id: self.storage_hex(),
                    });
                    self.net.send(to.as_str(), &renew);
                }
                // Requests waiting for a lease go on (they re-check it against their own time).
                HolderOutput::Counted => self.metadata_changed = true,
            }
        }
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
            lease_ms: self.lease.terms().lease_ms as u32,
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
        let applied = self.meta().applied;
        self.lease.granted(seq, grant, applied);
        self.drain_lease_counted();
    }

    /// Metadata was applied: a grant waiting for it may count now.
    pub(super) fn lease_metadata_applied(&mut self) {
        let applied = self.meta().applied;
        self.lease.metadata_applied(applied);
        self.drain_lease_counted();
    }

    /// After a grant or applied metadata the holder can only have counted a grant.
    fn drain_lease_counted(&mut self) {
        while let Some(out) = self.lease.poll_output() {
            debug_assert_eq!(out, HolderOutput::Counted);
            self.metadata_changed = true;
        }
    }
}
