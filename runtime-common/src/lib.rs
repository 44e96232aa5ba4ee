//! # felix-runtime-common
//!
//! Everything the Felix runtime adapters share, written once: the drive loop over the
//! Sans-IO engine ([`start`], `driver.rs`), the options, the running-broker handle and the
//! commands it sends the loop (`control.rs`), configuration from the environment
//! ([`config`]), TLS loading and generation, the file executor ([`files`]), the operator's
//! HTTP endpoint ([`ops`]), certificate and JWKS reloads and the `felix-broker` process
//! ([`process`]).
//!
//! An adapter implements [`Runtime`] — register a UDP socket, make a timer, spawn a task,
//! run blocking work — and nothing else. `felix-runtime-tokio` and `felix-runtime-smol` are
//! the two there are; `docs/runtimes.md` says how to add a third.

pub mod config;
mod control;
mod driver;
pub mod files;
pub mod ops;
pub mod process;
mod reload;
mod runtime;
mod tls;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use felix_engine::{AuthConfig, DurableConfig, Engine, EngineConfig};
use futures_channel::oneshot;
use quinn_udp::UdpSocketState;
use ring::rand::{SecureRandom, SystemRandom};
use tracing::info;

use crate::ops::http::{OpsServer, OpsState};

pub use crate::control::RunningBroker;
pub use crate::runtime::{Interest, Runtime, Timer, UdpSocket};
pub use felix_engine;
/// The `quinn-udp` the adapters' [`UdpSocket::sock_ref`] speaks.
pub use quinn_udp;

/// Socket buffer sizes asked for (the OS may grant less).
const SOCKET_BUFFER_BYTES: usize = 4 * 1024 * 1024;

/// A change to the engine configuration, applied before the engine starts.
pub type ConfigureEngine = Box<dyn FnOnce(&mut EngineConfig) + Send>;

/// How long the drive loop spins on the client socket after traffic by default: longer than a
/// client on loopback or a LAN takes to answer, so a request-answer client's next datagram
/// usually finds the broker awake, and short enough that an idle broker burns next to nothing
/// (docs/performance.md, "Busy polling").
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(50);
/// The longest spin `limits.busy_poll_us` accepts: past this a spin is a sleep that burns a core.
pub const MAX_BUSY_POLL: Duration = Duration::from_millis(10);

/// How to start a broker.
#[non_exhaustive]
pub struct BrokerOptions {
    /// Where to listen; port 0 picks a free one.
    pub bind: SocketAddr,
    /// PEM certificate chain (leaf first) and PEM private key. Without them a development CA
    /// and a leaf for `localhost`, 127.0.0.1 and ::1 are generated.
    pub tls_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// A JWKS document. Without one the broker runs in dev mode with a fresh key and exposes
    /// a full-permission token for tenant `t1` ([`RunningBroker::dev_token`]).
    pub jwks: Option<Vec<u8>>,
    /// Changes to the engine configuration (limits, windows, timeouts) before it starts.
    pub configure_engine: Option<ConfigureEngine>,
    /// Durable storage: streams and caches live in logs under this directory (created if
    /// missing). Without it they stay in memory.
    pub storage_dir: Option<PathBuf>,
    /// How durable storage behaves; used only with `storage_dir`.
    pub durable: DurableConfig,
    /// Serve `/metrics`, `/livez` and `/readyz` over HTTP here (port 0 picks a free one;
    /// see [`RunningBroker::metrics_addr`]). `None`: no endpoint.
    pub metrics_bind: Option<SocketAddr>,
    /// After each sync, pages of a log file more than this far behind its end are dropped
    /// from the page cache (`None`: never). Default [`files::DEFAULT_CACHE_BEHIND_BYTES`].
    pub cache_behind_bytes: Option<u64>,
    /// Appends go around the page cache (`O_DIRECT`) where the file system allows it
    /// (default `true`; see [`files`]).
    pub direct_io: bool,
    /// The internal (peer) listener, `FELIX_INTERNAL_BIND`: needed by a cluster member
    /// ([`felix_engine::EngineConfig::cluster`]).
    pub internal_bind: Option<SocketAddr>,
    /// A failure to bind `metrics_bind` only logs a warning (for a default address that
    /// another process may hold) instead of failing the start.
    pub metrics_bind_optional: bool,
    /// After a turn with traffic, how long the loop keeps polling the client socket before
    /// it sleeps in the reactor (`limits.busy_poll_us`; zero never spins). Default
    /// [`DEFAULT_BUSY_POLL`], at most [`MAX_BUSY_POLL`].
    pub busy_poll: Duration,
}

impl BrokerOptions {
    /// Defaults everywhere but the bind address.
    pub fn new(bind: SocketAddr) -> BrokerOptions {
        BrokerOptions {
            bind,
            tls_pem: None,
            jwks: None,
            configure_engine: None,
            storage_dir: None,
            durable: DurableConfig::default(),
            metrics_bind: None,
            metrics_bind_optional: false,
            internal_bind: None,
            cache_behind_bytes: Some(files::DEFAULT_CACHE_BEHIND_BYTES),
            direct_io: true,
            busy_poll: DEFAULT_BUSY_POLL,
        }
    }

    /// Defaults everywhere, listening on an ephemeral loopback port (`127.0.0.1:0`): what a
    /// test or an embedding program usually wants.
    pub fn ephemeral() -> BrokerOptions {
        BrokerOptions::new(SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Listens on `addr` (port 0 picks a free one).
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    /// Serves this PEM certificate chain (leaf first) and key instead of a generated CA
    /// and leaf.
    pub fn tls_pem(mut self, cert_chain: Vec<u8>, key: Vec<u8>) -> Self {
        self.tls_pem = Some((cert_chain, key));
        self
    }

    /// Verifies tokens against this JWKS document instead of running in dev mode.
    pub fn jwks(mut self, document: Vec<u8>) -> Self {
        self.jwks = Some(document);
        self
    }

    /// Keeps streams and caches in logs under `dir` (created if missing) instead of memory.
    pub fn storage_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.storage_dir = Some(dir.into());
        self
    }

    /// How durable storage behaves (with [`storage_dir`](Self::storage_dir)).
    pub fn durable(mut self, durable: DurableConfig) -> Self {
        self.durable = durable;
        self
    }

    /// Serves `/metrics`, `/livez` and `/readyz` on `addr` (port 0 picks a free one).
    pub fn metrics_bind(mut self, addr: SocketAddr) -> Self {
        self.metrics_bind = Some(addr);
        self
    }

    /// Adds a change to the engine configuration (applied after any earlier one).
    pub fn configure_engine(mut self, f: impl FnOnce(&mut EngineConfig) + Send + 'static) -> Self {
        let earlier = self.configure_engine.take();
        self.configure_engine = Some(Box::new(move |c: &mut EngineConfig| {
            if let Some(earlier) = earlier {
                earlier(c);
            }
            f(c);
        }));
        self
    }
}

impl fmt::Debug for BrokerOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BrokerOptions")
            .field("bind", &self.bind)
            .field("tls_pem", &self.tls_pem.is_some())
            .field("jwks", &self.jwks.is_some())
            .field("storage_dir", &self.storage_dir)
            .field("durable", &self.durable)
            .field("metrics_bind", &self.metrics_bind)
            .finish_non_exhaustive()
    }
}

fn random_seed(rng: &SystemRandom) -> io::Result<[u8; 32]> {
    let mut seed = [0u8; 32];
    rng.fill(&mut seed)
        .map_err(|_| io::Error::other("the OS random source failed"))?;
    Ok(seed)
}

/// Binds the socket, builds the engine, recovers durable storage (performing file ops until
/// every log on disk is open; a corrupt log fails the start, naming the file and byte), and
/// spawns the drive loop on `runtime`. Datagrams are read only after recovery.
pub async fn start<R: Runtime>(runtime: R, opts: BrokerOptions) -> io::Result<RunningBroker> {
    let (identity, ca_cert_pem) = match &opts.tls_pem {
        Some((cert, key)) => (
            tls::from_pem(cert, key)?,
            String::from_utf8_lossy(cert).into_owned(),
        ),
        None => {
            let generated = tls::generate(&[opts.bind.ip()])?;
            (generated.identity, generated.ca_pem)
        }
    };
    let rng = SystemRandom::new();
    let auth = match opts.jwks {
        Some(doc) => AuthConfig::Jwks(doc),
        None => AuthConfig::Dev {
            seed: random_seed(&rng)?,
        },
    };

    let std_socket = std::net::UdpSocket::bind(opts.bind)?;
    std_socket.set_nonblocking(true)?;
    let state = UdpSocketState::new((&std_socket).into())?;
    // Larger buffers absorb bursts (40 auths at connect, fan-out); best effort.
    let _ = state.set_recv_buffer_size((&std_socket).into(), SOCKET_BUFFER_BYTES);
    let _ = state.set_send_buffer_size((&std_socket).into(), SOCKET_BUFFER_BYTES);
    let local_addr = std_socket.local_addr()?;
    let socket = runtime.wrap_udp_socket(std_socket)?;

    let mut config = EngineConfig::new(identity, auth, random_seed(&rng)?);
    let executor = match &opts.storage_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            config.durable = Some(opts.durable.clone());
            Some(Arc::new(
                files::FileExecutor::with_drop_behind(dir.clone(), opts.cache_behind_bytes)
                    .with_direct_io(opts.direct_io),
            ))
        }
        None => None,
    };
    if let Some(configure) = opts.configure_engine {
        configure(&mut config);
    }
    if config.durable.is_some() && executor.is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "durable storage needs a storage directory",
        ));
    }
    config.max_gso_segments = config.max_gso_segments.min(state.max_gso_segments()).max(1);
    let unix_micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    let clustered = config.cluster.is_some();
    let engine = Engine::new(config, Instant::now(), unix_micros)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let dev_token = engine.dev_token().map(str::to_owned);

    // The endpoint comes up before recovery, so probes see "live, not ready" meanwhile.
    let (ops_state, control) = OpsState::new();
    let ops = match opts.metrics_bind {
        Some(addr) => match OpsServer::start(addr, ops_state.clone()) {
            Ok(server) => Some(server),
            Err(e) if opts.metrics_bind_optional => {
                tracing::warn!(%addr, error = %e, "metrics endpoint disabled: cannot bind");
                None
            }
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("metrics endpoint {addr}: {e}"),
                ))
            }
        },
        None => None,
    };
    let peer = match (clustered, opts.internal_bind) {
        (false, _) => None,
        (true, None) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a cluster member needs an internal listener (FELIX_INTERNAL_BIND)",
            ))
        }
        (true, Some(addr)) => {
            let std_socket = std::net::UdpSocket::bind(addr)
                .map_err(|e| io::Error::new(e.kind(), format!("internal listener {addr}: {e}")))?;
            std_socket.set_nonblocking(true)?;
            let state = UdpSocketState::new((&std_socket).into())?;
            let local = std_socket.local_addr()?;
            info!(%local, "internal listener for peers");
            Some((runtime.wrap_udp_socket(std_socket)?, state))
        }
    };
    let (failed_tx, failed) = oneshot::channel();
    let mut driver = driver::Driver::new(
        runtime.clone(),
        engine,
        socket,
        state,
        executor.clone(),
        control,
    )
    .with_peer_socket(peer)
    .with_readiness(ops_state.clone(), failed_tx)
    .with_busy_poll(opts.busy_poll);
    if let Some(dir) = &opts.storage_dir {
        let began = Instant::now();
        driver.recover().await?;
        info!(dir = %dir.display(), took = ?began.elapsed(), "durable storage recovered");
    }
    // A cluster member is ready once it has joined; the loop reports that.
    ops_state.set_ready(!clustered);
    let (stop, stop_rx) = oneshot::channel();
    let (stopped_tx, stopped) = oneshot::channel();
    // Boxed: the loop's future holds the whole engine, and an unoptimised build copies a
    // future by value through the executor's spawn frames (it overflowed a 2 MiB test thread).
    runtime.spawn(Box::pin(async move {
        driver.run(stop_rx).await;
        let _ = stopped_tx.send(());
    }));
    info!(%local_addr, runtime = R::NAME, dev_mode = dev_token.is_some(), "felix broker listening");
    Ok(RunningBroker {
        runtime: R::NAME,
        local_addr,
        files: executor,
        ca_cert_pem,
        dev_token,
        stop: Some(stop),
        stopped: Some(stopped),
        ops,
        ops_state,
        watcher: None,
        failed: Some(failed),
    })
}
