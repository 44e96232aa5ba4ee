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
use std::task::{ready, Context, Poll};
use std::time::Instant;

use felix_runtime_common::{quinn_udp, Interest, Runtime, Timer, UdpSocket};
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
        tokio::net::UdpSocket::from_std(socket).map(Socket)
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

/// A UDP socket on tokio's reactor.
#[derive(Debug)]
pub struct Socket(tokio::net::UdpSocket);

impl UdpSocket for Socket {
    fn sock_ref(&self) -> quinn_udp::UdpSockRef<'_> {
        (&self.0).into()
    }

    fn poll_io<T>(
        &self,
        cx: &mut Context<'_>,
        interest: Interest,
        mut op: impl FnMut() -> io::Result<T>,
    ) -> Poll<io::Result<T>> {
        // Readiness first, then the call; `try_io` clears readiness on `WouldBlock`.
        loop {
            let tokio_interest = match interest {
                Interest::Read => {
                    ready!(self.0.poll_recv_ready(cx))?;
                    tokio::io::Interest::READABLE
                }
                Interest::Write => {
                    ready!(self.0.poll_send_ready(cx))?;
                    tokio::io::Interest::WRITABLE
                }
            };
            match self.0.try_io(tokio_interest, &mut op) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                result => return Poll::Ready(result),
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
