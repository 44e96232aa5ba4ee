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

use std::time::Duration;

use felix_engine::stream_admin::{CacheSpec, CacheView};
use felix_engine::{AdminError, Engine};
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::{json as j, Value};

use super::admin::{
    bad, created, error, get_all, get_one, names, no_token, object, shard_json, shards_and_rf,
    token_and_body, until_deleted_here, Deadline, Names, Placed, ViewOne, CREATE_TIMEOUT,
};
use super::http::{bearer_token, json, on_engine, Answer, OpsState};

const CREATE_FIELDS: [&str; 6] = [
    "tenant",
    "namespace",
    "cache",
    "shards",
    "replication_factor",
    "durable",
];

pub(crate) async fn serve(state: &OpsState, req: Request<Incoming>, timeout: Duration) -> Answer {
    let path = req.uri().path().to_owned();
    let names: Vec<&str> = path
        .trim_start_matches("/v1/caches")
        .split('/')
        .skip(1)
        .collect();
    let method = req.method().clone();
    match (method, &names[..]) {
        (Method::POST, []) => match token_and_body(req, timeout, parse_create).await {
            Err(answer) => answer,
            Ok((token, (names, spec))) => create(state, token, names, spec).await,
        },
        (Method::GET | Method::HEAD, []) => {
            get_all(state, &req, "caches", Engine::cache_views).await
        }
        (Method::GET | Method::HEAD, &[t, n, c]) => {
            get_one(state, &req, [t, n, c], Engine::cache_view).await
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
    let deadline = Deadline::now() + CREATE_TIMEOUT;
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
    until_deleted_here(
        state,
        deadline,
        names,
        incarnation,
        Engine::cache_deleted_here,
        || {
            error(&AdminError::Unavailable(format!(
                "the delete was not applied within {CREATE_TIMEOUT:?}: the control plane may \
                 have no majority; retry (the delete is one command: asking again is safe)"
            )))
        },
    )
    .await
}

/// Asks for the cache, then waits for every shard to have a live leader.
async fn create(state: &OpsState, token: String, names: Names, spec: CacheSpec) -> Answer {
    let deadline = Deadline::now() + CREATE_TIMEOUT;
    let asked = names.clone();
    let outcome = on_engine(state, move |e, now| {
        e.create_cache_as(now, &token, (&asked.0, &asked.1, &asked.2), spec)
    })
    .await;
    // Another create of the same name, with another spec, applied first.
    let conflict = |view: &CacheView| {
        (view.spec != spec).then(|| AdminError::Conflict {
            field: if view.spec.shards != spec.shards {
                "shards"
            } else {
                "replication_factor"
            },
            why: format!(
                "{}/{}/{} exists with another spec",
                names.0, names.1, names.2
            ),
        })
    };
    let late = format!(
        "not placed with its shard led within {CREATE_TIMEOUT:?}: the control plane may have no \
         majority, or fewer live nodes than the replication factor; retry (the same create is \
         safe to repeat)"
    );
    let view = (&names, Engine::cache_view as ViewOne<_>);
    created(state, deadline, outcome, view, conflict, late).await
}

fn parse_create(bytes: &[u8]) -> Result<(Names, CacheSpec), AdminError> {
    let map = object(bytes, &CREATE_FIELDS)?;
    let names = names(&map, "cache")?;
    let (shards, replication_factor) = shards_and_rf(&map, Some(1))?;
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

impl Placed for CacheView {
    fn writable(&self) -> bool {
        CacheView::writable(self)
    }

    /// A cache as the API shows it.
    fn json(&self) -> Value {
        let v = self;
        j!({
            "tenant": v.tenant,
            "namespace": v.namespace,
            "cache": v.cache,
            "spec": {
                "shards": v.spec.shards,
                "replication_factor": v.spec.replication_factor,
            },
            "shards": v.shards.iter().map(shard_json).collect::<Vec<_>>(),
            "incarnation": v.incarnation,
        })
    }
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
