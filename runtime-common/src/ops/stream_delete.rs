//! `DELETE /v1/streams/{tenant}/{namespace}/{stream}` on the ops endpoint, and the drive
//! loop's side of a deletion (docs/operations.md, "Deleting a stream").
//!
//! The request carries `Authorization: Bearer <Felix JWT>`; the engine checks it exactly as
//! it checks a session's `auth` and wants `stream.manage` on the stream. Answers: 204
//! deleted, 400 a bad name, 401 a token that does not verify for the tenant, 403 one
//! without `stream.manage`, 404 no such stream, 503 not now (recovering, draining, a log
//! still opening, or the drive loop did not answer).

use std::time::{Duration, Instant};

use felix_engine::{DeleteStreamError, Engine};
use tracing::info;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};

use super::admin::until_deleted_here;
use super::http::{ask, bearer_token, json, no_token, on_engine, text, Answer, OpsState};
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

/// How long a delete in a cluster waits for the control plane to apply it and this node to
/// remove its copies before answering `503` (the delete, one command, may still apply whole
/// later; asking again is safe: `204` or `404`).
pub const DELETE_TIMEOUT: Duration = Duration::from_secs(15);

/// Serves `DELETE /v1/streams/{tenant}/{namespace}/{stream}` (`names` from the path).
///
/// On a single node the stream is deleted in the drive loop's turn. In a cluster the engine
/// asks the control plane for one `DeleteStream` command and this waits until this node has
/// applied it and removed its own copies (every other node does the same as it applies it).
pub(crate) async fn serve(state: &OpsState, req: &Request<Incoming>, names: [&str; 3]) -> Answer {
    let [tenant, namespace, stream] = names;
    let Some(token) = bearer_token(req) else {
        return no_token();
    };
    let deadline = Instant::now() + DELETE_TIMEOUT;
    let owned = (tenant.to_owned(), namespace.to_owned(), stream.to_owned());
    let asked = owned.clone();
    let before = match on_engine(state, move |e, _| {
        e.stream_incarnation((&asked.0, &asked.1, &asked.2))
    })
    .await
    {
        Ok(b) => b,
        Err(answer) => return answer,
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
        Ok(Ok(())) => match before {
            None => text(StatusCode::NO_CONTENT, ""),
            Some(incarnation) => wait_deleted(state, owned, incarnation, deadline).await,
        },
        Ok(Err(e)) => refused(e),
    }
}

/// Waits until this node's metadata no longer has `incarnation` of the stream and its copies
/// here are gone.
async fn wait_deleted(
    state: &OpsState,
    names: (String, String, String),
    incarnation: u64,
    deadline: Instant,
) -> Answer {
    until_deleted_here(
        state,
        deadline,
        names,
        incarnation,
        Engine::stream_deleted_here,
        || {
            refused(DeleteStreamError::Unavailable(format!(
                "the delete was not applied within {DELETE_TIMEOUT:?}: the control plane may \
                 have no majority; retry (the delete is one command: asking again is safe)"
            )))
        },
    )
    .await
}

fn refused(e: DeleteStreamError) -> Answer {
    let status = match e {
        DeleteStreamError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
        DeleteStreamError::Forbidden => StatusCode::FORBIDDEN,
        DeleteStreamError::InvalidName => StatusCode::BAD_REQUEST,
        DeleteStreamError::NotFound => StatusCode::NOT_FOUND,
        DeleteStreamError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    let mut answer = json(status, &serde_json::json!({ "error": e.to_string() }));
    if status == StatusCode::UNAUTHORIZED {
        answer.headers_mut().insert(
            "www-authenticate",
            hyper::header::HeaderValue::from_static("Bearer"),
        );
    }
    answer
}
