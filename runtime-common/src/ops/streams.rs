//! `/v1/streams` on the ops endpoint: the admin API for streams (docs/operations.md).

use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};

use super::http::{body, json, text, Answer, OpsState};

pub(crate) async fn serve(state: &OpsState, req: Request<Incoming>, timeout: Duration) -> Answer {
    let path = req.uri().path().to_owned();
    let names: Vec<&str> = path
        .trim_start_matches("/v1/streams")
        .split('/')
        .skip(1)
        .collect();
    match (req.method().clone(), &names[..]) {
        (Method::DELETE, &[t, n, s]) => super::stream_delete::serve(state, &req, [t, n, s]).await,
        (Method::POST, []) => {
            let bytes = match body(req, timeout).await {
                Ok(b) => b,
                Err(answer) => return answer,
            };
            match serde_json::from_slice::<serde_json::Value>(&bytes) {
                Err(e) => text(StatusCode::BAD_REQUEST, format!("bad JSON: {e}\n")),
                Ok(v) => {
                    let _ = state;
                    json(StatusCode::NOT_IMPLEMENTED, &v)
                }
            }
        }
        (_, [] | [_, _, _]) => text(StatusCode::METHOD_NOT_ALLOWED, "not allowed\n"),
        _ => text(
            StatusCode::NOT_FOUND,
            "expected /v1/streams or /v1/streams/{tenant}/{namespace}/{stream}\n",
        ),
    }
}
