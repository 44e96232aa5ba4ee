//! The one seam a session asks about a shard: who owns it and how wide its object is, whether
//! a shard led here may serve now, and the forwards and write notes that follow the answer
//! (serve here, forward to a node, or redirect: felix-cluster's `routing` decides, the session
//! applies it). Sessions (`conn/`) and the shared context (`node.rs`) name this module, never
//! `cluster/`; tidy's `ENGINE_MODULE_RULES` hold them to it.
//!
//! The router owns this node's cluster driver (`cluster::ClusterNode`) privately and exposes
//! only the calls a session makes. The engine, which drives the cluster, reaches the driver
//! through `cluster::Wired`, a trait sessions cannot import without naming `cluster/`. (Why a
//! wrapper and not yet a table the engine refreshes: ARCHITECTURE.md, "Where the next engineer
//! adds a shard move, or a core".)

use std::time::{Duration, Instant};

use felix_cluster::routing::Owner;
use felix_cluster::NodeId;
use quinn_proto::{ConnectionHandle, StreamId};

use crate::cluster::ClusterNode;

/// How a forward this node sent ended.
#[derive(Debug)]
pub(crate) enum ForwardOutcome {
    /// The leader's answer frame.
    Answered(bytes::Bytes),
    /// The leader refused it, or it never answered.
    Refused(felix_proto::ErrorCode, String),
}

/// A shard's owner as `shard_owners` reports it.
pub(crate) struct OwnerEntry {
    pub(crate) node_id: Option<String>,
    pub(crate) addr: Option<String>,
    pub(crate) generation: u64,
}

/// What sessions ask about shards, on a node that is one of several.
pub(crate) struct Router {
    driver: ClusterNode,
}

impl Router {
    pub(crate) fn new(driver: ClusterNode) -> Router {
        Router { driver }
    }

    /// For `cluster::Wired` only: the driver this router answers from.
    pub(crate) fn wired(&self, _: crate::cluster::Wiring) -> &ClusterNode {
        &self.driver
    }

    /// For `cluster::Wired` only.
    pub(crate) fn wired_mut(&mut self, _: crate::cluster::Wiring) -> &mut ClusterNode {
        &mut self.driver
    }

    // Owners and widths, from the applied metadata.

    /// A placed stream's width.
    pub(crate) fn stream_width(&self, tenant: &str, namespace: &str, stream: &str) -> Option<u32> {
        self.driver.stream_width(tenant, namespace, stream)
    }

    /// A placed cache's width: its keys hash over this many shards.
    pub(crate) fn cache_width(&self, tenant: &str, namespace: &str, cache: &str) -> Option<u32> {
        self.driver.cache_width(tenant, namespace, cache)
    }

    /// Who serves shard `shard` of a stream; `None` for a stream not placed yet.
    pub(crate) fn stream_owner(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
    ) -> Option<Owner> {
        self.driver.stream_owner(tenant, namespace, stream, shard)
    }

    /// Who serves one shard of a cache; `None` for a cache not placed.
    pub(crate) fn cache_owner(&self, names: (&str, &str, &str), shard: u32) -> Option<Owner> {
        self.driver.cache_owner(names, shard)
    }

    /// Every shard's owner, for `shard_owners`; `None` for an object not placed.
    pub(crate) fn owners(
        &self,
        cache: bool,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Vec<OwnerEntry>> {
        self.driver.owners(cache, tenant, namespace, name)
    }

    /// `topology`'s answer: every member that can serve and has a client address.
    pub(crate) fn topology(&self) -> Vec<(String, String)> {
        self.driver.topology()
    }

    /// `cluster.place_streams_on_first_use`.
    pub(crate) fn places_streams_on_first_use(&self) -> bool {
        self.driver.places_streams_on_first_use()
    }

    /// Asks the cluster to place a stream first used here.
    pub(crate) fn place_stream(
        &mut self,
        now: Instant,
        (tenant, namespace, stream): (&str, &str, &str),
        shards: u32,
    ) {
        self.driver
            .place_stream(now, tenant, namespace, stream, shards);
    }

    // Readiness of a shard led here, and what serving it leaves behind.

    /// Whether a write on this stream shard may be served here now: the lease holds, and a
    /// replicated shard's copy is open for writes at the metadata's generation.
    pub(crate) fn local_ready(
        &self,
        now: Instant,
        names: (&str, &str, &str),
        shard: u32,
    ) -> Result<(), &'static str> {
        self.driver.local_ready(now, names, shard)
    }

    /// As [`local_ready`](Self::local_ready), and the shard's group log is open too.
    pub(crate) fn groups_ready(
        &self,
        now: Instant,
        names: (&str, &str, &str),
        shard: u32,
    ) -> Result<(), &'static str> {
        self.driver.groups_ready(now, names, shard)
    }

    /// Whether a request on this cache shard led here may be served now.
    pub(crate) fn local_ready_cache(
        &self,
        now: Instant,
        names: (&str, &str, &str),
        shard: u32,
    ) -> Result<(), &'static str> {
        self.driver.local_ready_cache(now, names, shard)
    }

    /// A publish on this stream shard is served here as its leader.
    pub(crate) fn note_write(&mut self, names: (&str, &str, &str), shard: u32) {
        self.driver.note_write(names, shard);
    }

    /// A publish on a gated (replicated, led here) log is owed an answer once `end` is
    /// committed.
    pub(crate) fn replica_owes(&mut self, log: felix_storage::ops::LogId, end: u64) {
        self.driver.replica_owes(log, end);
    }

    // Forwards to a shard's leader.

    /// How long a forward, or a request waiting for its shard, may take.
    pub(crate) fn forward_timeout(&self) -> Duration {
        self.driver.forward_timeout()
    }

    /// The scope a forward names: the shard, at the generation this node routed by.
    pub(crate) fn scope(
        &self,
        cache: bool,
        names: (&str, &str, &str),
        shard: u32,
        generation: u64,
    ) -> felix_peer_proto::ShardScope {
        self.driver.scope(cache, names, shard, generation)
    }

    /// A channel number for one client session's forwards (the high half of their ids).
    pub(crate) fn new_channel(&mut self) -> u32 {
        self.driver.new_channel()
    }

    /// Registers that a session's channel is being opened on `to` with `open` (its `auth`).
    pub(crate) fn channel_opened(
        &mut self,
        channel: u32,
        owner: (ConnectionHandle, StreamId),
        to: &NodeId,
        open: &felix_peer_proto::Forward,
    ) {
        self.driver.channel_opened(channel, owner, to, open);
    }

    /// Sends a forward to `to`; with `answer_to`, its answer is owed to that session (it
    /// comes back as a [`ForwardOutcome`]).
    pub(crate) fn forward(
        &mut self,
        now: Instant,
        to: &NodeId,
        forward: felix_peer_proto::Forward,
        answer_to: Option<(ConnectionHandle, StreamId)>,
    ) {
        self.driver.forward(now, to, forward, answer_to);
    }
}
