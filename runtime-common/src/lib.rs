//! # felix-runtime-common
//!
//! Everything the Felix runtime adapters share, written once: the drive loop over the
//! Sans-IO engine ([`start`]), the options and the running-broker handle, configuration
//! from the environment ([`config`]), TLS loading and generation, the file executor
//! ([`files`]) and the `felix-broker` process ([`process`]).
//!
//! An adapter implements [`Runtime`] — register a UDP socket, make a timer, spawn a task,
//! run blocking work — and nothing else. `felix-runtime-tokio` and `felix-runtime-smol` are
//! the two there are; `docs/runtimes.md` says how to add a third.

pub mod config;
mod driver;
// The executor is shared by every runtime; it still lives beside the tokio adapter, where it
// was written (and is maintained), and is compiled here so no adapter depends on another.
#[path = "../../runtime-tokio/src/files.rs"]
pub mod files;
pub mod ops_http;
pub mod process;
mod reload;
mod runtime;
mod stream_delete;
mod tls;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use felix_engine::{AuthConfig, DurableConfig, Engine, EngineConfig};
use futures_channel::oneshot;
use quinn_udp::UdpSocketState;
use ring::rand::{SecureRandom, SystemRandom};
use tracing::info;

pub use crate::runtime::{Interest, Runtime, Timer, UdpSocket};
pub use felix_engine;
/// The `quinn-udp` the adapters' [`UdpSocket::sock_ref`] speaks.
pub use quinn_udp;

/// Socket buffer sizes asked for (the OS may grant less).
const SOCKET_BUFFER_BYTES: usize = 4 * 1024 * 1024;

/// A change to the engine configuration, applied before the engine starts.
pub type ConfigureEngine = Box<dyn FnOnce(&mut EngineConfig) + Send>;

/// How to start a broker.
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
    /// A failure to bind `metrics_bind` only logs a warning (for a default address that
    /// another process may hold) instead of failing the start.
    pub metrics_bind_optional: bool,
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
            cache_behind_bytes: Some(files::DEFAULT_CACHE_BEHIND_BYTES),
            direct_io: true,
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

/// A broker running in the background on some runtime. Dropping it stops the broker too
/// (at once, without draining or waiting); [`RunningBroker::shutdown`] — or awaiting the
/// handle — drains it, closes its connections and syncs its logs, and waits for all that.
pub struct RunningBroker {
    runtime: &'static str,
    local_addr: SocketAddr,
    files: Option<Arc<files::FileExecutor>>,
    ca_cert_pem: String,
    dev_token: Option<String>,
    stop: Option<oneshot::Sender<()>>,
    stopped: Option<oneshot::Receiver<()>>,
    ops: Option<ops_http::OpsServer>,
    ops_state: Arc<ops_http::OpsState>,
    watcher: Option<reload::Watcher>,
}

impl RunningBroker {
    /// The runtime it runs on (`"tokio"`, `"smol"`).
    pub fn runtime(&self) -> &'static str {
        self.runtime
    }

    /// The bound address (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The PEM clients should trust: the generated CA, or the configured certificate chain.
    pub fn ca_cert_pem(&self) -> &str {
        &self.ca_cert_pem
    }

    /// The dev-mode token (tenant `t1`, every permission); `None` with a JWKS.
    pub fn dev_token(&self) -> Option<&str> {
        self.dev_token.as_deref()
    }

    /// Where `/metrics`, `/livez` and `/readyz` are served, when enabled.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.ops.as_ref().map(ops_http::OpsServer::local_addr)
    }

    /// Serves this certificate chain (PEM, leaf first) and key to new connections from now
    /// on; established ones keep theirs. Fails if the PEM does not parse; a key the engine
    /// refuses is logged and the old identity stays.
    pub fn rotate_tls(&self, cert_pem: &[u8], key_pem: &[u8]) -> io::Result<()> {
        let identity = tls::from_pem(cert_pem, key_pem)?;
        self.send_control(driver::Control::TlsIdentity(identity))
    }

    /// Verifies new streams' tokens against this JWKS document from now on (only for a
    /// broker started with a JWKS); authenticated streams keep their identity.
    pub fn rotate_jwks(&self, jwks: Vec<u8>) -> io::Result<()> {
        self.send_control(driver::Control::Jwks(jwks))
    }

    /// Watches the files `reload` names (the configured certificate, key and JWKS) and
    /// rotates whenever they change, polling every `reload.interval`. Replaces an earlier
    /// watch; stops with the broker.
    pub fn watch_files(&mut self, reload: &config::Reload) -> io::Result<()> {
        self.watcher = None;
        self.watcher = reload::Watcher::spawn(reload, self.ops_state.control.clone())?;
        Ok(())
    }

    /// Deletes a stream (trusted: no token is checked; the ops endpoint's
    /// `DELETE /v1/streams/…` checks one). Its subscriptions end — with `stream_deleted`
    /// where the client offered it — and the next publish or subscribe creates it afresh.
    pub async fn delete_stream(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
    ) -> Result<(), felix_engine::DeleteStreamError> {
        let stopped =
            || felix_engine::DeleteStreamError::Unavailable("the broker has stopped".into());
        let (tx, rx) = oneshot::channel();
        let req = stream_delete::DeleteRequest {
            token: None,
            tenant: tenant.into(),
            namespace: namespace.into(),
            stream: stream.into(),
            reply: Box::new(move |outcome| {
                let _ = tx.send(outcome);
            }),
        };
        self.send_control(driver::Control::DeleteStream(req))
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    fn send_control(&self, control: driver::Control) -> io::Result<()> {
        self.ops_state
            .control
            .unbounded_send(control)
            .map_err(|_| io::Error::other("the broker has stopped"))
    }

    /// What the file executor has done (with a storage directory), readable from any thread
    /// while the broker runs.
    pub fn file_stats(&self) -> Option<files::FileStats> {
        self.files.as_ref().map(|f| f.stats())
    }

    /// A handle on the file executor's counters that outlives this value.
    pub fn file_executor(&self) -> Option<Arc<files::FileExecutor>> {
        self.files.clone()
    }

    /// Stops gracefully and waits until done: drains first (new connections and new work
    /// are refused `draining`, answers already owed are delivered, held ones once their
    /// logs sync; at most 10 s), then closes every connection with code 0, syncs the logs
    /// and ends the drive loop. `/readyz` turns 503 at once.
    pub async fn shutdown(mut self) -> io::Result<()> {
        self.ops_state.set_ready(false);
        if let Some(stop) = self.stop.take() {
            // A value asks for the graceful drain (dropping the sender stops at once).
            let _ = stop.send(());
        }
        match self.stopped.take() {
            Some(stopped) => stopped
                .await
                .map_err(|_| io::Error::other("the broker task ended without stopping")),
            None => Ok(()),
        }
    }
}

/// Awaiting the handle shuts the broker down cleanly, as [`RunningBroker::shutdown`].
impl std::future::IntoFuture for RunningBroker {
    type Output = io::Result<()>;
    type IntoFuture = std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<()>> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.shutdown())
    }
}

impl Drop for RunningBroker {
    fn drop(&mut self) {
        // Dropping the sender is the stop signal.
        drop(self.stop.take());
    }
}

impl fmt::Debug for RunningBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunningBroker")
            .field("runtime", &self.runtime)
            .field("local_addr", &self.local_addr)
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
    let engine = Engine::new(config, Instant::now(), unix_micros)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let dev_token = engine.dev_token().map(str::to_owned);

    // The endpoint comes up before recovery, so probes see "live, not ready" meanwhile.
    let (ops_state, control) = ops_http::OpsState::new();
    let ops = match opts.metrics_bind {
        Some(addr) => match ops_http::OpsServer::start(addr, ops_state.clone()) {
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
    let mut driver = driver::Driver::new(
        runtime.clone(),
        engine,
        socket,
        state,
        executor.clone(),
        control,
    );
    if let Some(dir) = &opts.storage_dir {
        let began = Instant::now();
        driver.recover().await?;
        info!(dir = %dir.display(), took = ?began.elapsed(), "durable storage recovered");
    }
    ops_state.set_ready(true);
    let (stop, stop_rx) = oneshot::channel();
    let (stopped_tx, stopped) = oneshot::channel();
    runtime.spawn(async move {
        driver.run(stop_rx).await;
        let _ = stopped_tx.send(());
    });
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
    })
}
