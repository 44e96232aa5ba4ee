//! `DELETE /v1/streams/{tenant}/{namespace}/{stream}` on the ops endpoint, and the drive
//! loop's side of a deletion (docs/operations.md, "Deleting a stream").
//!
//! The request carries `Authorization: Bearer <Felix JWT>`; the engine checks it exactly as
//! it checks a session's `auth` and wants `stream.manage` on the stream. Answers: 204
//! deleted, 400 a bad name, 401 a token that does not verify for the tenant, 403 one
//! without `stream.manage`, 404 no such stream, 503 not now (recovering, draining, a log
//! still opening, or the drive loop did not answer).

use std::time::Instant;

use felix_engine::{DeleteStreamError, Engine};
use tracing::info;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};

use super::http::{ask, bearer_token, no_token, text, Answer, OpsState};
use crate::control::Control;

/// Where the drive loop sends a deletion's outcome.
pub(crate) type DeleteReply = Box<dyn FnOnce(Result<(), DeleteStreamError>) + Send>;

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

/// Serves `DELETE /v1/streams/{tenant}/{namespace}/{stream}` (`names` from the path).
pub(crate) async fn serve(state: &OpsState, req: &Request<Incoming>, names: [&str; 3]) -> Answer {
    let [tenant, namespace, stream] = names;
    let Some(token) = bearer_token(req) else {
        return no_token();
    };
    let outcome = ask(state, |reply| {
        Control::DeleteStream(DeleteRequest {
            token: Some(token),
            tenant: tenant.into(),
            namespace: namespace.into(),
            stream: stream.into(),
            reply,
        })
    })
    .await;
    match outcome {
        Err(answer) => answer,
        Ok(Ok(())) => text(StatusCode::NO_CONTENT, ""),
        Ok(Err(e)) => {
            let status = match e {
                DeleteStreamError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
                DeleteStreamError::Forbidden => StatusCode::FORBIDDEN,
                DeleteStreamError::InvalidName => StatusCode::BAD_REQUEST,
                DeleteStreamError::NotFound => StatusCode::NOT_FOUND,
                DeleteStreamError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            };
            text(status, format!("{e}\n"))
        }
    }
}
