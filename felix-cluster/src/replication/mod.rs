//! Decisions about replicating one shard's log, as pure functions of what the nodes reported.
//!
//! The engine ships records and persists fences; what it may *conclude* from the answers lives
//! here so each rule is one function with exact-output tests:
//! - [`quorum`]: how far the log is held durably by a majority, leader included — the mark that
//!   releases `quorum` acknowledgements and bounds what subscribers see;
//! - [`lease`]: whether a leader may still write, when the control plane may grant the next
//!   generation, and whether a set of lease margins is safe under a clock drift bound;
//! - [`holder`]: the node's lease as its holder keeps it — when to renew, when a grant
//!   counts, until when writes may be served;
//! - [`fence`]: when a promoted leader may open, and whose log it must adopt first;
//! - [`divergence`]: where two copies of a log stop agreeing, so a rejoining replica truncates
//!   only above what was committed;
//! - [`copy`]: one log's copy on a node, joining the above into its roles (preparing, fencing
//!   and adopting, leading, following): the metadata's view, the log's position, peer
//!   messages and completed log work in; peer messages, log work and metadata proposals out.
//!
//! Why a fence and not an ordered report (issue 18, point 4): a promotion that waits for a
//! majority of the replica set to persist the new generation, and adopts the most advanced log
//! among them, keeps every record a majority held at the old generation whatever the reports
//! said and whatever the clocks did — the two majorities share a replica. Ordering reports
//! before marks would make the metadata log part of every quorum acknowledgement.

pub mod copy;
pub mod divergence;
pub mod fence;
pub mod follower;
pub mod holder;
pub mod leader;
pub mod lease;
pub mod promotion;
pub mod quiesce;
pub mod quorum;

#[cfg(test)]
mod golden;

/// One replica of a shard as the metadata records it: the node, and the storage identity its
/// copy lives on. A report or fence answer from a different storage identity is from a wiped
/// or replaced disk and counts for nothing until that replica is rebuilt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    pub node: crate::NodeId,
    pub storage_id: String,
}

/// How many replicas, leader included, make a majority of a set of `len`.
pub fn majority(len: usize) -> usize {
    len / 2 + 1
}
