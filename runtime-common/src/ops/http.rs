//! The operator's HTTP endpoint: `/metrics` (Prometheus text, `felix_broker_*`, rendered by
//! [`super::metrics`]), `/livez` and `/readyz`.
//!
//! It is deliberately tiny and runtime-neutral: one plain thread accepts on a blocking
//! `std::net::TcpListener` and serves each request on a short-lived thread (at most
//! [`MAX_CONCURRENT_REQUESTS`] at once), so it works the same under tokio, smol or anything
//! else, and a slow scraper never touches the drive loop. A scrape asks the drive loop for a
//! snapshot of the engine's [`Metrics`] over a channel and waits for the answer; the engine
//! stays the only owner of its counters.
//!
//! Past the limit the accept thread answers `503 busy` itself, without waiting for the
//! request, so a flood of connections cannot slow accepting. Closing such a connection at once
//! would often reset it (the kernel resets a socket closed with unread request bytes, and the
//! reset can destroy the answer before the client reads it), so the accept thread writes the
//! answer, shuts down its side for writing and hands the connection to one closer thread. The
//! closer reads what the client sends and closes once the client has closed, with bounds on
//! the bytes it reads (`MAX_REQUEST_BYTES`), the time it waits (`BUSY_LINGER`) and the
//! connections it holds (`BUSY_CLOSER_QUEUE`); only past the last is a busy connection
//! closed at once, and so possibly reset.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use felix_engine::Metrics;
use futures_channel::mpsc;
use tracing::{debug, info, warn};

use super::metrics::render;
use super::stream_delete;
use crate::control::Control;

/// Requests served at once; more are answered 503 straight away.
pub const MAX_CONCURRENT_REQUESTS: usize = 8;
/// How long a client may take to send its request, and a scrape may wait for the loop.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The most request bytes read (a request line and headers; there is no body), also from a
/// connection refused busy.
const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// How long the closer keeps a busy connection open for its client to send the request and
/// close. A client closes about one round trip after the answer reaches it, so a second
/// covers slow networks; a client that stays silent holds the closer (serving one connection
/// at a time) no longer than this.
const BUSY_LINGER: Duration = Duration::from_secs(1);
/// Busy connections waiting for the closer; past this they are closed at once (and may be
/// reset). Each one is an open socket, so the bound keeps a flood's cost to a few dozen file
/// descriptors, while prompt clients (gone within a round trip) rarely queue at all. A queued
/// connection already has its answer; waiting (at worst this many `BUSY_LINGER`s) only keeps
/// its socket open.
const BUSY_CLOSER_QUEUE: usize = 32;

/// The endpoint's time bounds. Production uses the constants above; tests pick their own so
/// that what they check is an order or an outcome ("answered at all", "cut off while the
/// client was still sending") rather than a wall-clock figure.
#[derive(Debug, Clone, Copy)]
struct Timing {
    /// [`REQUEST_TIMEOUT`].
    request: Duration,
    /// [`BUSY_LINGER`].
    busy_linger: Duration,
}

const TIMING: Timing = Timing {
    request: REQUEST_TIMEOUT,
    busy_linger: BUSY_LINGER,
};

/// A scrape's question to the drive loop: where to send the snapshot.
pub(crate) type ScrapeRequest = std_mpsc::SyncSender<Metrics>;

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

/// The running endpoint; dropping it stops the accept thread.
#[derive(Debug)]
pub(crate) struct OpsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl OpsServer {
    /// Binds `addr` and starts serving.
    pub(crate) fn start(addr: SocketAddr, state: Arc<OpsState>) -> io::Result<OpsServer> {
        OpsServer::start_timed(addr, state, TIMING)
    }

    fn start_timed(
        addr: SocketAddr,
        state: Arc<OpsState>,
        timing: Timing,
    ) -> io::Result<OpsServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("felix-ops-http".into())
            .spawn(move || accept_loop(listener, state, stopping, timing))?;
        info!(%addr, "metrics and health endpoint listening");
        Ok(OpsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for OpsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept with a connection of our own.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn accept_loop(listener: TcpListener, state: Arc<OpsState>, stop: Arc<AtomicBool>, timing: Timing) {
    let (busy_tx, busy_rx) = std_mpsc::sync_channel(BUSY_CLOSER_QUEUE);
    let closer = std::thread::Builder::new()
        .name("felix-ops-closer".into())
        .spawn({
            let stop = stop.clone();
            move || close_busy(busy_rx, &stop, timing.busy_linger)
        });
    let closer = match closer {
        Ok(closer) => Some(closer),
        Err(e) => {
            // Busy connections are then closed at once, as `try_send` fails.
            warn!(error = %e, "could not start the ops closer thread");
            None
        }
    };
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(conn) = conn else {
            continue;
        };
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONCURRENT_REQUESTS {
            active.fetch_sub(1, Ordering::SeqCst);
            refuse_busy(conn, &busy_tx);
            continue;
        }
        let (state, active) = (state.clone(), active.clone());
        let spawned = std::thread::Builder::new()
            .name("felix-ops-request".into())
            .spawn({
                let active = active.clone();
                move || {
                    if let Err(e) = serve(conn, &state, timing.request) {
                        debug!(error = %e, "ops request failed");
                    }
                    active.fetch_sub(1, Ordering::SeqCst);
                }
            });
        if spawned.is_err() {
            active.fetch_sub(1, Ordering::SeqCst);
        }
    }
    // The closer ends once the channel closes; with `stop` set it no longer lingers, so this
    // waits at most one `BUSY_LINGER`.
    drop(busy_tx);
    if let Some(closer) = closer {
        let _ = closer.join();
    }
}

/// Answers `503 busy` and passes the connection to the closer, or closes it when the closer's
/// queue is full.
fn refuse_busy(mut conn: TcpStream, closer: &std_mpsc::SyncSender<TcpStream>) {
    // Non-blocking, so a client that does not read cannot stall accepting (a fresh socket's
    // send buffer takes the short answer whole anyway).
    let answered = conn.set_nonblocking(true).is_ok()
        && respond(&mut conn, 503, "text/plain", "busy\n", false).is_ok()
        && conn.shutdown(Shutdown::Write).is_ok();
    if answered {
        if let Err(std_mpsc::TrySendError::Full(_)) = closer.try_send(conn) {
            debug!("ops closer queue full; closing a busy connection at once");
        }
    }
}

/// The closer thread: one busy connection at a time, each until its client closes.
fn close_busy(busy: std_mpsc::Receiver<TcpStream>, stop: &AtomicBool, linger: Duration) {
    for conn in busy {
        if !stop.load(Ordering::SeqCst) {
            drain_until_closed(conn, linger);
        }
    }
}

/// Reads and discards until the client closes, `MAX_REQUEST_BYTES` have come or `linger`
/// (`BUSY_LINGER`) has passed. Closing with nothing unread sends a FIN, not a reset, so the
/// answer already sent survives.
fn drain_until_closed(mut conn: TcpStream, linger: Duration) {
    let deadline = Instant::now() + linger;
    if conn.set_nonblocking(false).is_err() {
        return;
    }
    let mut buf = [0u8; 1024];
    let mut read = 0;
    while read < MAX_REQUEST_BYTES {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || conn.set_read_timeout(Some(left)).is_err() {
            return;
        }
        let room = buf.len().min(MAX_REQUEST_BYTES - read);
        match conn.read(&mut buf[..room]) {
            Ok(0) | Err(_) => return,
            Ok(n) => read += n,
        }
    }
}

fn serve(mut conn: TcpStream, state: &OpsState, timeout: Duration) -> io::Result<()> {
    conn.set_write_timeout(Some(timeout))?;
    // One deadline for the whole request, so a client dripping bytes cannot hold a slot
    // past it (a per-read timeout alone would restart with every byte).
    let deadline = Instant::now() + timeout;
    let mut request = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < MAX_REQUEST_BYTES {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        conn.set_read_timeout(Some(left))?;
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
    }
    let line = request.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if target.starts_with(super::abandon::ROUTE) {
        return super::abandon::serve(&mut conn, state, method, target, &request);
    }
    if target.starts_with(stream_delete::ROUTE) {
        let path = target.split('?').next().unwrap_or("");
        return stream_delete::serve(&mut conn, state, method, path, &request);
    }
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        return respond(&mut conn, 405, "text/plain", "GET only\n", head_only);
    }
    let path = target.split('?').next().unwrap_or("");
    match path {
        "/livez" => respond(&mut conn, 200, "text/plain", "ok\n", head_only),
        "/readyz" if state.ready.load(Ordering::SeqCst) => {
            respond(&mut conn, 200, "text/plain", "ready\n", head_only)
        }
        "/readyz" => respond(&mut conn, 503, "text/plain", "not ready\n", head_only),
        "/metrics" => match scrape(state, timeout) {
            Some(metrics) => {
                let ready = state.ready.load(Ordering::SeqCst);
                let body = render(metrics, ready).map_err(io::Error::other)?;
                let kind = "application/openmetrics-text; version=1.0.0; charset=utf-8";
                respond(&mut conn, 200, kind, &body, head_only)
            }
            None => respond(
                &mut conn,
                503,
                "text/plain",
                "the broker is not running\n",
                head_only,
            ),
        },
        _ => respond(&mut conn, 404, "text/plain", "not found\n", head_only),
    }
}

/// Asks the drive loop for a snapshot.
fn scrape(state: &OpsState, timeout: Duration) -> Option<Metrics> {
    let (tx, rx) = std_mpsc::sync_channel(1);
    state.control.unbounded_send(Control::Scrape(tx)).ok()?;
    match rx.recv_timeout(timeout) {
        Ok(m) => Some(m),
        Err(e) => {
            warn!(error = %e, "the drive loop did not answer a scrape");
            None
        }
    }
}

fn respond(
    conn: &mut TcpStream,
    status: u16,
    content_type: &str,
    body: &str,
    head_only: bool,
) -> io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        out.push_str(body);
    }
    conn.write_all(out.as_bytes())?;
    conn.flush()
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

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
        conn.write_all(text.as_bytes()).unwrap();
        let mut out = String::new();
        conn.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn routes_methods_readiness_and_the_exposition() {
        let (state, mut control) = OpsState::new();
        // Stands in for the drive loop: answers scrapes with an empty snapshot.
        let loop_thread = std::thread::spawn(move || {
            while let Some(c) = futures_executor_lite(&mut control) {
                if let Control::Scrape(reply) = c {
                    let _ = reply.send(Metrics::default());
                }
            }
        });
        let server = OpsServer::start("127.0.0.1:0".parse().unwrap(), state.clone()).unwrap();
        let addr = server.local_addr();
        let get = |path: &str| request(addr, &format!("GET {path} HTTP/1.1\r\n\r\n"));

        assert!(get("/livez").starts_with("HTTP/1.1 200"));
        assert!(get("/readyz").starts_with("HTTP/1.1 503"));
        state.set_ready(true);
        assert!(get("/readyz").starts_with("HTTP/1.1 200"));
        assert!(get("/nope").starts_with("HTTP/1.1 404"));
        assert!(request(addr, "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let head = request(addr, "HEAD /livez HTTP/1.1\r\n\r\n");
        assert!(
            head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"),
            "{head}"
        );

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

    fn server_with(request: Duration, busy_linger: Duration) -> OpsServer {
        let (state, _control) = OpsState::new();
        let timing = Timing {
            request,
            busy_linger,
        };
        OpsServer::start_timed("127.0.0.1:0".parse().unwrap(), state, timing).unwrap()
    }

    /// A request of exactly `MAX_REQUEST_BYTES` with no end of headers is answered at once,
    /// not after the read timeout: the server stops reading at the limit. With an hour's
    /// request timeout an answer at all shows it (a server that read on would answer nothing
    /// until the hour had passed, and the client's `HUNG` read timeout fails it).
    #[test]
    fn a_request_at_the_size_limit_is_answered_without_waiting_for_more() {
        let server = server_with(NEVER, BUSY_LINGER);
        let mut text = String::from("GET /livez HTTP/1.1\r\nX-Pad: ");
        text.push_str(&"a".repeat(MAX_REQUEST_BYTES - text.len()));
        assert_eq!(text.len(), MAX_REQUEST_BYTES);
        let mut conn = TcpStream::connect(server.local_addr()).unwrap();
        conn.set_read_timeout(Some(HUNG)).unwrap();
        conn.write_all(text.as_bytes()).unwrap();
        let mut answer = String::new();
        let read = conn.read_to_string(&mut answer);
        assert!(read.is_ok(), "{read:?}");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    /// A client that drips its request a byte at a time is cut off once the request timeout
    /// has passed since it connected, not kept while each byte restarts a read timeout: with
    /// a 1 s timeout and a minute of dripping, the cut comes while the client still sends.
    #[test]
    fn a_dripping_request_is_cut_off_at_the_request_timeout() {
        const DRIP: usize = 240; // 250 ms apart: a minute
        let server = server_with(Duration::from_secs(1), BUSY_LINGER);
        let mut conn = TcpStream::connect(server.local_addr()).unwrap();
        conn.set_read_timeout(Some(HUNG * 2)).unwrap();
        let mut writer = conn.try_clone().unwrap();
        let sent = Arc::new(AtomicUsize::new(0));
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
        assert!(answer.is_empty(), "{answer:?}");
        drop(conn);
        drip.join().unwrap();
    }

    /// With `MAX_CONCURRENT_REQUESTS` connections holding a slot, one more (sending nothing)
    /// is refused `503 busy`; a freed slot serves again.
    #[test]
    fn one_request_past_the_concurrency_limit_is_refused_busy() {
        let (state, _control) = OpsState::new();
        let server = OpsServer::start("127.0.0.1:0".parse().unwrap(), state).unwrap();
        let addr = server.local_addr();
        let held = hold_all_slots(addr);
        let mut busy = String::new();
        TcpStream::connect(addr)
            .unwrap()
            .read_to_string(&mut busy)
            .unwrap();
        assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
        assert!(busy.ends_with("busy\n"), "{busy}");
        drop(held);
        wait_until_served(addr);
    }

    /// Retries `/livez` until a slot serves it (held connections free theirs once dropped).
    fn wait_until_served(addr: SocketAddr) {
        let deadline = Instant::now() + HUNG;
        loop {
            let answer = request(addr, "GET /livez HTTP/1.1\r\n\r\n");
            if answer.starts_with("HTTP/1.1 200") {
                break;
            }
            assert!(Instant::now() < deadline, "no slot freed: {answer}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Connects while every slot is held and reads the whole busy answer, sending nothing.
    fn busy_connection(addr: SocketAddr) -> TcpStream {
        let mut conn = TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(HUNG)).unwrap();
        let mut busy = String::new();
        conn.read_to_string(&mut busy).unwrap();
        assert!(
            busy.starts_with("HTTP/1.1 503") && busy.ends_with("busy\n"),
            "{busy}"
        );
        conn
    }

    /// Whether the server has closed `conn` (whose answer and FIN were read already): a byte
    /// sent to a closed socket draws a reset, which fails the next write. Reads cannot tell,
    /// as they keep returning the FIN's end of stream.
    fn closed_by_server(conn: &mut TcpStream) -> bool {
        if conn.write_all(b"x").is_err() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
        conn.write_all(b"x").is_err()
    }

    /// Probes until the server has closed `conn`; fails only a connection never closed.
    fn wait_closed_by_server(conn: &mut TcpStream) {
        let deadline = Instant::now() + HUNG;
        while !closed_by_server(conn) {
            assert!(Instant::now() < deadline, "still open after {HUNG:?}");
        }
    }

    /// A busy client that neither sends nor closes is let go after the linger, and not
    /// before it (how much later a loaded machine gets to it is not a pass/fail line).
    #[test]
    fn a_silent_busy_connection_is_closed_after_the_linger() {
        let server = server_with(REQUEST_TIMEOUT, BUSY_LINGER);
        let held = hold_all_slots(server.local_addr());
        let started = Instant::now();
        let mut conn = busy_connection(server.local_addr());
        wait_closed_by_server(&mut conn);
        let took = started.elapsed();
        assert!(took >= BUSY_LINGER, "closed after {took:?}");
        drop(held);
    }

    /// Draining a busy connection stops at `MAX_REQUEST_BYTES`: a client that has sent that
    /// much is closed at once instead of being waited for. With an hour's linger, being
    /// closed at all shows it.
    #[test]
    fn a_busy_connection_is_drained_of_at_most_the_request_limit() {
        let server = server_with(REQUEST_TIMEOUT, NEVER);
        let held = hold_all_slots(server.local_addr());
        let mut conn = TcpStream::connect(server.local_addr()).unwrap();
        conn.set_read_timeout(Some(HUNG)).unwrap();
        conn.write_all(&[b'a'; MAX_REQUEST_BYTES]).unwrap();
        let mut busy = String::new();
        conn.read_to_string(&mut busy).unwrap();
        assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
        wait_closed_by_server(&mut conn);
        drop(held);
    }

    /// With the closer busy and its queue full, further busy connections are still accepted
    /// and answered (and closed at once), and the endpoint serves again once slots free. The
    /// closer lingers an hour on the one it holds: accepting that waited for it would not
    /// answer the later connections within their `HUNG` read timeout.
    #[test]
    fn a_full_closer_queue_does_not_stop_accepting() {
        const PAST_THE_QUEUE: usize = 4;
        let server = server_with(REQUEST_TIMEOUT, NEVER);
        let addr = server.local_addr();
        let held = hold_all_slots(addr);
        // One for the closer to linger on, a queue's worth, and a few that cannot fit.
        let busy: Vec<TcpStream> = (0..1 + BUSY_CLOSER_QUEUE + PAST_THE_QUEUE)
            .map(|_| busy_connection(addr))
            .collect();
        // As in `closed_by_server`, but probed all at once; until those past the queue are
        // seen closed (nothing else closes within the hour's linger).
        let probe = |mut c: &TcpStream| c.write_all(b"x").is_err();
        let deadline = Instant::now() + HUNG;
        let dropped = loop {
            let dropped = busy.iter().filter(|c| probe(c)).count();
            if dropped >= PAST_THE_QUEUE {
                break dropped;
            }
            assert!(Instant::now() < deadline, "only {dropped} closed at once");
            std::thread::sleep(Duration::from_millis(10));
        };
        // At least a full queue stays open (plus the closer's own connection, unless the
        // closer had not taken its first one yet when the queue filled, as under load).
        assert!(
            busy.len() - dropped >= BUSY_CLOSER_QUEUE,
            "{dropped} dropped"
        );
        drop(busy);
        drop(held);
        wait_until_served(addr);
    }

    /// Holds every request slot: each connection sends nothing, so its request thread waits
    /// in `read` and keeps its slot until the connection is dropped.
    fn hold_all_slots(addr: SocketAddr) -> Vec<TcpStream> {
        (0..MAX_CONCURRENT_REQUESTS)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect()
    }

    /// A client that sends a whole request before reading still gets `503 busy`, and no
    /// reset: the busy answer is followed by draining the request and waiting for the
    /// client to close. Repeated so a reset race would show.
    #[test]
    fn a_busy_answer_reaches_a_client_that_sent_its_request() {
        let (state, _control) = OpsState::new();
        let server = OpsServer::start("127.0.0.1:0".parse().unwrap(), state).unwrap();
        let addr = server.local_addr();
        let held = hold_all_slots(addr);
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
            // A reset after the FIN leaves reads at end of stream but sets the socket error.
            assert!(conn.take_error().unwrap().is_none(), "connection {i} reset");
        }
        drop(held);
    }

    /// Blocks on the next control message (`None` once every sender is gone).
    fn futures_executor_lite(rx: &mut mpsc::UnboundedReceiver<Control>) -> Option<Control> {
        loop {
            match rx.try_recv() {
                Ok(message) => return Some(message),
                Err(mpsc::TryRecvError::Closed) => return None,
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }
}
