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

use super::admin::{until_deleted_here, Deadline};
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
    let deadline = Deadline::now() + DELETE_TIMEOUT;
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
            Some(incarnation) => {
                let gone = Engine::stream_deleted_here;
                wait_deleted(state, owned, incarnation, deadline, gone).await
            }
        },
        Ok(Err(e)) => refused(e),
    }
}

/// Waits until `gone` (`Engine::stream_deleted_here`) says this node's metadata no longer has
/// `incarnation` of the stream and its copies here are gone: `204`; at `deadline`, `503`.
async fn wait_deleted(
    state: &OpsState,
    names: (String, String, String),
    incarnation: u64,
    deadline: Deadline,
    gone: fn(&Engine, (&str, &str, &str), u64) -> bool,
) -> Answer {
    until_deleted_here(state, deadline, names, incarnation, gone, || {
        refused(DeleteStreamError::Unavailable(format!(
            "the delete was not applied within {DELETE_TIMEOUT:?}: the control plane may \
                 have no majority; retry (the delete is one command: asking again is safe)"
        )))
    })
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

#[cfg(test)]
mod tests {
    use std::future::{pending, poll_fn};
    use std::pin::Pin;
    use std::sync::atomic::{AtomicBool, Ordering};

    use felix_engine::{AuthConfig, EngineConfig};
    use futures_channel::mpsc;
    use futures_core::Stream;

    use super::*;
    use crate::ops::http::OpsState;

    /// Stands in for the drive loop: runs every admin job on a single-node engine, forever.
    async fn drive(mut control: mpsc::UnboundedReceiver<Control>) {
        let identity = crate::tls::generate(&[]).unwrap().identity;
        let config = EngineConfig::new(identity, AuthConfig::Dev { seed: [7; 32] }, [9; 32]);
        let mut engine = Engine::new(config, Instant::now(), 1_767_225_600_000_000).unwrap();
        while let Some(c) = poll_fn(|cx| Pin::new(&mut control).poll_next(cx)).await {
            if let Control::Admin(job) = c {
                job(&mut engine, Instant::now());
            }
        }
        pending::<()>().await;
    }

    fn names() -> (String, String, String) {
        ("t1".into(), "default".into(), "orders".into())
    }

    /// A delete this node never sees applied is answered `503` at `DELETE_TIMEOUT`, not
    /// before (tokio's clock paused: time moves only to the next timer, and only when nothing
    /// else can run; its timers tick in whole milliseconds).
    #[tokio::test(start_paused = true)]
    async fn a_delete_never_applied_here_is_answered_503_at_its_timeout_not_before() {
        let (state, control) = OpsState::new();
        let start = Deadline::now();
        let never = |_: &Engine, _: (&str, &str, &str), _: u64| false;
        let answer = tokio::select! {
            answer = wait_deleted(&state, names(), 1, start + DELETE_TIMEOUT, never) => answer,
            () = drive(control) => unreachable!("the drive loop stand-in never ends"),
        };
        let waited = Deadline::now() - start;
        assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            waited >= DELETE_TIMEOUT,
            "answered after {waited:?}, before the timeout"
        );
        assert!(
            waited < DELETE_TIMEOUT + Duration::from_millis(1),
            "answered after {waited:?}, well past the timeout"
        );
    }

    /// Applied here 1 ms before `DELETE_TIMEOUT` (a metadata change, then `gone` is true):
    /// answered `204` then, not `503`.
    #[tokio::test(start_paused = true)]
    async fn a_delete_applied_just_inside_its_timeout_is_answered_204() {
        static APPLIED: AtomicBool = AtomicBool::new(false);
        let (state, control) = OpsState::new();
        let start = Deadline::now();
        let applied = |_: &Engine, _: (&str, &str, &str), _: u64| APPLIED.load(Ordering::SeqCst);
        let inside = DELETE_TIMEOUT - Duration::from_millis(1);
        let apply = async {
            tokio::time::sleep_until(start + inside).await;
            APPLIED.store(true, Ordering::SeqCst);
            state.set_metadata_applied(1);
            pending::<()>().await;
        };
        let answer = tokio::select! {
            answer = wait_deleted(&state, names(), 1, start + DELETE_TIMEOUT, applied) => answer,
            () = drive(control) => unreachable!("the drive loop stand-in never ends"),
            () = apply => unreachable!("never ends"),
        };
        let waited = Deadline::now() - start;
        assert_eq!(answer.status(), StatusCode::NO_CONTENT, "after {waited:?}");
        assert!(
            waited >= inside && waited < DELETE_TIMEOUT,
            "answered after {waited:?}"
        );
    }
}
