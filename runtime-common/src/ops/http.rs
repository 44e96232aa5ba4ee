//! The operator's HTTP endpoint: `/metrics` (Prometheus text, `felix_broker_*`, rendered by
//! [`super::metrics`]), `/livez`, `/readyz` and the admin API under `/v1/` (docs/operations.md).
//!
//! HTTP/1.1 is spoken by hyper, on a current-thread tokio runtime of the endpoint's own in one
//! plain thread: it works the same whichever runtime drives the broker, and a slow client
//! never touches the drive loop. Handlers ask the drive loop (the engine's only owner) over the
//! control channel and wait for its answer, bounded.
//!
//! Limits, each named below: the request head's size ([`MAX_HEAD_BYTES`], past it `431`), a
//! body's size ([`MAX_BODY_BYTES`], past it `413`), the time a client has to send its request
//! ([`REQUEST_TIMEOUT`], one deadline for the whole head, then one for the body, so a client
//! dripping bytes cannot hold a slot past it), and the requests served at once
//! ([`MAX_CONCURRENT_REQUESTS`]). One request per connection (no keep-alive), so a slot is a
//! connection. Past the slots a connection is still read and answered `503 busy` (answering
//! before the request is read would often reset it: the kernel resets a socket closed with
//! unread bytes), up to [`MAX_BUSY_CONNECTIONS`] at once, each given [`BUSY_LINGER`] to send
//! its request; past that it is closed at once.

use std::convert::Infallible;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use felix_engine::Metrics;
use futures_channel::{mpsc, oneshot};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;
use tracing::{debug, info, warn};

use super::metrics::render;
use crate::control::Control;

/// Requests served at once; more are answered `503 busy`.
pub const MAX_CONCURRENT_REQUESTS: usize = 8;
/// How long a client may take to send its request head, and then its body.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest request head (request line and headers). hyper's smallest read buffer is 8 KiB,
/// so this is also the least it can be.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// The largest request body (an admin request's JSON is a few hundred bytes).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Connections past the slots being answered `503 busy` at once; more are closed unanswered.
/// Each is an open socket, so the bound keeps a flood's cost to a few dozen descriptors.
pub const MAX_BUSY_CONNECTIONS: usize = 32;
/// How long a connection refused busy may take to send its request before it is closed.
pub const BUSY_LINGER: Duration = Duration::from_secs(1);
/// How long a handler waits for the drive loop to answer.
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The endpoint's bounds. Production uses the constants above; tests pick their own so that
/// what they check is an order or an outcome ("answered at all", "cut off while the client was
/// still sending") rather than a wall-clock figure.
#[derive(Debug, Clone, Copy)]
struct Limits {
    request: Duration,
    busy_linger: Duration,
    concurrent: usize,
    busy: usize,
}

const LIMITS: Limits = Limits {
    request: REQUEST_TIMEOUT,
    busy_linger: BUSY_LINGER,
    concurrent: MAX_CONCURRENT_REQUESTS,
    busy: MAX_BUSY_CONNECTIONS,
};

/// Work for the drive loop on its engine (at the time given), answering through what it
/// captured.
pub(crate) type AdminJob = Box<dyn FnOnce(&mut felix_engine::Engine, std::time::Instant) + Send>;

/// What a handler answers.
pub(crate) type Answer = Response<Full<Bytes>>;

/// A scrape's question to the drive loop: where to send the snapshot.
pub(crate) type ScrapeRequest = oneshot::Sender<Metrics>;

/// What the endpoint and the drive loop share.
#[derive(Debug)]
pub(crate) struct OpsState {
    /// Recovery finished and the listener is bound; cleared when draining starts.
    pub(crate) ready: AtomicBool,
    /// To the drive loop (scrapes; `RunningBroker` sends rotations on it too).
    pub(crate) control: mpsc::UnboundedSender<Control>,
    /// Waiting for `ready` to turn true ([`crate::RunningBroker::until_ready`]).
    ready_waiters: std::sync::Mutex<Vec<futures_channel::oneshot::Sender<()>>>,
    /// In a cluster: the last metadata index applied, and who waits for it to move
    /// ([`crate::RunningBroker::metadata_changed`]).
    metadata: std::sync::Mutex<(u64, Vec<futures_channel::oneshot::Sender<()>>)>,
    /// The change counter and its waiters (`GET /v1/cluster/changes`, [`super::changes`]).
    pub(crate) changes: std::sync::Mutex<super::changes::Changes>,
}

impl OpsState {
    /// The state, and the receiving end the drive loop serves.
    pub(crate) fn new() -> (Arc<OpsState>, mpsc::UnboundedReceiver<Control>) {
        let (tx, rx) = mpsc::unbounded();
        let state = OpsState {
            ready: AtomicBool::new(false),
            control: tx,
            ready_waiters: std::sync::Mutex::new(Vec::new()),
            metadata: std::sync::Mutex::new((0, Vec::new())),
            changes: std::sync::Mutex::new(super::changes::Changes::default()),
        };
        (Arc::new(state), rx)
    }

    pub(crate) fn set_ready(&self, ready: bool) {
        let mut waiters = self.ready_waiters.lock().expect("not poisoned");
        self.ready.store(ready, Ordering::SeqCst);
        if ready {
            for w in waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }

    /// The drive loop reports the metadata index it has applied; a move wakes the waiters.
    pub(crate) fn set_metadata_applied(&self, applied: u64) {
        let mut m = self.metadata.lock().expect("not poisoned");
        if m.0 != applied {
            m.0 = applied;
            for w in m.1.drain(..) {
                let _ = w.send(());
            }
        }
    }

    /// Resolves once the applied metadata index moves past what it is now.
    pub(crate) fn next_metadata_change(&self) -> futures_channel::oneshot::Receiver<()> {
        let (tx, rx) = futures_channel::oneshot::channel();
        self.metadata.lock().expect("not poisoned").1.push(tx);
        rx
    }

    /// Resolves once `ready` is true (at once if it is); the check and the registration are
    /// made under one lock, so a flip between them is not missed.
    pub(crate) fn until_ready(&self) -> futures_channel::oneshot::Receiver<()> {
        let (tx, rx) = futures_channel::oneshot::channel();
        let mut waiters = self.ready_waiters.lock().expect("not poisoned");
        if self.ready.load(Ordering::SeqCst) {
            let _ = tx.send(());
        } else {
            waiters.push(tx);
        }
        rx
    }
}

/// The running endpoint; dropping it stops its thread and every connection.
#[derive(Debug)]
pub(crate) struct OpsServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl OpsServer {
    /// Binds `addr` and starts serving.
    pub(crate) fn start(addr: SocketAddr, state: Arc<OpsState>) -> io::Result<OpsServer> {
        OpsServer::start_with(addr, state, LIMITS)
    }

    fn start_with(addr: SocketAddr, state: Arc<OpsState>, limits: Limits) -> io::Result<OpsServer> {
        // Bound here, so a taken port fails the start rather than the thread.
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("felix-ops-http".into())
            .spawn(move || {
                runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => accept_loop(l, state, stopped, limits).await,
                        Err(e) => warn!(error = %e, "the ops endpoint could not listen"),
                    }
                });
                // Dropping the runtime here cancels every connection still served.
            })?;
        info!(%addr, "metrics, health and admin endpoint listening");
        Ok(OpsServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for OpsServer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    state: Arc<OpsState>,
    mut stopped: oneshot::Receiver<()>,
    limits: Limits,
) {
    let slots = Arc::new(Semaphore::new(limits.concurrent));
    let busy = Arc::new(Semaphore::new(limits.busy));
    loop {
        let conn = tokio::select! {
            _ = &mut stopped => return,
            conn = listener.accept() => conn,
        };
        let Ok((conn, _)) = conn else {
            continue;
        };
        let io = TokioIo::new(conn);
        if let Ok(slot) = slots.clone().try_acquire_owned() {
            let state = state.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(route(&state, req, limits.request).await) }
                });
                if let Err(e) = builder(limits.request).serve_connection(io, service).await {
                    debug!(error = %e, "ops connection ended");
                }
                drop(slot);
            });
        } else if let Ok(permit) = busy.clone().try_acquire_owned() {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, Infallible>(text(StatusCode::SERVICE_UNAVAILABLE, "busy\n"))
                });
                let _ = builder(limits.busy_linger)
                    .serve_connection(io, service)
                    .await;
                drop(permit);
            });
        } else {
            debug!("too many busy ops connections; closing one unanswered");
        }
    }
}

/// One request per connection, the head bounded in size and time.
fn builder(head_timeout: Duration) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.keep_alive(false)
        .max_buf_size(MAX_HEAD_BYTES)
        .timer(TokioTimer::new())
        .header_read_timeout(head_timeout);
    b
}

/// A plain-text answer.
pub(crate) fn text(status: StatusCode, body: impl Into<String>) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(body.into())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert("www-authenticate", HeaderValue::from_static("Bearer"));
    }
    r
}

/// A JSON answer.
pub(crate) fn json(status: StatusCode, body: &serde_json::Value) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string() + "\n")));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The request's body, bounded in size ([`MAX_BODY_BYTES`]) and time: `Err` is the answer.
pub(crate) async fn body(req: Request<Incoming>, timeout: Duration) -> Result<Bytes, Answer> {
    let limited = Limited::new(req.into_body(), MAX_BODY_BYTES);
    match tokio::time::timeout(timeout, limited.collect()).await {
        Err(_) => Err(text(
            StatusCode::REQUEST_TIMEOUT,
            "the body took too long\n",
        )),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a body is at most {MAX_BODY_BYTES} bytes\n"),
        )),
        Ok(Err(e)) => Err(text(StatusCode::BAD_REQUEST, format!("{e}\n"))),
        Ok(Ok(b)) => Ok(b.to_bytes()),
    }
}

/// The token of an `Authorization: Bearer …` header (the scheme is case-insensitive).
pub(crate) fn bearer_token(req: &Request<Incoming>) -> Option<String> {
    bearer_of(
        req.headers()
            .get(hyper::header::AUTHORIZATION)?
            .to_str()
            .ok()?,
    )
}

fn bearer_of(value: &str) -> Option<String> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_owned())
}

/// The answer to a request without a token.
pub(crate) fn no_token() -> Answer {
    text(
        StatusCode::UNAUTHORIZED,
        "an Authorization: Bearer <token> header is required\n",
    )
}

/// Sends `make(reply)` to the drive loop and waits for its answer; `Err` is a 503.
pub(crate) async fn ask<T>(
    state: &OpsState,
    make: impl FnOnce(Box<dyn FnOnce(T) + Send>) -> Control,
) -> Result<T, Answer>
where
    T: Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let reply: Box<dyn FnOnce(T) + Send> = Box::new(move |t| {
        let _ = tx.send(t);
    });
    if state.control.unbounded_send(make(reply)).is_err() {
        return Err(text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the broker is not running\n",
        ));
    }
    match tokio::time::timeout(ANSWER_TIMEOUT, rx).await {
        Ok(Ok(t)) => Ok(t),
        _ => {
            warn!("the drive loop did not answer an ops request");
            Err(text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the broker did not answer\n",
            ))
        }
    }
}

/// Runs `job` on the drive loop's engine and waits for its result; `Err` is a 503.
pub(crate) async fn on_engine<T: Send + 'static>(
    state: &OpsState,
    job: impl FnOnce(&mut felix_engine::Engine, std::time::Instant) -> T + Send + 'static,
) -> Result<T, Answer> {
    ask(state, move |reply| {
        Control::Admin(Box::new(move |engine, now| reply(job(engine, now))))
    })
    .await
}

async fn route(state: &OpsState, req: Request<Incoming>, timeout: Duration) -> Answer {
    let path = req.uri().path().to_owned();
    if path.starts_with(super::abandon::ROUTE) {
        return super::abandon::serve(state, req).await;
    }
    if path == "/v1/streams" || path.starts_with("/v1/streams/") {
        return super::streams::serve(state, req, timeout).await;
    }
    if path == "/v1/caches" || path.starts_with("/v1/caches/") {
        return super::caches::serve(state, req, timeout).await;
    }
    if path == super::changes::ROUTE {
        return super::changes::serve(state, req).await;
    }
    let head_only = req.method() == Method::HEAD;
    if req.method() != Method::GET && !head_only {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    match path.as_str() {
        "/livez" => text(StatusCode::OK, "ok\n"),
        "/readyz" if state.ready.load(Ordering::SeqCst) => text(StatusCode::OK, "ready\n"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        "/metrics" => match scrape(state).await {
            Some(metrics) => {
                let ready = state.ready.load(Ordering::SeqCst);
                match render(metrics, ready) {
                    Ok(body) => {
                        let mut r = text(StatusCode::OK, body);
                        r.headers_mut().insert(
                            CONTENT_TYPE,
                            HeaderValue::from_static(
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            ),
                        );
                        r
                    }
                    Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
                }
            }
            None => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the broker is not running\n",
            ),
        },
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// Asks the drive loop for a snapshot.
async fn scrape(state: &OpsState) -> Option<Metrics> {
    let (tx, rx) = oneshot::channel();
    state.control.unbounded_send(Control::Scrape(tx)).ok()?;
    match tokio::time::timeout(ANSWER_TIMEOUT, rx).await {
        Ok(Ok(m)) => Some(m),
        _ => {
            warn!("the drive loop did not answer a scrape");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    use super::*;

    #[test]
    fn readiness_wakes_its_waiters_and_answers_late_ones_at_once() {
        let (state, _rx) = OpsState::new();
        let mut early = state.until_ready();
        assert_eq!(early.try_recv(), Ok(None), "not ready yet");
        state.set_ready(false);
        assert_eq!(early.try_recv(), Ok(None), "not-ready wakes nobody");
        state.set_ready(true);
        assert_eq!(early.try_recv(), Ok(Some(())));
        let mut late = state.until_ready();
        assert_eq!(late.try_recv(), Ok(Some(())), "already ready");
    }

    fn request(addr: SocketAddr, text: &str) -> String {
        let mut conn = TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(HUNG)).unwrap();
        conn.write_all(text.as_bytes()).unwrap();
        let mut out = String::new();
        conn.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn routes_methods_readiness_and_the_exposition() {
        let (state, mut control) = OpsState::new();
        // Stands in for the drive loop: answers scrapes with an empty snapshot, and registers
        // change waiters against a state that never moves. It holds the state weakly: the
        // control channel closes when the test drops the state, which ends the loop.
        let looped = Arc::downgrade(&state);
        let loop_thread = std::thread::spawn(move || {
            while let Some(c) = next_control(&mut control) {
                match c {
                    Control::Scrape(reply) => {
                        let _ = reply.send(Metrics::default());
                    }
                    Control::Changes(req) => {
                        if let Some(state) = looped.upgrade() {
                            state.changes.lock().unwrap().register(req, 7);
                        }
                    }
                    _ => {}
                }
            }
        });
        let server = OpsServer::start("127.0.0.1:0".parse().unwrap(), state.clone()).unwrap();
        let addr = server.local_addr();
        let get = |path: &str| request(addr, &format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n"));

        assert!(get("/livez").starts_with("HTTP/1.1 200"));
        assert!(get("/livez").ends_with("\r\n\r\nok\n"));
        assert!(get("/readyz").starts_with("HTTP/1.1 503"));
        state.set_ready(true);
        assert!(get("/readyz").starts_with("HTTP/1.1 200"));
        assert!(get("/nope").starts_with("HTTP/1.1 404"));
        assert!(request(
            addr,
            "POST /metrics HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"
        )
        .starts_with("HTTP/1.1 405"));
        let head = request(addr, "HEAD /livez HTTP/1.1\r\nhost: x\r\n\r\n");
        assert!(
            head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        // The routes that need the drive loop's engine answer 401 before asking it.
        let unauthorized = request(
            addr,
            "POST /v1/shards/stream/t1/default/s/0/abandon HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n",
        );
        assert!(unauthorized.starts_with("HTTP/1.1 401"), "{unauthorized}");
        assert!(unauthorized
            .to_ascii_lowercase()
            .contains("www-authenticate: bearer"));
        assert!(request(
            addr,
            "DELETE /v1/streams/t1/default/s HTTP/1.1\r\nhost: x\r\n\r\n"
        )
        .starts_with("HTTP/1.1 401"));

        // The change long-poll: at once past `after`, `changed: false` at a (short) timeout.
        let first = get("/v1/cluster/changes?after=0");
        assert!(first.starts_with("HTTP/1.1 200"), "{first}");
        assert!(
            first
                .trim_end()
                .ends_with(r#"{"changed":true,"changes":2}"#),
            "{first}"
        );
        let held = get("/v1/cluster/changes?after=2&timeout_ms=1");
        assert!(
            held.trim_end()
                .ends_with(r#"{"changed":false,"changes":2}"#),
            "{held}"
        );
        assert!(get("/v1/cluster/changes?after=x").starts_with("HTTP/1.1 400"));
        assert!(request(
            addr,
            "POST /v1/cluster/changes HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"
        )
        .starts_with("HTTP/1.1 405"));

        let metrics = get("/metrics");
        assert!(
            metrics.contains("application/openmetrics-text"),
            "{metrics}"
        );
        assert!(metrics.contains("\nfelix_broker_ready 1\n"), "{metrics}");
        assert!(metrics.contains("# TYPE felix_broker_fsync_seconds histogram"));
        assert!(
            metrics.contains("felix_broker_fsync_seconds_bucket{le=\"0.00005\"} 0"),
            "{metrics}"
        );
        assert!(metrics.contains("felix_broker_json_publishes_total{frame=\"publish_batch\"} 0"));
        assert!(metrics.trim_end().ends_with("# EOF"));

        drop(server);
        assert!(TcpStream::connect(addr).is_err(), "stopped with its handle");
        drop(state);
        loop_thread.join().unwrap();
    }

    /// A deadline for what a test waits on; generous, so only a hung server fails on it.
    const HUNG: Duration = Duration::from_secs(60);

    /// An hour: longer than any test runs, so reaching an outcome at all proves the server
    /// did not wait this long for it.
    const NEVER: Duration = Duration::from_secs(3_600);

    fn server_with(limits: Limits) -> OpsServer {
        let (state, _control) = OpsState::new();
        OpsServer::start_with("127.0.0.1:0".parse().unwrap(), state, limits).unwrap()
    }

    /// A `/livez` request whose head is `len` bytes, padded with one header.
    fn head_of(len: usize) -> String {
        let mut text = String::from("GET /livez HTTP/1.1\r\nhost: x\r\nx-pad: ");
        text.push_str(&"a".repeat(len - text.len() - 4));
        text.push_str("\r\n\r\n");
        assert_eq!(text.len(), len);
        text
    }

    /// A head of exactly `MAX_HEAD_BYTES` is served; one a byte longer is refused `431` at
    /// once, not after the request timeout (an hour here: an answer at all shows it).
    #[test]
    fn the_head_size_limit_serves_its_edge_and_refuses_past_it() {
        let server = server_with(Limits {
            request: NEVER,
            ..LIMITS
        });
        let at = request(server.local_addr(), &head_of(MAX_HEAD_BYTES));
        assert!(at.starts_with("HTTP/1.1 200"), "{at}");
        let past = request(server.local_addr(), &head_of(MAX_HEAD_BYTES + 1));
        assert!(past.starts_with("HTTP/1.1 431"), "{past}");
    }

    /// A body of exactly `MAX_BODY_BYTES` is read whole (and judged: not JSON, so `400`); one
    /// a byte longer is refused `413`.
    #[test]
    fn the_body_size_limit_reads_its_edge_and_refuses_past_it() {
        let server = server_with(LIMITS);
        let post = |len: usize| {
            request(
                server.local_addr(),
                &format!(
                    "POST /v1/streams HTTP/1.1\r\nhost: x\r\nauthorization: Bearer t\r\ncontent-length: {len}\r\n\r\n{}",
                    "a".repeat(len)
                ),
            )
        };
        let at = post(MAX_BODY_BYTES);
        assert!(at.starts_with("HTTP/1.1 400"), "{at}");
        let past = post(MAX_BODY_BYTES + 1);
        assert!(past.starts_with("HTTP/1.1 413"), "{past}");
    }

    /// A client that drips its request a byte at a time is cut off once the request timeout
    /// has passed since it connected, not kept while each byte restarts a read timeout: with
    /// a 1 s timeout and a minute of dripping, the cut comes while the client still sends.
    #[test]
    fn a_dripping_request_is_cut_off_at_the_request_timeout() {
        const DRIP: usize = 240; // 250 ms apart: a minute
        let server = server_with(Limits {
            request: Duration::from_secs(1),
            ..LIMITS
        });
        let mut conn = TcpStream::connect(server.local_addr()).unwrap();
        conn.set_read_timeout(Some(HUNG * 2)).unwrap();
        let mut writer = conn.try_clone().unwrap();
        let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let drip = std::thread::spawn({
            let sent = sent.clone();
            move || {
                for byte in b"GET /livez HTTP/1.1\r\nX-Slow: ".iter().cycle().take(DRIP) {
                    if writer.write_all(&[*byte]).is_err() {
                        return;
                    }
                    sent.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
        });
        let mut answer = Vec::new();
        // The server closes (or resets, with drip bytes unread): either ends the read.
        let outcome = conn.read_to_end(&mut answer);
        let sent_when_cut = sent.load(Ordering::SeqCst);
        assert!(
            !matches!(&outcome, Err(e) if e.kind() == io::ErrorKind::WouldBlock
                || e.kind() == io::ErrorKind::TimedOut),
            "still open after the client's {:?}",
            HUNG * 2
        );
        assert!(
            sent_when_cut < DRIP,
            "cut off only once the client stopped ({sent_when_cut} bytes)"
        );
        assert!(!answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
        drop(conn);
        drip.join().unwrap();
    }

    /// Holds every request slot: each connection sends nothing, so hyper waits for its head
    /// and the slot stays taken until the connection is dropped.
    fn hold(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
        (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect()
    }

    /// Retries `/livez` until a slot serves it (held connections free theirs once dropped).
    fn wait_until_served(addr: SocketAddr) {
        let deadline = Instant::now() + HUNG;
        loop {
            let answer = request(addr, "GET /livez HTTP/1.1\r\nhost: x\r\n\r\n");
            if answer.starts_with("HTTP/1.1 200") {
                break;
            }
            assert!(Instant::now() < deadline, "no slot freed: {answer}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// With `MAX_CONCURRENT_REQUESTS` connections holding a slot, the next request is answered
    /// `503 busy`, with no reset (repeated so a reset race would show); a freed slot serves
    /// again.
    #[test]
    fn a_request_past_the_concurrency_limit_is_refused_busy() {
        let (state, _control) = OpsState::new();
        let server = OpsServer::start("127.0.0.1:0".parse().unwrap(), state).unwrap();
        let addr = server.local_addr();
        let held = hold(addr, MAX_CONCURRENT_REQUESTS);
        for i in 0..20 {
            let mut conn = TcpStream::connect(addr).unwrap();
            conn.set_read_timeout(Some(HUNG)).unwrap();
            conn.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
                .unwrap();
            let mut busy = String::new();
            let read = conn.read_to_string(&mut busy);
            assert!(read.is_ok(), "connection {i}: {read:?} after {busy:?}");
            assert!(busy.starts_with("HTTP/1.1 503"), "connection {i}: {busy}");
            assert!(busy.ends_with("busy\n"), "connection {i}: {busy}");
            assert!(conn.take_error().unwrap().is_none(), "connection {i} reset");
        }
        drop(held);
        wait_until_served(addr);
    }

    /// Whether the server has closed `conn`: a read sees the end of the stream (or a reset).
    fn closed_by_server(conn: &mut TcpStream) -> bool {
        let mut buf = [0u8; 64];
        matches!(conn.read(&mut buf), Ok(0) | Err(_))
    }

    /// A busy client that sends nothing is let go after the linger, and not before it (how
    /// much later a loaded machine gets to it is not a pass/fail line).
    #[test]
    fn a_silent_busy_connection_is_closed_after_the_linger() {
        let server = server_with(Limits {
            concurrent: 1,
            ..LIMITS
        });
        let held = hold(server.local_addr(), 1);
        let started = Instant::now();
        let mut conn = TcpStream::connect(server.local_addr()).unwrap();
        conn.set_read_timeout(Some(HUNG)).unwrap();
        assert!(closed_by_server(&mut conn), "still open after {HUNG:?}");
        let took = started.elapsed();
        assert!(took >= BUSY_LINGER, "closed after {took:?}");
        drop(held);
    }

    /// With every slot held and `MAX_BUSY_CONNECTIONS` busy connections lingering (for an
    /// hour), one more is closed at once, unanswered: accepting goes on. Freed slots serve again.
    #[test]
    fn past_the_busy_connections_a_connection_is_closed_at_once() {
        let server = server_with(Limits {
            concurrent: 1,
            busy: 2,
            busy_linger: NEVER,
            ..LIMITS
        });
        let addr = server.local_addr();
        let held = hold(addr, 1);
        let mut busy = hold(addr, 2);
        let mut extra = TcpStream::connect(addr).unwrap();
        extra.set_read_timeout(Some(HUNG)).unwrap();
        let mut answer = Vec::new();
        let read = extra.read_to_end(&mut answer);
        assert!(
            !matches!(&read, Err(e) if e.kind() == io::ErrorKind::WouldBlock
                || e.kind() == io::ErrorKind::TimedOut),
            "not closed"
        );
        assert!(answer.is_empty(), "{answer:?}");
        // The lingering ones are still open: answered busy once they send their request.
        for b in &mut busy {
            b.set_read_timeout(Some(HUNG)).unwrap();
            b.write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
                .unwrap();
            let mut s = String::new();
            b.read_to_string(&mut s).unwrap();
            assert!(
                s.starts_with("HTTP/1.1 503") && s.ends_with("busy\n"),
                "{s}"
            );
        }
        drop(held);
        wait_until_served(addr);
    }

    #[test]
    fn the_bearer_token_is_taken_from_its_header_only() {
        assert_eq!(bearer_of("bearer abc.def").as_deref(), Some("abc.def"));
        assert_eq!(bearer_of("Bearer  abc ").as_deref(), Some("abc"));
        assert_eq!(bearer_of("Basic eA=="), None);
        assert_eq!(bearer_of("Bearer "), None);
    }

    /// Blocks on the next control message (`None` once every sender is gone).
    fn next_control(rx: &mut mpsc::UnboundedReceiver<Control>) -> Option<Control> {
        futures_executor_block(rx)
    }

    fn futures_executor_block(rx: &mut mpsc::UnboundedReceiver<Control>) -> Option<Control> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(futures_next(rx))
    }

    async fn futures_next(rx: &mut mpsc::UnboundedReceiver<Control>) -> Option<Control> {
        std::future::poll_fn(|cx| futures_core::Stream::poll_next(std::pin::Pin::new(&mut *rx), cx))
            .await
    }
}
