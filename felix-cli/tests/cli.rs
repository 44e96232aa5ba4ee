//! The real `felix` binary against a broker started in this process on 127.0.0.1:0.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use felix_runtime_tokio::BrokerOptions;

/// A broker on its own thread and runtime, so the test thread can block on processes.
struct Broker {
    addr: SocketAddr,
    dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Broker {
    /// Dev mode (a token for t1 with every permission), or verifying tokens with `jwks`.
    fn start(jwks: Option<Vec<u8>>) -> Broker {
        let dir = tempfile::tempdir().expect("temp dir");
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let files = dir.path().to_owned();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("broker runtime");
            rt.block_on(async move {
                let mut opts = BrokerOptions::new("127.0.0.1:0".parse().unwrap());
                opts.jwks = jwks;
                let broker = felix_runtime_tokio::start(opts)
                    .await
                    .expect("broker starts");
                std::fs::write(files.join("ca.pem"), broker.ca_cert_pem()).unwrap();
                if let Some(token) = broker.dev_token() {
                    std::fs::write(files.join("token"), token).unwrap();
                }
                ready_tx.send(broker.local_addr()).unwrap();
                let _ = stop_rx.await;
                broker.shutdown().await.expect("broker stops");
            });
        });
        let addr = ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("broker started");
        Broker {
            addr,
            dir,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `felix` aimed at this broker (address, CA and, in dev mode, token from the
    /// environment, as a user would set them).
    fn felix(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_felix"));
        cmd.env("FELIX_ADDR", self.addr.to_string())
            .env("FELIX_CA_FILE", self.path("ca.pem"))
            .env("FELIX_TOKEN_FILE", self.path("token"))
            .env_remove("FELIX_TOKEN")
            .env_remove("FELIX_TENANT")
            .stdin(Stdio::null());
        cmd
    }

    fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().expect("broker thread");
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}

fn felix_alone() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_felix"));
    cmd.env_remove("FELIX_TENANT").stdin(Stdio::null());
    cmd
}

/// Waits for `child` at most `limit`; kills it and fails the test past that.
fn wait_bounded(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("felix did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs to completion (bounded), capturing stdout and stderr.
fn run(cmd: &mut Command) -> Output {
    run_with_stdin(cmd, None)
}

fn run_with_stdin(cmd: &mut Command, stdin: Option<&[u8]>) -> Output {
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("felix runs");
    if let Some(input) = stdin {
        use std::io::Write;
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input).unwrap();
        // Dropped: end of input.
    }
    // Read the pipes on threads so a chatty child never blocks on a full pipe.
    let mut out_pipe = child.stdout.take().unwrap();
    let mut err_pipe = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        out_pipe.read_to_end(&mut v).unwrap();
        v
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        err_pipe.read_to_end(&mut v).unwrap();
        v
    });
    let status = wait_bounded(&mut child, Duration::from_secs(30));
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A running `felix sub`, once it has said (on stderr) that it is subscribed.
struct Subscriber {
    child: Child,
    stderr: mpsc::Receiver<String>,
}

impl Subscriber {
    fn start(cmd: &mut Command) -> Subscriber {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("felix sub runs");
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let first = rx.recv_timeout(Duration::from_secs(10));
        match first {
            Ok(line) if line.starts_with("subscribed to ") => Subscriber { child, stderr: rx },
            other => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("felix sub did not subscribe: {other:?}");
            }
        }
    }

    /// Waits for exit; returns the status, stdout and the rest of stderr.
    fn finish(mut self, limit: Duration) -> (ExitStatus, String, String) {
        let status = wait_bounded(&mut self.child, limit);
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let err: Vec<String> = self.stderr.try_iter().collect();
        (status, out, err.join("\n"))
    }
}

#[test]
fn published_messages_reach_a_subscriber_started_from_latest() {
    let broker = Broker::start(None);
    let sub = Subscriber::start(
        broker
            .felix()
            .args(["sub", "orders", "--from", "latest", "--count", "4"]),
    );

    let out = run(broker.felix().args(["pub", "orders", "one", "two"]));
    assert!(out.status.success(), "pub: {}", text(&out.stderr));
    // In-memory streams have no offsets, so an acked publish prints nothing.
    assert_eq!(text(&out.stdout), "");
    // Lines of stdin, fire and forget: they must still arrive although felix exits at once.
    let out = run_with_stdin(
        broker.felix().args(["pub", "orders", "--ack", "none"]),
        Some(b"three\nfour\r\n"),
    );
    assert!(out.status.success(), "pub stdin: {}", text(&out.stderr));

    let (status, stdout, stderr) = sub.finish(Duration::from_secs(10));
    assert!(status.success(), "sub: {stderr}");
    assert_eq!(stdout, "one\ntwo\nthree\nfour\n");
}

/// Reads `child`'s stdout on a thread: its first line (with its newline) arrives on the
/// channel as soon as it is printed; the thread's result is everything after it, to EOF.
fn first_line_then_rest(child: &mut Child) -> (mpsc::Receiver<String>, JoinHandle<String>) {
    let mut reader = BufReader::new(child.stdout.take().expect("stdout piped"));
    let (tx, rx) = mpsc::channel();
    let rest = std::thread::spawn(move || {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let _ = tx.send(line);
        let mut rest = String::new();
        reader.read_to_string(&mut rest).unwrap();
        rest
    });
    (rx, rest)
}

#[test]
fn a_subscription_cut_off_by_the_broker_exits_non_zero() {
    let mut broker = Broker::start(None);
    let mut sub = Subscriber::start(broker.felix().args(["sub", "orders", "--hex"]));
    let out = run(broker.felix().args(["pub", "orders", "hi"]));
    assert!(out.status.success(), "pub: {}", text(&out.stderr));
    // The broker goes away once the event has arrived: wait for its line, not a guessed time.
    let (first, rest) = first_line_then_rest(&mut sub.child);
    let first = first
        .recv_timeout(Duration::from_secs(60))
        .expect("the event is printed");
    assert_eq!(first, "6869\n");
    broker.stop();
    let status = wait_bounded(&mut sub.child, Duration::from_secs(15));
    assert_eq!(rest.join().unwrap(), "", "nothing after the one event");
    let stderr = sub.stderr.iter().collect::<Vec<_>>().join("\n");
    let code = status.code().expect("exited");
    assert!(code == 4 || code == 5, "exit {code}, stderr {stderr}");
    assert!(stderr.starts_with("felix: "), "{stderr}");
}

#[test]
fn a_subscriber_whose_reader_goes_away_exits_cleanly() {
    let broker = Broker::start(None);
    let mut sub = Subscriber::start(broker.felix().args(["sub", "orders"]));
    let out = run(broker.felix().args(["pub", "orders", "first"]));
    assert!(out.status.success(), "pub: {}", text(&out.stderr));
    // Like `felix sub orders | head -1`: read one line, then close the pipe.
    let mut reader = BufReader::new(sub.child.stdout.take().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line, "first\n");
    drop(reader);
    let out = run(broker.felix().args(["pub", "orders", "second"]));
    assert!(out.status.success(), "pub: {}", text(&out.stderr));
    let status = wait_bounded(&mut sub.child, Duration::from_secs(10));
    let stderr: Vec<String> = sub.stderr.try_iter().collect();
    assert_eq!(status.code(), Some(0), "{stderr:?}");
}

#[test]
fn cache_commands_exit_by_outcome() {
    let broker = Broker::start(None);
    let cache = |args: &[&str]| run(broker.felix().arg("cache").args(args));

    let put = cache(&["put", "sessions", "alice", "token-1"]);
    assert_eq!(put.status.code(), Some(0), "{}", text(&put.stderr));
    let get = cache(&["get", "sessions", "alice"]);
    assert_eq!(get.status.code(), Some(0), "{}", text(&get.stderr));
    assert_eq!(text(&get.stdout), "token-1\n");
    let hex = cache(&["get", "sessions", "alice", "--hex"]);
    assert_eq!(text(&hex.stdout), format!("{}\n", hex_of(b"token-1")));

    let del = cache(&["del", "sessions", "alice"]);
    assert_eq!(del.status.code(), Some(0), "{}", text(&del.stderr));
    let miss = cache(&["get", "sessions", "alice"]);
    assert_eq!(miss.status.code(), Some(1));
    assert_eq!(text(&miss.stdout), "");
    assert_eq!(text(&miss.stderr), "", "a miss is not an error");
    let del_again = cache(&["del", "sessions", "alice"]);
    assert_eq!(del_again.status.code(), Some(1));

    // A value from stdin, kept byte for byte (a TTL long enough not to race the read).
    let out = run_with_stdin(
        broker
            .felix()
            .args(["cache", "put", "sessions", "bob", "--ttl", "10m"]),
        Some(b"multi\nline"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&cache(&["get", "sessions", "bob"]).stdout),
        "multi\nline\n"
    );
    // A short TTL ends its value: wait for the miss instead of sleeping past the TTL and
    // hoping. The deadline only fails a TTL that never took effect (or was read as seconds).
    let put = cache(&["put", "sessions", "dave", "v", "--ttl", "400ms"]);
    assert_eq!(put.status.code(), Some(0), "{}", text(&put.stderr));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let get = cache(&["get", "sessions", "dave"]);
        match get.status.code() {
            Some(1) => break,
            Some(0) => assert!(Instant::now() < deadline, "a 400 ms TTL never expired"),
            other => panic!("get: {other:?} {}", text(&get.stderr)),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        cache(&["get", "sessions", "bob"]).status.code(),
        Some(0),
        "the other key's TTL is its own"
    );

    let bad_ttl = cache(&["put", "sessions", "carol", "v", "--ttl", "soon"]);
    assert_eq!(bad_ttl.status.code(), Some(2));
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn connection_flags_are_checked_before_dialling() {
    let broker = Broker::start(None);
    let out = run(broker
        .felix()
        .env_remove("FELIX_CA_FILE")
        .args(["cache", "get", "c", "k"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("no CA"), "{}", text(&out.stderr));

    let out = run(broker
        .felix()
        .env_remove("FELIX_TOKEN_FILE")
        .args(["cache", "get", "c", "k"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no token"),
        "{}",
        text(&out.stderr)
    );

    // A token flag wins over the environment's token file: this one is refused.
    let out = run(broker
        .felix()
        .args(["cache", "get", "c", "k", "--token", "not-a-jwt"]));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
}

#[test]
fn read_back_wants_one_acknowledged_message_with_an_offset() {
    let broker = Broker::start(None);
    let out = run(broker
        .felix()
        .args(["pub", "orders", "a", "b", "--read-back"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("exactly one"),
        "{}",
        text(&out.stderr)
    );
    // This broker keeps streams in memory: acknowledged, but no offset to read back at.
    let out = run(broker.felix().args(["pub", "orders", "a", "--read-back"]));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("without an offset"),
        "{}",
        text(&out.stderr)
    );
}

fn mint(key: &Path, kid: &str, perms: &[&str]) -> String {
    let mut cmd = felix_alone();
    cmd.arg("token")
        .arg("--key")
        .arg(key)
        .args(["--kid", kid, "--tenant", "t1", "--ttl", "10m"]);
    for p in perms {
        cmd.args(["--perm", p]);
    }
    let out = run(&mut cmd);
    assert!(out.status.success(), "token: {}", text(&out.stderr));
    text(&out.stdout).trim().to_owned()
}

#[test]
fn minted_tokens_are_accepted_within_their_permissions() {
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("k1.pem");
    let out = run(felix_alone()
        .arg("token")
        .arg("--generate-key")
        .arg(&key)
        .args(["--kid", "k1"]));
    assert!(out.status.success(), "generate: {}", text(&out.stderr));
    let jwks = out.stdout;
    let doc: serde_json::Value = serde_json::from_slice(&jwks).expect("JWKS is JSON");
    assert_eq!(doc["keys"][0]["kid"], "k1");
    // Generating again must not replace the key.
    let again = run(felix_alone()
        .arg("token")
        .arg("--generate-key")
        .arg(&key)
        .args(["--kid", "k1"]));
    assert_eq!(again.status.code(), Some(2));

    let broker = Broker::start(Some(jwks));
    assert!(!broker.path("token").exists(), "no dev token with a JWKS");
    let with = |token: &str, args: &[&str]| {
        run(broker
            .felix()
            .env_remove("FELIX_TOKEN_FILE")
            .env("FELIX_TOKEN", token)
            .args(args))
    };

    let full = mint(&key, "k1", &[]);
    let out = with(&full, &["cache", "put", "c", "k", "v"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    let reader = mint(&key, "k1", &["cache.read:cache:t1/default/*"]);
    let out = with(&reader, &["cache", "get", "c", "k"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "v\n");
    let out = with(&reader, &["cache", "put", "c", "k", "w"]);
    assert_eq!(out.status.code(), Some(3), "refused: {}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("forbidden"),
        "{}",
        text(&out.stderr)
    );
    let out = with(&reader, &["pub", "orders", "x"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));

    // The same kid on another key, and a kid the JWKS lacks: not authenticated.
    let other = keys.path().join("other.pem");
    std::fs::write(&other, hex_of(&[42u8; 32])).unwrap();
    for token in [mint(&other, "k1", &[]), mint(&key, "k9", &[])] {
        let out = with(&token, &["cache", "get", "c", "k"]);
        assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("unauthenticated"),
            "{}",
            text(&out.stderr)
        );
    }
}

#[test]
fn bench_runs_a_bounded_count_and_reports_json() {
    let broker = Broker::start(None);
    let out = run(broker.felix().args([
        "bench",
        "--count",
        "320",
        "--batch",
        "32",
        "--payload",
        "256",
        "--fanout",
        "2",
        "--duration",
        "10s",
        "--json",
    ]));
    assert!(out.status.success(), "bench: {}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(report["scenario"], "pubsub");
    assert_eq!(report["published"], 320);
    assert_eq!(report["expected"], 640);
    assert_eq!(report["delivered"], 640);
    assert_eq!(report["lost"], 0);
    assert_eq!(report["acked"], true);
    let latency = &report["latency_us"];
    assert_eq!(latency["count"], 640);
    let (p50, p99, p999) = (
        latency["p50"].as_f64().unwrap(),
        latency["p99"].as_f64().unwrap(),
        latency["p999"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p50 <= p99 && p99 <= p999, "{latency}");
    assert!(report["deliver_mb_per_sec"].as_f64().unwrap() > 0.0);
    assert!(report["publish_msgs_per_sec"].as_f64().unwrap() > 0.0);
    assert_eq!(
        report["ack_latency_us"]["count"], 10,
        "one answer per batch"
    );

    let out = run(broker.felix().args([
        "bench",
        "--scenario",
        "cache",
        "--count",
        "200",
        "--concurrency",
        "4",
        "--keys",
        "50",
        "--json",
    ]));
    assert!(out.status.success(), "cache bench: {}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(report["put"]["ops"], 200);
    assert_eq!(report["get"]["ops"], 200);
    assert_eq!(report["get"]["hits"], 200, "every key read was written");
    assert_eq!(report["get"]["latency_us"]["count"], 200);

    // Human output by default.
    let out = run(broker.felix().args([
        "bench",
        "--scenario",
        "latency",
        "--count",
        "50",
        "--no-ack",
    ]));
    assert!(out.status.success(), "latency bench: {}", text(&out.stderr));
    let human = text(&out.stdout);
    assert!(
        human.contains("delivered") && human.contains("p999"),
        "{human}"
    );
    assert!(human.contains("not acked"), "{human}");
    assert!(!human.contains("publish->ack"), "{human}");
}
