//! What the operator reaches over HTTP, beside the QUIC listener: the endpoint itself
//! ([`http`]: `/livez`, `/readyz`, the routing), the `/metrics` exposition ([`metrics`]) and
//! the operator's stream deletion (`stream_delete`: `DELETE /v1/streams/…` and the drive
//! loop's side of it), the admin API's streams (`streams`: `/v1/streams`), caches (`caches`:
//! `/v1/caches`), what they share (`admin`), `abandon`, and the change long-poll
//! ([`changes`]: `/v1/cluster/changes`).
//! hyper serves it on a runtime of its own in one thread, the same under every broker runtime.

pub(crate) mod abandon;
mod admin;
pub(crate) mod caches;
pub mod changes;
pub mod http;
pub mod metrics;
pub(crate) mod stream_delete;
pub(crate) mod streams;
