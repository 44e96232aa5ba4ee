//! The drive loop: one UDP socket, one timer, one engine, one task, and a file executor on
//! tokio's blocking pool.
//!
//! Each wake-up does a bounded amount of work: at most [`MAX_RECV_BATCHES_PER_WAKE`] receive
//! calls, or [`MAX_COMPLETIONS_PER_WAKE`] file completions, before the timer and the stop
//! signal get a look in. Outputs are drained after every receive batch, every batch of
//! completions and every timeout, so answers leave in the turn that produced them.

use std::future::pending;
use std::io::{self, IoSliceMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use felix_engine::{Datagram, EcnCodepoint, Engine, FileCompletion, FileOp, Output, Transmit};
use quinn_udp::{RecvMeta, UdpSocketState, BATCH_SIZE};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::files::FileExecutor;

/// Receive calls per wake-up before yielding to the timer and the stop signal.
const MAX_RECV_BATCHES_PER_WAKE: usize = 64;
/// The largest datagram the endpoint accepts (quinn's default `max_udp_payload_size`).
const MAX_DATAGRAM: usize = 1472;
/// How long a stopping broker keeps answering so its CONNECTION_CLOSE reaches peers whose
/// packets were in flight.
const SHUTDOWN_LINGER: Duration = Duration::from_millis(200);
/// How long a stopping broker waits for its logs to sync what they wrote.
const STORAGE_DRAIN: Duration = Duration::from_secs(10);
/// File completions handled per wake-up before the socket and the timer get a look in.
const MAX_COMPLETIONS_PER_WAKE: usize = 256;

/// Where file ops run and how their completions come back. The engine bounds how many are
/// out at once (`DurableConfig::max_inflight_file_ops`), which bounds this channel too.
struct Files {
    executor: Option<Arc<FileExecutor>>,
    done_tx: mpsc::UnboundedSender<FileCompletion>,
    done_rx: mpsc::UnboundedReceiver<FileCompletion>,
}

pub(crate) struct Driver {
    pub(crate) engine: Engine,
    pub(crate) socket: UdpSocket,
    pub(crate) state: UdpSocketState,
    out: Vec<u8>,
    recv_bufs: Vec<Vec<u8>>,
    metas: Vec<RecvMeta>,
    files: Files,
}

impl Driver {
    pub(crate) fn new(
        engine: Engine,
        socket: UdpSocket,
        state: UdpSocketState,
        executor: Option<Arc<FileExecutor>>,
    ) -> Driver {
        let slot = (MAX_DATAGRAM * state.gro_segments()).max(u16::MAX as usize);
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Driver {
            engine,
            socket,
            state,
            out: Vec::with_capacity(64 * 1024),
            recv_bufs: (0..BATCH_SIZE).map(|_| vec![0u8; slot]).collect(),
            metas: vec![RecvMeta::default(); BATCH_SIZE],
            files: Files {
                executor,
                done_tx,
                done_rx,
            },
        }
    }

    /// Startup recovery: performs file ops until every log on disk is open. Fails, naming
    /// the file, if one is corrupt.
    pub(crate) async fn recover(&mut self) -> io::Result<()> {
        loop {
            self.flush().await?;
            if let Some(e) = self.engine.storage_error() {
                return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_owned()));
            }
            if self.engine.is_ready() {
                return Ok(());
            }
            match self.files.done_rx.recv().await {
                Some(c) => self.completed(c),
                None => return Err(io::Error::other("the file executor stopped")),
            }
        }
    }

    /// Feeds one completion and whatever else has arrived, up to the per-wake bound.
    fn completed(&mut self, first: FileCompletion) {
        self.engine.handle_file_completion(Instant::now(), first);
        for _ in 1..MAX_COMPLETIONS_PER_WAKE {
            match self.files.done_rx.try_recv() {
                Ok(c) => self.engine.handle_file_completion(Instant::now(), c),
                Err(_) => break,
            }
        }
    }

    /// Runs a file op on the blocking pool; its completion comes back on the channel.
    fn submit(&self, op: FileOp) {
        let done = self.files.done_tx.clone();
        match &self.files.executor {
            Some(executor) => {
                let executor = executor.clone();
                tokio::task::spawn_blocking(move || {
                    let _ = done.send(executor.execute(op));
                });
            }
            None => {
                // Only a durable engine asks for file ops, and `start` gives it a root.
                let error = felix_engine::FileError::new(
                    felix_engine::FileErrorKind::Other,
                    "no storage directory is configured",
                );
                let _ = done.send(FileCompletion {
                    id: op.id,
                    result: Err(error),
                });
            }
        }
    }

    /// Runs until `stop` flips to true, then closes every connection and flushes.
    pub(crate) async fn run(mut self, mut stop: watch::Receiver<bool>) -> io::Result<()> {
        loop {
            self.flush().await?;
            if *stop.borrow() {
                break;
            }
            let deadline = self.engine.poll_timeout();
            tokio::select! {
                biased;
                changed = stop.changed() => {
                    // A dropped sender means the handle is gone: stop as well.
                    if changed.is_err() || *stop.borrow() {
                        break;
                    }
                }
                ready = self.socket.readable() => {
                    ready?;
                    self.receive().await?;
                }
                Some(c) = self.files.done_rx.recv() => self.completed(c),
                _ = sleep_until(deadline) => {
                    self.engine.handle_timeout(Instant::now());
                }
            }
        }
        self.stop().await
    }

    async fn stop(mut self) -> io::Result<()> {
        let stats = self.engine.stats();
        info!(
            connections = self.engine.connection_count(),
            ?stats,
            "shutting down"
        );
        if let Some(files) = &self.files.executor {
            info!(stats = ?files.stats(), "file executor");
        }
        self.engine.shutdown(Instant::now());
        self.flush().await?;
        let until = tokio::time::Instant::now() + SHUTDOWN_LINGER;
        while self.engine.connection_count() > 0 {
            let deadline = self.engine.poll_timeout();
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(until) => break,
                ready = self.socket.readable() => {
                    ready?;
                    self.receive().await?;
                }
                Some(c) = self.files.done_rx.recv() => self.completed(c),
                _ = sleep_until(deadline) => self.engine.handle_timeout(Instant::now()),
            }
            self.flush().await?;
        }
        // What the logs wrote is synced before the process goes.
        let until = tokio::time::Instant::now() + STORAGE_DRAIN;
        while !self.engine.storage_idle() {
            let deadline = self.engine.poll_timeout();
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(until) => {
                    warn!("stopping before the logs finished syncing");
                    break;
                }
                Some(c) = self.files.done_rx.recv() => self.completed(c),
                _ = sleep_until(deadline) => self.engine.handle_timeout(Instant::now()),
            }
            self.flush().await?;
        }
        Ok(())
    }

    /// Reads whatever the socket holds, feeding each datagram batch to the engine and
    /// sending its answers before reading on.
    async fn receive(&mut self) -> io::Result<()> {
        for _ in 0..MAX_RECV_BATCHES_PER_WAKE {
            let mut iovs: Vec<IoSliceMut<'_>> = self
                .recv_bufs
                .iter_mut()
                .map(|b| IoSliceMut::new(b))
                .collect();
            let (socket, state, metas) = (&self.socket, &self.state, &mut self.metas);
            let result = socket.try_io(Interest::READABLE, || {
                state.recv(socket.into(), &mut iovs, metas)
            });
            drop(iovs);
            let n = match result {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                // ICMP errors surfacing on an unconnected socket concern one peer only.
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => continue,
                Err(e) => {
                    warn!(error = %e, "UDP receive failed");
                    return Ok(());
                }
            };
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
            self.flush().await?;
        }
        Ok(())
    }

    /// Sends every output the engine has.
    async fn flush(&mut self) -> io::Result<()> {
        loop {
            let Some(output) = self.engine.poll_output(Instant::now(), &mut self.out) else {
                return Ok(());
            };
            match output {
                Output::Transmit(t) => self.send(t).await?,
                Output::FileOp(op) => self.submit(op),
            }
        }
    }

    async fn send(&self, t: Transmit) -> io::Result<()> {
        let contents = &self.out[..t.size];
        // GSO can be found broken at run time; then send the segments one by one.
        match t.segment_size {
            Some(segment) if self.state.max_gso_segments() < 2 => {
                for one in contents.chunks(segment) {
                    self.send_one(&t, one, None).await?;
                }
                Ok(())
            }
            segment => self.send_one(&t, contents, segment).await,
        }
    }

    async fn send_one(
        &self,
        t: &Transmit,
        contents: &[u8],
        segment_size: Option<usize>,
    ) -> io::Result<()> {
        let transmit = quinn_udp::Transmit {
            destination: t.destination,
            ecn: t
                .ecn
                .and_then(|e| quinn_udp::EcnCodepoint::from_bits(e as u8)),
            contents,
            segment_size,
            src_ip: t.src_ip,
        };
        loop {
            let (socket, state) = (&self.socket, &self.state);
            match socket.try_io(Interest::WRITABLE, || state.send(socket.into(), &transmit)) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.socket.writable().await?,
                Err(e) => {
                    // UDP is lossy anyway; QUIC retransmits.
                    debug!(error = %e, destination = %t.destination, "UDP send failed");
                    return Ok(());
                }
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => pending().await,
    }
}
