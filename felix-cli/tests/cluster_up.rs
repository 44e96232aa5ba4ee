//! `felix cluster up` as a real process over real `felix-broker` processes: it writes every
//! node's files, starts the nodes, and on SIGINT stops every one of them and exits 0.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

/// Bound on waiting for the cluster to come up (three brokers started from cold).
const START_LIMIT: Duration = Duration::from_secs(180);
/// Bound on waiting for `felix` to exit after SIGINT (it gives each node 15 s).
const STOP_LIMIT: Duration = Duration::from_secs(60);

/// The newest file time under `dirs`.
fn newest_source(dirs: &[PathBuf]) -> SystemTime {
    let mut newest = SystemTime::UNIX_EPOCH;
    let mut stack: Vec<PathBuf> = dirs.to_vec();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(m) = entry.metadata().and_then(|m| m.modified()) {
                newest = newest.max(m);
            }
        }
    }
    newest
}

/// The `felix-broker` binary, found as integration/lib.rs finds it: `FELIX_BROKER_BIN`, else
/// a debug or release build not older than the broker's sources, else one built here into
/// `target/crash-test` (a target directory of its own: this test's may be locked by cargo).
fn broker_binary() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if let Ok(path) = std::env::var("FELIX_BROKER_BIN") {
        let path = PathBuf::from(path);
        return if path.is_absolute() {
            path
        } else {
            workspace.join(path)
        };
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace.join("target"));
    let sources = newest_source(
        &[
            "felix-engine/src",
            "felix-proto/src",
            "felix-storage/src",
            "felix-auth/src",
            "runtime-common/src",
            "runtime-tokio/src",
            "runtime-smol/src",
            "felix-broker/src",
        ]
        .map(|d| workspace.join(d)),
    );
    let fresh = [
        target.join("release/felix-broker"),
        target.join("debug/felix-broker"),
        target.join("crash-test/debug/felix-broker"),
    ]
    .into_iter()
    .filter_map(|p| {
        let m = std::fs::metadata(&p).and_then(|m| m.modified()).ok()?;
        (m >= sources).then_some((m, p))
    })
    .max();
    if let Some((_, path)) = fresh {
        return path;
    }
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

fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(conn, "GET {path} HTTP/1.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    answer.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `pid` names a process (a zombie counts: it has not been reaped).
fn exists(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists; nothing is delivered.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Waits for the child to exit (a thread blocks in `wait`, so the exit itself is the event),
/// killing it and failing past `limit`.
fn wait_bounded(child: Child, limit: Duration) -> ExitStatus {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut child = child;
    std::thread::spawn(move || {
        let _ = tx.send(child.wait().expect("wait"));
    });
    match rx.recv_timeout(limit) {
        Ok(status) => status,
        Err(_) => {
            // SAFETY: signalling the child this test spawned.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
            panic!("felix did not exit within {limit:?}");
        }
    }
}

/// A node line: `node n1 pid 123 client A internal B ops http://C log PATH`.
struct NodeLine {
    id: String,
    pid: i32,
    client: SocketAddr,
    ops: SocketAddr,
}

fn parse_node_line(line: &str) -> Option<NodeLine> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |key: &str| {
        words
            .iter()
            .position(|w| *w == key)
            .and_then(|i| words.get(i + 1))
            .copied()
    };
    if words.first() != Some(&"node") {
        return None;
    }
    Some(NodeLine {
        id: words.get(1)?.to_string(),
        pid: after("pid")?.parse().ok()?,
        client: after("client")?.parse().ok()?,
        ops: after("ops")?.strip_prefix("http://")?.parse().ok()?,
    })
}

#[test]
fn cluster_up_starts_three_nodes_and_stops_them_all_on_sigint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    let mut felix = Command::new(env!("CARGO_BIN_EXE_felix"))
        .args(["cluster", "up", "--nodes", "3", "--dir"])
        .arg(&dir)
        .arg("--broker")
        .arg(broker_binary())
        // Created through the admin API once the cluster is up, not declared in the configs.
        .args(["--stream", "t1/default/created:2:3:quorum:max_age=7d"])
        .args(["--cache", "t1/default/sessions:3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start felix");
    let (tx, lines) = mpsc::channel::<String>();
    let stdout = felix.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut stderr = felix.stderr.take().unwrap();
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });

    // Everything up to the seed line, which comes once every node answers and every object
    // asked for is created.
    let deadline = Instant::now() + START_LIMIT;
    let mut nodes = Vec::new();
    let mut created = Vec::new();
    let seeds = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match lines.recv_timeout(left) {
            Ok(line) => line,
            Err(e) => {
                let _ = felix.kill();
                let _ = felix.wait();
                panic!("no seed line ({e}); stderr:\n{}", errors.join().unwrap());
            }
        };
        if let Some(seeds) = line.strip_prefix("seeds: ") {
            break seeds.to_owned();
        }
        if let Some(node) = parse_node_line(&line) {
            nodes.push(node);
        }
        if let Some(name) = line.strip_prefix("created: ") {
            created.push(name.to_owned());
        }
    };
    assert_eq!(created, ["t1/default/created", "t1/default/sessions"]);
    assert_eq!(
        nodes.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(),
        ["n1", "n2", "n3"]
    );
    let clients: Vec<String> = nodes.iter().map(|n| n.client.to_string()).collect();
    assert_eq!(
        seeds,
        clients.join(","),
        "the seeds are the client addresses"
    );

    for file in ["ca.pem", "jwks.json", "token"] {
        assert!(dir.join(file).is_file(), "{file}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("token"))
            .unwrap()
            .trim()
            .split('.')
            .count(),
        3,
        "the token is a compact JWS"
    );
    for node in &nodes {
        let config = std::fs::read_to_string(dir.join(format!("node{}.toml", &node.id[1..])))
            .expect("node config");
        assert!(
            config.contains(&format!("node_id = \"{}\"", node.id)),
            "{config}"
        );
        assert!(
            config.contains(&format!("quic_bind = \"{}\"", node.client)),
            "{config}"
        );
        assert!(
            !config.contains("[[streams]]") && !config.contains("[[caches]]"),
            "{config}"
        );
        for pem in ["cert.pem", "key.pem"] {
            let text = std::fs::read_to_string(dir.join(&node.id).join(pem)).unwrap();
            assert!(text.contains("-----BEGIN"), "{pem}");
        }
        assert!(dir.join(&node.id).join("data").is_dir());
        assert_eq!(
            http_status(node.ops, "/livez"),
            Some(200),
            "node {}",
            node.id
        );
        assert!(exists(node.pid));
    }

    cli_reaches_the_cluster_through_its_seeds(&dir, &seeds);
    // The cluster's records, as any node shows them.
    let token = std::fs::read_to_string(dir.join("token")).unwrap();
    let get = Command::new(env!("CARGO_BIN_EXE_felix"))
        .args([
            "admin", "streams", "get", "t1", "default", "created", "--json", "--broker",
        ])
        .arg(nodes[2].ops.to_string())
        .args(["--token", token.trim()])
        .output()
        .unwrap();
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&get.stdout).unwrap();
    assert_eq!(v["spec"]["shards"], 2, "{v}");
    assert_eq!(v["spec"]["replication_factor"], 3, "{v}");
    assert_eq!(v["spec"]["consistency"], "quorum", "{v}");
    assert_eq!(v["spec"]["retention"]["max_age_seconds"], 604_800, "{v}");

    // SAFETY: signalling the child we spawned.
    unsafe {
        libc::kill(felix.id() as i32, libc::SIGINT);
    }
    let status = wait_bounded(felix, STOP_LIMIT);
    let stderr = errors.join().unwrap();
    reader.join().unwrap();
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    for node in &nodes {
        assert!(
            !exists(node.pid),
            "node {} (pid {}) still runs",
            node.id,
            node.pid
        );
    }
}

/// `felix` with `--addr` given several seeds, comma-separated, the first one dead (nothing
/// listens there): `pub` gets through; and `bench --cluster` given one seed accounts for each
/// keyed message on the node that owns its shard.
fn cli_reaches_the_cluster_through_its_seeds(dir: &Path, seeds: &str) {
    let dead = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .unwrap();
    let felix = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_felix"));
        cmd.args(args)
            .env("FELIX_CA_FILE", dir.join("ca.pem"))
            .env("FELIX_TOKEN_FILE", dir.join("token"))
            .env_remove("FELIX_TOKEN")
            .env_remove("FELIX_ADDR")
            .env_remove("FELIX_ADDRS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let out = wait_output(cmd.spawn().expect("start felix"), STOP_LIMIT * 3);
        assert!(
            out.status.success(),
            "felix {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let with_dead = format!("{dead},{seeds}");
    felix(&["pub", "--addr", &with_dead, "orders", "one", "two"]);
    let first = seeds.split(',').next().unwrap();
    // The deployment smoke test's step (the Helm chart's test pod): through one address,
    // acknowledged, then read back from its shard at the offset printed.
    let offset = felix(&[
        "pub",
        "--addr",
        first,
        "--key",
        "smoke",
        "--read-back",
        "orders",
        "read me back",
    ]);
    assert!(
        offset.trim().parse::<u64>().is_ok(),
        "an offset: {offset:?}"
    );
    let report = felix(&[
        "bench",
        "--cluster",
        "--addr",
        first,
        "--count",
        "3000",
        "--batch",
        "10",
        "--duration",
        "60s",
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_str(report.trim()).expect("one JSON object");
    assert_eq!(report["published"], 3000, "{report}");
    let nodes = report["nodes"].as_array().expect("per-node figures");
    let per_node: u64 = nodes.iter().map(|n| n["published"].as_u64().unwrap()).sum();
    assert_eq!(per_node, 3000, "{report}");
    // Each figure is a node of the cluster (a stream `cluster up` places has one shard, so
    // one node owns it all here; the chaos cluster's 3-shard streams spread over three).
    for n in nodes {
        let owner = n["owner"].as_str().unwrap();
        assert!(seeds.split(',').any(|s| s == owner), "{owner} in {seeds}");
    }
}

/// Like [`wait_bounded`], with the output read.
fn wait_output(child: Child, limit: Duration) -> std::process::Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output().expect("wait"));
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out,
        Err(_) => {
            // SAFETY: signalling the child this test spawned.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
            panic!("felix did not exit within {limit:?}");
        }
    }
}

#[test]
fn cluster_up_takes_three_or_five_nodes() {
    let out = Command::new(env!("CARGO_BIN_EXE_felix"))
        .args(["cluster", "up", "--nodes", "4"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("3 or 5"));
}

#[test]
fn cluster_up_refuses_a_directory_that_holds_files() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("old"), "x").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_felix"))
        .args(["cluster", "up", "--broker", "/bin/true", "--dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not empty"));
}
