//! # felix-testkit
//!
//! What tests need to talk to a real [`felix_engine::Engine`] without sockets, threads or
//! sleeping: quinn-proto *client* endpoints on one side, the engine on the other, datagrams
//! moved by hand and time moved by a virtual clock. Engine integration tests use [`Net`]
//! whole; the engine fuzz target and the simulator, which pump datagrams their own way, use
//! the pieces under it.
//!
//! - [`Net`], [`Peer`]: one engine, client connections, an in-memory disk ([`MemFs`]), and
//!   the clock; `run` settles, `advance` lets time pass firing every timer.
//! - [`ClusterNet`]: several engines as cluster nodes, each a [`Net`], their peer datagrams
//!   carried by hand (links can be cut one way) on one clock.
//! - TLS fixtures: [`tls`] (a CA and a `localhost` leaf), [`shared_tls`] (the same, made once
//!   per process), [`ed25519_identity`] (a self-signed certificate from a seed, for runs that
//!   must repeat byte for byte).
//! - Client plumbing: [`client_tls`], [`quic_crypto`], [`client_config`],
//!   [`client_endpoint`], [`to_engine`], [`to_client`], [`poll_connection`], [`read_stream`].
//! - Tokens: [`token`], [`jwks`] (over `felix_auth`'s minting).
//! - Frames: [`json_frame`], [`binary_frame`], [`binary_publish`], [`real_client_auth`],
//!   [`text`], [`bytes_of`].
//!
//! - Real processes: [`history`], the checker a chaos run's record is judged by, and
//!   [`Relay`], a UDP relay whose directions can be cut (threads and real sockets, for tests
//!   that run real brokers; nothing else in this crate touches the OS).
//!
//! Key generation in [`tls`] uses the OS's randomness; nothing else here does.

mod cluster_net;
mod frames;
pub mod history;
mod net;
mod quic;
mod relay;
mod tls;
mod tokens;

pub use cluster_net::{key_for_shard, log_entries_on, shard_log_on, ClusterNet, ClusterSpec};
pub use felix_storage::memfs::MemFs;
pub use frames::{
    binary_frame, binary_publish, bytes_of, json_frame, real_client_auth, text,
    REAL_CLIENT_FEATURES, REAL_CLIENT_FEATURES_HI, REAL_CLIENT_FLAGS,
};
pub use net::{Net, Peer};
pub use quic::{
    client_config, client_endpoint, client_tls, client_transport, poll_connection, quic_crypto,
    read_stream, to_client, to_engine, ClientTransport, StreamRead, Trust,
};
pub use relay::{Counts, Direction, Relay, Rule};
pub use tls::{ed25519_identity, shared_tls, tls, Tls};
pub use tokens::{jwks, token};
