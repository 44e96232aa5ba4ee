//! # felix-client
//!
//! A Felix client in two layers:
//! - [`core`]: the protocol per stream as Sans-IO state machines — the `auth` offer and what
//!   it negotiates, request encoding and answer correlation, event-stream decoding. No
//!   sockets, no async, no clock; a smol (or any) front end reuses it unchanged.
//! - [`Client`]: a tokio front end over quinn (rustls 0.23, `ring`), one QUIC connection per
//!   client.

mod client;
pub mod core;
mod error;
mod transport;

pub use crate::client::{Client, ClientConfig, RawStream, Subscription, SubscriptionItem};
pub use crate::core::{Ack, Event, Offer, Start, SubscriptionEnd};
pub use crate::error::ClientError;
pub use crate::transport::CLIENT_ALPN;
pub use felix_proto::{ErrorCode, RetryClass};
