//! The four things a runtime adapter provides. Everything else — the drive loop, startup,
//! recovery, shutdown, the process — is written once against this trait, the way quinn's
//! `Runtime` lets one `ConnectionDriver` run on tokio, smol or async-std.
//!
//! An adapter is a unit-ish struct (`felix_runtime_tokio::Tokio`, `felix_runtime_smol::Smol`)
//! of about a hundred lines; `docs/runtimes.md` shows how to write a third.

use std::future::Future;
use std::io;
use std::task::{Context, Poll};
use std::time::Instant;

/// An async runtime the broker can run on.
pub trait Runtime: Clone + Send + Sync + 'static {
    /// Its name in logs and on `RunningBroker::runtime` (`"tokio"`, `"smol"`).
    const NAME: &'static str;
    /// A UDP socket registered with the runtime's reactor.
    type Socket: UdpSocket;
    /// A resettable one-shot timer.
    type Timer: Timer;

    /// Registers a bound, non-blocking socket with the reactor.
    fn wrap_udp_socket(&self, socket: std::net::UdpSocket) -> io::Result<Self::Socket>;

    /// A timer that fires at `deadline`.
    fn new_timer(&self, deadline: Instant) -> Self::Timer;

    /// Runs `task` in the background until it finishes.
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static);

    /// Runs blocking `work` (a file op) off the reactor's threads.
    fn spawn_blocking(&self, work: impl FnOnce() + Send + 'static);
}

/// What an I/O operation waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interest {
    Read,
    Write,
}

/// A UDP socket driven by a reactor. The datagram calls themselves are made by the caller
/// (through `quinn-udp`, for GSO/GRO/ECN); the adapter only knows when to make them.
pub trait UdpSocket: Send + Sync + 'static {
    /// The socket, for `quinn-udp` calls.
    fn sock_ref(&self) -> quinn_udp::UdpSockRef<'_>;

    /// Runs `op` once the socket is ready for `interest`. `op` failing with `WouldBlock`
    /// means the readiness was stale: the adapter clears it and waits again, so `op` may
    /// run several times. Any other result is returned.
    fn poll_io<T>(
        &self,
        cx: &mut Context<'_>,
        interest: Interest,
        op: impl FnMut() -> io::Result<T>,
    ) -> Poll<io::Result<T>>;

    /// Runs `op`, a receive of up to `capacity` datagrams, once the socket is readable. A
    /// batch short of `capacity` emptied the socket, so an adapter may forget the readiness:
    /// the next receive then waits for the reactor instead of first failing with
    /// `WouldBlock`, one system call saved per wake-up. By default, `poll_io`.
    fn poll_recv_batch(
        &self,
        cx: &mut Context<'_>,
        capacity: usize,
        op: impl FnMut() -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        let _ = capacity;
        self.poll_io(cx, Interest::Read, op)
    }
}

/// One timer, re-armed rather than re-created.
pub trait Timer: Send + Sync + 'static {
    /// Moves the deadline (earlier or later).
    fn reset(&mut self, deadline: Instant);

    /// `Ready` once the deadline has passed.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()>;
}
