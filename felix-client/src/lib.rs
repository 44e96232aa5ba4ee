//! # felix-client
//!
//! A Felix client in two layers:
//! - [`core`]: the protocol per stream as Sans-IO state machines — the `auth` offer and what
//!   it negotiates, every request's encoding and answer decoding (publishes, cache, groups,
//!   watches, stream operations), answer correlation, event-stream decoding. No sockets, no
//!   async, no clock; the front end below and the simulator both drive it.
//! - `Client`: the async front end over quinn (rustls 0.23, `ring`), one QUIC connection
//!   per client, written once and run on tokio (feature `tokio`, on by default) or smol
//!   (feature `smol`), chosen by [`ClientConfig::runtime`](crate::ClientConfig). It is
//!   plumbing: it writes the frames the core builds and hands the frames it reads to the
//!   core. Build with `default-features = false` for the core alone.
//!
//! ```no_run
//! # #[cfg(feature = "front-end")]
//! # async fn demo(addr: std::net::SocketAddr, ca_pem: Vec<u8>, token: &str) -> Result<(), felix_client::ClientError> {
//! use bytes::Bytes;
//! use felix_client::{Ack, Client, ClientConfig, Start, SubscriptionItem};
//!
//! let client = Client::connect(ClientConfig::new(addr, ca_pem, "t1", token)).await?;
//! let mut sub = client.subscribe("default", "orders", Start::Latest).await?;
//! client.publish("default", "orders", vec![Bytes::from_static(b"hello")], None, Ack::PerMessage).await?;
//! if let SubscriptionItem::Event(event) = sub.next().await? {
//!     assert_eq!(&event.payload[..], b"hello");
//! }
//! client.cache_put("default", "sessions", "k", Bytes::from_static(b"v"), None).await?;
//! assert_eq!(client.cache_get("default", "sessions", "k").await?.as_deref(), Some(&b"v"[..]));
//! # Ok(()) }
//! ```

#[cfg(feature = "front-end")]
mod client;
pub mod core;
mod error;
#[cfg(feature = "front-end")]
mod runtime;
#[cfg(feature = "front-end")]
mod transport;

#[cfg(feature = "front-end")]
pub use crate::client::cluster::{ShardedEvent, ShardedSubscription};
#[cfg(feature = "front-end")]
pub use crate::client::groups::Group;
#[cfg(feature = "front-end")]
pub use crate::client::watch::CacheWatch;
#[cfg(feature = "front-end")]
pub use crate::client::{
    Client, ClientConfig, RawStream, Subscription, SubscriptionItem, DEFAULT_IDLE_TIMEOUT,
};
#[cfg(feature = "front-end")]
pub use crate::core::cache_features::{Condition, ConditionResult};
pub use crate::core::cluster::RetryPolicy;
#[cfg(feature = "front-end")]
pub use crate::core::groups::{GroupInfo, GroupRecord, PollOptions};
#[cfg(feature = "front-end")]
pub use crate::core::stream_ops::{
    CommitOp, CommitPlan, CommitRefused, Guarded, IdempotentBatch, IdempotentEncoding, StateValue,
    StreamPage,
};
#[cfg(feature = "front-end")]
pub use crate::core::watch::{CacheChange, CacheWatchItem, WatchFilter, WatchStart};
pub use crate::core::{Ack, Event, Offer, Start, SubscriptionEnd};
pub use crate::error::ClientError;
#[cfg(feature = "front-end")]
pub use crate::runtime::Runtime;
#[cfg(feature = "front-end")]
pub use crate::transport::{
    CLIENT_ALPN, DEFAULT_ACK_ELICITING_THRESHOLD, DEFAULT_INITIAL_MTU, DEFAULT_MAX_ACK_DELAY,
    DEFAULT_MTU_UPPER_BOUND, MTU_RANGE,
};
pub use felix_proto::message::{PublishRefusalReason, StateChange};
pub use felix_proto::{ErrorCode, RetryClass};
