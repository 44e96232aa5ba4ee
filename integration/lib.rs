//! Shared helpers for the end-to-end tests and the benchmark: a broker started in-process
//! on 127.0.0.1:0 and clients configured to trust it.
//!
//! **Runtimes.** One run of the suite tests one broker runtime, named by `FELIX_RUNTIME`
//! (`tokio`, the default, or `smol`); its clients run on `FELIX_CLIENT_RUNTIME`, by default
//! the same. Every broker a test starts goes through [`start_broker`] (and the binary reads
//! the same variable), so the suite is written once and `scripts/test` runs it per runtime.

pub mod client_cluster_support;
pub mod cluster_support;
pub mod durable_support;
pub mod ops_support;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use felix_client::{Client, ClientConfig, ClientError, Event, Subscription, SubscriptionItem};
use felix_runtime_tokio::felix_engine::{DeclaredStream, EngineConfig};
use felix_runtime_tokio::files::{FileExecutor, FileStats};
use felix_runtime_tokio::{BrokerOptions, RunningBroker};

/// The broker runtimes there are, as `FELIX_RUNTIME` names them.
pub const RUNTIMES: [&str; 2] = ["tokio", "smol"];

fn runtime_var(name: &str) -> Option<&'static str> {
    let value = std::env::var(name).ok().filter(|v| !v.is_empty())?;
    match RUNTIMES.iter().find(|r| **r == value) {
        Some(r) => Some(r),
        None => panic!("{name}={value:?}: expected one of {RUNTIMES:?}"),
    }
}

/// The broker runtime this run tests (`FELIX_RUNTIME`, default `tokio`).
pub fn broker_runtime() -> &'static str {
    runtime_var("FELIX_RUNTIME").unwrap_or("tokio")
}

/// The client runtime this run uses (`FELIX_CLIENT_RUNTIME`, default the broker's).
pub fn client_runtime() -> felix_client::Runtime {
    match runtime_var("FELIX_CLIENT_RUNTIME").unwrap_or_else(broker_runtime) {
        "smol" => felix_client::Runtime::Smol,
        _ => felix_client::Runtime::Tokio,
    }
}

/// Starts a broker in this process on [`broker_runtime`].
pub async fn start_broker(opts: BrokerOptions) -> std::io::Result<RunningBroker> {
    let broker = match broker_runtime() {
        "smol" => felix_runtime_smol::start(opts).await?,
        _ => felix_runtime_tokio::start(opts).await?,
    };
    assert_eq!(broker.runtime(), broker_runtime());
    Ok(broker)
}

/// A client configuration on [`client_runtime`] with test-sized timeouts.
pub fn client_config(addr: SocketAddr, ca_pem: Vec<u8>, token: &str) -> ClientConfig {
    let mut config = ClientConfig::new(addr, ca_pem, TENANT, token);
    config.runtime = client_runtime();
    // Tests fail fast rather than wait out the production timeouts.
    config.request_timeout = Duration::from_secs(10);
    config.connect_timeout = Duration::from_secs(10);
    config
}

/// The tenant the dev token is minted for.
pub const TENANT: &str = "t1";

/// Mints Felix tokens (EdDSA JWTs) with a key whose public half is in [`TokenMinter::jwks`].
pub struct TokenMinter {
    key: felix_auth::SigningKey,
    kid: String,
}

/// What a minted token says; every field the broker checks can be made wrong on purpose.
#[derive(Debug, Clone)]
pub struct Claims {
    pub tenant: String,
    pub perms: Vec<String>,
    pub iss: String,
    pub aud: String,
    /// Seconds from now until expiry (negative: already expired).
    pub expires_in: i64,
}

impl Claims {
    /// A valid token for `tenant` with `perms` (e.g. `"stream.publish:stream:t1/default/*"`).
    pub fn new(tenant: &str, perms: &[&str]) -> Claims {
        Claims {
            tenant: tenant.into(),
            perms: perms.iter().map(|p| p.to_string()).collect(),
            iss: "felix-auth".into(),
            aud: "felix-broker".into(),
            expires_in: 3600,
        }
    }
}

impl TokenMinter {
    /// A minter with a fixed test key.
    pub fn new(kid: &str, seed: [u8; 32]) -> TokenMinter {
        TokenMinter {
            key: felix_auth::SigningKey::from_bytes(&seed),
            kid: kid.into(),
        }
    }

    /// The JWKS document holding the public key.
    pub fn jwks(&self) -> Vec<u8> {
        felix_auth::jwks_document(&[(&self.kid, &self.key)]).into_bytes()
    }

    /// A compact JWS for `claims`, signed by this key under `kid` (by `felix_auth`, the one
    /// minter).
    pub fn mint_as(&self, kid: &str, claims: &Claims) -> String {
        let now = unix_micros() / 1_000_000;
        let claims = felix_auth::Claims {
            iss: claims.iss.clone(),
            aud: felix_auth::Audience::One(claims.aud.clone()),
            sub: "integration-test".into(),
            tid: claims.tenant.clone(),
            exp: now.saturating_add_signed(claims.expires_in),
            iat: Some(now - 10),
            nbf: None,
            perms: claims.perms.clone(),
        };
        felix_auth::mint_token(&self.key, kid, &claims)
    }

    /// A token signed under this minter's own `kid`.
    pub fn mint(&self, claims: &Claims) -> String {
        self.mint_as(&self.kid.clone(), claims)
    }
}

/// Starts a broker on 127.0.0.1:0 that verifies tokens against `jwks` (no dev token).
pub async fn broker_with_jwks(jwks: Vec<u8>) -> TestBroker {
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().expect("literal"));
    opts.jwks = Some(jwks);
    let broker = within(10, start_broker(opts)).await.expect("broker starts");
    TestBroker { broker }
}

/// A broker running in this process.
pub struct TestBroker {
    broker: RunningBroker,
}

/// Starts a broker with default options on an ephemeral loopback port.
pub async fn broker() -> TestBroker {
    broker_with(|_| {}).await
}

/// Starts a broker on 127.0.0.1:0 after `configure` adjusted its engine configuration.
pub async fn broker_with(configure: impl FnOnce(&mut EngineConfig) + Send + 'static) -> TestBroker {
    let opts =
        BrokerOptions::new("127.0.0.1:0".parse().expect("literal")).configure_engine(configure);
    let broker = within(10, start_broker(opts)).await.expect("broker starts");
    TestBroker { broker }
}

/// Declares `namespace/stream` of tenant [`TENANT`] with `shards` shards.
pub fn declare_stream(config: &mut EngineConfig, namespace: &str, stream: &str, shards: u32) {
    config
        .declared_streams
        .push(DeclaredStream::new(TENANT, namespace, stream, shards));
}

impl TestBroker {
    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.broker.local_addr()
    }

    /// The dev token (full permissions for tenant [`TENANT`]).
    pub fn token(&self) -> String {
        self.broker.dev_token().expect("dev mode").to_owned()
    }

    /// A client configuration trusting this broker, authenticating with the dev token (or
    /// an empty one on a JWKS broker: set `token` yourself).
    pub fn config(&self) -> ClientConfig {
        client_config(
            self.addr(),
            self.broker.ca_cert_pem().as_bytes().to_vec(),
            self.broker.dev_token().unwrap_or_default(),
        )
    }

    /// A connected client with the default configuration.
    pub async fn client(&self) -> Client {
        self.client_with(|_| {}).await.expect("client connects")
    }

    /// Connects with an adjusted configuration.
    pub async fn client_with(
        &self,
        adjust: impl FnOnce(&mut ClientConfig),
    ) -> Result<Client, ClientError> {
        let mut config = self.config();
        adjust(&mut config);
        within(15, Client::connect(config)).await
    }

    /// Stops the broker.
    pub async fn shutdown(self) {
        within(10, self.broker.shutdown())
            .await
            .expect("clean shutdown");
    }
}

/// Picks a free loopback UDP port (for a broker process told where to bind).
pub fn free_udp_port() -> u16 {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    socket.local_addr().expect("addr").port()
}

/// Starts the `felix-broker` binary at `path` on a free loopback port, in dev mode, and
/// returns the child with the address, CA PEM and dev token it exported.
pub async fn spawn_broker_binary(path: &str) -> (std::process::Child, SocketAddr, Vec<u8>, String) {
    let dir = std::env::temp_dir().join(format!(
        "felix-bench-{}-{}",
        std::process::id(),
        free_udp_port()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let ca = dir.join("ca.pem");
    let token = dir.join("token");
    let addr: SocketAddr = format!("127.0.0.1:{}", free_udp_port())
        .parse()
        .expect("addr");
    let child = std::process::Command::new(path)
        .env("FELIX_QUIC_BIND", addr.to_string())
        .env("FELIX_TLS_CERT_EXPORT", &ca)
        .env("FELIX_DEV_TOKEN_EXPORT", &token)
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {path}: {e} (build it with cargo build --release --bin felix-broker)"
            )
        });
    let mut child = child;
    for _ in 0..100 {
        if let (Ok(ca_pem), Ok(token)) = (std::fs::read(&ca), std::fs::read_to_string(&token)) {
            return (child, addr, ca_pem, token.trim().to_owned());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("{path} did not export its CA and token within 5 s");
}

/// Awaits `fut`, panicking if it takes longer than `secs` seconds: no test waits forever.
/// With `FELIX_TEST_LOG` set (an env filter, e.g. `felix_engine=debug`), the in-process
/// brokers' logs go to stderr; call first in a test. For reading a failure, not for asserting.
pub fn test_logs() {
    if let Ok(filter) = std::env::var("FELIX_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
}

pub async fn within<T>(secs: u64, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out after {secs}s"))
}

/// The next event of `sub`, panicking on an end, an error, or 10 s of silence.
pub async fn next_event(sub: &mut Subscription) -> Event {
    match within(10, sub.next()).await {
        Ok(SubscriptionItem::Event(event)) => event,
        other => panic!("expected an event, got {other:?}"),
    }
}

/// Asserts that `sub` delivers nothing within `ms` milliseconds.
pub async fn assert_quiet(sub: &mut Subscription, ms: u64) {
    if let Ok(item) = tokio::time::timeout(Duration::from_millis(ms), sub.next()).await {
        panic!("expected no delivery, got {item:?}");
    }
}

/// The wall clock in microseconds since the Unix epoch, as the broker stamps records.
pub fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64
}

/// A name no other test uses (tests share nothing, but names make failures readable).
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Polls every future in the order given (so they enter the client's queues in that order).
pub async fn join_all<F: std::future::Future>(
    futures: impl IntoIterator<Item = F>,
) -> Vec<F::Output> {
    let mut set = Vec::new();
    for f in futures {
        set.push(Box::pin(f));
    }
    let mut outputs: Vec<Option<F::Output>> = (0..set.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in set.iter_mut().enumerate() {
            if outputs[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => outputs[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().map(|o| o.expect("ready")).collect()
}

fn newest_source(dirs: &[PathBuf]) -> SystemTime {
    let mut newest = SystemTime::UNIX_EPOCH;
    let mut stack: Vec<PathBuf> = dirs.to_vec();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                if let Ok(m) = e.metadata().and_then(|m| m.modified()) {
                    newest = newest.max(m);
                }
            }
        }
    }
    newest
}

/// `path` as given if absolute, else relative to the workspace root: tests run in their
/// crate's directory, but the commands in the docs are written from the root.
pub fn from_workspace(path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        return path.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// The `felix-broker` binary for tests that run the real process: `FELIX_BROKER_BIN` if set,
/// else the newest of `target/{release,debug}/felix-broker` that is not older than the
/// broker's sources, else one built here into `target/crash-test`.
pub fn broker_binary() -> PathBuf {
    if let Ok(path) = std::env::var("FELIX_BROKER_BIN") {
        return from_workspace(&path);
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace.join("target"));
    let sources = newest_source(&[
        workspace.join("felix-engine/src"),
        workspace.join("runtime-common/src"),
        workspace.join("runtime-tokio/src"),
        workspace.join("runtime-smol/src"),
        workspace.join("felix-broker/src"),
        workspace.join("felix-proto/src"),
    ]);
    let fresh = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .ok()
            .filter(|m| *m >= sources)
    };
    let candidates = [
        target.join("release/felix-broker"),
        target.join("debug/felix-broker"),
        target.join("crash-test/debug/felix-broker"),
    ];
    if let Some(best) = candidates
        .iter()
        .filter_map(|p| fresh(p).map(|m| (m, p)))
        .max()
    {
        return best.1.clone();
    }
    // A separate target directory: the one this test runs from may be locked by cargo.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", "felix-broker", "--bin", "felix-broker"])
        .env("CARGO_TARGET_DIR", target.join("crash-test"))
        .current_dir(&workspace)
        .status()
        .expect("run cargo build");
    assert!(status.success(), "building felix-broker failed");
    target.join("crash-test/debug/felix-broker")
}

/// A broker for a benchmark: in this process, on a one-worker tokio runtime and a thread of
/// its own, so the clients' runtime never shares its thread.
pub struct BenchBroker {
    pub addr: SocketAddr,
    pub ca_pem: Vec<u8>,
    /// The dev token for [`TENANT`].
    pub token: String,
    /// The file executor of a durable broker, for its counters.
    pub files: Option<std::sync::Arc<FileExecutor>>,
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl BenchBroker {
    /// Starts the broker and returns once it listens.
    pub fn start(opts: BrokerOptions) -> BenchBroker {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("broker".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("broker-rt")
                    .enable_all()
                    .build()
                    .expect("broker runtime");
                rt.block_on(async move {
                    let broker = felix_runtime_tokio::start(opts)
                        .await
                        .expect("broker starts");
                    tx.send((
                        broker.local_addr(),
                        broker.ca_cert_pem().as_bytes().to_vec(),
                        broker.dev_token().expect("dev mode").to_owned(),
                        broker.file_executor(),
                    ))
                    .expect("the starting thread waits");
                    tokio::task::spawn_blocking(move || stopped.recv())
                        .await
                        .expect("stop wait")
                        .ok();
                    broker.shutdown().await.expect("clean shutdown");
                });
            })
            .expect("broker thread");
        let (addr, ca_pem, token, files) = rx.recv().expect("broker started");
        BenchBroker {
            addr,
            ca_pem,
            token,
            files,
            stop,
            thread,
        }
    }

    /// A client configuration for [`TENANT`] with a request timeout long enough for a
    /// benchmark's deepest queues.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new(self.addr, self.ca_pem.clone(), TENANT, &self.token);
        c.request_timeout = Duration::from_secs(60);
        c
    }

    /// A connected client ([`BenchBroker::client_config`]).
    pub async fn client(&self) -> Client {
        Client::connect(self.client_config())
            .await
            .expect("client connects")
    }

    /// The file executor's counters so far (zero for an in-memory broker).
    pub fn file_stats(&self) -> FileStats {
        self.files.as_ref().map(|f| f.stats()).unwrap_or_default()
    }

    /// Shuts the broker down cleanly and waits for its thread.
    pub fn stop(self) {
        self.stop.send(()).ok();
        self.thread.join().expect("broker thread");
    }
}

/// A benchmark's command line: `--name value` pairs, the last of a name winning.
pub struct BenchArgs(Vec<(String, String)>);

impl BenchArgs {
    pub fn parse() -> BenchArgs {
        let mut it = std::env::args().skip(1);
        let mut opts = Vec::new();
        while let Some(k) = it.next() {
            let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
            opts.push((k.trim_start_matches("--").to_owned(), v));
        }
        BenchArgs(opts)
    }

    fn raw(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `--key`'s value, or `default` when absent.
    pub fn get<T: std::str::FromStr>(&self, key: &str, default: T) -> T {
        self.raw(key)
            .map(|v| v.parse().unwrap_or_else(|_| panic!("bad --{key}")))
            .unwrap_or(default)
    }

    /// `--key` as a comma-separated list of numbers, or `default` (in the same form).
    pub fn list(&self, key: &str, default: &str) -> Vec<usize> {
        self.raw(key)
            .unwrap_or(default)
            .split(',')
            .map(|n| n.trim().parse().expect("a number"))
            .collect()
    }
}

/// CPU time (user + system, seconds) of this process's threads whose name starts with
/// `prefix` — the in-process [`BenchBroker`]'s threads are `broker` and `broker-rt` — read
/// from `/proc/self/task`. Threads that have ended are not counted. `None` off Linux.
pub fn threads_cpu_seconds(prefix: &str) -> Option<f64> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    let mut total = 0.0;
    for task in tasks.flatten() {
        let dir = task.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.trim_end().starts_with(prefix) {
            continue;
        }
        // schedstat's first field is the time on a CPU in nanoseconds; stat's ticks are the
        // fallback where the kernel keeps no schedstat.
        let precise = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        total += match precise {
            Some(ns) => ns as f64 / 1e9,
            None => stat_cpu_seconds(&dir.join("stat")).unwrap_or(0.0),
        };
    }
    Some(total)
}

/// CPU time of a whole process (every thread, ended ones too): `/proc/<pid>/stat`, or
/// `/proc/self/stat` for `None`.
pub fn process_cpu_seconds(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(pid) => PathBuf::from(format!("/proc/{pid}/stat")),
        None => PathBuf::from("/proc/self/stat"),
    };
    stat_cpu_seconds(&path)
}

/// utime + stime from a `stat` file, in seconds (clock ticks of 1/100 s, Linux's USER_HZ).
fn stat_cpu_seconds(path: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    // The command name, in parentheses, may hold spaces; the fields after it are fixed.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime field 14 and stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}
