//! The drive loop, written once for every runtime: one UDP socket, one timer, one engine, one
//! task, and a file executor on the runtime's blocking pool.
//!
//! Each wake-up does a bounded amount of work: at most [`MAX_RECV_BATCHES_PER_WAKE`] receive
//! calls, or [`MAX_COMPLETIONS_PER_WAKE`] file completions, before the timer and the stop
//! signal get a look in. Outputs are drained after every receive batch, every batch of
//! completions and every timeout, so answers leave in the turn that produced them.

use std::future::{poll_fn, Future};
use std::io::{self, IoSliceMut};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use felix_engine::{Datagram, EcnCodepoint, Engine, FileCompletion, FileOp, Output, Transmit};
use futures_channel::{mpsc, oneshot};
use futures_core::Stream;
use quinn_udp::{RecvMeta, UdpSocketState, BATCH_SIZE};
use tracing::{debug, info, warn};

use crate::control::Control;
use crate::files::FileExecutor;
use crate::runtime::{Interest, Runtime, Timer, UdpSocket};

/// Receive calls per wake-up before yielding to the timer and the stop signal.
const MAX_RECV_BATCHES_PER_WAKE: usize = 64;
/// The largest datagram the endpoint accepts (quinn's default `max_udp_payload_size`).
const MAX_DATAGRAM: usize = 1472;
/// How long a stopping broker keeps answering so its CONNECTION_CLOSE reaches peers whose
/// packets were in flight.
const SHUTDOWN_LINGER: Duration = Duration::from_millis(200);
/// How long a stopping broker waits for its logs to sync what they wrote.
const STORAGE_DRAIN: Duration = Duration::from_secs(10);
/// How long a draining broker keeps serving answers owed before it closes anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long nothing must be owed before a draining broker closes: peers' acknowledgements of
/// the last answers arrive, and requests already on the wire are refused rather than lost.
const DRAIN_QUIET: Duration = Duration::from_millis(100);
/// File completions handled per wake-up before the socket and the timer get a look in.
const MAX_COMPLETIONS_PER_WAKE: usize = 256;

/// One `recvmmsg` of up to [`BATCH_SIZE`] datagrams into `bufs`.
fn recv_batch(
    socket: &impl UdpSocket,
    state: &UdpSocketState,
    bufs: &mut [Vec<u8>],
    metas: &mut [RecvMeta],
) -> io::Result<usize> {
    let mut bufs = bufs.iter_mut();
    let mut iovs: [IoSliceMut<'_>; BATCH_SIZE] =
        std::array::from_fn(|_| IoSliceMut::new(bufs.next().expect("BATCH_SIZE buffers")));
    state.recv(socket.sock_ref(), &mut iovs, metas)
}

/// What ended a wait.
enum Wake {
    /// Stop; `true` drains first (a `shutdown`), `false` stops at once (the handle dropped).
    Stop(bool),
    Received(io::Result<usize>),
    /// A batch on the internal (peer) socket.
    PeerReceived(io::Result<usize>),
    Completed(FileCompletion),
    Timer,
    Control(Control),
}

pub(crate) struct Driver<R: Runtime> {
    runtime: R,
    engine: Engine,
    socket: R::Socket,
    state: UdpSocketState,
    timer: R::Timer,
    /// The deadline `timer` is set to.
    armed: Option<Instant>,
    out: Vec<u8>,
    recv_bufs: Vec<Vec<u8>>,
    metas: Vec<RecvMeta>,
    executor: Option<Arc<FileExecutor>>,
    /// Completions come back from the blocking pool on this channel. The engine bounds how
    /// many ops are out at once (`DurableConfig::max_inflight_file_ops`), which bounds it too.
    done_tx: mpsc::UnboundedSender<FileCompletion>,
    done_rx: mpsc::UnboundedReceiver<FileCompletion>,
    /// Scrapes and rotations from the rest of the process.
    control: Option<mpsc::UnboundedReceiver<Control>>,
    /// The internal socket of a cluster member, with its state and receive buffers.
    peer: Option<PeerSocket<R>>,
    /// Where `/readyz` reads from, and where a cluster's refusal of this node is reported.
    readiness: Option<(
        Arc<crate::ops::http::OpsState>,
        Option<oneshot::Sender<String>>,
    )>,
    /// How long the loop keeps polling the client socket itself after traffic before it
    /// sleeps in the reactor (`limits.busy_poll_us`); zero never spins.
    busy_poll: Duration,
}

struct PeerSocket<R: Runtime> {
    socket: R::Socket,
    state: UdpSocketState,
    bufs: Vec<Vec<u8>>,
    metas: Vec<RecvMeta>,
}

impl<R: Runtime> Driver<R> {
    pub(crate) fn new(
        runtime: R,
        engine: Engine,
        socket: R::Socket,
        state: UdpSocketState,
        executor: Option<Arc<FileExecutor>>,
        control: mpsc::UnboundedReceiver<Control>,
    ) -> Driver<R> {
        let slot = (MAX_DATAGRAM * state.gro_segments()).max(u16::MAX as usize);
        let (done_tx, done_rx) = mpsc::unbounded();
        let timer = runtime.new_timer(Instant::now());
        Driver {
            runtime,
            engine,
            socket,
            state,
            timer,
            armed: None,
            out: Vec::with_capacity(64 * 1024),
            recv_bufs: (0..BATCH_SIZE).map(|_| vec![0u8; slot]).collect(),
            metas: vec![RecvMeta::default(); BATCH_SIZE],
            executor,
            done_tx,
            done_rx,
            control: Some(control),
            peer: None,
            readiness: None,
            busy_poll: Duration::ZERO,
        }
    }

    /// Keep polling the client socket for up to `busy_poll` after traffic before sleeping.
    pub(crate) fn with_busy_poll(mut self, busy_poll: Duration) -> Self {
        self.busy_poll = busy_poll;
        self
    }

    pub(crate) fn with_peer_socket(mut self, peer: Option<(R::Socket, UdpSocketState)>) -> Self {
        self.peer = peer.map(|(socket, state)| PeerSocket {
            socket,
            state,
            bufs: (0..BATCH_SIZE)
                .map(|_| vec![0u8; u16::MAX as usize])
                .collect(),
            metas: vec![RecvMeta::default(); BATCH_SIZE],
        });
        self
    }

    pub(crate) fn with_readiness(
        mut self,
        ops: Arc<crate::ops::http::OpsState>,
        failed: oneshot::Sender<String>,
    ) -> Self {
        self.readiness = Some((ops, Some(failed)));
        self
    }

    /// A cluster member reports readiness as it joins; a refused one stops. True to stop.
    fn check_cluster(&mut self) -> bool {
        if self.peer.is_none() {
            return false;
        }
        let Some((ops, failed)) = self.readiness.as_mut() else {
            return false;
        };
        if let Some(why) = self.engine.cluster_error() {
            tracing::error!(reason = why, "the cluster refused this node; stopping");
            ops.set_ready(false);
            if let Some(tx) = failed.take() {
                let _ = tx.send(why.to_owned());
            }
            return true;
        }
        ops.set_ready(self.engine.is_serving());
        ops.set_metadata_applied(self.engine.cluster_changes());
        false
    }

    /// Wakes the change counter's waiters (`GET /v1/cluster/changes`) if what they wait on
    /// moved this turn; nothing is looked at while nobody waits.
    fn look_for_changes(&mut self) {
        if let Some((ops, _)) = &self.readiness {
            let engine = &self.engine;
            ops.changes
                .lock()
                .expect("not poisoned")
                .turn(|| crate::ops::changes::fingerprint(engine));
        }
    }

    /// Startup recovery: performs file ops until every log on disk is open. Fails, naming
    /// the file, if one is corrupt.
    pub(crate) async fn recover(&mut self) -> io::Result<()> {
        loop {
            self.flush().await;
            if let Some(e) = self.engine.storage_error() {
                return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_owned()));
            }
            if self.engine.is_ready() {
                return Ok(());
            }
            // Only file completions move recovery on (no timers, no datagrams yet); control
            // requests are served meanwhile, so /metrics works while the logs are read.
            let wake = poll_fn(|cx| {
                if let Poll::Ready(c) = Pin::new(&mut self.done_rx).poll_next(cx) {
                    return Poll::Ready(c.map(Wake::Completed));
                }
                self.poll_control(cx)
            })
            .await;
            match wake {
                Some(Wake::Completed(c)) => self.completed(c),
                Some(Wake::Control(c)) => self.control(c),
                Some(_) => {}
                None => return Err(io::Error::other("the file executor stopped")),
            }
        }
    }

    /// Runs until `stop` fires (or its sender is dropped), then closes every connection
    /// and flushes.
    pub(crate) async fn run(mut self, mut stop: oneshot::Receiver<()>) {
        // Whether the last turn had work that a client is likely to follow up on soon.
        let mut busy = false;
        loop {
            self.flush().await;
            if self.check_cluster() {
                break;
            }
            self.look_for_changes();
            let wake = if busy && !self.busy_poll.is_zero() {
                // Whatever the reactor already holds comes first, so a spin never starves
                // the peer socket, the timer, scrapes or the stop signal.
                match self.wait_now(&mut stop).await {
                    Some(wake) => wake,
                    None if self.spin().await => continue,
                    None => self.wait(Some(&mut stop), true, None).await,
                }
            } else {
                self.wait(Some(&mut stop), true, None).await
            };
            match wake {
                Wake::Stop(drain) => {
                    if drain {
                        self.drain().await;
                    }
                    break;
                }
                other => {
                    busy = !matches!(other, Wake::Timer | Wake::Control(_));
                    self.handle(other).await
                }
            }
        }
        self.stop().await
    }

    /// After traffic, polls the sockets and the completions directly for up to `busy_poll`
    /// before sleeping: a request-answer client's next datagram (or a follower's report, a
    /// leader's shipment) usually comes within tens of microseconds, and being awake for it
    /// saves a reactor wake-up (an `epoll_wait` return and a context switch) per round trip.
    /// `true` if it found work.
    async fn spin(&mut self) -> bool {
        if self.busy_poll.is_zero() {
            return false;
        }
        let began = Instant::now();
        let engine_due = self.engine.poll_timeout();
        loop {
            match self.try_recv() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                result => {
                    self.received(result).await;
                    return true;
                }
            }
            match self.try_peer_recv() {
                None => {}
                Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
                Some(result) => {
                    self.peer_received(result).await;
                    return true;
                }
            }
            if let Ok(c) = self.done_rx.try_recv() {
                self.completed(c);
                return true;
            }
            let now = Instant::now();
            if now >= began + self.busy_poll || engine_due.is_some_and(|at| at <= now) {
                return false;
            }
            // Another thread that needs this core (a client on the same machine, the file
            // pool) gets it; with none runnable this returns at once.
            std::thread::yield_now();
        }
    }

    /// One receive straight from the client socket, bypassing the reactor (`WouldBlock` if
    /// empty).
    fn try_recv(&mut self) -> io::Result<usize> {
        let Driver {
            socket,
            state,
            recv_bufs,
            metas,
            ..
        } = self;
        recv_batch(socket, state, recv_bufs, metas)
    }

    /// The same on the peer socket; `None` without one.
    fn try_peer_recv(&mut self) -> Option<io::Result<usize>> {
        let PeerSocket {
            socket,
            state,
            bufs,
            metas,
        } = self.peer.as_mut()?;
        Some(recv_batch(socket, state, bufs, metas))
    }

    /// Graceful drain before the stop: new work is refused `draining`, answers owed are
    /// delivered (held ones once their logs sync), and the loop goes on until nothing has
    /// been owed for [`DRAIN_QUIET`] or [`DRAIN_TIMEOUT`] passes.
    async fn drain(&mut self) {
        let began = Instant::now();
        self.engine.drain(began);
        self.flush().await;
        let deadline = began + DRAIN_TIMEOUT;
        let mut quiet_since: Option<Instant> = None;
        loop {
            let now = Instant::now();
            if self.engine.connection_count() == 0 && self.engine.is_drained() {
                break;
            }
            if self.engine.is_drained() {
                let since = *quiet_since.get_or_insert(now);
                if now >= since + DRAIN_QUIET {
                    break;
                }
            } else {
                quiet_since = None;
            }
            if now >= deadline {
                warn!("drain deadline passed with answers still owed");
                break;
            }
            let until = quiet_since.map_or(deadline, |s| (s + DRAIN_QUIET).min(deadline));
            let wake = self.wait(None, true, Some(until)).await;
            self.handle(wake).await;
            self.flush().await;
        }
        info!(took = ?began.elapsed(), "drained");
    }

    async fn stop(mut self) {
        let stats = self.engine.stats();
        info!(
            runtime = R::NAME,
            connections = self.engine.connection_count(),
            ?stats,
            "shutting down"
        );
        if let Some(files) = &self.executor {
            info!(stats = ?files.stats(), "file executor");
        }
        self.engine.shutdown(Instant::now());
        self.flush().await;
        let until = Instant::now() + SHUTDOWN_LINGER;
        while self.engine.connection_count() > 0 {
            match self.wait(None, true, Some(until)).await {
                Wake::Timer if Instant::now() >= until => break,
                other => self.handle(other).await,
            }
            self.flush().await;
        }
        // What the logs wrote is synced before the process goes.
        let until = Instant::now() + STORAGE_DRAIN;
        while !self.engine.storage_idle() {
            match self.wait(None, false, Some(until)).await {
                Wake::Timer if Instant::now() >= until => {
                    warn!("stopping before the logs finished syncing");
                    break;
                }
                // The socket is not watched here (`wait(.., false, ..)`).
                Wake::Received(_) => {}
                other => self.handle(other).await,
            }
            self.flush().await;
        }
    }

    /// Waits for the first of: `stop`, a received datagram batch (when `socket`), a file
    /// completion, the engine's deadline or `until`. One timer serves both deadlines.
    async fn wait(
        &mut self,
        mut stop: Option<&mut oneshot::Receiver<()>>,
        socket: bool,
        until: Option<Instant>,
    ) -> Wake {
        let deadline = match (self.engine.poll_timeout(), until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(at) = deadline {
            // Re-arming is not free (async-io wakes its reactor thread for every insert), and
            // while traffic flows the engine's deadline mostly moves later. So an earlier
            // timer stays armed and fires early; that wake re-arms for the real deadline.
            if self.armed.is_none_or(|armed| at < armed) {
                self.timer.reset(at);
                self.armed = Some(at);
            }
        }
        poll_fn(|cx| self.poll_wake(&mut stop, socket, cx)).await
    }

    /// What the reactor already holds, without sleeping: `None` when nothing is ready.
    async fn wait_now(&mut self, stop: &mut oneshot::Receiver<()>) -> Option<Wake> {
        let mut stop = Some(stop);
        poll_fn(|cx| match self.poll_wake(&mut stop, true, cx) {
            Poll::Ready(wake) => Poll::Ready(Some(wake)),
            Poll::Pending => Poll::Ready(None),
        })
        .await
    }

    /// One look at every source [`wait`](Self::wait) waits on, in its order.
    fn poll_wake(
        &mut self,
        stop: &mut Option<&mut oneshot::Receiver<()>>,
        socket: bool,
        cx: &mut Context<'_>,
    ) -> Poll<Wake> {
        if let Some(stop) = stop.as_deref_mut() {
            // A value asks for a drain; a dropped sender for an immediate stop.
            if let Poll::Ready(sent) = Pin::new(stop).poll(cx) {
                return Poll::Ready(Wake::Stop(sent.is_ok()));
            }
        }
        // Completions before datagrams: under load the socket is nearly always readable,
        // and a completion left waiting behind it idles a log's write or sync lane.
        if let Poll::Ready(Some(c)) = Pin::new(&mut self.done_rx).poll_next(cx) {
            return Poll::Ready(Wake::Completed(c));
        }
        if socket {
            if let Poll::Ready(result) = self.poll_recv(cx) {
                return Poll::Ready(Wake::Received(result));
            }
            if let Poll::Ready(result) = self.poll_peer_recv(cx) {
                return Poll::Ready(Wake::PeerReceived(result));
            }
        }
        if let Poll::Ready(Some(scrape)) = self.poll_control(cx) {
            return Poll::Ready(scrape);
        }
        if self.armed.is_some() && self.timer.poll_expired(cx).is_ready() {
            self.armed = None;
            return Poll::Ready(Wake::Timer);
        }
        Poll::Pending
    }

    /// Serves one wake; a stop is the caller's to act on, so it is ignored here.
    async fn handle(&mut self, wake: Wake) {
        match wake {
            Wake::Received(result) => self.received(result).await,
            Wake::PeerReceived(result) => self.peer_received(result).await,
            Wake::Completed(c) => self.completed(c),
            Wake::Timer => self.timer_fired(),
            Wake::Control(c) => self.control(c),
            Wake::Stop(_) => {}
        }
    }

    fn poll_control(&mut self, cx: &mut Context<'_>) -> Poll<Option<Wake>> {
        if let Some(control) = self.control.as_mut() {
            match Pin::new(control).poll_next(cx) {
                Poll::Ready(Some(c)) => return Poll::Ready(Some(Wake::Control(c))),
                // Every sender is gone; stop polling the channel.
                Poll::Ready(None) => self.control = None,
                Poll::Pending => {}
            }
        }
        Poll::Pending
    }

    fn control(&mut self, control: Control) {
        match control {
            // The scraper may have timed out and gone; nothing to do then.
            Control::Scrape(reply) => {
                let _ = reply.send(self.engine.metrics());
            }
            Control::TlsIdentity(identity) => match self.engine.set_tls_identity(identity) {
                Ok(()) => info!("serving the rotated certificate to new connections"),
                Err(e) => warn!(error = %e, "refused the rotated certificate; the old one stays"),
            },
            Control::Jwks(doc) => match self.engine.set_jwks(&doc) {
                Ok(()) => info!("verifying tokens against the changed JWKS"),
                Err(e) => warn!(error = %e, "refused the changed JWKS; the old keys stay"),
            },
            Control::DeleteStream(req) => crate::ops::stream_delete::run(&mut self.engine, req),
            Control::Abandon(req) => crate::ops::abandon::run(&mut self.engine, req),
            Control::Admin(job) => job(&mut self.engine, std::time::Instant::now()),
            Control::Changes(req) => {
                if let Some((ops, _)) = &self.readiness {
                    let fingerprint = crate::ops::changes::fingerprint(&self.engine);
                    ops.changes
                        .lock()
                        .expect("not poisoned")
                        .register(req, fingerprint);
                }
            }
        }
    }

    /// The timer may have been armed for an earlier deadline than the engine's current one.
    fn timer_fired(&mut self) {
        let now = Instant::now();
        if self.engine.poll_timeout().is_some_and(|at| at <= now) {
            self.engine.handle_timeout(now);
        }
    }

    /// One `recvmmsg` (or `recvmsg` with GRO) into the receive buffers, when readable.
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let Driver {
            socket,
            state,
            recv_bufs,
            metas,
            ..
        } = self;
        socket.poll_recv_batch(cx, BATCH_SIZE, || {
            recv_batch(socket, state, recv_bufs, metas)
        })
    }

    fn poll_peer_recv(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let Some(PeerSocket {
            socket,
            state,
            bufs,
            metas,
        }) = self.peer.as_mut()
        else {
            return Poll::Pending;
        };
        socket.poll_io(cx, Interest::Read, || {
            recv_batch(socket, state, bufs, metas)
        })
    }

    /// Peer traffic is light (raft, forwards): one batch per wake, then back to clients.
    async fn peer_received(&mut self, result: io::Result<usize>) {
        let n = match result {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return,
            Err(e) => {
                warn!(error = %e, "internal UDP receive failed");
                return;
            }
        };
        let now = Instant::now();
        let Some(peer) = self.peer.as_ref() else {
            return;
        };
        let datagrams: Vec<Datagram> = (0..n)
            .map(|i| {
                let meta = peer.metas[i];
                Datagram {
                    remote: meta.addr,
                    local_ip: meta.dst_ip,
                    ecn: meta.ecn.and_then(|e| EcnCodepoint::from_bits(e as u8)),
                    data: BytesMut::from(&peer.bufs[i][..meta.len]),
                    segment_size: (meta.stride < meta.len).then_some(meta.stride),
                }
            })
            .collect();
        for d in datagrams {
            self.engine.handle_peer_datagram(now, d);
        }
        self.flush().await;
    }

    /// Feeds a received batch and whatever else the socket holds, up to the per-wake bound,
    /// sending the answers to each batch before reading on.
    async fn received(&mut self, first: io::Result<usize>) {
        let mut result = first;
        for _ in 0..MAX_RECV_BATCHES_PER_WAKE {
            match result {
                Ok(n) => {
                    self.feed(n);
                    // Completions between batches, not only between wakes: one burst of
                    // publishes can fill a whole wake, and a log whose write or sync finished
                    // meanwhile would sit idle behind it, so that every record of the burst
                    // then waits for one late sync and the next burst arrives as one too.
                    if let Ok(c) = self.done_rx.try_recv() {
                        self.completed(c);
                    }
                    self.flush().await;
                }
                // ICMP errors surfacing on an unconnected socket concern one peer only.
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
                Err(e) => {
                    warn!(error = %e, "UDP receive failed");
                    return;
                }
            }
            // Read on only while the socket has more; `Pending` leaves the reactor armed.
            match poll_fn(|cx| Poll::Ready(self.poll_recv(cx))).await {
                Poll::Ready(next) => result = next,
                Poll::Pending => return,
            }
        }
    }

    fn feed(&mut self, n: usize) {
        let now = Instant::now();
        for i in 0..n {
            let meta = self.metas[i];
            let data = BytesMut::from(&self.recv_bufs[i][..meta.len]);
            self.engine.handle_datagram(
                now,
                Datagram {
                    remote: meta.addr,
                    local_ip: meta.dst_ip,
                    ecn: meta.ecn.and_then(|e| EcnCodepoint::from_bits(e as u8)),
                    data,
                    segment_size: (meta.stride < meta.len).then_some(meta.stride),
                },
            );
        }
    }

    /// Feeds one completion and whatever else has arrived, up to the per-wake bound.
    fn completed(&mut self, first: FileCompletion) {
        self.engine.handle_file_completion(Instant::now(), first);
        for _ in 1..MAX_COMPLETIONS_PER_WAKE {
            match self.done_rx.try_recv() {
                Ok(c) => self.engine.handle_file_completion(Instant::now(), c),
                Err(_) => break,
            }
        }
    }

    /// Runs a file op on the blocking pool; its completion comes back on the channel.
    fn submit(&self, op: FileOp) {
        let done = self.done_tx.clone();
        match &self.executor {
            Some(executor) => {
                let executor = executor.clone();
                self.runtime.spawn_blocking(move || {
                    let _ = done.unbounded_send(executor.execute(op));
                });
            }
            None => {
                // Only a durable engine asks for file ops, and `start` gives it a root.
                let error = felix_engine::FileError::new(
                    felix_engine::FileErrorKind::Other,
                    "no storage directory is configured",
                );
                let _ = done.unbounded_send(FileCompletion {
                    id: op.id,
                    result: Err(error),
                });
            }
        }
    }

    /// Sends every output the engine has. A failed send is not an error: UDP is lossy
    /// anyway and QUIC retransmits.
    async fn flush(&mut self) {
        while let Some(output) = self.engine.poll_output(Instant::now(), &mut self.out) {
            match output {
                Output::Transmit(t) => self.send(&t).await,
                Output::FileOp(op) => self.submit(op),
                Output::PeerTransmit(t) => self.send_peer(&t).await,
                // The engine and this loop are built together; a new output kind is wired here
                // in the same change that adds it.
                other => unreachable!("an engine output this loop does not handle: {other:?}"),
            }
        }
    }

    async fn send(&self, t: &Transmit) {
        let contents = &self.out[..t.size];
        // GSO can be found broken at run time; then send the segments one by one.
        match t.segment_size {
            Some(segment) if self.state.max_gso_segments() < 2 => {
                for one in contents.chunks(segment) {
                    self.send_one(t, one, None).await;
                }
            }
            segment => self.send_one(t, contents, segment).await,
        }
    }

    /// Sends on the internal socket: a GSO train whole where the socket takes them, else
    /// one datagram at a time.
    async fn send_peer(&self, t: &Transmit) {
        let Some(peer) = self.peer.as_ref() else {
            return;
        };
        let contents = &self.out[..t.size];
        // GSO can be found broken at run time; then the segments go one by one.
        let (step, segment_size) = match t.segment_size {
            Some(segment) if peer.state.max_gso_segments() < 2 => (segment, None),
            segment => (contents.len().max(1), segment),
        };
        for one in contents.chunks(step) {
            let transmit = quinn_udp::Transmit {
                destination: t.destination,
                ecn: t
                    .ecn
                    .and_then(|e| quinn_udp::EcnCodepoint::from_bits(e as u8)),
                contents: one,
                segment_size,
                src_ip: t.src_ip,
            };
            let sent = poll_fn(|cx| {
                peer.socket.poll_io(cx, Interest::Write, || {
                    peer.state.send(peer.socket.sock_ref(), &transmit)
                })
            })
            .await;
            if let Err(e) = sent {
                debug!(error = %e, destination = %t.destination, "internal UDP send failed");
            }
        }
    }

    /// Sends one datagram (or one GSO train), waiting while the socket buffer is full.
    async fn send_one(&self, t: &Transmit, contents: &[u8], segment_size: Option<usize>) {
        let transmit = quinn_udp::Transmit {
            destination: t.destination,
            ecn: t
                .ecn
                .and_then(|e| quinn_udp::EcnCodepoint::from_bits(e as u8)),
            contents,
            segment_size,
            src_ip: t.src_ip,
        };
        let (socket, state) = (&self.socket, &self.state);
        let sent = poll_fn(|cx| {
            socket.poll_io(cx, Interest::Write, || {
                state.send(socket.sock_ref(), &transmit)
            })
        })
        .await;
        if let Err(e) = sent {
            // UDP is lossy anyway; QUIC retransmits.
            debug!(error = %e, destination = %t.destination, "UDP send failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket as StdSocket;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    use bytes::Bytes;
    use felix_engine::{AuthConfig, EngineConfig, FileOutput, OpId};

    use super::*;

    /// A runtime whose socket hands the driver a fixed number of receive batches and then
    /// reports "not readable", so one call to `received` runs to a known end.
    #[derive(Clone)]
    struct Scripted;

    impl Runtime for Scripted {
        const NAME: &'static str = "scripted";
        type Socket = ScriptedSocket;
        type Timer = IdleTimer;

        fn wrap_udp_socket(&self, _: StdSocket) -> io::Result<ScriptedSocket> {
            Err(io::Error::other("the test builds its socket itself"))
        }

        fn new_timer(&self, _: Instant) -> IdleTimer {
            IdleTimer
        }

        fn spawn(&self, _: impl Future<Output = ()> + Send + 'static) {
            unreachable!("the driver under test spawns no tasks");
        }

        fn spawn_blocking(&self, work: impl FnOnce() + Send + 'static) {
            work();
        }
    }

    struct IdleTimer;

    impl Timer for IdleTimer {
        fn reset(&mut self, _: Instant) {}

        fn poll_expired(&mut self, _: &mut Context<'_>) -> Poll<()> {
            Poll::Pending
        }
    }

    struct Script {
        /// Reads still to be answered with a datagram; after them the socket is drained.
        batches_left: usize,
        /// Injected into the driver's completion channel during the first read, as if a
        /// sync finished while the burst was being received.
        completion: Option<(mpsc::UnboundedSender<FileCompletion>, FileCompletion)>,
        /// At each read: had the driver handled the completion by then?
        handled_at_read: Vec<bool>,
    }

    struct ScriptedSocket {
        socket: StdSocket,
        /// Sends the datagram each read receives, just before that read.
        peer: StdSocket,
        script: Mutex<Script>,
        handled: Arc<AtomicBool>,
    }

    /// Runs a socket op, waiting out a datagram the loopback has not delivered yet. Bounded,
    /// and only a wait: what the test asserts does not depend on how long it takes.
    fn until_ready<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match op() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                result => return result,
            }
        }
    }

    impl UdpSocket for ScriptedSocket {
        fn sock_ref(&self) -> quinn_udp::UdpSockRef<'_> {
            (&self.socket).into()
        }

        fn poll_io<T>(
            &self,
            _: &mut Context<'_>,
            interest: Interest,
            op: impl FnMut() -> io::Result<T>,
        ) -> Poll<io::Result<T>> {
            if interest == Interest::Write {
                return Poll::Ready(until_ready(op));
            }
            let mut script = self.script.lock().unwrap();
            if script.batches_left == 0 {
                // Drained. No waker is kept: the test never waits on the socket.
                return Poll::Pending;
            }
            script.batches_left -= 1;
            script
                .handled_at_read
                .push(self.handled.load(Ordering::SeqCst));
            if let Some((done, completion)) = script.completion.take() {
                done.unbounded_send(completion).unwrap();
            }
            // One datagram per read, so each read is exactly one batch.
            let to = self.socket.local_addr()?;
            self.peer.send_to(&[0u8; 8], to)?;
            Poll::Ready(until_ready(op))
        }
    }

    /// The bytes of the injected completion: dropped, and so marked handled, once the
    /// engine has taken the completion (an in-memory engine keeps none).
    struct Witness(Arc<AtomicBool>);

    impl AsRef<[u8]> for Witness {
        fn as_ref(&self) -> &[u8] {
            &[]
        }
    }

    impl Drop for Witness {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// Polls once: the scripted socket never leaves the driver waiting.
    fn poll_once<F: Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        match f
            .as_mut()
            .poll(&mut Context::from_waker(std::task::Waker::noop()))
        {
            Poll::Ready(out) => out,
            Poll::Pending => panic!("the driver waited on the scripted runtime"),
        }
    }

    /// Pins that a file completion arriving during a burst is handled after the receive
    /// batch in hand and before the next is read: left until the wake ends, a finished sync
    /// idles its log's sync lane and publishes move as one convoy (docs/durability.md,
    /// "Session 3").
    /// A driver over an in-memory engine and a scripted socket that answers `batches` reads
    /// through the reactor and then reports "not readable".
    fn scripted_driver(batches: usize) -> (Driver<Scripted>, Arc<AtomicBool>) {
        let socket = StdSocket::bind("127.0.0.1:0").unwrap();
        socket.set_nonblocking(true).unwrap();
        let state = UdpSocketState::new((&socket).into()).unwrap();
        let handled = Arc::new(AtomicBool::new(false));
        let scripted = ScriptedSocket {
            socket,
            peer: StdSocket::bind("127.0.0.1:0").unwrap(),
            script: Mutex::new(Script {
                batches_left: batches,
                completion: None,
                handled_at_read: Vec::new(),
            }),
            handled: handled.clone(),
        };
        let identity = crate::tls::generate(&[]).unwrap().identity;
        let config = EngineConfig::new(identity, AuthConfig::Dev { seed: [7; 32] }, [9; 32]);
        let engine = Engine::new(config, Instant::now(), 1_767_225_600_000_000).unwrap();
        let (_control_tx, control) = mpsc::unbounded();
        let driver = Driver::new(Scripted, engine, scripted, state, None, control);
        (driver, handled)
    }

    /// Sends one datagram to the driver's client socket, as a client would.
    fn send_to_driver(driver: &Driver<Scripted>) {
        let to = driver.socket.socket.local_addr().unwrap();
        driver.socket.peer.send_to(&[0u8; 8], to).unwrap();
    }

    /// Pins busy polling: after traffic, a datagram the reactor has not reported (the
    /// scripted socket never does here) is taken by the spin itself, so no wake-up is needed.
    #[test]
    fn a_spin_takes_a_datagram_the_reactor_has_not_reported() {
        let (driver, _) = scripted_driver(0);
        // Long enough never to end before loopback delivers; the spin returns on arrival.
        let mut driver = driver.with_busy_poll(Duration::from_secs(30));
        send_to_driver(&driver);
        assert!(poll_once(driver.spin()), "the spin found the datagram");
        let err = driver.try_recv().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "it was consumed");
    }

    /// With busy polling off (the zero setting), the loop goes straight to the reactor.
    #[test]
    fn a_zero_busy_poll_never_spins() {
        let (mut driver, _) = scripted_driver(0);
        send_to_driver(&driver);
        assert!(!poll_once(driver.spin()));
        // The datagram is still there for the reactor's read.
        assert_eq!(until_ready(|| driver.try_recv()).unwrap(), 1);
    }

    /// Between spins the loop looks at every other source without sleeping: a completion
    /// is served first, and with nothing ready the look returns at once.
    #[test]
    fn the_look_before_a_spin_serves_what_is_ready_and_never_sleeps() {
        let (mut driver, _) = scripted_driver(0);
        let (stop_tx, mut stop) = oneshot::channel::<()>();
        assert!(poll_once(driver.wait_now(&mut stop)).is_none());
        let completion = FileCompletion {
            id: OpId(u64::MAX),
            result: Ok(FileOutput::Data(Bytes::new())),
        };
        driver.done_tx.unbounded_send(completion).unwrap();
        assert!(matches!(
            poll_once(driver.wait_now(&mut stop)),
            Some(Wake::Completed(_))
        ));
        drop(stop_tx);
        assert!(matches!(
            poll_once(driver.wait_now(&mut stop)),
            Some(Wake::Stop(false))
        ));
    }

    /// Pins that a file completion arriving during a burst is handled after the receive
    /// batch in hand and before the next is read: left until the wake ends, a finished sync
    /// idles its log's sync lane and publishes move as one convoy (docs/durability.md,
    /// "Session 3").
    #[test]
    fn a_completion_is_handled_between_receive_batches() {
        let (mut driver, handled) = scripted_driver(3);
        // An id the engine never issued: an in-memory engine takes it and does nothing.
        let completion = FileCompletion {
            id: OpId(u64::MAX),
            result: Ok(FileOutput::Data(Bytes::from_owner(Witness(
                handled.clone(),
            )))),
        };
        driver.socket.script.lock().unwrap().completion =
            Some((driver.done_tx.clone(), completion));

        poll_once(async {
            let Poll::Ready(first) = poll_fn(|cx| Poll::Ready(driver.poll_recv(cx))).await else {
                panic!("the first batch was not readable");
            };
            driver.received(first).await;
        });

        let seen = driver.socket.script.lock().unwrap().handled_at_read.clone();
        // Read 1 brings the completion; reads 2 and 3 come after it was handled.
        assert_eq!(seen, [false, true, true]);
    }
}
