//! # felix-runtime-smol
//!
//! Runs the Felix engine on smol. Like `felix-runtime-tokio`, this crate is only the
//! adapter for the drive loop written once in `felix-runtime-common`: a UDP socket on the
//! async-io reactor (`Async<UdpSocket>`), an async-io `Timer`, tasks on an async-executor,
//! and file ops on the `blocking` pool.
//!
//! The builder and handle are the same as on tokio ([`BrokerOptions`], [`RunningBroker`]);
//! `examples/embed.rs` is a whole program, and a test under `cargo test`.
//!
//! ```no_run
//! # fn demo() -> std::io::Result<()> {
//! smol::block_on(async {
//!     let opts = felix_runtime_smol::BrokerOptions::ephemeral();
//!     let broker = felix_runtime_smol::start(opts).await?;
//!     println!("listening on {}, token {:?}", broker.local_addr(), broker.dev_token());
//!     broker.await
//! })
//! # }
//! ```

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use felix_runtime_common::{quinn_udp, Interest, Runtime, Timer, UdpSocket};
use smol::{Async, Executor};

pub use felix_runtime_common::{
    config, felix_engine, files, BrokerOptions, ConfigureEngine, RunningBroker,
};

/// The smol adapter: spawns on the given executor, or on smol's global one.
#[derive(Debug, Clone, Default)]
pub struct Smol {
    executor: Option<Arc<Executor<'static>>>,
}

impl Smol {
    /// Tasks go to smol's global executor (threads of its own; works from any runtime).
    pub fn global() -> Smol {
        Smol { executor: None }
    }

    /// Tasks go to `executor`, run by whoever runs it (the binary: its main thread, which
    /// also drives the reactor, so a datagram wakes no other thread).
    pub fn on(executor: Arc<Executor<'static>>) -> Smol {
        Smol {
            executor: Some(executor),
        }
    }
}

impl Runtime for Smol {
    const NAME: &'static str = "smol";
    type Socket = Socket;
    type Timer = SmolTimer;

    fn wrap_udp_socket(&self, socket: std::net::UdpSocket) -> io::Result<Socket> {
        Async::new_nonblocking(socket).map(Socket)
    }

    fn new_timer(&self, deadline: Instant) -> SmolTimer {
        SmolTimer(smol::Timer::at(deadline))
    }

    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        match &self.executor {
            Some(executor) => executor.spawn(task).detach(),
            None => smol::spawn(task).detach(),
        }
    }

    fn spawn_blocking(&self, work: impl FnOnce() + Send + 'static) {
        smol::unblock(work).detach();
    }
}

/// A UDP socket on the async-io reactor.
#[derive(Debug)]
pub struct Socket(Async<std::net::UdpSocket>);

impl UdpSocket for Socket {
    fn sock_ref(&self) -> quinn_udp::UdpSockRef<'_> {
        self.0.get_ref().into()
    }

    fn poll_io<T>(
        &self,
        cx: &mut Context<'_>,
        interest: Interest,
        mut op: impl FnMut() -> io::Result<T>,
    ) -> Poll<io::Result<T>> {
        // The call first, readiness after (as async-io's own `read_with`): async-io reports
        // an event once, so a socket drained only part-way would otherwise wait for the
        // reactor to re-arm before the next read.
        loop {
            match op() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                result => return Poll::Ready(result),
            }
            match interest {
                Interest::Read => ready!(self.0.poll_readable(cx))?,
                Interest::Write => ready!(self.0.poll_writable(cx))?,
            }
        }
    }
}

/// The one timer.
#[derive(Debug)]
pub struct SmolTimer(smol::Timer);

impl Timer for SmolTimer {
    fn reset(&mut self, deadline: Instant) {
        self.0.set_at(deadline);
    }

    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

/// Starts a broker whose task runs on smol's global executor; callable from any runtime
/// (see [`felix_runtime_common::start`] to pick the executor with [`Smol::on`]).
pub async fn start(opts: BrokerOptions) -> io::Result<RunningBroker> {
    felix_runtime_common::start(Smol::global(), opts).await
}

/// The `felix-broker` process on an executor run by this thread, until SIGINT or SIGTERM.
pub fn run_process(config: config::Config) -> io::Result<()> {
    let executor = Arc::new(Executor::new());
    let adapter = Smol::on(executor.clone());
    smol::block_on(executor.run(felix_runtime_common::process::serve(adapter, config)))
}
