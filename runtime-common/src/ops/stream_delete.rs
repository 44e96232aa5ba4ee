//! `DELETE /v1/streams/{tenant}/{namespace}/{stream}` on the ops endpoint, and the drive
//! loop's side of a deletion (docs/operations.md, "Deleting a stream").
//!
//! The request carries `Authorization: Bearer <Felix JWT>`; the engine checks it exactly as
//! it checks a session's `auth` and wants `stream.manage` on the stream. Answers: 204
//! deleted, 400 a bad name, 401 a token that does not verify for the tenant, 403 one
//! without `stream.manage`, 404 no such stream, 503 not now (recovering, draining, a log
//! still opening, or the drive loop did not answer).

use std::io::{self, Write};
use std::net::TcpStream;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use felix_engine::{DeleteStreamError, Engine};
use tracing::{info, warn};

use super::http::OpsState;
use crate::control::Control;

/// Where the drive loop sends a deletion's outcome.
pub(crate) type DeleteReply = Box<dyn FnOnce(Result<(), DeleteStreamError>) + Send>;

/// The route's prefix.
pub(crate) const ROUTE: &str = "/v1/streams/";
/// How long the endpoint waits for the drive loop's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// A deletion for the drive loop to run: with a token from HTTP, without one from the
/// embedder's handle (trusted).
pub(crate) struct DeleteRequest {
    pub(crate) token: Option<String>,
    pub(crate) tenant: String,
    pub(crate) namespace: String,
    pub(crate) stream: String,
    pub(crate) reply: DeleteReply,
}

/// Runs a deletion on the engine (called by the drive loop).
pub(crate) fn run(engine: &mut Engine, req: DeleteRequest) {
    let outcome = if !engine.is_ready() {
        Err(DeleteStreamError::Unavailable(
            "recovery is not finished".into(),
        ))
    } else {
        let now = Instant::now();
        let (t, n, s) = (&req.tenant, &req.namespace, &req.stream);
        match &req.token {
            Some(token) => engine.delete_stream_as(now, token, t, n, s),
            None => engine.delete_stream(now, t, n, s),
        }
    };
    match &outcome {
        Ok(()) => {
            info!(tenant = %req.tenant, namespace = %req.namespace, stream = %req.stream, "stream deleted")
        }
        Err(e) => {
            info!(tenant = %req.tenant, namespace = %req.namespace, stream = %req.stream, error = %e, "stream not deleted")
        }
    }
    (req.reply)(outcome);
}

/// Serves one request whose path starts with [`ROUTE`]. `request` is the raw head.
pub(crate) fn serve(
    conn: &mut TcpStream,
    state: &OpsState,
    method: &str,
    path: &str,
    request: &[u8],
) -> io::Result<()> {
    if method != "DELETE" {
        return respond(conn, 405, "DELETE only\n");
    }
    let names: Vec<&str> = path[ROUTE.len()..].split('/').collect();
    let [tenant, namespace, stream] = names[..] else {
        return respond(
            conn,
            404,
            "expected /v1/streams/{tenant}/{namespace}/{stream}\n",
        );
    };
    let Some(token) = bearer_token(request) else {
        return respond(
            conn,
            401,
            "an Authorization: Bearer <token> header is required\n",
        );
    };
    let (tx, rx) = std_mpsc::sync_channel(1);
    let req = DeleteRequest {
        token: Some(token),
        tenant: tenant.into(),
        namespace: namespace.into(),
        stream: stream.into(),
        reply: Box::new(move |outcome| {
            let _ = tx.try_send(outcome);
        }),
    };
    if state
        .control
        .unbounded_send(Control::DeleteStream(req))
        .is_err()
    {
        return respond(conn, 503, "the broker is not running\n");
    }
    let outcome = match rx.recv_timeout(ANSWER_TIMEOUT) {
        Ok(outcome) => outcome,
        Err(e) => {
            warn!(error = %e, "the drive loop did not answer a stream deletion");
            return respond(conn, 503, "the broker did not answer\n");
        }
    };
    match outcome {
        Ok(()) => respond(conn, 204, ""),
        Err(e) => {
            let status = match e {
                DeleteStreamError::Unauthorized(_) => 401,
                DeleteStreamError::Forbidden => 403,
                DeleteStreamError::InvalidName => 400,
                DeleteStreamError::NotFound => 404,
                DeleteStreamError::Unavailable(_) => 503,
            };
            respond(conn, status, &format!("{e}\n"))
        }
    }
}

/// The token of an `Authorization: Bearer …` header (the scheme is case-insensitive).
pub(super) fn bearer_token(request: &[u8]) -> Option<String> {
    let head = String::from_utf8_lossy(request);
    head.lines().skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        if !name.trim().eq_ignore_ascii_case("authorization") {
            return None;
        }
        let (scheme, token) = value.trim().split_once(' ')?;
        let token = token.trim();
        (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_owned())
    })
}

fn respond(conn: &mut TcpStream, status: u16, body: &str) -> io::Result<()> {
    let reason = match status {
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let mut out = format!("HTTP/1.1 {status} {reason}\r\n");
    if status == 401 {
        out.push_str("www-authenticate: Bearer\r\n");
    }
    if status == 204 {
        out.push_str("connection: close\r\n\r\n");
    } else {
        out.push_str(&format!(
            "content-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        ));
    }
    conn.write_all(out.as_bytes())?;
    conn.flush()
}

#[cfg(test)]
mod tests {
    use super::bearer_token;

    #[test]
    fn the_bearer_token_is_taken_from_its_header_only() {
        let req = b"DELETE /v1/streams/t/n/s HTTP/1.1\r\nHost: x\r\nauthorization: bearer abc.def\r\n\r\n";
        assert_eq!(bearer_token(req).as_deref(), Some("abc.def"));
        assert_eq!(
            bearer_token(b"DELETE / HTTP/1.1\r\nAuthorization: Basic eA==\r\n\r\n"),
            None
        );
        assert_eq!(
            bearer_token(b"DELETE / HTTP/1.1\r\nX-Authorization: Bearer a\r\n\r\n"),
            None
        );
    }
}
