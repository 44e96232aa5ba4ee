//! # felix-cluster
//!
//! What a Felix cluster decides, as pure functions and plain state, and the control plane that
//! agrees on it:
//! - [`placement`]: where each shard's replicas and leader go;
//! - [`routing`]: what a node does with a request for a shard it does not lead;
//! - [`forward`]: the forwards a node sends to leaders: windows, channels, deadlines, reopening;
//! - [`meta`]: the cluster metadata as a deterministic state machine over ordered maps;
//! - [`replication`]: quorum marks, leases, promotion fences and divergence of a shard's log;
//! - [`control`]: raft-rs's `RawNode` driven Sans-IO: ticks from the caller's time, messages
//!   in and out as values, persistence as records the caller writes and confirms.
//!
//! Like every core crate it reads no clock, draws no OS randomness (see `control::election`
//! for the one place raft-rs would) and touches no file or socket.

// raft-rs's generated protobuf types carry hidden bookkeeping fields; building them from
// `default()` field by field reads better than struct literals that must spell those out.
#![allow(clippy::field_reassign_with_default)]

pub mod control;
pub mod forward;
pub mod ids;
pub mod meta;
pub mod placement;
pub mod replication;
pub mod routing;

pub use ids::{NodeId, Voters, VotersError};
