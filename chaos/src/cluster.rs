//! Three `felix-broker` processes on loopback, every peer link through a relay of its own
//! (one per ordered pair: node A dials B at relay A→B, which forwards to B's internal bind),
//! so one direction of one link can be cut. Files as `felix cluster up` writes them
//! (`felix_cli::layout`), plus durable storage with fsync on every commit, a short lease and
//! the two declared streams. `felix-repl-bench` lays out the same files through [`Layout`]:
//! its own streams, direct peer links, or one node without a cluster.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use felix_cli::layout::{toml_string, Certificates, NodeConfig};
use felix_testkit::Relay;

pub const NODES: [&str; 3] = ["n1", "n2", "n3"];
pub const TENANT: &str = "t1";
pub const NAMESPACE: &str = "chaos";
/// The declared streams: name and consistency (the name says which).
pub const STREAMS: [&str; 2] = ["quorum", "leader"];
pub const SHARDS: u32 = 3;
pub const REPLICATION_FACTOR: u32 = 3;
/// `cluster.lease_ms`: short, so a node stopped for two leases is a fault of seconds.
pub const LEASE: Duration = Duration::from_millis(1000);
/// How long a node may take to answer `/readyz` 200 after it starts.
pub const READY_LIMIT: Duration = Duration::from_secs(60);
/// Between two looks at `/readyz`.
const POLL: Duration = Duration::from_millis(100);
/// One HTTP request to the ops endpoint may take this long.
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a node has to exit after SIGTERM at the end before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

pub struct Node {
    pub id: &'static str,
    pub client: SocketAddr,
    pub internal: SocketAddr,
    pub ops: SocketAddr,
    config: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
}

/// One `[[streams]]` declaration.
#[derive(Debug, Clone)]
pub struct StreamDecl {
    pub name: &'static str,
    pub shards: u32,
    pub replication_factor: u32,
    /// `"leader"` or `"quorum"`.
    pub consistency: &'static str,
}

/// What [`Cluster::lay_out_with`] writes.
#[derive(Debug, Clone)]
pub struct Layout {
    /// `NODES.len()` nodes in a cluster, or one node with no `[cluster]` section at all.
    pub cluster: bool,
    pub streams: Vec<StreamDecl>,
    pub fsync_mode: String,
    pub lease: Duration,
    /// Every peer link through a relay of its own (a link can be cut), or direct.
    pub relays: bool,
    /// The run directory's name starts with it.
    pub prefix: &'static str,
}

impl Layout {
    /// The chaos run's: three nodes, relayed links, the two streams of [`STREAMS`].
    pub fn chaos() -> Layout {
        Layout {
            cluster: true,
            streams: STREAMS
                .iter()
                .map(|name| StreamDecl {
                    name,
                    shards: SHARDS,
                    replication_factor: REPLICATION_FACTOR,
                    consistency: name,
                })
                .collect(),
            fsync_mode: "on_commit".into(),
            lease: LEASE,
            relays: true,
            prefix: "felix-chaos",
        }
    }
}

pub struct Cluster {
    pub dir: PathBuf,
    pub nodes: Vec<Node>,
    /// `relays[from][to]`: the link `from` dials to reach `to` (`None` on the diagonal).
    pub relays: Vec<Vec<Option<Relay>>>,
    pub ca_pem: String,
    pub token: String,
    broker: PathBuf,
    /// The run's signing key (its JWKS names it `chaos`): [`Cluster::mint`].
    key: felix_auth::SigningKey,
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A loopback port free now for UDP and TCP, below the ephemeral range (Linux: 32768 up), so
/// that while a killed node is down no `bind(0)` elsewhere is handed its port. Ports go round
/// a window from a per-process start; one in use is skipped.
fn kept_port(next: &mut u32) -> Result<u16, String> {
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    for _ in 0..SPAN {
        let port = (LOW + *next % SPAN) as u16;
        *next += 1;
        let udp = std::net::UdpSocket::bind(loopback(port));
        let tcp = std::net::TcpListener::bind(loopback(port));
        if udp.is_ok() && tcp.is_ok() {
            return Ok(port);
        }
    }
    Err(format!("no free loopback port in {LOW}..{}", LOW + SPAN))
}

fn write(path: &Path, contents: &[u8]) -> Result<(), String> {
    std::fs::write(path, contents).map_err(|e| format!("writing {}: {e}", path.display()))
}

impl Cluster {
    /// Writes every file and starts the relays; no node runs yet.
    pub fn lay_out(broker: &Path) -> Result<Cluster, String> {
        Cluster::lay_out_with(broker, &Layout::chaos())
    }

    /// [`Cluster::lay_out`] with other streams, settings or links.
    pub fn lay_out_with(broker: &Path, layout: &Layout) -> Result<Cluster, String> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "{}-{}-{nanos:x}",
            layout.prefix,
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;

        // Two layouts in one process (the bench's cluster and single node) start their port
        // windows apart.
        let mut next = (std::process::id() * 7919 + u32::from(!layout.cluster) * 6000) % 12_000;
        let mut nodes = Vec::new();
        let ids: &[&'static str] = if layout.cluster { &NODES } else { &NODES[..1] };
        for &id in ids {
            let node_dir = dir.join(id);
            std::fs::create_dir_all(node_dir.join("data"))
                .map_err(|e| format!("creating {}: {e}", node_dir.display()))?;
            nodes.push(Node {
                id,
                client: loopback(kept_port(&mut next)?),
                internal: loopback(kept_port(&mut next)?),
                ops: loopback(kept_port(&mut next)?),
                config: dir.join(format!("{id}.toml")),
                log: node_dir.join("broker.log"),
                child: None,
            });
        }
        let relays: Vec<Vec<Option<Relay>>> = (0..nodes.len())
            .map(|from| {
                (0..nodes.len())
                    .map(|to| {
                        (layout.relays && from != to)
                            .then(|| Relay::start(loopback(0), nodes[to].internal))
                            .transpose()
                    })
                    .collect::<Result<_, _>>()
            })
            .collect::<Result<_, _>>()
            .map_err(|e| format!("starting a relay: {e}"))?;

        let certs = Certificates::new().map_err(|e| format!("generating certificates: {e}"))?;
        let ca = dir.join("ca.pem");
        write(&ca, certs.ca_pem.as_bytes())?;
        // A key of the run's own, from its start time: the token is valid for this run only.
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&u64::from(nanos).to_le_bytes());
        seed[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        let key = felix_auth::SigningKey::from_bytes(&seed);
        let jwks = dir.join("jwks.json");
        write(
            &jwks,
            felix_auth::jwks_document(&[("chaos", &key)]).as_bytes(),
        )?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| "the system clock is before 1970".to_owned())?
            .as_secs();
        let token = felix_auth::mint_token(
            &key,
            "chaos",
            &felix_auth::Claims::for_tenant(
                TENANT,
                felix_auth::full_permissions(TENANT),
                now,
                3600,
            ),
        );

        let mut streams = String::new();
        for s in &layout.streams {
            streams.push_str(&format!(
                "\n[[streams]]\ntenant = {}\nnamespace = {}\nstream = {}\nshards = {}\n\
                 replication_factor = {}\nconsistency = {}\n",
                toml_string(TENANT),
                toml_string(NAMESPACE),
                toml_string(s.name),
                s.shards,
                s.replication_factor,
                toml_string(s.consistency),
            ));
        }
        for (i, node) in nodes.iter().enumerate() {
            let peers = nodes
                .iter()
                .enumerate()
                .map(|(j, n)| {
                    let addr = match &relays[i][j] {
                        Some(relay) => relay.listen_addr(),
                        None => n.internal,
                    };
                    format!("{}={addr}", n.id)
                })
                .collect::<Vec<_>>()
                .join(",");
            let node_dir = dir.join(node.id);
            let (cert_pem, key_pem) = certs
                .leaf(node.id)
                .map_err(|e| format!("generating certificates: {e}"))?;
            let (cert, key) = (node_dir.join("cert.pem"), node_dir.join("key.pem"));
            write(&cert, cert_pem.as_bytes())?;
            write(&key, key_pem.as_bytes())?;
            let mut text = NodeConfig {
                id: node.id,
                client: node.client,
                internal: node.internal,
                ops: node.ops,
                peers: &peers,
                runtime: None,
                cert: &cert,
                key: &key,
                ca: &ca,
                jwks: &jwks,
                data: &node_dir.join("data"),
                fsync_mode: Some(&layout.fsync_mode),
                lease_ms: Some(layout.lease.as_millis() as u64),
            }
            .render();
            if !layout.cluster {
                // A plain durable broker: the `[cluster]` section is the last one written.
                if let Some(at) = text.find("\n[cluster]") {
                    text.truncate(at + 1);
                }
            }
            text.push_str(&streams);
            write(&node.config, text.as_bytes())?;
        }
        Ok(Cluster {
            dir,
            nodes,
            relays,
            ca_pem: certs.ca_pem,
            token,
            broker: broker.to_path_buf(),
            key,
        })
    }

    /// A token of this run for [`TENANT`] granting `perms`, valid for `ttl_secs` from now.
    pub fn mint(&self, perms: Vec<String>, ttl_secs: u64) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        felix_auth::mint_token(
            &self.key,
            "chaos",
            &felix_auth::Claims::for_tenant(TENANT, perms, now, ttl_secs),
        )
    }

    /// Appends `text` (`[[streams]]`, `[[caches]]` tables of other namespaces) to every
    /// node's configuration; before the nodes start.
    pub fn append_config(&self, text: &str) -> Result<(), String> {
        for node in &self.nodes {
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(&node.config)
                .map_err(|e| format!("opening {}: {e}", node.config.display()))?;
            file.write_all(text.as_bytes())
                .map_err(|e| format!("writing {}: {e}", node.config.display()))?;
        }
        Ok(())
    }

    /// Node `i`'s configuration file: a test may change one node's before it starts.
    pub fn config_of(&self, i: usize) -> &Path {
        &self.nodes[i].config
    }

    /// Starts node `i` from its config and data directory (its log is appended to).
    pub fn start(&mut self, i: usize) -> Result<u32, String> {
        use std::os::unix::process::CommandExt;
        let node = &mut self.nodes[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .map_err(|e| format!("opening {}: {e}", node.log.display()))?;
        let err = log
            .try_clone()
            .map_err(|e| format!("{}: {e}", node.log.display()))?;
        let child = Command::new(&self.broker)
            .arg("--config")
            .arg(&node.config)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            // Its own group: a terminal's Ctrl-C reaches this process only.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.broker.display()))?;
        let pid = child.id();
        node.child = Some(child);
        Ok(pid)
    }

    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].child.as_ref().map(Child::id)
    }

    /// Sends `signal` to node `i`, a process this run started and has not reaped.
    pub fn signal(&mut self, i: usize, signal: libc::c_int) -> Result<(), String> {
        let node = &mut self.nodes[i];
        let child = node
            .child
            .as_mut()
            .ok_or_else(|| format!("{} is not running", node.id))?;
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "{} exited by itself ({status}); see {}",
                node.id,
                node.log.display()
            ));
        }
        // SAFETY: `kill` has no memory effects; the pid is our own unreaped child, so it
        // cannot name another process.
        let rc = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        if rc != 0 {
            return Err(format!(
                "kill({}, {signal}): {}",
                child.id(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// Empties node `i`'s data directory (it must not be running): it comes back blank.
    pub fn wipe(&mut self, i: usize) -> Result<(), String> {
        let data = self.dir.join(self.nodes[i].id).join("data");
        std::fs::remove_dir_all(&data)
            .and_then(|()| std::fs::create_dir_all(&data))
            .map_err(|e| format!("wiping {}: {e}", data.display()))
    }

    /// SIGKILL, then reaps the process (so its ports are free for the restart).
    pub fn kill(&mut self, i: usize) -> Result<(), String> {
        self.signal(i, libc::SIGKILL)?;
        if let Some(mut child) = self.nodes[i].child.take() {
            child
                .wait()
                .map_err(|e| format!("waiting for {}: {e}", self.nodes[i].id))?;
        }
        Ok(())
    }

    /// Waits until node `i` answers `/readyz` 200, at most `limit`.
    pub fn wait_ready(&mut self, i: usize, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let node = &mut self.nodes[i];
        loop {
            if let Some(Ok(Some(status))) = node.child.as_mut().map(Child::try_wait) {
                return Err(format!(
                    "{} exited ({status}); its log ends:\n{}",
                    node.id,
                    log_tail(&node.log)
                ));
            }
            if http_status(node.ops, "/readyz") == Some(200) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} did not answer /readyz 200 within {limit:?} (log {})",
                    node.id,
                    node.log.display()
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Which nodes exited without being told to.
    pub fn exited(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for node in &mut self.nodes {
            if let Some(Ok(Some(status))) = node.child.as_mut().map(Child::try_wait) {
                out.push(format!("{} exited ({status})", node.id));
            }
        }
        out
    }

    /// SIGCONT (in case), SIGTERM to every node, a bounded wait, then SIGKILL.
    pub fn stop_all(&mut self) {
        for i in 0..self.nodes.len() {
            let _ = self.signal(i, libc::SIGCONT);
            let _ = self.signal(i, libc::SIGTERM);
        }
        let deadline = Instant::now() + STOP_GRACE;
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                loop {
                    match child.try_wait() {
                        Ok(Some(_)) => break,
                        Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
                        _ => {
                            let _ = child.kill();
                            let _ = child.wait();
                            break;
                        }
                    }
                }
            }
        }
    }

    pub fn heal_all(&self) {
        for relay in self.relays.iter().flatten().flatten() {
            relay.heal();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// `GET path`: the status code and, if `body`, the whole answer (bounded).
pub fn http_get(addr: SocketAddr, path: &str, body: bool) -> Option<(u16, String)> {
    const MAX_ANSWER: usize = 1 << 20;
    let mut conn = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).ok()?;
    conn.set_read_timeout(Some(HTTP_TIMEOUT)).ok()?;
    conn.set_write_timeout(Some(HTTP_TIMEOUT)).ok()?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while (body || !answer.contains(&b'\n')) && answer.len() < MAX_ANSWER {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, text))
}

fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    http_get(addr, path, false).map(|(status, _)| status)
}

impl Cluster {
    /// What each node says of itself and what each relay carried: for a run that failed.
    pub fn diagnose(&self) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            let ready = http_status(node.ops, "/readyz");
            out.push_str(&format!("  {} /readyz {ready:?}:", node.id));
            if let Some((_, text)) = http_get(node.ops, "/metrics", true) {
                for line in text.lines().filter(|l| {
                    l.starts_with("felix_broker_cluster") || l.starts_with("felix_broker_peer")
                }) {
                    out.push_str(&format!(" {line};"));
                }
            }
            out.push('\n');
        }
        for (from, row) in self.relays.iter().enumerate() {
            for (to, relay) in row.iter().enumerate() {
                if let Some(r) = relay {
                    out.push_str(&format!(
                        "  relay {}->{}: forward {:?} backward {:?}\n",
                        NODES[from],
                        NODES[to],
                        r.counts(felix_testkit::Direction::Forward),
                        r.counts(felix_testkit::Direction::Backward)
                    ));
                }
            }
        }
        out
    }
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
