//! The admin API's streams as the engine exposes them (`POST`/`GET /v1/streams` on the ops
//! endpoint, docs/operations.md): who may do what, the answers, and what a stream looks like.
//! The cluster side is `cluster/objects.rs`.

use std::fmt;

use felix_auth::{cache_object, stream_object, Action, Verifier};
pub use felix_cluster::meta::{CacheSpec, Consistency, Retention, StreamSpec, MAX_STREAM_SHARDS};

/// Why an admin request was not done. Each maps to one HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminError {
    /// A bad spec or name (400), naming the field.
    BadRequest { field: &'static str, why: String },
    /// The token does not verify for the tenant (401).
    Unauthorized(String),
    /// The token lacks the permission named (403).
    Forbidden(String),
    /// No such object, or not a cluster node (404).
    NotFound(String),
    /// The object exists with another spec (409), naming the first differing field.
    Conflict { field: &'static str, why: String },
    /// Not now, retryable (503): no control-plane leader, or the broker not ready.
    Unavailable(String),
}

impl AdminError {
    /// The HTTP status the ops endpoint answers with.
    pub fn status(&self) -> u16 {
        match self {
            AdminError::BadRequest { .. } => 400,
            AdminError::Unauthorized(_) => 401,
            AdminError::Forbidden(_) => 403,
            AdminError::NotFound(_) => 404,
            AdminError::Conflict { .. } => 409,
            AdminError::Unavailable(_) => 503,
        }
    }

    /// The field a 400 or 409 names.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            AdminError::BadRequest { field, .. } | AdminError::Conflict { field, .. } => {
                Some(field)
            }
            _ => None,
        }
    }
}

impl fmt::Display for AdminError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdminError::BadRequest { field, why } => write!(f, "{field}: {why}"),
            AdminError::Unauthorized(why) => write!(f, "unauthorized: {why}"),
            AdminError::Forbidden(why) => write!(f, "forbidden: {why}"),
            AdminError::NotFound(why) | AdminError::Unavailable(why) => f.write_str(why),
            AdminError::Conflict { why, .. } => f.write_str(why),
        }
    }
}

impl std::error::Error for AdminError {}

/// One shard of a placed stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardView {
    pub shard: u32,
    pub leader: Option<String>,
    /// It has a leader, and that leader is live: writes can be served.
    pub writable: bool,
    pub replicas: Vec<String>,
    /// Its current leadership generation.
    pub generation: u64,
    /// The answering node's copy of the shard's records, when it holds one: where its log
    /// starts (retention moves it) and ends. Every copy of a shard starts where its leader's
    /// log does once the leader's word has reached it.
    pub here: Option<CopyBounds>,
}

/// Where one node's copy of a shard starts and ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyBounds {
    pub log_start: u64,
    pub log_end: u64,
}

/// A placed stream: its spec and where each shard lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamView {
    pub tenant: String,
    pub namespace: String,
    pub stream: String,
    pub spec: StreamSpec,
    pub shards: Vec<ShardView>,
    /// Which life of the name this is: 0, then one more after each delete.
    pub incarnation: u64,
}

impl StreamView {
    /// Every shard has a live leader: a create is answered once this holds.
    pub fn writable(&self) -> bool {
        self.shards.iter().all(|s| s.writable)
    }
}

/// A placed cache: its spec and where each shard lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheView {
    pub tenant: String,
    pub namespace: String,
    pub cache: String,
    pub spec: CacheSpec,
    pub shards: Vec<ShardView>,
    /// As [`StreamView::incarnation`].
    pub incarnation: u64,
}

impl CacheView {
    /// Every shard has a live leader: a create is answered once this holds.
    pub fn writable(&self) -> bool {
        self.shards.iter().all(|s| s.writable)
    }
}

/// As [`authorize`], for a cache (`cache.manage` also grants `cache.view`).
pub(crate) fn authorize_cache(
    verifier: &Verifier,
    unix_secs: u64,
    token: &str,
    action: Action,
    (tenant, namespace, cache): (&str, &str, &str),
) -> Result<(), AdminError> {
    let object = cache_object(tenant, namespace, cache).ok_or_else(bad_name)?;
    let identity = verifier
        .verify(token, tenant, unix_secs)
        .map_err(|e| AdminError::Unauthorized(e.to_string()))?;
    let allowed = identity.allows(action, &object)
        || (action == Action::CacheView && identity.allows(Action::CacheManage, &object));
    if !allowed {
        return Err(AdminError::Forbidden(format!(
            "{action} on {object} is required"
        )));
    }
    Ok(())
}

/// The token must verify for `tenant` and grant `action` on the stream (`stream.manage`
/// also grants `stream.view`).
pub(crate) fn authorize(
    verifier: &Verifier,
    unix_secs: u64,
    token: &str,
    action: Action,
    (tenant, namespace, stream): (&str, &str, &str),
) -> Result<(), AdminError> {
    let object = stream_object(tenant, namespace, stream).ok_or_else(bad_name)?;
    let identity = verifier
        .verify(token, tenant, unix_secs)
        .map_err(|e| AdminError::Unauthorized(e.to_string()))?;
    let allowed = identity.allows(action, &object)
        || (action == Action::StreamView && identity.allows(Action::StreamManage, &object));
    if !allowed {
        return Err(AdminError::Forbidden(format!(
            "{action} on {object} is required"
        )));
    }
    Ok(())
}

/// A name that breaks the protocol's rule (1..=255 bytes of `[A-Za-z0-9._-]`), naming which.
pub(crate) fn check_names(names: (&str, &str, &str)) -> Result<(), AdminError> {
    check_object_names(names, "stream")
}

/// [`check_names`] for a cache.
pub(crate) fn check_cache_names(names: (&str, &str, &str)) -> Result<(), AdminError> {
    check_object_names(names, "cache")
}

fn check_object_names(
    (tenant, namespace, name): (&str, &str, &str),
    kind: &'static str,
) -> Result<(), AdminError> {
    for (field, name) in [("tenant", tenant), ("namespace", namespace), (kind, name)] {
        if !((1..=felix_auth::NAME_MAX_BYTES).contains(&name.len())
            && felix_auth::name_charset_ok(name))
        {
            return Err(AdminError::BadRequest {
                field,
                why: format!(
                    "{name:?} is not 1..={} bytes of [A-Za-z0-9._-]",
                    felix_auth::NAME_MAX_BYTES
                ),
            });
        }
    }
    Ok(())
}

fn bad_name() -> AdminError {
    AdminError::BadRequest {
        field: "name",
        why: "tenant, namespace and stream are 1..=255 bytes of [A-Za-z0-9._-]".into(),
    }
}
