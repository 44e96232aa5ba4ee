//! # felix-runtime-tokio
//!
//! Runs the Felix engine on tokio. This crate is only the adapter — a UDP socket registered
//! with tokio's reactor, a `tokio::time::Sleep` as the one timer, `spawn` and
//! `spawn_blocking` — for the drive loop written once in `felix-runtime-common`. The
//! `felix-broker` binary, on this adapter or on smol, is the `felix-broker` crate.
//!
//! ## Embedding a broker
//!
//! [`BrokerOptions`] is the builder; [`start`] starts a real broker on the current tokio
//! runtime (real QUIC on the address asked for, real files with a storage directory) and
//! returns the [`RunningBroker`] handle: its address, the CA certificate to trust, a dev
//! token, the metrics endpoint. Await the handle (or call `shutdown`) to stop cleanly;
//! dropping it stops the broker without waiting. `examples/embed.rs` is a whole program, and a
//! test under `cargo test`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use felix_runtime_tokio::BrokerOptions;
//!
//! let broker = felix_runtime_tokio::start(
//!     BrokerOptions::ephemeral()                    // 127.0.0.1:0, dev mode, in memory
//!         .storage_dir("/tmp/felix-data")           // durable logs instead
//!         .metrics_bind("127.0.0.1:0".parse()?),    // /metrics, /livez, /readyz
//! )
//! .await?;
//! println!("listening on {}, token {:?}", broker.local_addr(), broker.dev_token());
//! broker.await?; // closes every connection with code 0 and syncs the logs
//! # Ok(()) }
//! ```

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use felix_runtime_common::{quinn_udp, Interest, Runtime, Timer, UdpSocket};
use tokio::io::unix::AsyncFd;
use tokio::runtime::Handle;

pub use felix_runtime_common::{
    config, felix_engine, files, BrokerOptions, ConfigureEngine, RunningBroker,
};

/// The tokio adapter: spawns on the runtime it was made in.
#[derive(Debug, Clone)]
pub struct Tokio(Handle);

impl Tokio {
    /// The adapter for the current tokio runtime. Panics outside one.
    pub fn current() -> Tokio {
        Tokio(Handle::current())
    }
}

impl Runtime for Tokio {
    const NAME: &'static str = "tokio";
    type Socket = Socket;
    type Timer = Sleep;

    fn wrap_udp_socket(&self, socket: std::net::UdpSocket) -> io::Result<Socket> {
        let _entered = self.0.enter();
        socket.set_nonblocking(true)?;
        Socket::new(socket)
    }

    fn new_timer(&self, deadline: Instant) -> Sleep {
        let _entered = self.0.enter();
        Sleep(Box::pin(tokio::time::sleep_until(deadline.into())))
    }

    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.0.spawn(task);
    }

    fn spawn_blocking(&self, work: impl FnOnce() + Send + 'static) {
        self.0.spawn_blocking(work);
    }
}

/// A UDP socket on tokio's reactor, registered for readability only.
///
/// `tokio::net::UdpSocket` registers for both directions, edge-triggered, and a UDP socket
/// reports "writable" each time the kernel frees a datagram it sent (on loopback, when the
/// receiver reads it): one reactor wake-up per datagram sent, each an `epoll_wait` and usually a
/// context switch for nothing, since the socket is almost never full. So sends are simply
/// tried, and only a send that finds the buffer full registers a second handle on the socket
/// (a `dup`) for writability, dropped again once the send goes through.
#[derive(Debug)]
pub struct Socket {
    io: AsyncFd<std::net::UdpSocket>,
    /// Registered for writability while a send waits for room; `None` otherwise.
    write: Mutex<Option<AsyncFd<std::net::UdpSocket>>>,
}

impl Socket {
    fn new(socket: std::net::UdpSocket) -> io::Result<Socket> {
        Ok(Socket {
            io: register(socket, tokio::io::Interest::READABLE)?,
            write: Mutex::new(None),
        })
    }

    /// Waits for room to send, then runs `op`; the writability registration lives only as
    /// long as a send is blocked.
    fn poll_write_blocked<T>(
        &self,
        cx: &mut Context<'_>,
        op: &mut impl FnMut() -> io::Result<T>,
    ) -> Poll<io::Result<T>> {
        let mut slot = self.write.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if slot.is_none() {
                let dup = self.io.get_ref().try_clone()?;
                *slot = Some(register(dup, tokio::io::Interest::WRITABLE)?);
            }
            let fd = slot.as_ref().expect("registered above");
            let mut guard = ready!(fd.poll_write_ready(cx))?;
            match op() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                result => {
                    drop(guard);
                    *slot = None;
                    return Poll::Ready(result);
                }
            }
        }
    }

    /// Whether a writability registration is held (tests).
    #[cfg(test)]
    fn write_registered(&self) -> bool {
        self.write.lock().unwrap().is_some()
    }
}

/// Registers `socket` with the current reactor for `interest` only.
fn register(
    socket: std::net::UdpSocket,
    interest: tokio::io::Interest,
) -> io::Result<AsyncFd<std::net::UdpSocket>> {
    // SAFETY: a `std::net::UdpSocket` owns its descriptor: it stays open, and is the one
    // `as_raw_fd` returns, until the `AsyncFd` drops the socket.
    unsafe { AsyncFd::register_with_interest(socket, interest) }.map_err(|e| e.into_parts().1)
}

impl UdpSocket for Socket {
    fn sock_ref(&self) -> quinn_udp::UdpSockRef<'_> {
        self.io.get_ref().into()
    }

    fn poll_recv_batch(
        &self,
        cx: &mut Context<'_>,
        capacity: usize,
        mut op: impl FnMut() -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.io.poll_read_ready(cx))?;
            match guard.try_io(|_| op()) {
                Ok(Ok(n)) => {
                    // Emptied: a datagram arriving from now on raises a new edge, and a
                    // readiness the reactor recorded meanwhile is not cleared (its tick moved).
                    if n < capacity {
                        guard.clear_ready();
                    }
                    return Poll::Ready(Ok(n));
                }
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_io<T>(
        &self,
        cx: &mut Context<'_>,
        interest: Interest,
        mut op: impl FnMut() -> io::Result<T>,
    ) -> Poll<io::Result<T>> {
        match interest {
            // Readiness first, then the call; `try_io` clears readiness on `WouldBlock`.
            Interest::Read => loop {
                let mut guard = ready!(self.io.poll_read_ready(cx))?;
                match guard.try_io(|_| op()) {
                    Ok(result) => return Poll::Ready(result),
                    Err(_would_block) => continue,
                }
            },
            // The call first: the socket nearly always has room.
            Interest::Write => {
                if self
                    .write
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .is_none()
                {
                    match op() {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        result => return Poll::Ready(result),
                    }
                }
                self.poll_write_blocked(cx, &mut op)
            }
        }
    }
}

/// The one timer.
#[derive(Debug)]
pub struct Sleep(Pin<Box<tokio::time::Sleep>>);

impl Timer for Sleep {
    fn reset(&mut self, deadline: Instant) {
        self.0.as_mut().reset(deadline.into());
    }

    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

/// Starts a broker on the current tokio runtime (see [`felix_runtime_common::start`]).
pub async fn start(opts: BrokerOptions) -> io::Result<RunningBroker> {
    felix_runtime_common::start(Tokio::current(), opts).await
}

/// The `felix-broker` process on a single-threaded tokio runtime, until SIGINT or SIGTERM.
pub fn run_process(config: config::Config) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let adapter = Tokio(runtime.handle().clone());
    runtime.block_on(felix_runtime_common::process::serve(adapter, config))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    /// The epoll event masks registered for file descriptor `fd`, from every epoll instance
    /// of this process (`/proc/self/fdinfo` lists each instance's registrations).
    fn epoll_masks(fd: i32) -> Vec<u32> {
        let mut masks = Vec::new();
        for entry in std::fs::read_dir("/proc/self/fdinfo").unwrap() {
            let Ok(info) = std::fs::read_to_string(entry.unwrap().path()) else {
                continue;
            };
            for line in info.lines().filter(|l| l.starts_with("tfd:")) {
                let mut words = line.split_whitespace();
                let tfd = words.nth(1).and_then(|w| w.parse::<i32>().ok());
                let mask = words.nth(1).and_then(|w| u32::from_str_radix(w, 16).ok());
                if let (Some(tfd), Some(mask)) = (tfd, mask) {
                    if tfd == fd {
                        masks.push(mask);
                    }
                }
            }
        }
        masks
    }

    const EPOLLIN: u32 = 0x1;
    const EPOLLOUT: u32 = 0x4;

    /// Pins the read-only registration: registered for writability, the reactor wakes once
    /// for every datagram the kernel frees after sending it (docs/performance.md).
    #[tokio::test(flavor = "current_thread")]
    async fn the_socket_is_watched_for_reading_only() {
        let std_socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let fd = std_socket.as_raw_fd();
        let socket = Tokio::current().wrap_udp_socket(std_socket).unwrap();
        // A registration another test left behind under a closed descriptor with the same
        // number may show up too; none may watch for writability.
        let masks = epoll_masks(fd);
        assert!(!masks.is_empty(), "the socket is not registered");
        for mask in &masks {
            assert_eq!(mask & (EPOLLIN | EPOLLOUT), EPOLLIN, "{masks:x?}");
        }
        drop(socket);
    }

    /// A send that finds the buffer full waits for room on a second registration, and drops
    /// it once the send went through.
    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_send_waits_for_room_and_then_unregisters() {
        let std_socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = peer.local_addr().unwrap();
        let socket = Tokio::current().wrap_udp_socket(std_socket).unwrap();
        // The first attempt reports a full buffer, as the kernel would.
        let mut attempts = 0;
        let sent = std::future::poll_fn(|cx| {
            socket.poll_io(cx, Interest::Write, || {
                attempts += 1;
                if attempts == 1 {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                socket.io.get_ref().send_to(b"x", to)
            })
        })
        .await
        .unwrap();
        assert_eq!(sent, 1);
        assert_eq!(attempts, 2);
        assert!(!socket.write_registered());
        let mut buf = [0u8; 4];
        assert_eq!(peer.recv(&mut buf).unwrap(), 1);
    }

    /// Pins the saved call: a receive that came back short of its capacity emptied the
    /// socket, so the next one waits for the reactor rather than failing once first; and
    /// a datagram arriving afterwards still wakes it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_short_receive_batch_forgets_the_readiness() {
        let std_socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = std_socket.local_addr().unwrap();
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let socket = Tokio::current().wrap_udp_socket(std_socket).unwrap();
        peer.send_to(b"one", to).unwrap();
        let calls = std::cell::Cell::new(0);
        let recv = || {
            calls.set(calls.get() + 1);
            let mut buf = [0u8; 16];
            socket.io.get_ref().recv(&mut buf).map(|_| 1)
        };
        let n = std::future::poll_fn(|cx| socket.poll_recv_batch(cx, 4, recv))
            .await
            .unwrap();
        assert_eq!((n, calls.get()), (1, 1));
        // Drained: polling again makes no call and waits.
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(socket.poll_recv_batch(&mut cx, 4, recv).is_pending());
        assert_eq!(calls.get(), 1, "a receive was tried on an emptied socket");
        // A new datagram raises readiness again.
        peer.send_to(b"two", to).unwrap();
        let n = std::future::poll_fn(|cx| socket.poll_recv_batch(cx, 4, recv))
            .await
            .unwrap();
        assert_eq!((n, calls.get()), (1, 2));
    }
}
