//! `/v1/caches` on the ops endpoint: caches through the control plane (docs/operations.md).
//!
//! - `POST /v1/caches` {tenant, namespace, cache, shards, replication_factor, durable}
//!   creates one (one `CreateCache` command), answered once every shard has a live leader:
//!   `201` created, `200` it exists with this very spec;
//! - `GET /v1/caches` lists the token's tenant's caches, `GET /v1/caches/{t}/{ns}/{c}` shows one;
//! - `DELETE /v1/caches/{t}/{ns}/{c}` deletes one on every node (one `DeleteCache` command),
//!   answered `204` once this node applied it and removed its copies.
//!
//! `shards` (default 1) is bounded as a stream's (1 to `MAX_STREAM_SHARDS`, 1024; `400` naming
//! `shards` outside it): the cache's keys hash over them with the protocol's routing function,
//! each shard placed, led and replicated as a stream shard; `GET` shows each shard's leader,
//! replicas and generation. Answers and errors are JSON, as for `/v1/streams`.

use std::time::{Duration, Instant};

use felix_engine::stream_admin::{CacheSpec, CacheView};
use felix_engine::AdminError;
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::{json as j, Value};

use super::http::{bearer_token, body, json, on_engine, Answer, OpsState};
use super::streams::{error, no_token, shard_json, uint, CREATE_TIMEOUT};

const CREATE_FIELDS: [&str; 6] = [
    "tenant",
    "namespace",
    "cache",
    "shards",
    "replication_factor",
    "durable",
];

type Names = (String, String, String);

pub(crate) async fn serve(state: &OpsState, req: Request<Incoming>, timeout: Duration) -> Answer {
    let path = req.uri().path().to_owned();
    let names: Vec<&str> = path
        .trim_start_matches("/v1/caches")
        .split('/')
        .skip(1)
        .collect();
    let method = req.method().clone();
    match (method, &names[..]) {
        (Method::POST, []) => {
            let token = bearer_token(&req);
            let bytes = match body(req, timeout).await {
                Ok(b) => b,
                Err(answer) => return answer,
            };
            let (names, spec) = match parse_create(&bytes) {
                Ok(x) => x,
                Err(e) => return error(&e),
            };
            let Some(token) = token else {
                return no_token();
            };
            create(state, token, names, spec).await
        }
        (Method::GET | Method::HEAD, []) => {
            let Some(token) = bearer_token(&req) else {
                return no_token();
            };
            match on_engine(state, move |e, now| e.cache_views(now, &token)).await {
                Err(answer) => answer,
                Ok(Err(e)) => error(&e),
                Ok(Ok(views)) => json(
                    StatusCode::OK,
                    &j!({ "caches": views.iter().map(view_json).collect::<Vec<_>>() }),
                ),
            }
        }
        (Method::GET | Method::HEAD, &[t, n, c]) => {
            let Some(token) = bearer_token(&req) else {
                return no_token();
            };
            let names = (t.to_owned(), n.to_owned(), c.to_owned());
            let outcome = on_engine(state, move |e, now| {
                e.cache_view(now, Some(&token), (&names.0, &names.1, &names.2))
            })
            .await;
            match outcome {
                Err(answer) => answer,
                Ok(Err(e)) => error(&e),
                Ok(Ok(view)) => json(StatusCode::OK, &view_json(&view)),
            }
        }
        (Method::DELETE, &[t, n, c]) => {
            let Some(token) = bearer_token(&req) else {
                return no_token();
            };
            delete(state, token, (t.to_owned(), n.to_owned(), c.to_owned())).await
        }
        (_, [] | [_, _, _]) => json(
            StatusCode::METHOD_NOT_ALLOWED,
            &j!({ "error": "GET or POST on /v1/caches; GET or DELETE on /v1/caches/{tenant}/{namespace}/{cache}" }),
        ),
        _ => json(
            StatusCode::NOT_FOUND,
            &j!({ "error": "expected /v1/caches or /v1/caches/{tenant}/{namespace}/{cache}" }),
        ),
    }
}

/// Asks for the cache's deletion (one `DeleteCache` command), then waits until this node has
/// applied it and removed its own copies: `204`. `404` unknown, `401`/`403` the token, `503` no
/// control-plane leader or not applied within [`CREATE_TIMEOUT`] (retryable: one command).
async fn delete(state: &OpsState, token: String, names: Names) -> Answer {
    let deadline = Instant::now() + CREATE_TIMEOUT;
    let asked = names.clone();
    let outcome = on_engine(state, move |e, now| {
        e.delete_cache_as(now, &token, (&asked.0, &asked.1, &asked.2))
    })
    .await;
    let incarnation = match outcome {
        Err(answer) => return answer,
        Ok(Err(e)) => return error(&e),
        Ok(Ok(i)) => i,
    };
    loop {
        let changed = state.next_metadata_change();
        let asked = names.clone();
        let done = on_engine(state, move |e, _| {
            e.cache_deleted_here((&asked.0, &asked.1, &asked.2), incarnation)
        })
        .await;
        match done {
            Err(answer) => return answer,
            Ok(true) => return super::http::text(StatusCode::NO_CONTENT, ""),
            Ok(false) => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || tokio::time::timeout(left, changed).await.is_err() {
            return error(&AdminError::Unavailable(format!(
                "the delete was not applied within {CREATE_TIMEOUT:?}: the control plane may \
                 have no majority; retry (the delete is one command: asking again is safe)"
            )));
        }
    }
}

async fn create(state: &OpsState, token: String, names: Names, spec: CacheSpec) -> Answer {
    let deadline = Instant::now() + CREATE_TIMEOUT;
    let asked = names.clone();
    let outcome = on_engine(state, move |e, now| {
        e.create_cache_as(now, &token, (&asked.0, &asked.1, &asked.2), spec)
    })
    .await;
    let created = match outcome {
        Err(answer) => return answer,
        Ok(Err(e)) => return error(&e),
        Ok(Ok(Some(view))) if view.writable() => return json(StatusCode::OK, &view_json(&view)),
        Ok(Ok(existing)) => existing.is_none(),
    };
    loop {
        let changed = state.next_metadata_change();
        let asked = names.clone();
        let look = on_engine(state, move |e, now| {
            e.cache_view(now, None, (&asked.0, &asked.1, &asked.2))
        })
        .await;
        match look {
            Err(answer) => return answer,
            Ok(Ok(view)) => {
                if view.spec != spec {
                    return error(&AdminError::Conflict {
                        field: if view.spec.shards != spec.shards {
                            "shards"
                        } else {
                            "replication_factor"
                        },
                        why: format!(
                            "{}/{}/{} exists with another spec",
                            names.0, names.1, names.2
                        ),
                    });
                }
                if view.writable() {
                    let status = if created {
                        StatusCode::CREATED
                    } else {
                        StatusCode::OK
                    };
                    return json(status, &view_json(&view));
                }
            }
            Ok(Err(AdminError::NotFound(_))) => {}
            Ok(Err(e)) => return error(&e),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || tokio::time::timeout(left, changed).await.is_err() {
            return error(&AdminError::Unavailable(format!(
                "not placed with its shard led within {CREATE_TIMEOUT:?}: the control plane \
                 may have no majority, or fewer live nodes than the replication factor; retry \
                 (the same create is safe to repeat)"
            )));
        }
    }
}

fn parse_create(bytes: &[u8]) -> Result<(Names, CacheSpec), AdminError> {
    let bad = |field: &'static str, why: String| AdminError::BadRequest { field, why };
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| bad("body", format!("not JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(bad("body", "not a JSON object".into()));
    };
    if let Some(unknown) = map.keys().find(|k| !CREATE_FIELDS.contains(&k.as_str())) {
        return Err(bad("body", format!("unknown field {unknown:?}")));
    }
    let name = |field: &'static str| -> Result<String, AdminError> {
        match map.get(field) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(bad(field, "must be a string".into())),
            None => Err(bad(field, "is required".into())),
        }
    };
    let names = (name("tenant")?, name("namespace")?, name("cache")?);
    let shards = uint(&map, "shards")?.unwrap_or(1);
    let shards =
        u32::try_from(shards).map_err(|_| bad("shards", format!("{shards} is too large")))?;
    let rf = uint(&map, "replication_factor")?
        .ok_or_else(|| bad("replication_factor", "is required".into()))?;
    let replication_factor =
        u8::try_from(rf).map_err(|_| bad("replication_factor", format!("{rf} is too large")))?;
    match map.get("durable") {
        None | Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => {
            return Err(bad(
                "durable",
                "a cache's values last as long as each node's own storage setting makes them; \
                 a per-cache setting is not built"
                    .into(),
            ))
        }
        Some(_) => return Err(bad("durable", "must be true or false".into())),
    }
    Ok((
        names,
        CacheSpec {
            shards,
            replication_factor,
        },
    ))
}

fn view_json(v: &CacheView) -> Value {
    j!({
        "tenant": v.tenant,
        "namespace": v.namespace,
        "cache": v.cache,
        "spec": {
            "shards": v.spec.shards,
            "replication_factor": v.spec.replication_factor,
        },
        "shards": v.shards.iter().map(shard_json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_create_body_names_its_bad_field() {
        let (names, spec) = parse_create(
            br#"{"tenant":"t1","namespace":"ops","cache":"sessions","shards":1,"replication_factor":3,"durable":true}"#,
        )
        .unwrap();
        assert_eq!(names, ("t1".into(), "ops".into(), "sessions".into()));
        assert_eq!(
            spec,
            CacheSpec {
                shards: 1,
                replication_factor: 3
            }
        );
        let field = |b: &str| parse_create(b.as_bytes()).unwrap_err().field();
        assert_eq!(field(r#"{"tenant":"t1","stream":"x"}"#), Some("body"));
        assert_eq!(field(r#"{"tenant":"t1","namespace":"n"}"#), Some("cache"));
        assert_eq!(
            field(r#"{"tenant":"t","namespace":"n","cache":"c","replication_factor":"3"}"#),
            Some("replication_factor")
        );
        assert_eq!(
            field(
                r#"{"tenant":"t","namespace":"n","cache":"c","replication_factor":1,"durable":false}"#
            ),
            Some("durable")
        );
    }
}
