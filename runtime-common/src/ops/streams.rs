//! `/v1/streams` on the ops endpoint: the admin API for streams (docs/operations.md).
//!
//! - `POST /v1/streams` creates one through the control plane and answers once every shard
//!   has a live leader: `201` created, `200` it already exists with this very spec;
//! - `GET /v1/streams` lists the token's tenant's streams, `GET /v1/streams/{t}/{ns}/{s}`
//!   shows one (spec, and per shard its leader, replicas and generation);
//! - `PATCH /v1/streams/{t}/{ns}/{s}` changes its retention (the rest of a spec is fixed, or
//!   not changeable yet: refused naming the field), answered once applied here;
//! - `DELETE /v1/streams/{t}/{ns}/{s}` deletes one (`stream_delete.rs`).
//!
//! Every answer but a `204` is JSON; an error is `{"error": …}`, with `"field"` on a `400` or
//! `409`.

use std::time::Duration;

use felix_engine::stream_admin::{Consistency, Retention, StreamSpec};
use felix_engine::{AdminError, Engine, StreamView};
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::{json as j, Value};

use super::admin::{
    bad, created, error, get_all, get_one, names, object, shard_json, shards_and_rf,
    token_and_body, uint, until_applied, Deadline, Names, Placed, ViewOne, CREATE_TIMEOUT,
};
use super::http::{json, on_engine, Answer, OpsState};

/// The fields a create's body may have; any other is refused `400`.
const CREATE_FIELDS: [&str; 8] = [
    "tenant",
    "namespace",
    "stream",
    "shards",
    "replication_factor",
    "consistency",
    "retention",
    "durable",
];

pub(crate) async fn serve(state: &OpsState, req: Request<Incoming>, timeout: Duration) -> Answer {
    let path = req.uri().path().to_owned();
    let names: Vec<String> = path
        .trim_start_matches("/v1/streams")
        .split('/')
        .skip(1)
        .map(str::to_owned)
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let method = req.method().clone();
    match (method, &names[..]) {
        (Method::DELETE, &[t, n, s]) => super::stream_delete::serve(state, &req, [t, n, s]).await,
        (Method::POST, []) => match token_and_body(req, timeout, parse_create).await {
            Err(answer) => answer,
            Ok((token, (names, spec))) => create(state, token, names, spec).await,
        },
        (Method::GET | Method::HEAD, []) => {
            get_all(state, &req, "streams", Engine::stream_views).await
        }
        (Method::GET | Method::HEAD, &[t, n, s]) => {
            get_one(state, &req, [t, n, s], Engine::stream_view).await
        }
        (Method::PATCH, &[t, n, s]) => match token_and_body(req, timeout, parse_patch).await {
            Err(answer) => answer,
            Ok((token, patch)) => {
                let names = (t.to_owned(), n.to_owned(), s.to_owned());
                alter(state, token, names, patch).await
            }
        },
        (_, [] | [_, _, _]) => json(
            StatusCode::METHOD_NOT_ALLOWED,
            &j!({ "error": "GET or POST on /v1/streams; GET, PATCH or DELETE on /v1/streams/{tenant}/{namespace}/{stream}" }),
        ),
        _ => json(
            StatusCode::NOT_FOUND,
            &j!({ "error": "expected /v1/streams or /v1/streams/{tenant}/{namespace}/{stream}" }),
        ),
    }
}

/// A `PATCH` body: what it asks to change.
#[derive(Debug, Default, PartialEq)]
struct Patch {
    /// Each retention field present: `Some(None)` back to the broker-wide setting.
    max_age_seconds: Option<Option<u64>>,
    max_bytes: Option<Option<u64>>,
    /// Fields fixed for a stream's life, or not changeable yet: refused unless equal to the
    /// stream's own.
    shards: Option<u64>,
    replication_factor: Option<u64>,
    consistency: Option<String>,
    durable: Option<bool>,
}

fn parse_patch(bytes: &[u8]) -> Result<Patch, AdminError> {
    const FIELDS: [&str; 5] = [
        "retention",
        "shards",
        "replication_factor",
        "consistency",
        "durable",
    ];
    let map = object(bytes, &FIELDS)?;
    let mut p = Patch {
        shards: uint(&map, "shards")?,
        replication_factor: uint(&map, "replication_factor")?,
        ..Patch::default()
    };
    match map.get("consistency") {
        None => {}
        Some(Value::String(c)) => p.consistency = Some(c.clone()),
        Some(_) => return Err(bad("consistency", "must be a string".into())),
    }
    match map.get("durable") {
        None => {}
        Some(Value::Bool(d)) => p.durable = Some(*d),
        Some(_) => return Err(bad("durable", "must be true or false".into())),
    }
    match map.get("retention") {
        None => {}
        Some(Value::Object(r)) => {
            if let Some(unknown) = r
                .keys()
                .find(|k| *k != "max_age_seconds" && *k != "max_bytes")
            {
                return Err(bad("retention", format!("unknown field {unknown:?}")));
            }
            if r.contains_key("max_age_seconds") {
                p.max_age_seconds = Some(
                    uint(r, "max_age_seconds")
                        .map_err(|e| rename(e, "retention.max_age_seconds"))?,
                );
            }
            if r.contains_key("max_bytes") {
                p.max_bytes =
                    Some(uint(r, "max_bytes").map_err(|e| rename(e, "retention.max_bytes"))?);
            }
        }
        Some(_) => return Err(bad("retention", "must be an object".into())),
    }
    Ok(p)
}

/// What a patch makes of `spec`'s retention, or why it cannot be done.
fn patched(spec: &StreamSpec, p: &Patch) -> Result<Retention, AdminError> {
    let fixed = |field: &'static str, why: &str| AdminError::BadRequest {
        field,
        why: why.to_owned(),
    };
    if p.shards.is_some_and(|s| s != u64::from(spec.shards)) {
        return Err(fixed(
            "shards",
            "fixed for a stream's life: a key's shard is a hash over the shard count, so a \
             new count would move keys between shards and break their order",
        ));
    }
    if p.consistency
        .as_ref()
        .is_some_and(|c| *c != spec.consistency.to_string())
    {
        return Err(fixed(
            "consistency",
            "fixed for a stream's life: records acknowledged under one promise cannot be \
             made to keep another",
        ));
    }
    if p.replication_factor
        .is_some_and(|r| r != u64::from(spec.replication_factor))
    {
        return Err(fixed(
            "replication_factor",
            "changes only with online replica-set changes, which come with shard moves; \
             not possible yet",
        ));
    }
    if p.durable.is_some_and(|d| d != spec.durable) {
        return Err(fixed("durable", "fixed for a stream's life"));
    }
    let mut r = spec.retention;
    if let Some(a) = p.max_age_seconds {
        r.max_age_seconds = a;
    }
    if let Some(b) = p.max_bytes {
        r.max_bytes = b;
    }
    Ok(r)
}

/// Reads the stream, asks for its new retention, then waits to see it applied here.
async fn alter(state: &OpsState, token: String, names: Names, patch: Patch) -> Answer {
    let deadline = Deadline::now() + CREATE_TIMEOUT;
    let (asked, t) = (names.clone(), token.clone());
    let current = on_engine(state, move |e, now| {
        e.stream_view(now, Some(&t), (&asked.0, &asked.1, &asked.2))
    })
    .await;
    let current = match current {
        Err(answer) => return answer,
        Ok(Err(e)) => return error(&e),
        Ok(Ok(v)) => v,
    };
    let retention = match patched(&current.spec, &patch) {
        Ok(r) => r,
        Err(e) => return error(&e),
    };
    let asked = names.clone();
    let outcome = on_engine(state, move |e, now| {
        e.alter_stream_as(now, &token, (&asked.0, &asked.1, &asked.2), retention)
    })
    .await;
    match outcome {
        Err(answer) => return answer,
        Ok(Err(e)) => return error(&e),
        Ok(Ok(_)) => {}
    }
    until_applied(
        state,
        deadline,
        || {
            let asked = names.clone();
            async move {
                let look = on_engine(state, move |e, now| {
                    e.stream_view(now, None, (&asked.0, &asked.1, &asked.2))
                })
                .await;
                match look {
                    Err(answer) => Some(answer),
                    Ok(Ok(view)) if view.spec.retention == retention => {
                        Some(json(StatusCode::OK, &view.json()))
                    }
                    Ok(Ok(_)) => None,
                    Ok(Err(e)) => Some(error(&e)),
                }
            }
        },
        || {
            error(&AdminError::Unavailable(format!(
                "the change was not applied within {CREATE_TIMEOUT:?}: the control plane may \
                 have no majority; retry (the same change is safe to repeat)"
            )))
        },
    )
    .await
}

/// Asks for the stream, then waits for every shard to have a live leader.
async fn create(state: &OpsState, token: String, names: Names, spec: StreamSpec) -> Answer {
    let deadline = Deadline::now() + CREATE_TIMEOUT;
    let asked = names.clone();
    let outcome = on_engine(state, move |e, now| {
        e.create_stream_as(now, &token, (&asked.0, &asked.1, &asked.2), spec)
    })
    .await;
    // Another create of the same name, with another spec, applied first.
    let conflict = |view: &StreamView| {
        let field = view.spec.first_difference(&spec)?;
        Some(AdminError::Conflict {
            field,
            why: format!(
                "{}/{}/{} exists with another {field}",
                names.0, names.1, names.2
            ),
        })
    };
    let late = format!(
        "not placed with every shard led within {CREATE_TIMEOUT:?}: the control plane may have \
         no majority, or fewer live nodes than the replication factor; retry (the same create \
         is safe to repeat)"
    );
    let view = (&names, Engine::stream_view as ViewOne<_>);
    created(state, deadline, outcome, view, conflict, late).await
}

/// A create's body, each bad field named.
fn parse_create(bytes: &[u8]) -> Result<(Names, StreamSpec), AdminError> {
    let map = object(bytes, &CREATE_FIELDS)?;
    let names = names(&map, "stream")?;
    let (shards, replication_factor) = shards_and_rf(&map, None)?;
    let consistency = match map.get("consistency") {
        None => Consistency::Leader,
        Some(Value::String(s)) if s == "leader" => Consistency::Leader,
        Some(Value::String(s)) if s == "quorum" => Consistency::Quorum,
        Some(_) => {
            return Err(bad(
                "consistency",
                "must be \"leader\" or \"quorum\"".into(),
            ))
        }
    };
    let retention = match map.get("retention") {
        None | Some(Value::Null) => Retention::default(),
        Some(Value::Object(r)) => {
            if let Some(unknown) = r
                .keys()
                .find(|k| *k != "max_age_seconds" && *k != "max_bytes")
            {
                return Err(bad("retention", format!("unknown field {unknown:?}")));
            }
            Retention {
                max_age_seconds: uint(r, "max_age_seconds")
                    .map_err(|e| rename(e, "retention.max_age_seconds"))?,
                max_bytes: uint(r, "max_bytes").map_err(|e| rename(e, "retention.max_bytes"))?,
            }
        }
        Some(_) => return Err(bad("retention", "must be an object".into())),
    };
    let durable = match map.get("durable") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("durable", "must be true or false".into())),
    };
    let spec = StreamSpec {
        shards,
        replication_factor,
        consistency,
        retention,
        durable,
    };
    Ok((names, spec))
}

fn rename(e: AdminError, field: &'static str) -> AdminError {
    match e {
        AdminError::BadRequest { why, .. } => AdminError::BadRequest { field, why },
        e => e,
    }
}

impl Placed for StreamView {
    fn writable(&self) -> bool {
        StreamView::writable(self)
    }

    /// A stream as the API shows it.
    fn json(&self) -> Value {
        let v = self;
        j!({
            "tenant": v.tenant,
            "namespace": v.namespace,
            "stream": v.stream,
            "spec": {
                "shards": v.spec.shards,
                "replication_factor": v.spec.replication_factor,
                "consistency": v.spec.consistency.to_string(),
                "retention": {
                    "max_age_seconds": v.spec.retention.max_age_seconds,
                    "max_bytes": v.spec.retention.max_bytes,
                },
                "durable": v.spec.durable,
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
    fn a_patch_changes_retention_and_refuses_the_fixed_fields_by_name() {
        let spec = StreamSpec {
            retention: Retention {
                max_age_seconds: Some(60),
                max_bytes: Some(1000),
            },
            ..StreamSpec::new(6, 3, Consistency::Quorum)
        };
        let patch = |body: &str| patched(&spec, &parse_patch(body.as_bytes()).unwrap());
        assert_eq!(
            patch(r#"{"retention":{"max_age_seconds":120}}"#).unwrap(),
            Retention {
                max_age_seconds: Some(120),
                max_bytes: Some(1000)
            }
        );
        assert_eq!(
            patch(r#"{"retention":{"max_bytes":null}}"#).unwrap(),
            Retention {
                max_age_seconds: Some(60),
                max_bytes: None
            }
        );
        // The fixed fields may be restated as they are.
        assert!(patch(r#"{"shards":6,"consistency":"quorum","replication_factor":3}"#).is_ok());
        let field = |body: &str| patch(body).unwrap_err().field();
        assert_eq!(field(r#"{"shards":8}"#), Some("shards"));
        assert_eq!(field(r#"{"consistency":"leader"}"#), Some("consistency"));
        let rf = patch(r#"{"replication_factor":5}"#).unwrap_err();
        assert_eq!(rf.field(), Some("replication_factor"));
        assert!(rf.to_string().contains("shard moves"), "{rf}");
        assert_eq!(field(r#"{"durable":false}"#), Some("durable"));
        let parse = |body: &str| parse_patch(body.as_bytes()).unwrap_err().field();
        assert_eq!(parse(r#"{"name":"x"}"#), Some("body"));
        assert_eq!(
            parse(r#"{"retention":{"max_bytes":-1}}"#),
            Some("retention.max_bytes")
        );
    }

    fn field_of(body: &str) -> Option<&'static str> {
        parse_create(body.as_bytes()).err().and_then(|e| e.field())
    }

    #[test]
    fn a_create_body_names_its_bad_field() {
        let ok = r#"{"tenant":"t1","namespace":"ops","stream":"orders","shards":6,
            "replication_factor":3,"consistency":"quorum",
            "retention":{"max_age_seconds":86400,"max_bytes":1000},"durable":true}"#;
        let (names, spec) = parse_create(ok.as_bytes()).unwrap();
        assert_eq!(names, ("t1".into(), "ops".into(), "orders".into()));
        assert_eq!(spec.shards, 6);
        assert_eq!(spec.consistency, Consistency::Quorum);
        assert_eq!(spec.retention.max_age_seconds, Some(86_400));
        let minimal =
            r#"{"tenant":"t1","namespace":"ops","stream":"o","shards":1,"replication_factor":1}"#;
        let (_, spec) = parse_create(minimal.as_bytes()).unwrap();
        assert_eq!(spec, StreamSpec::new(1, 1, Consistency::Leader));

        assert_eq!(field_of("[1]"), Some("body"));
        assert_eq!(field_of("{"), Some("body"));
        let e = parse_create(br#"{"tenant":"t1","colour":"red"}"#).unwrap_err();
        assert_eq!(e.field(), Some("body"));
        assert!(e.to_string().contains("\"colour\""), "{e}");
        assert_eq!(field_of(r#"{"namespace":"n"}"#), Some("tenant"));
        assert_eq!(
            field_of(
                r#"{"tenant":"t","namespace":"n","stream":"s","shards":-1,"replication_factor":1}"#
            ),
            Some("shards")
        );
        assert_eq!(
            field_of(
                r#"{"tenant":"t","namespace":"n","stream":"s","shards":1,"replication_factor":300}"#
            ),
            Some("replication_factor")
        );
        assert_eq!(
            field_of(
                r#"{"tenant":"t","namespace":"n","stream":"s","shards":1,"replication_factor":1,"consistency":"strong"}"#
            ),
            Some("consistency")
        );
        assert_eq!(
            field_of(
                r#"{"tenant":"t","namespace":"n","stream":"s","shards":1,"replication_factor":1,"retention":{"max_bytes":"x"}}"#
            ),
            Some("retention.max_bytes")
        );
        assert_eq!(
            field_of(
                r#"{"tenant":"t","namespace":"n","stream":"s","shards":1,"replication_factor":1,"retention":{"keep":1}}"#
            ),
            Some("retention")
        );
    }
}
