//! `GET /v1/cluster/changes?after=N&timeout_ms=T`: a long-poll on the node's change counter,
//! for whoever waits for this node's state to move (the real-process tests, an operator's
//! script) instead of re-reading it on a timer.
//!
//! The counter moves when what a waiter may be waiting for moves on this node: cluster
//! metadata applied (placement, a promotion, a member joining or lost, an alter, a create or
//! delete), a deleted object's copies removed here, whether the node serves, a shard copy's
//! replication role, generation or commit mark, and where this node's logs stand (a
//! retention cut, a follower's trim to its leader's start, an append, a sync, a segment file
//! born or removed). It is a number with no
//! meaning beyond "larger is later"; it starts at 1 and never goes back while the process runs.
//!
//! Answered at once with the current counter when it is past `after`; otherwise held until the
//! counter moves past it or `timeout_ms` elapses (default [`DEFAULT_WAIT`], capped at
//! [`MAX_WAIT`]), then answered with the counter as it stands. The answer is
//! `{"changes": N, "changed": bool}` (`changed`: it is past `after`).
//!
//! Nothing polls: the drive loop registers a waiter when the request comes (taking the state's
//! fingerprint then), and at the end of each of its turns, only while a waiter is registered,
//! takes it again; a different fingerprint moves the counter and wakes the waiters.
//! No token is asked, as for `/metrics`: the counter says only that something changed.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use futures_channel::oneshot;
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};

use super::http::{json, text, Answer, OpsState};
use crate::control::Control;

/// The route.
pub(crate) const ROUTE: &str = "/v1/cluster/changes";
/// How long a request is held when it names no `timeout_ms`.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);
/// The longest a request is held, whatever `timeout_ms` it names: each held request takes one
/// of the endpoint's slots (`MAX_CONCURRENT_REQUESTS`).
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// A waiter's registration, for the drive loop: wake `reply` with the counter once it is past
/// `after`.
pub(crate) struct ChangesRequest {
    pub(crate) after: u64,
    pub(crate) reply: oneshot::Sender<u64>,
}

/// The counter, the fingerprint it was last moved or confirmed at, and who waits.
#[derive(Debug)]
pub(crate) struct Changes {
    counter: u64,
    fingerprint: Option<u64>,
    waiters: Vec<(u64, oneshot::Sender<u64>)>,
}

impl Default for Changes {
    fn default() -> Self {
        Changes {
            counter: 1,
            fingerprint: None,
            waiters: Vec::new(),
        }
    }
}

impl Changes {
    /// The counter as it stands.
    pub(crate) fn counter(&self) -> u64 {
        self.counter
    }

    /// Takes the fingerprint now: a different one moves the counter, and every waiter it is
    /// past is answered.
    fn look(&mut self, fingerprint: u64) {
        if self.fingerprint != Some(fingerprint) {
            self.fingerprint = Some(fingerprint);
            self.counter += 1;
        }
        let counter = self.counter;
        for (after, reply) in std::mem::take(&mut self.waiters) {
            if counter > after {
                let _ = reply.send(counter);
            } else if !reply.is_canceled() {
                self.waiters.push((after, reply));
            }
        }
    }

    /// On the drive loop: registers `req` after taking the fingerprint (so a change since the
    /// counter the waiter saw is not missed); answered at once if the counter is past it.
    pub(crate) fn register(&mut self, req: ChangesRequest, fingerprint: u64) {
        self.waiters.push((req.after, req.reply));
        self.look(fingerprint);
    }

    /// On the drive loop, at the end of a turn: only while someone waits, takes the
    /// fingerprint (`fingerprint` is not called otherwise).
    pub(crate) fn turn(&mut self, fingerprint: impl FnOnce() -> u64) {
        if !self.waiters.is_empty() {
            self.look(fingerprint());
        }
    }
}

/// What the counter follows on `engine`, hashed (see the module's doc).
pub(crate) fn fingerprint(engine: &felix_engine::Engine) -> u64 {
    let mut h = DefaultHasher::new();
    engine.is_serving().hash(&mut h);
    engine.cluster_changes().hash(&mut h);
    engine.log_positions().hash(&mut h);
    if let Some(view) = engine.cluster_view() {
        for r in view.replicas() {
            (&r.object, r.shard, r.generation, r.role, r.commit).hash(&mut h);
        }
    }
    h.finish()
}

/// `after` and the wait a request asks for (`None`: a malformed query).
fn parse(query: &str) -> Option<(u64, Duration)> {
    let mut after = 0;
    let mut wait = DEFAULT_WAIT;
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        match kv.split_once('=')? {
            ("after", n) => after = n.parse().ok()?,
            ("timeout_ms", ms) => wait = Duration::from_millis(ms.parse().ok()?),
            _ => return None,
        }
    }
    Some((after, wait.min(MAX_WAIT)))
}

pub(crate) async fn serve(state: &OpsState, req: Request<Incoming>) -> Answer {
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    let Some((after, wait)) = parse(req.uri().query().unwrap_or("")) else {
        return text(
            StatusCode::BAD_REQUEST,
            "expected ?after=N and optionally &timeout_ms=T\n",
        );
    };
    match wait_past(state, after, wait).await {
        Some(changes) => json(
            StatusCode::OK,
            &serde_json::json!({ "changes": changes, "changed": changes > after }),
        ),
        None => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the broker is not running\n",
        ),
    }
}

/// The counter once it is past `after`, or as it stands after `wait` (tokio's clock); `None`
/// when the drive loop is gone.
pub(crate) async fn wait_past(state: &OpsState, after: u64, wait: Duration) -> Option<u64> {
    let (reply, rx) = oneshot::channel();
    state
        .control
        .unbounded_send(Control::Changes(ChangesRequest { after, reply }))
        .ok()?;
    match tokio::time::timeout(wait, rx).await {
        Ok(Ok(n)) => Some(n),
        Ok(Err(_)) => None,
        Err(_) => Some(state.changes.lock().expect("not poisoned").counter()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use futures_channel::mpsc;
    use futures_core::Stream;

    use super::*;

    /// A stand-in drive loop: registers each waiter against the fingerprint `state_now` holds,
    /// and takes it again whenever `turns` says a turn ended.
    fn drive(
        state: Arc<OpsState>,
        mut rx: mpsc::UnboundedReceiver<Control>,
        mut turns: mpsc::UnboundedReceiver<()>,
        state_now: Arc<AtomicU64>,
    ) {
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    c = next(&mut rx) => match c {
                        Some(Control::Changes(req)) => state
                            .changes
                            .lock()
                            .unwrap()
                            .register(req, state_now.load(Ordering::SeqCst)),
                        Some(_) => {}
                        None => return,
                    },
                    t = next(&mut turns) => match t {
                        Some(()) => state
                            .changes
                            .lock()
                            .unwrap()
                            .turn(|| state_now.load(Ordering::SeqCst)),
                        None => return,
                    },
                }
            }
        });
    }

    async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> Option<T> {
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut *rx).poll_next(cx)).await
    }

    fn rig() -> (Arc<OpsState>, mpsc::UnboundedSender<()>, Arc<AtomicU64>) {
        let (state, rx) = OpsState::new();
        let (turn, turns) = mpsc::unbounded();
        let now = Arc::new(AtomicU64::new(7));
        drive(state.clone(), rx, turns, now.clone());
        (state, turn, now)
    }

    #[tokio::test(start_paused = true)]
    async fn a_counter_past_after_is_answered_at_once() {
        let (state, _turn, _) = rig();
        // The first look takes the state's fingerprint: 1 -> 2.
        let first = wait_past(&state, 0, MAX_WAIT).await.unwrap();
        assert_eq!(first, 2);
        let began = tokio::time::Instant::now();
        assert_eq!(wait_past(&state, 1, MAX_WAIT).await, Some(2));
        assert_eq!(began.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_is_held_until_the_state_changes() {
        let (state, turn, now) = rig();
        let seen = wait_past(&state, 0, MAX_WAIT).await.unwrap();
        let waiter = tokio::spawn({
            let state = state.clone();
            async move { wait_past(&state, seen, MAX_WAIT).await }
        });
        // Turns with the same state wake nobody.
        for _ in 0..3 {
            turn.unbounded_send(()).unwrap();
            tokio::task::yield_now().await;
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished());
        now.store(8, Ordering::SeqCst);
        turn.unbounded_send(()).unwrap();
        assert_eq!(waiter.await.unwrap(), Some(seen + 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_between_the_look_and_the_wait_is_not_missed() {
        let (state, _turn, now) = rig();
        let seen = wait_past(&state, 0, MAX_WAIT).await.unwrap();
        // The state moves while nobody waits (no turn takes it)...
        now.store(9, Ordering::SeqCst);
        // ...and the next wait after what was seen is answered at once.
        let began = tokio::time::Instant::now();
        assert_eq!(wait_past(&state, seen, MAX_WAIT).await, Some(seen + 1));
        assert_eq!(began.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unchanged_state_is_answered_at_the_timeout_with_the_same_counter() {
        let (state, _turn, _) = rig();
        let seen = wait_past(&state, 0, MAX_WAIT).await.unwrap();
        let t = Duration::from_millis(1500);
        let waiter = tokio::spawn({
            let state = state.clone();
            async move { wait_past(&state, seen, t).await }
        });
        tokio::time::advance(t - Duration::from_millis(1)).await;
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "answered before the timeout");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(waiter.await.unwrap(), Some(seen));
    }

    #[test]
    fn the_asked_wait_is_capped_at_max_wait_and_defaults() {
        assert_eq!(parse("after=3"), Some((3, DEFAULT_WAIT)));
        assert_eq!(parse(""), Some((0, DEFAULT_WAIT)));
        let at = MAX_WAIT.as_millis();
        assert_eq!(
            parse(&format!("after=1&timeout_ms={at}")),
            Some((1, MAX_WAIT))
        );
        assert_eq!(
            parse(&format!("after=1&timeout_ms={}", at - 1)),
            Some((1, MAX_WAIT - Duration::from_millis(1)))
        );
        assert_eq!(
            parse(&format!("after=1&timeout_ms={}", at + 1)),
            Some((1, MAX_WAIT))
        );
        assert_eq!(parse("after=x"), None);
        assert_eq!(parse("before=1"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_asked_past_the_cap_is_held_for_the_cap_only() {
        let (state, _turn, _) = rig();
        let seen = wait_past(&state, 0, MAX_WAIT).await.unwrap();
        let (_, wait) = parse(&format!("after={seen}&timeout_ms=3600000")).unwrap();
        let waiter = tokio::spawn({
            let state = state.clone();
            async move { wait_past(&state, seen, wait).await }
        });
        tokio::time::advance(MAX_WAIT - Duration::from_millis(1)).await;
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "answered before the cap");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(waiter.await.unwrap(), Some(seen));
    }
}
