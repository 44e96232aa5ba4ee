//! `felix cluster up`: a local cluster on loopback in one command (docs/cluster.md).
//!
//! Everything a cluster node needs is made here: one CA and a leaf per node (the node's
//! client-facing certificate and its peer mTLS certificate at once), a JWKS with a token
//! minted against it, a data directory and free ports per node, and `nodeN.toml` files in
//! the form docs/cluster.md describes. Then one `felix-broker --config nodeN.toml` per node
//! runs until Ctrl-C (or SIGTERM), when every node is stopped: SIGTERM, a bounded wait, then
//! SIGKILL. The directory is kept, logs included.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};
use ed25519_dalek::SigningKey;
use felix_cli::layout::{Certificates, NodeConfig};

use crate::failure::Failure;
use crate::token;

/// The tenant the minted token is for (the dev tenant every example uses).
pub(crate) const TENANT: &str = "t1";
/// Key id of the generated signing key, in the JWKS and the token header.
const KID: &str = "felix-cluster-dev";
/// How long the minted token is valid.
const TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long a stopped node has to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(15);
/// Between two looks at a node's health endpoint, or at the signal flag.
const POLL: Duration = Duration::from_millis(100);
/// One health request may take this long.
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Args, Debug)]
pub(crate) struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Start a local cluster on loopback and run it until Ctrl-C.
    Up(UpArgs),
}

#[derive(Args, Debug)]
struct UpArgs {
    /// Nodes in the cluster: 3 or 5.
    #[arg(long, default_value_t = 3, value_parser = parse_nodes)]
    nodes: usize,
    /// Directory for certificates, token, configs, data and logs (created; must be empty if
    /// it exists). Default: a fresh directory under the system temp directory.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// The felix-broker binary. Default: next to this `felix`, else `felix-broker` on PATH.
    #[arg(long, value_name = "PATH")]
    broker: Option<PathBuf>,
    /// The runtime every node runs on.
    #[arg(long, value_parser = ["tokio", "smol"])]
    runtime: Option<String>,
    /// Create a stream once the cluster is up, through the admin API (repeatable):
    /// `TENANT/NAMESPACE/STREAM:SHARDS[:REPLICATION_FACTOR[:CONSISTENCY]][:max_age=DURATION]
    /// [:max_bytes=N]`, CONSISTENCY `leader` (default) or `quorum`, DURATION like `86400`,
    /// `7d` or `12h` (whole seconds). Other streams are placed on first use.
    #[arg(long = "stream", value_name = "SPEC", value_parser = parse_stream)]
    streams: Vec<Declared>,
    /// Create a cache once the cluster is up, through the admin API (repeatable):
    /// `TENANT/NAMESPACE/CACHE[:REPLICATION_FACTOR][:shards=N]`.
    #[arg(long = "cache", value_name = "SPEC", value_parser = parse_cache)]
    caches: Vec<Declared>,
    /// How long the nodes together may take to answer their health endpoints.
    #[arg(long, default_value = "60s", value_parser = crate::duration::parse)]
    start_timeout: Duration,
}

/// A `--stream` or `--cache` spec: created through the admin API once the cluster is up.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Declared {
    names: [String; 3],
    shards: u32,
    replication_factor: u8,
    /// A stream's `consistency` as the broker spells it; `None` for a cache, which has none.
    consistency: Option<&'static str>,
    /// A stream's own retention (`max_age=`, `max_bytes=`); unset: the broker-wide bound.
    max_age_seconds: Option<u64>,
    max_bytes: Option<u64>,
}

/// The spec's `key=value` fields (after the positional ones): `max_age` and `max_bytes` for a
/// stream, `shards` for a cache. Each above zero, at most once.
fn keyed(text: &str, parts: &mut Vec<&str>, stream: bool) -> Result<Vec<(String, u64)>, String> {
    let mut out: Vec<(String, u64)> = Vec::new();
    let allowed: &[&str] = if stream {
        &["max_age", "max_bytes"]
    } else {
        &["shards"]
    };
    while let Some(pos) = parts.iter().position(|p| p.contains('=')) {
        let (k, v) = parts.remove(pos).split_once('=').expect("contains '='");
        if !allowed.contains(&k) {
            return Err(format!(
                "{text:?}: unknown field {k:?} (expected {})",
                allowed.join(" or ")
            ));
        }
        let n = if k == "max_age" {
            let d = crate::duration::parse(v).map_err(|e| format!("{text:?}: max_age: {e}"))?;
            (d.subsec_nanos() == 0)
                .then_some(d.as_secs())
                .ok_or_else(|| format!("{text:?}: max_age {v:?}: whole seconds"))?
        } else {
            v.parse::<u64>()
                .map_err(|e| format!("{text:?}: {k} {v:?}: {e}"))?
        };
        if n == 0 {
            return Err(format!("{text:?}: {k} 0 would keep nothing"));
        }
        if out.iter().any(|(seen, _)| seen == k) {
            return Err(format!("{text:?}: {k} given twice"));
        }
        out.push((k.to_owned(), n));
    }
    Ok(out)
}

fn parse_declared(text: &str, with_shards: bool) -> Result<Declared, String> {
    let mut all: Vec<&str> = text.split(':').collect();
    let keyed = keyed(text, &mut all, with_shards)?;
    let field = |k: &str| keyed.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
    let mut parts = all.into_iter();
    let path = parts.next().unwrap_or_default();
    let names: Vec<&str> = path.split('/').collect();
    let [t, n, s] = names[..] else {
        return Err(format!("{text:?}: expected TENANT/NAMESPACE/NAME"));
    };
    let number = |p: Option<&str>, what: &str| -> Result<Option<u64>, String> {
        p.map(|v| {
            v.parse::<u64>()
                .map_err(|e| format!("{text:?}: {what} {v:?}: {e}"))
        })
        .transpose()
    };
    let shards = if with_shards {
        number(parts.next(), "shards")?.ok_or_else(|| format!("{text:?}: expected :SHARDS"))?
    } else {
        0
    };
    let rf = number(parts.next(), "replication factor")?.unwrap_or(1);
    // A cache's shard count: `shards=N`, or a field after its replication factor (default 1).
    let shards = if with_shards {
        shards
    } else {
        match (field("shards"), number(parts.next(), "shards")?) {
            (Some(_), Some(_)) => return Err(format!("{text:?}: shards given twice")),
            (keyed, positional) => keyed.or(positional).unwrap_or(1),
        }
    };
    let consistency = if with_shards {
        match parts.next() {
            None | Some("leader") => Some("leader"),
            Some("quorum") => Some("quorum"),
            Some(other) => {
                return Err(format!(
                    "{text:?}: consistency {other:?}: expected \"leader\" or \"quorum\""
                ))
            }
        }
    } else {
        None
    };
    if parts.next().is_some() {
        return Err(format!("{text:?}: too many ':' fields"));
    }
    Ok(Declared {
        names: [t.to_owned(), n.to_owned(), s.to_owned()],
        shards: u32::try_from(shards).map_err(|_| format!("{text:?}: too many shards"))?,
        replication_factor: u8::try_from(rf)
            .map_err(|_| format!("{text:?}: replication factor"))?,
        consistency,
        max_age_seconds: field("max_age"),
        max_bytes: field("max_bytes"),
    })
}

impl Declared {
    /// The admin API's path and body that create it.
    fn request(&self) -> (&'static str, serde_json::Value) {
        let [t, n, s] = &self.names;
        match self.consistency {
            Some(consistency) => (
                "/v1/streams",
                serde_json::json!({
                    "tenant": t, "namespace": n, "stream": s,
                    "shards": self.shards,
                    "replication_factor": self.replication_factor,
                    "consistency": consistency,
                    "retention": {
                        "max_age_seconds": self.max_age_seconds,
                        "max_bytes": self.max_bytes,
                    },
                }),
            ),
            None => (
                "/v1/caches",
                serde_json::json!({
                    "tenant": t, "namespace": n, "cache": s,
                    "shards": self.shards,
                    "replication_factor": self.replication_factor,
                }),
            ),
        }
    }
}

/// Creates every `--stream` and `--cache` through the admin API, asking the nodes in turn:
/// a `503` or no answer (the control plane still electing) is asked again until `deadline`;
/// a `4xx` is the operator's to fix (exit 3).
fn create_all(
    nodes: &[Node],
    token: &str,
    objects: &[Declared],
    deadline: Instant,
) -> Result<(), Failure> {
    for d in objects {
        let (path, body) = d.request();
        let name = d.names.join("/");
        let mut last = String::new();
        'asking: loop {
            for node in nodes {
                let addr = node.ops.to_string();
                match crate::admin_streams::request(&addr, "POST", path, token, Some(&body)) {
                    Ok((200 | 201, _)) => break 'asking,
                    Ok((status @ 400..=499, text)) => {
                        return Err(Failure::Refused(format!(
                            "creating {name}: {status}: {text}"
                        )))
                    }
                    Ok((status, text)) => last = format!("{status}: {text}"),
                    Err(e) => last = format!("{e:?}"),
                }
            }
            if Instant::now() >= deadline {
                return Err(Failure::Connection(format!("creating {name}: {last}")));
            }
            std::thread::sleep(POLL);
        }
        println!("created: {name}");
    }
    Ok(())
}

fn parse_stream(text: &str) -> Result<Declared, String> {
    parse_declared(text, true)
}

fn parse_cache(text: &str) -> Result<Declared, String> {
    parse_declared(text, false)
}

fn parse_nodes(text: &str) -> Result<usize, String> {
    match text.trim() {
        "3" => Ok(3),
        "5" => Ok(5),
        other => Err(format!(
            "{other:?}: a cluster has 3 or 5 nodes (a majority that survives a failure)"
        )),
    }
}

pub(crate) fn run(args: ClusterArgs) -> Result<(), Failure> {
    match args.command {
        ClusterCommand::Up(up) => cluster_up(up),
    }
}

/// One node: its name, files and addresses.
struct Node {
    id: String,
    dir: PathBuf,
    config: PathBuf,
    client: SocketAddr,
    internal: SocketAddr,
    ops: SocketAddr,
}

fn cluster_up(args: UpArgs) -> Result<(), Failure> {
    // Registered before any node starts, so a Ctrl-C during the start still stops them all.
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .map_err(|e| Failure::io("installing the signal handler", e))?;
    }
    let dir = prepare_dir(args.dir.as_deref())?;
    let broker = broker_binary(args.broker.as_deref())?;
    let nodes = lay_out(&dir, args.nodes, args.runtime.as_deref())?;
    println!("felix cluster: {} nodes in {}", nodes.len(), dir.display());

    let mut running: Vec<(String, Child)> = Vec::new();
    let deadline = Instant::now() + args.start_timeout;
    let started = start_all(&broker, &nodes, &mut running, &stop, args.start_timeout);
    // The objects asked for are the cluster's own records (alter or delete them like any
    // other), not configuration every node would ensure again at each start.
    let started = started.and_then(|()| {
        let token = std::fs::read_to_string(dir.join("token"))
            .map_err(|e| Failure::io("reading the token", e))?;
        let objects: Vec<Declared> = args.streams.iter().chain(&args.caches).cloned().collect();
        create_all(&nodes, token.trim(), &objects, deadline)
    });
    if let Err(failure) = started {
        stop_all(&mut running);
        return Err(failure);
    }
    if stop.load(Ordering::SeqCst) {
        stop_all(&mut running);
        return Ok(());
    }

    let seeds: Vec<String> = nodes.iter().map(|n| n.client.to_string()).collect();
    let ca = dir.join("ca.pem");
    let token = dir.join("token");
    println!("seeds: {}", seeds.join(","));
    println!("ca: {}", ca.display());
    println!(
        "token: {} (tenant {TENANT}, every permission, valid {} h)",
        token.display(),
        TOKEN_TTL.as_secs() / 3600
    );
    println!("python:");
    println!("  import felix");
    println!(
        "  client = felix.Client([{}], tenant_id=\"{TENANT}\", token=open(\"{}\").read().strip(), ca_file=\"{}\")",
        seeds
            .iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", "),
        token.display(),
        ca.display()
    );
    println!("Ctrl-C stops the cluster.");
    let _ = std::io::stdout().flush();

    // Until a signal: a node that dies meanwhile is reported once, the others keep running.
    let mut reported = vec![false; running.len()];
    while !stop.load(Ordering::SeqCst) {
        for ((id, child), reported) in running.iter_mut().zip(reported.iter_mut()) {
            if let (false, Ok(Some(status))) = (*reported, child.try_wait()) {
                eprintln!("felix cluster: node {id} exited ({status}); see its broker.log");
                *reported = true;
            }
        }
        std::thread::sleep(POLL);
    }
    stop_all(&mut running);
    println!("felix cluster: stopped");
    Ok(())
}

/// The given directory (created, refused if it holds anything) or a fresh one under the
/// system temp directory.
fn prepare_dir(dir: Option<&Path>) -> Result<PathBuf, Failure> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            std::env::temp_dir().join(format!("felix-cluster-{}-{nanos:x}", std::process::id()))
        }
    };
    std::fs::create_dir_all(&dir)
        .map_err(|e| Failure::usage(format!("cannot create {}: {e}", dir.display())))?;
    let used = std::fs::read_dir(&dir)
        .map_err(|e| Failure::usage(format!("cannot read {}: {e}", dir.display())))?
        .next()
        .is_some();
    if used {
        return Err(Failure::usage(format!(
            "{} is not empty: give a new or empty directory",
            dir.display()
        )));
    }
    // Absolute, so the printed paths and the configs work from any directory.
    std::fs::canonicalize(&dir).map_err(|e| Failure::usage(format!("{}: {e}", dir.display())))
}

/// `--broker`, else `felix-broker` next to this executable, else the one on PATH.
fn broker_binary(flag: Option<&Path>) -> Result<PathBuf, Failure> {
    if let Some(path) = flag {
        if !path.is_file() {
            return Err(Failure::usage(format!(
                "--broker {}: no such file",
                path.display()
            )));
        }
        return Ok(path.to_path_buf());
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("felix-broker")))
        .filter(|p| p.is_file());
    Ok(beside.unwrap_or_else(|| PathBuf::from("felix-broker")))
}

/// Free loopback ports: `udp` UDP ones and `tcp` TCP ones, all held until every one is
/// picked so no two are the same, then released for the nodes to bind.
fn free_ports(udp: usize, tcp: usize) -> Result<(Vec<SocketAddr>, Vec<SocketAddr>), Failure> {
    let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let io = |e| Failure::io("finding a free loopback port", e);
    let udp_sockets = (0..udp)
        .map(|_| UdpSocket::bind(any))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io)?;
    let tcp_listeners = (0..tcp)
        .map(|_| TcpListener::bind(any))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io)?;
    let udp = udp_sockets
        .iter()
        .map(UdpSocket::local_addr)
        .collect::<Result<Vec<_>, _>>()
        .map_err(io)?;
    let tcp = tcp_listeners
        .iter()
        .map(TcpListener::local_addr)
        .collect::<Result<Vec<_>, _>>()
        .map_err(io)?;
    Ok((udp, tcp))
}

/// Writes the CA, each node's certificate, key, data directory and config, the JWKS and the
/// token.
fn lay_out(dir: &Path, count: usize, runtime: Option<&str>) -> Result<Vec<Node>, Failure> {
    let (udp, tcp) = free_ports(2 * count, count)?;
    let nodes: Vec<Node> = (0..count)
        .map(|i| {
            let id = format!("n{}", i + 1);
            let node_dir = dir.join(&id);
            Node {
                config: dir.join(format!("node{}.toml", i + 1)),
                dir: node_dir,
                id,
                client: udp[2 * i],
                internal: udp[2 * i + 1],
                ops: tcp[i],
            }
        })
        .collect();

    let write = |path: &Path, contents: &[u8]| {
        std::fs::write(path, contents)
            .map_err(|e| Failure::io(&format!("writing {}", path.display()), e))
    };
    let certs = Certificates::new().map_err(cert_failure)?;
    let ca_path = dir.join("ca.pem");
    write(&ca_path, certs.ca_pem.as_bytes())?;

    let key = SigningKey::generate(&mut rand_core::OsRng);
    let jwks_path = dir.join("jwks.json");
    write(&jwks_path, token::jwks(&key, KID).as_bytes())?;
    let issued_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .map_err(|_| Failure::usage("the system clock is before 1970"))?;
    let minted = token::mint(
        &key,
        KID,
        &token::Claims {
            tenant: TENANT,
            subject: "felix-cluster-up",
            audience: felix_auth::EXPECTED_AUDIENCE,
            perms: token::full_permissions(TENANT),
            issued_at,
            ttl: TOKEN_TTL,
        },
    );
    write(&dir.join("token"), format!("{minted}\n").as_bytes())?;

    let peers = nodes
        .iter()
        .map(|n| format!("{}={}", n.id, n.internal))
        .collect::<Vec<_>>()
        .join(",");
    for node in &nodes {
        let data = node.dir.join("data");
        std::fs::create_dir_all(&data)
            .map_err(|e| Failure::io(&format!("creating {}", data.display()), e))?;
        let (cert_pem, key_pem) = certs.leaf(&node.id).map_err(cert_failure)?;
        let cert = node.dir.join("cert.pem");
        let key = node.dir.join("key.pem");
        write(&cert, cert_pem.as_bytes())?;
        write(&key, key_pem.as_bytes())?;
        restrict(&key)?;
        let text = NodeConfig {
            id: &node.id,
            client: node.client,
            internal: node.internal,
            ops: node.ops,
            peers: &peers,
            runtime,
            cert: &cert,
            key: &key,
            ca: &ca_path,
            jwks: &jwks_path,
            data: &data,
            fsync_mode: None,
            lease_ms: None,
        }
        .render();
        write(&node.config, text.as_bytes())?;
    }
    Ok(nodes)
}

/// A private key file readable by its owner only.
fn restrict(path: &Path) -> Result<(), Failure> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Failure::io(&format!("restricting {}", path.display()), e))
}

fn cert_failure(e: rcgen::Error) -> Failure {
    Failure::Connection(format!("generating certificates: {e}"))
}

/// Starts every node, then waits for each to answer its health endpoint.
fn start_all(
    broker: &Path,
    nodes: &[Node],
    running: &mut Vec<(String, Child)>,
    stop: &AtomicBool,
    timeout: Duration,
) -> Result<(), Failure> {
    use std::os::unix::process::CommandExt;
    for node in nodes {
        let log_path = node.dir.join("broker.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| Failure::io(&format!("creating {}", log_path.display()), e))?;
        let err = log
            .try_clone()
            .map_err(|e| Failure::io(&format!("opening {}", log_path.display()), e))?;
        let child = Command::new(broker)
            .arg("--config")
            .arg(&node.config)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            // A group of its own: a terminal's Ctrl-C reaches this process only, which then
            // stops the nodes in order.
            .process_group(0)
            .spawn()
            .map_err(|e| Failure::io(&format!("starting {}", broker.display()), e))?;
        println!(
            "node {} pid {} client {} internal {} ops http://{} log {}",
            node.id,
            child.id(),
            node.client,
            node.internal,
            node.ops,
            log_path.display()
        );
        running.push((node.id.clone(), child));
    }
    let _ = std::io::stdout().flush();
    // One bound for the whole start: the nodes come up side by side.
    let deadline = Instant::now() + timeout;
    for (node, (_, child)) in nodes.iter().zip(running.iter_mut()) {
        match wait_healthy(node, child, stop, deadline, timeout)? {
            Health::Ready | Health::Stopped => {}
            Health::Alive => {
                return Err(Failure::Connection(format!(
                    "node {} is alive (/livez) but did not join the cluster (/readyz) within \
                     {timeout:?}; see its log",
                    node.id
                )));
            }
        }
    }
    Ok(())
}

enum Health {
    Ready,
    /// `/livez` answers, `/readyz` did not within the bound.
    Alive,
    /// A signal came while waiting.
    Stopped,
}

/// Polls `/readyz` (and `/livez`) until ready, the deadline, a signal or the node's exit.
fn wait_healthy(
    node: &Node,
    child: &mut Child,
    stop: &AtomicBool,
    deadline: Instant,
    timeout: Duration,
) -> Result<Health, Failure> {
    let mut alive = false;
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ok(Health::Stopped);
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(Failure::Connection(format!(
                "node {} exited during start ({status}); its log:\n{}",
                node.id,
                log_tail(&node.dir.join("broker.log"))
            )));
        }
        if http_status(node.ops, "/readyz") == Some(200) {
            return Ok(Health::Ready);
        }
        alive = alive || http_status(node.ops, "/livez") == Some(200);
        if Instant::now() >= deadline {
            if alive {
                return Ok(Health::Alive);
            }
            return Err(Failure::Connection(format!(
                "node {} did not answer http://{}/livez within {:?}; its log:\n{}",
                node.id,
                node.ops,
                timeout,
                log_tail(&node.dir.join("broker.log"))
            )));
        }
        std::thread::sleep(POLL);
    }
}

/// The status code of `GET path`, or `None` if there was no answer.
fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut conn = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).ok()?;
    conn.set_read_timeout(Some(HTTP_TIMEOUT)).ok()?;
    conn.set_write_timeout(Some(HTTP_TIMEOUT)).ok()?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 64];
    let mut len = 0;
    // The status line fits in the first bytes; read until it is complete or the buffer full.
    while len < head.len() && !head[..len].contains(&b'\n') {
        match conn.read(&mut head[len..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => len += n,
        }
    }
    let line = std::str::from_utf8(&head[..len]).ok()?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The last lines of a node's log, for an error message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// SIGTERM to every node still running, a bounded wait, then SIGKILL for any left.
fn stop_all(running: &mut [(String, Child)]) {
    for (_, child) in running.iter_mut() {
        if let Ok(None) = child.try_wait() {
            // SAFETY: `kill` has no memory effects; the pid is our own unreaped child, so it
            // cannot name another process.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
        }
    }
    let deadline = Instant::now() + STOP_GRACE;
    for (id, child) in running.iter_mut() {
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    println!("node {id} stopped ({status})");
                    break;
                }
                Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
                _ => {
                    eprintln!(
                        "felix cluster: node {id} did not stop within {STOP_GRACE:?}; killing it"
                    );
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_counts_are_three_or_five() {
        assert_eq!(parse_nodes("3"), Ok(3));
        assert_eq!(parse_nodes("5"), Ok(5));
        for bad in ["1", "2", "4", "6", "three"] {
            assert!(parse_nodes(bad).unwrap_err().contains("3 or 5"), "{bad}");
        }
    }

    #[test]
    fn specs_parse_into_admin_api_requests() {
        let s = parse_stream("t1/default/orders:6:3").unwrap();
        assert_eq!(s.shards, 6);
        assert_eq!(s.replication_factor, 3);
        assert_eq!(
            parse_stream("t1/default/x:2").unwrap().replication_factor,
            1
        );
        assert!(parse_stream("t1/default/x").unwrap_err().contains("SHARDS"));
        assert!(parse_stream("t1/x:2")
            .unwrap_err()
            .contains("TENANT/NAMESPACE/NAME"));
        assert!(parse_stream("t1/a/b:2:1:leader:9")
            .unwrap_err()
            .contains("too many"));
        let c = parse_cache("t1/default/sessions").unwrap();
        assert_eq!(
            s.request(),
            (
                "/v1/streams",
                serde_json::json!({"tenant": "t1", "namespace": "default", "stream": "orders",
                    "shards": 6, "replication_factor": 3, "consistency": "leader",
                    "retention": {"max_age_seconds": null, "max_bytes": null}})
            )
        );
        assert_eq!(
            c.request(),
            (
                "/v1/caches",
                serde_json::json!({"tenant": "t1", "namespace": "default", "cache": "sessions",
                    "shards": 1, "replication_factor": 1})
            )
        );
    }

    #[test]
    fn retention_and_cache_shards_are_keyed_fields() {
        let s = parse_stream("t1/ops/orders:6:3:quorum:max_age=7d:max_bytes=1073741824").unwrap();
        assert_eq!(
            (s.max_age_seconds, s.max_bytes),
            (Some(604_800), Some(1 << 30))
        );
        assert_eq!(s.consistency, Some("quorum"));
        let (_, body) = s.request();
        assert_eq!(
            body["retention"],
            serde_json::json!({"max_age_seconds": 604800, "max_bytes": 1073741824u64})
        );
        // Keyed fields go anywhere after the names; positional ones keep their order.
        let s = parse_stream("t1/ops/orders:max_bytes=10:6").unwrap();
        assert_eq!(
            (s.shards, s.max_bytes, s.max_age_seconds),
            (6, Some(10), None)
        );
        assert_eq!(
            parse_stream("t1/a/b:1:max_age=86400")
                .unwrap()
                .max_age_seconds,
            Some(86_400)
        );
        assert_eq!(parse_cache("t1/a/c:3:shards=4").unwrap().shards, 4);
        for (bad, needle) in [
            ("t1/a/b:1:max_age=0", "0 would keep nothing"),
            ("t1/a/b:1:max_bytes=0", "0 would keep nothing"),
            ("t1/a/b:1:max_age=1.5s", "whole seconds"),
            ("t1/a/b:1:max_age=soon", "max_age"),
            ("t1/a/b:1:max_bytes=-1", "max_bytes"),
            ("t1/a/b:1:max_bytes=1:max_bytes=2", "given twice"),
            (
                "t1/a/b:1:ttl=3",
                "unknown field \"ttl\" (expected max_age or max_bytes)",
            ),
        ] {
            let err = parse_stream(bad).unwrap_err();
            assert!(err.contains(needle), "{bad}: {err}");
        }
        let err = parse_cache("t1/a/c:max_bytes=3").unwrap_err();
        assert!(err.contains("(expected shards)"), "{err}");
        assert!(parse_cache("t1/a/c:shards=0")
            .unwrap_err()
            .contains("0 would keep nothing"));
    }

    #[test]
    fn a_stream_declares_its_consistency_leader_by_default() {
        assert_eq!(
            parse_stream("t1/default/x:3:3").unwrap().consistency,
            Some("leader")
        );
        for (spec, want) in [
            ("t1/default/x:3:3:leader", "leader"),
            ("t1/default/x:3:3:quorum", "quorum"),
        ] {
            let d = parse_stream(spec).unwrap();
            assert_eq!((d.shards, d.replication_factor), (3, 3), "{spec}");
            assert_eq!(d.consistency, Some(want), "{spec}");
            assert_eq!(d.request().1["consistency"], want, "{spec}");
        }
        // Spelled as the broker's config spells it: anything else is named, with the choices.
        for bad in ["all", "Quorum", "", "1"] {
            let err = parse_stream(&format!("t1/default/x:3:3:{bad}")).unwrap_err();
            assert!(
                err.contains(&format!("consistency {bad:?}"))
                    && err.contains("\"leader\" or \"quorum\""),
                "{bad}: {err}"
            );
        }
        // The replication factor comes first: a consistency in its place is not a number.
        assert!(parse_stream("t1/default/x:3:quorum")
            .unwrap_err()
            .contains("replication factor \"quorum\""));
        // A cache has no consistency: its third field is its shard count, a fourth too many.
        assert!(parse_cache("t1/default/c:3:quorum")
            .unwrap_err()
            .contains("shards \"quorum\""));
        assert!(parse_cache("t1/default/c:3:4:2")
            .unwrap_err()
            .contains("too many"));
        assert_eq!(parse_cache("t1/default/c:3").unwrap().consistency, None);
        let wide = parse_cache("t1/default/c:3:4").unwrap();
        assert_eq!((wide.replication_factor, wide.shards), (3, 4));
        assert_eq!(parse_cache("t1/default/c:3:shards=4").unwrap().shards, 4);
        assert!(parse_cache("t1/default/c:3:4:shards=4")
            .unwrap_err()
            .contains("twice"));
        assert_eq!(parse_cache("t1/default/c:3").unwrap().shards, 1);
    }
}
