//! The one seam a session asks about a shard. [`Router::locate`] names the shard a request
//! is for and who serves it, by the metadata applied here; for a shard led here,
//! [`Router::ready_here`] says whether it may serve now; felix-cluster's `routing::route` turns
//! the owner into serve here, forward to a node, or redirect, and the session applies that
//! (`conn/session/cluster.rs`), forwarding through the router ([`Router::forward`]) and
//! noting a write served as leader ([`Router::note_write`]). Sessions (`conn/`) and the
//! shared context (`node.rs`) name this module, never `cluster/`; tidy's
//! `ENGINE_MODULE_RULES` hold them to it.
//!
//! The router owns this node's cluster driver (`cluster::ClusterNode`) privately and exposes
//! only the calls a session makes. The engine, which drives the cluster, reaches the driver
//! through `cluster::Wired`, a trait sessions cannot import without naming `cluster/`. (Why a
//! wrapper and not yet a table the engine refreshes: ARCHITECTURE.md, "Where the next engineer
//! adds a shard move, or a core".)

use std::time::{Duration, Instant};

use felix_cluster::routing::{Owner, RequestClass};
use felix_cluster::NodeId;
use felix_proto::routing::{shard_for_key, RoutingMapping};
use quinn_proto::{ConnectionHandle, StreamId};

use crate::cluster::{ClusterNode, Wired};
pub(crate) use crate::cluster::{ForwardOutcome, OwnerEntry};

/// The shard a request names: a cache's by its item key (or, for a prefix watch, the shard
/// it names); a stream's by the shard it names, or else its key.
pub(crate) struct ShardAsk<'a> {
    pub(crate) cache: bool,
    pub(crate) names: (&'a str, &'a str, &'a str),
    pub(crate) shard: Option<u64>,
    pub(crate) key: Option<&'a [u8]>,
}

/// Where a request's shard is.
pub(crate) enum Located {
    /// The object is placed, but the request names no shard of it that routing could answer
    /// for: the handler here refuses it.
    Handler,
    /// The object is not placed (yet).
    NotPlaced,
    /// Shard `shard`, served by `owner` (felix-cluster's `routing` says what to do with it).
    Shard { shard: u32, owner: Owner },
}

/// What sessions ask about shards, on a node that is one of several.
pub(crate) struct Router {
    driver: ClusterNode,
}

// The engine's way to the driver: `cluster::Wired`, which sessions cannot import.
impl Wired for Option<Router> {
    fn driver(&self) -> Option<&ClusterNode> {
        self.as_ref().map(|r| &r.driver)
    }

    fn driver_mut(&mut self) -> Option<&mut ClusterNode> {
        self.as_mut().map(|r| &mut r.driver)
    }
}

impl Router {
    pub(crate) fn new(driver: ClusterNode) -> Router {
        Router { driver }
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

    /// The shard `ask` is for and who serves it, by the metadata applied here.
    pub(crate) fn locate(&self, ask: &ShardAsk<'_>, mapping: RoutingMapping) -> Located {
        let (tenant, namespace, name) = ask.names;
        let (shard, owner) = if ask.cache {
            let Some(width) = self.driver.cache_width(tenant, namespace, name) else {
                return Located::NotPlaced;
            };
            let shard = match (ask.shard, ask.key) {
                (_, Some(k)) => felix_cluster::routing::cache_shard(k, width),
                (Some(s), None) => u32::try_from(s).unwrap_or(u32::MAX),
                (None, None) => 0,
            };
            // A prefix watch naming no shard of a wide cache, or one past its width: the
            // handler here refuses it (`invalid_request`), wherever shards live.
            if ask.key.is_none() && (shard >= width || ask.shard.is_none() && width > 1) {
                return Located::Handler;
            }
            (shard, self.driver.cache_owner(ask.names, shard))
        } else {
            let Some(width) = self.driver.stream_width(tenant, namespace, name) else {
                return Located::NotPlaced;
            };
            let shard = match ask.shard {
                Some(s) => u32::try_from(s).unwrap_or(u32::MAX),
                None => shard_for_key(ask.key, width, mapping),
            };
            (
                shard,
                self.driver.stream_owner(tenant, namespace, name, shard),
            )
        };
        match owner {
            Some(owner) => Located::Shard { shard, owner },
            None => Located::NotPlaced,
        }
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

    /// Whether shard `shard`, led here by the metadata, may serve a request of `class` now:
    /// this node's lease holds, and each copy the request needs (a stream's records, and its
    /// group log for a group request; a cache's values and counters) is open at the
    /// metadata's generation. The error says why not (usually one round trip away: a lease
    /// renewal, a fence).
    pub(crate) fn ready_here(
        &self,
        now: Instant,
        cache: bool,
        class: RequestClass,
        names: (&str, &str, &str),
        shard: u32,
    ) -> Result<(), &'static str> {
        if cache {
            self.driver.local_ready_cache(now, names, shard)
        } else if matches!(class, RequestClass::Group) {
            // Group state lives in the shard's group log, which has its own fence.
            self.driver.groups_ready(now, names, shard)
        } else {
            self.driver.local_ready(now, names, shard)
        }
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
