//! `POST /v1/shards/{stream|cache}/{tenant}/{namespace}/{name}/{shard}/abandon[?to=NODE]` on
//! the ops endpoint: an operator gives up what a shard's gone leader acknowledged
//! (`felix admin abandon`; docs/replication.md, "Giving records up").
//!
//! `Authorization: Bearer <token>`: it must verify for the tenant and grant `node.manage` on
//! `cluster:*`. Answers: 202 asked (the body says what is given up), 400 a bad path, 401,
//! 403, 404 no such shard or not a cluster node, 409 the leader is live or no node can take
//! it, 503 the broker did not answer.

use std::time::Instant;

use felix_engine::{AbandonError, AbandonPlan, Engine};
use tracing::{info, warn};

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};

use super::http::{ask, bearer_token, no_token, text, Answer, OpsState};
use crate::control::Control;

pub(crate) const ROUTE: &str = "/v1/shards/";

pub(crate) struct AbandonRequest {
    token: String,
    cache: bool,
    names: (String, String, String),
    shard: u32,
    to: Option<String>,
    reply: Box<dyn FnOnce(Result<AbandonPlan, AbandonError>) + Send>,
}

/// Runs an abandon on the engine (called by the drive loop).
pub(crate) fn run(engine: &mut Engine, req: AbandonRequest) {
    let (t, n, s) = &req.names;
    let outcome = engine.abandon_shard_as(
        Instant::now(),
        &req.token,
        req.cache,
        (t, n, s),
        req.shard,
        req.to.as_deref(),
    );
    match &outcome {
        Ok(p) => warn!(shard = %p.shard, from = ?p.from, to = %p.to, given_up = %p.given_up,
            "an operator abandoned a shard's records"),
        Err(e) => info!(tenant = %t, namespace = %n, name = %s, shard = req.shard, error = %e,
            "abandon refused"),
    }
    (req.reply)(outcome);
}

/// The parts of `/v1/shards/{kind}/{tenant}/{namespace}/{name}/{shard}/abandon`.
fn parse(path: &str) -> Option<(bool, (String, String, String), u32)> {
    let parts: Vec<&str> = path.strip_prefix(ROUTE)?.split('/').collect();
    let [kind, tenant, namespace, name, shard, "abandon"] = parts[..] else {
        return None;
    };
    let cache = match kind {
        "stream" => false,
        "cache" => true,
        _ => return None,
    };
    let names = (tenant.to_owned(), namespace.to_owned(), name.to_owned());
    Some((cache, names, shard.parse().ok()?))
}

pub(crate) async fn serve(state: &OpsState, req: Request<Incoming>) -> Answer {
    if req.method() != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, "POST only\n");
    }
    let Some((cache, names, shard)) = parse(req.uri().path()) else {
        return text(
            StatusCode::BAD_REQUEST,
            "expected /v1/shards/{stream|cache}/{tenant}/{namespace}/{name}/{shard}/abandon\n",
        );
    };
    let to = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("to="))
        .filter(|t| !t.is_empty())
        .map(str::to_owned);
    let Some(token) = bearer_token(&req) else {
        return no_token();
    };
    let outcome = ask(state, |reply| {
        Control::Abandon(AbandonRequest {
            token,
            cache,
            names,
            shard,
            to,
            reply,
        })
    })
    .await;
    match outcome {
        Err(answer) => answer,
        Ok(Ok(p)) => text(
            StatusCode::ACCEPTED,
            format!(
                "{}: {} leads it at generation {} (was {}); given up: {}\n",
                p.shard,
                p.to,
                p.generation,
                p.from.as_deref().unwrap_or("nobody"),
                p.given_up
            ),
        ),
        Ok(Err(e)) => {
            let status = match e {
                AbandonError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
                AbandonError::Forbidden => StatusCode::FORBIDDEN,
                AbandonError::NotFound(_) => StatusCode::NOT_FOUND,
                AbandonError::Refused(_) => StatusCode::CONFLICT,
            };
            text(status, format!("{e}\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn the_path_names_the_kind_the_shard_and_the_verb() {
        let (cache, names, shard) = parse("/v1/shards/stream/t1/default/orders/2/abandon").unwrap();
        assert!(!cache);
        assert_eq!(names, ("t1".into(), "default".into(), "orders".into()));
        assert_eq!(shard, 2);
        assert!(
            parse("/v1/shards/cache/t1/default/sessions/0/abandon")
                .unwrap()
                .0
        );
        assert!(parse("/v1/shards/queue/t1/default/orders/2/abandon").is_none());
        assert!(parse("/v1/shards/stream/t1/default/orders/x/abandon").is_none());
        assert!(parse("/v1/shards/stream/t1/default/orders/2").is_none());
    }
}
