//! `POST /v1/shards/{stream|cache}/{tenant}/{namespace}/{name}/{shard}/abandon[?to=NODE]` on
//! the ops endpoint: an operator gives up what a shard's gone leader acknowledged
//! (`felix admin abandon`; docs/replication.md, "Giving records up").
//!
//! `Authorization: Bearer <token>`: it must verify for the tenant and grant `node.manage` on
//! `cluster:*`. Answers: 202 asked (the body says what is given up), 400 a bad path, 401,
//! 403, 404 no such shard or not a cluster node, 409 the leader is live or no node can take
//! it, 503 the broker did not answer.

use std::io::{self, Write};
use std::net::TcpStream;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use felix_engine::{AbandonError, AbandonPlan, Engine};
use tracing::{info, warn};

use super::http::OpsState;
use crate::control::Control;

pub(crate) const ROUTE: &str = "/v1/shards/";
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

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

pub(crate) fn serve(
    conn: &mut TcpStream,
    state: &OpsState,
    method: &str,
    target: &str,
    request: &[u8],
) -> io::Result<()> {
    if method != "POST" {
        return respond(conn, 405, "POST only\n");
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let Some((cache, names, shard)) = parse(path) else {
        return respond(
            conn,
            400,
            "expected /v1/shards/{stream|cache}/{tenant}/{namespace}/{name}/{shard}/abandon\n",
        );
    };
    let to = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("to="))
        .filter(|t| !t.is_empty())
        .map(str::to_owned);
    let Some(token) = super::stream_delete::bearer_token(request) else {
        return respond(
            conn,
            401,
            "an Authorization: Bearer <token> header is required\n",
        );
    };
    let (tx, rx) = std_mpsc::sync_channel(1);
    let req = AbandonRequest {
        token,
        cache,
        names,
        shard,
        to,
        reply: Box::new(move |outcome| {
            let _ = tx.try_send(outcome);
        }),
    };
    if state.control.unbounded_send(Control::Abandon(req)).is_err() {
        return respond(conn, 503, "the broker is not running\n");
    }
    let Ok(outcome) = rx.recv_timeout(ANSWER_TIMEOUT) else {
        return respond(conn, 503, "the broker did not answer\n");
    };
    match outcome {
        Ok(p) => respond(
            conn,
            202,
            &format!(
                "{}: {} leads it at generation {} (was {}); given up: {}\n",
                p.shard,
                p.to,
                p.generation,
                p.from.as_deref().unwrap_or("nobody"),
                p.given_up
            ),
        ),
        Err(e) => {
            let status = match e {
                AbandonError::Unauthorized(_) => 401,
                AbandonError::Forbidden => 403,
                AbandonError::NotFound(_) => 404,
                AbandonError::Refused(_) => 409,
            };
            respond(conn, status, &format!("{e}\n"))
        }
    }
}

fn respond(conn: &mut TcpStream, status: u16, body: &str) -> io::Result<()> {
    let reason = match status {
        202 => "Accepted",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        _ => "Service Unavailable",
    };
    let out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(out.as_bytes())?;
    conn.flush()
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
