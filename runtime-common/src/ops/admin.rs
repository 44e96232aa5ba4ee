//! What the admin API's resources (`streams`: `/v1/streams`, `caches`: `/v1/caches`, and a
//! stream's deletion, `stream_delete`) share: reading a request's token and body, a JSON
//! body's fields, the JSON error, and waiting for the control plane's command to be applied
//! here (a create until every shard is led, an alter until it shows, a delete until this
//! node's copies are gone).

use std::future::Future;
use std::time::{Duration, Instant};

use felix_engine::{AdminError, Engine};
use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::{json as j, Map, Value};

use super::http::{bearer_token, body, json, on_engine, text, Answer, OpsState};

/// When a wait for the control plane ends: read on the ops thread's tokio clock (the same
/// instants as std's, except under a test's paused clock, which the deadline then follows).
pub(super) type Deadline = tokio::time::Instant;

/// How long a create waits for its object to be placed with every shard led by a live node
/// before answering `503` (the create may still complete: asking again with the same spec is
/// safe and answers `200` once it has); an alter or a cache's delete waits as long to be
/// applied here.
pub const CREATE_TIMEOUT: Duration = Duration::from_secs(15);

/// A resource's `tenant`, `namespace` and name.
pub(super) type Names = (String, String, String);

/// An engine's view of one resource, for a token if one is given: `Engine::stream_view`,
/// `Engine::cache_view`.
pub(super) type ViewOne<V> =
    fn(&Engine, Instant, Option<&str>, (&str, &str, &str)) -> Result<V, AdminError>;

/// A request with a body (`POST`, `PATCH`): its token and `parse`'s reading of the body. The
/// body is read and judged first (a bad body is `400` whoever asks); then no token is `401`.
pub(super) async fn token_and_body<T>(
    req: Request<Incoming>,
    timeout: Duration,
    parse: impl FnOnce(&[u8]) -> Result<T, AdminError>,
) -> Result<(String, T), Answer> {
    let token = bearer_token(&req);
    let bytes = body(req, timeout).await?;
    let parsed = parse(&bytes).map_err(|e| error(&e))?;
    let token = token.ok_or_else(no_token)?;
    Ok((token, parsed))
}

/// What an engine call answered, shown as JSON by `show` with `200`, or its error.
pub(super) fn shown<V>(
    outcome: Result<Result<V, AdminError>, Answer>,
    show: impl FnOnce(&V) -> Value,
) -> Answer {
    match outcome {
        Err(answer) => answer,
        Ok(Err(e)) => error(&e),
        Ok(Ok(v)) => json(StatusCode::OK, &show(&v)),
    }
}

/// `GET` of every resource of the token's tenant (`all` lists them), as JSON under `key`.
pub(super) async fn get_all<V: Placed + Send + 'static>(
    state: &OpsState,
    req: &Request<Incoming>,
    key: &str,
    all: fn(&Engine, Instant, &str) -> Result<Vec<V>, AdminError>,
) -> Answer {
    let Some(token) = bearer_token(req) else {
        return no_token();
    };
    let views = on_engine(state, move |e, now| all(e, now, &token)).await;
    shown(views, |views| {
        let mut listed = Map::new();
        listed.insert(key.into(), views.iter().map(Placed::json).collect());
        Value::Object(listed)
    })
}

/// `GET` of the resource the path `names` (`one` shows it).
pub(super) async fn get_one<V: Placed + Send + 'static>(
    state: &OpsState,
    req: &Request<Incoming>,
    names: [&str; 3],
    one: ViewOne<V>,
) -> Answer {
    let Some(token) = bearer_token(req) else {
        return no_token();
    };
    let [t, n, r] = names.map(str::to_owned);
    let view = on_engine(state, move |e, now| one(e, now, Some(&token), (&t, &n, &r))).await;
    shown(view, Placed::json)
}

/// A body that is a JSON object with no field outside `fields`.
pub(super) fn object(bytes: &[u8], fields: &[&str]) -> Result<Map<String, Value>, AdminError> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| bad("body", format!("not JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(bad("body", "not a JSON object".into()));
    };
    if let Some(unknown) = map.keys().find(|k| !fields.contains(&k.as_str())) {
        return Err(bad("body", format!("unknown field {unknown:?}")));
    }
    Ok(map)
}

/// A body's `tenant`, `namespace` and the field `name` names the resource by: each a
/// required string.
pub(super) fn names(map: &Map<String, Value>, name: &'static str) -> Result<Names, AdminError> {
    let string = |field: &'static str| match map.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(bad(field, "must be a string".into())),
        None => Err(bad(field, "is required".into())),
    };
    Ok((string("tenant")?, string("namespace")?, string(name)?))
}

/// A `400` naming `field`.
pub(super) fn bad(field: &'static str, why: String) -> AdminError {
    AdminError::BadRequest { field, why }
}

/// An optional non-negative integer field (`null` is absent).
pub(super) fn uint(
    map: &Map<String, Value>,
    field: &'static str,
) -> Result<Option<u64>, AdminError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad(field, "must be a non-negative integer".into())),
    }
}

/// A required `shards` and `replication_factor` (`shards` defaults to `default_shards` where
/// there is one), each within its type.
pub(super) fn shards_and_rf(
    map: &Map<String, Value>,
    default_shards: Option<u64>,
) -> Result<(u32, u8), AdminError> {
    let shards = uint(map, "shards")?
        .or(default_shards)
        .ok_or_else(|| bad("shards", "is required".into()))?;
    let shards =
        u32::try_from(shards).map_err(|_| bad("shards", format!("{shards} is too large")))?;
    let rf = uint(map, "replication_factor")?
        .ok_or_else(|| bad("replication_factor", "is required".into()))?;
    let rf =
        u8::try_from(rf).map_err(|_| bad("replication_factor", format!("{rf} is too large")))?;
    Ok((shards, rf))
}

/// One shard of a stream or cache as the API shows it.
pub(super) fn shard_json(s: &felix_engine::ShardView) -> Value {
    j!({
        "shard": s.shard,
        "leader": s.leader,
        "writable": s.writable,
        "replicas": s.replicas,
        "generation": s.generation,
        "here": s.here.map(|h| j!({ "log_start": h.log_start, "log_end": h.log_end })),
    })
}

/// An admin error as JSON: `{"error": …}`, with `"field"` on a `400` or `409`.
pub(super) fn error(e: &AdminError) -> Answer {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut body = j!({ "error": e.to_string() });
    if let Some(field) = e.field() {
        body["field"] = j!(field);
    }
    let mut r = json(status, &body);
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            "www-authenticate",
            hyper::header::HeaderValue::from_static("Bearer"),
        );
    }
    r
}

/// A request without a token, as JSON.
pub(super) fn no_token() -> Answer {
    error(&AdminError::Unauthorized(
        "an Authorization: Bearer <token> header is required".into(),
    ))
}

/// What an object shown by a create is asked.
pub(super) trait Placed {
    /// Every shard has a live leader.
    fn writable(&self) -> bool;
    /// As the API shows it.
    fn json(&self) -> Value;
}

/// The rest of a create of `names`, once the command was asked (`asked`: the object as it
/// already was, if it was): `200` at once for one that exists writable; else waits until
/// `view` shows it writable (`201`, or `200` when it existed), any `conflict` of what it shows
/// with what was asked (another create applied first) refused, and `503` saying `late` past
/// `deadline`.
pub(super) async fn created<V: Placed + Send + 'static>(
    state: &OpsState,
    deadline: Deadline,
    asked: Result<Result<Option<V>, AdminError>, Answer>,
    (names, view): (&Names, ViewOne<V>),
    conflict: impl Fn(&V) -> Option<AdminError>,
    late: String,
) -> Answer {
    let created = match asked {
        Err(answer) => return answer,
        Ok(Err(e)) => return error(&e),
        Ok(Ok(Some(view))) if view.writable() => return json(StatusCode::OK, &view.json()),
        Ok(Ok(existing)) => existing.is_none(),
    };
    let conflict = &conflict;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    until_applied(
        state,
        deadline,
        || {
            let asked = names.clone();
            let look = on_engine(state, move |e, now| {
                view(e, now, None, (&asked.0, &asked.1, &asked.2))
            });
            async move {
                match look.await {
                    Err(answer) => Some(answer),
                    Ok(Ok(view)) => match conflict(&view) {
                        Some(e) => Some(error(&e)),
                        None => view.writable().then(|| json(status, &view.json())),
                    },
                    Ok(Err(AdminError::NotFound(_))) => None,
                    Ok(Err(e)) => Some(error(&e)),
                }
            }
        },
        || error(&AdminError::Unavailable(late)),
    )
    .await
}

/// Asks `look` now and after each metadata change this node applies, until it gives the
/// answer; past `deadline`, the answer is `late()`.
pub(super) async fn until_applied<F>(
    state: &OpsState,
    deadline: Deadline,
    mut look: impl FnMut() -> F,
    late: impl FnOnce() -> Answer,
) -> Answer
where
    F: Future<Output = Option<Answer>>,
{
    loop {
        // Registered before looking, so a change between the look and the wait is not missed.
        let changed = state.next_metadata_change();
        if let Some(answer) = look().await {
            return answer;
        }
        let left = deadline.saturating_duration_since(Deadline::now());
        if left.is_zero() || tokio::time::timeout(left, changed).await.is_err() {
            return late();
        }
    }
}

/// The rest of a delete in a cluster, once its command was asked: waits until `gone` says
/// this node applied it for `incarnation` of `names` and removed its copies (`204`); past
/// `deadline`, the answer is `late()`.
pub(super) async fn until_deleted_here(
    state: &OpsState,
    deadline: Deadline,
    names: Names,
    incarnation: u64,
    gone: fn(&Engine, (&str, &str, &str), u64) -> bool,
    late: impl FnOnce() -> Answer,
) -> Answer {
    let look = || {
        let asked = names.clone();
        async move {
            let done = on_engine(state, move |e, _| {
                gone(e, (&asked.0, &asked.1, &asked.2), incarnation)
            })
            .await;
            match done {
                Err(answer) => Some(answer),
                Ok(true) => Some(text(StatusCode::NO_CONTENT, "")),
                Ok(false) => None,
            }
        }
    };
    until_applied(state, deadline, look, late).await
}
