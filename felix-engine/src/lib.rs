//! # felix-engine
//!
//! One Felix broker node as a Sans-IO state machine: [`Engine`] takes UDP datagrams and
//! timeouts (each with its `now`) and gives back datagrams to send and the next deadline. It
//! owns a `quinn_proto::Endpoint` and its connections, maps QUIC streams to Felix sessions,
//! and runs the broker (streams, subscriptions, cache, groups), in memory or over logs it
//! drives as [`FileOp`]s handed to the runtime. In a cluster it also runs this node's part:
//! a second (peer) endpoint, the metadata control plane, forwards and replication. It reads
//! no clock, draws no OS randomness and owns no socket, thread or file; `runtime-common`
//! (under tokio or smol) or the simulator drives it.
//!
//! Modules, outside in:
//! - `engine`: [`Engine`], the client endpoint, connection table, timers and outputs; it
//!   drives everything below, the cluster included (`forwarded`: requests peers forward here,
//!   `replication`: the copies' log work run on the broker);
//! - `settings`: an [`EngineConfig`] turned into each part's settings, beside `config`;
//! - `conn`: one QUIC connection, its subscription event streams, and `conn::session`, one
//!   client stream each: `auth`, negotiated capabilities, requests and answers;
//! - `node`: `Core`, what every connection and session shares, below `conn`;
//! - `router`: the one seam a session asks about a shard (owner, width, readiness, forwards,
//!   write notes); in a cluster `Core` holds one;
//! - `cluster`: this node's part in a cluster as wiring of felix-cluster's decisions (control
//!   plane, forwards, lease holder, copies of replicated shards) to the peer links, the
//!   broker and the metadata log; behind the router, reached only by the engine;
//! - `broker`: streams, shards, subscriber queues, event batches, cache, groups, and the
//!   broker's side of the logs;
//! - `net`: [`Datagram`] in and [`Transmit`] out, shared by the client and peer endpoints;
//! - `tls`: rustls configs and per-connection ALPN selection;
//! - `seed`: every random choice derived from [`EngineConfig::rng_seed`]; `clock`: Unix time
//!   from each input's `now`;
//! - `stream_admin`, `stream_delete`: the operator's stream and cache API (token checks,
//!   errors, views);
//! - `fuzzing` (feature `fuzzing` only): a harness that drives sessions and the broker
//!   beneath QUIC, for the `engine_frames` fuzz target.
//!
//! Module arrows point down this list's layers, never up: tidy's `ENGINE_MODULE_RULES`
//! (ARCHITECTURE.md, "The arrows").

pub(crate) mod broker;
mod clock;
mod cluster;
mod config;
mod conn;
mod engine;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod metrics;
mod net;
mod node;
mod router;
mod seed;
mod settings;
pub mod stream_admin;
mod stream_delete;
mod tls;

pub use broker::groups::GroupConfig;
pub use broker::retention::LogPositions;
pub use cluster::abandon::{AbandonError, AbandonPlan};
pub use cluster::observe::{ClusterView, ReplicaView, ShardLeader, WritesServed};
pub use config::*;
pub use engine::{Engine, EngineError, Output};
pub use felix_proto::routing::RoutingMapping;
pub use felix_storage::ops::{
    DirEntry, FileCompletion, FileError, FileErrorKind, FileOp, FileOpKind, FileOutput, LogId, OpId,
};
pub use metrics::{Histogram, Metrics, Stats, Usage, FSYNC_MICROS_BUCKETS, GROUP_COMMIT_BUCKETS};
pub use net::{Datagram, EcnCodepoint, Transmit};
/// The rustls the engine builds its TLS with, for [`EngineConfig::crypto_provider`].
pub use rustls;
pub use settings::{SERVED_FEATURES, SERVED_FLAGS};
pub use stream_admin::{AdminError, CopyBounds, ShardView, StreamView};
pub use stream_delete::DeleteStreamError;
pub use tls::{TlsConfigError, TlsIdentity, ALPN_FELIX_V1};
