//! The operator's stream deletion as the engine exposes it: who may do it, and the answers.
//! The broker side is `broker/delete.rs`.

use std::fmt;

use crate::broker::DeleteRefusal;
use felix_auth::Verifier;
use felix_auth::{stream_object, Action};

/// Why [`Engine::delete_stream`](crate::Engine::delete_stream) (or `delete_stream_as`) did
/// not delete. Each maps to one HTTP status on the ops endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteStreamError {
    /// The token does not verify for the stream's tenant (401).
    Unauthorized(String),
    /// The token lacks `stream.manage` on `stream:{tenant}/{namespace}/{stream}` (403).
    Forbidden,
    /// A name breaks the naming rule (400).
    InvalidName,
    /// No such stream on this broker (404).
    NotFound,
    /// Not now: the broker is draining or a shard's log is still opening (503).
    Unavailable(String),
}

impl fmt::Display for DeleteStreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeleteStreamError::Unauthorized(why) => write!(f, "unauthorized: {why}"),
            DeleteStreamError::Forbidden => f.write_str("forbidden: stream.manage is required"),
            DeleteStreamError::InvalidName => {
                f.write_str("invalid tenant, namespace or stream name")
            }
            DeleteStreamError::NotFound => f.write_str("no such stream"),
            DeleteStreamError::Unavailable(why) => write!(f, "unavailable: {why}"),
        }
    }
}

impl std::error::Error for DeleteStreamError {}

impl From<DeleteRefusal> for DeleteStreamError {
    fn from(r: DeleteRefusal) -> Self {
        match r {
            DeleteRefusal::NotFound => DeleteStreamError::NotFound,
            DeleteRefusal::Unavailable(why) => DeleteStreamError::Unavailable(why),
        }
    }
}

/// The token must verify for `tenant` exactly as a session's `auth` does, and grant
/// `stream.manage` over the stream (docs/operations.md).
pub(crate) fn authorize(
    verifier: &Verifier,
    unix_secs: u64,
    token: &str,
    (tenant, namespace, stream): (&str, &str, &str),
) -> Result<(), DeleteStreamError> {
    let object = stream_object(tenant, namespace, stream).ok_or(DeleteStreamError::InvalidName)?;
    let identity = verifier
        .verify(token, tenant, unix_secs)
        .map_err(|e| DeleteStreamError::Unauthorized(e.to_string()))?;
    if !identity.allows(Action::StreamManage, &object) {
        return Err(DeleteStreamError::Forbidden);
    }
    Ok(())
}
