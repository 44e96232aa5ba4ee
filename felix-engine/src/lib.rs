//! # felix-engine
//!
//! One Felix broker node as a Sans-IO state machine: [`Engine`] takes UDP datagrams and
//! timeouts (each with its `now`) and gives back datagrams to send and the next deadline. It
//! owns a `quinn_proto::Endpoint` and its connections, maps QUIC streams to Felix sessions,
//! and runs the broker (streams, subscriptions, cache) in memory. It reads no clock, draws no
//! OS randomness and owns no socket, thread or file; `runtime-tokio` (or a simulator) drives it.
//!
//! Modules, outside in:
//! - `engine`: [`Engine`], the endpoint, connection table, timers and transmit queue;
//! - `net`: [`Datagram`] in and [`Transmit`] out, shared by the client and peer endpoints;
//! - `conn`: one QUIC connection, its session streams and subscription event streams;
//! - `session`: one client stream: `auth`, negotiated capabilities, requests and answers;
//! - `broker`: streams, shards, subscriber queues, event batches and the cache;
//! - `tls`: rustls configs and per-connection ALPN selection;
//! - `seed`: every random choice derived from [`EngineConfig::rng_seed`].
//! - `fuzzing` (feature `fuzzing` only): a harness that drives sessions and the broker
//!   beneath QUIC, for the `engine_frames` fuzz target.

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
