//! Graceful drain of the real `felix-broker` process: SIGTERM while several publishers send
//! acked publishes to an `on_commit` durable broker. Every publish gets an answer — an ack
//! with an offset, or a `draining` refusal — none is left to a closed connection; the
//! process exits 0; and on restart every acknowledged record is in the log.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_client::{Ack, Client, ClientConfig, ClientError, ErrorCode, Start, SubscriptionItem};
use felix_runtime_tokio::felix_engine::{DurableConfig, FsyncPolicy};
use felix_runtime_tokio::BrokerOptions;

const PUBLISHERS: usize = 4;
/// Acks the publishers get before the broker is signalled.
const ACKS_BEFORE_SIGNAL: usize = 4 * PUBLISHERS;

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_udp_port() -> u16 {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap().port()
}

/// The broker process, killed and reaped if a test fails before it exits on its own.
struct Process(Option<Child>);

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The broker process on `dir`, and the address, CA and token it exported.
fn spawn_broker(dir: &Path, runtime: &str) -> (Process, SocketAddr, Vec<u8>, String) {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_udp_port()).parse().unwrap();
    let (ca, token) = (dir.join("ca.pem"), dir.join("token"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_felix-broker"));
    for (name, _) in std::env::vars() {
        if name.starts_with("FELIX_") {
            cmd.env_remove(name);
        }
    }
    let child = Process(Some(
        cmd.args(["--runtime", runtime])
            .env("FELIX_QUIC_BIND", addr.to_string())
            .env("FELIX_DURABLE_STORAGE_DIR", dir.join("data"))
            .env("FELIX_DURABLE_FSYNC_MODE", "on_commit")
            .env("FELIX_METRICS_BIND", "off")
            .env("FELIX_TLS_CERT_EXPORT", &ca)
            .env("FELIX_DEV_TOKEN_EXPORT", &token)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    ));
    for _ in 0..200 {
        if let (Ok(ca), Ok(token)) = (std::fs::read(&ca), std::fs::read_to_string(&token)) {
            return (child, addr, ca, token.trim().to_owned());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("the broker did not export its CA and token within 5 s");
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits (bounded) for the process to exit.
fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let began = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if began.elapsed() > within {
            let _ = child.kill();
            panic!("the broker did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[derive(Debug, Default)]
struct Outcomes {
    acked: Vec<(String, u64)>,
    refused: usize,
    unanswered: Vec<(String, ClientError)>,
}

/// Publishes `p{task}-{i}` one at a time until refused or cut off (bounded in time), and
/// announces each ack on `acked` while it has room.
async fn publish_until_refused(
    client: Client,
    stream: String,
    task: usize,
    acked: tokio::sync::mpsc::Sender<()>,
) -> Outcomes {
    let mut out = Outcomes::default();
    let began = Instant::now();
    for i in 0.. {
        if began.elapsed() > Duration::from_secs(20) {
            break;
        }
        let payload = format!("p{task}-{i}");
        let result = client
            .publish(
                "app",
                &stream,
                vec![Bytes::from(payload.clone())],
                None,
                Ack::PerMessage,
            )
            .await;
        match result {
            Ok(Some(offset)) => {
                out.acked.push((payload, offset));
                let _ = acked.try_send(());
            }
            Ok(None) => panic!("an on_commit ack carries its offset"),
            Err(e) if e.code() == Some(&ErrorCode::Draining) => {
                out.refused += 1;
                break;
            }
            Err(e) => {
                out.unanswered.push((payload, e));
                break;
            }
        }
    }
    out
}

async fn drain_loses_nothing(runtime: &str) {
    let dir = TempDir(std::env::temp_dir().join(format!(
        "felix-drain-{runtime}-{}-{}",
        std::process::id(),
        free_udp_port()
    )));
    std::fs::create_dir_all(&dir.0).unwrap();
    let (mut process, addr, ca, token) = spawn_broker(&dir.0, runtime);
    let mut config = ClientConfig::new(addr, ca, "t1", &token);
    config.request_timeout = Duration::from_secs(10);
    let client = Client::connect(config).await.unwrap();
    let stream = "drained".to_owned();
    // Each ack is announced; the channel holds just the ones waited for (later ones are
    // dropped), and ends once every publisher has (each bounds itself in time).
    let (acked_tx, mut acked_rx) = tokio::sync::mpsc::channel(ACKS_BEFORE_SIGNAL);
    let tasks: Vec<_> = (0..PUBLISHERS)
        .map(|t| {
            let publisher =
                publish_until_refused(client.clone(), stream.clone(), t, acked_tx.clone());
            tokio::spawn(publisher)
        })
        .collect();
    drop(acked_tx);
    // The signal lands while publishes are in flight, once some were acked: waited for as
    // events, so a slow machine only takes longer.
    for _ in 0..ACKS_BEFORE_SIGNAL {
        acked_rx
            .recv()
            .await
            .unwrap_or_else(|| panic!("{runtime}: the publishers ended with no acks"));
    }
    let mut child = process.0.take().expect("running");
    sigterm(&child);
    let status =
        tokio::task::spawn_blocking(move || wait_exit(&mut child, Duration::from_secs(20)))
            .await
            .unwrap();
    let mut acked = Vec::new();
    let mut refused = 0;
    for task in tasks {
        let out = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("publishers finish")
            .unwrap();
        assert!(
            out.unanswered.is_empty(),
            "{runtime}: requests left unanswered by the drain: {:?}",
            out.unanswered
        );
        acked.extend(out.acked);
        refused += out.refused;
    }
    assert!(status.success(), "{runtime}: exit status {status:?}");
    assert!(
        !acked.is_empty(),
        "the publishers got acks before the signal"
    );
    assert_eq!(
        refused, PUBLISHERS,
        "each publisher was told the broker drains"
    );
    client.close().await;

    // Every acknowledged record is in the log after a restart.
    let broker = felix_runtime_tokio::start(
        BrokerOptions::ephemeral()
            .storage_dir(dir.0.join("data"))
            .durable({
                let mut durable_config = DurableConfig::default();
                durable_config.fsync = FsyncPolicy::OnCommit;
                durable_config
            }),
    )
    .await
    .unwrap();
    let config = ClientConfig::new(
        broker.local_addr(),
        broker.ca_cert_pem().as_bytes().to_vec(),
        "t1",
        broker.dev_token().unwrap(),
    );
    let reader = Client::connect(config).await.unwrap();
    let mut sub = reader
        .subscribe("app", &stream, Start::Earliest)
        .await
        .unwrap();
    let mut missing: BTreeSet<(String, u64)> = acked.iter().cloned().collect();
    let began = Instant::now();
    while !missing.is_empty() && began.elapsed() < Duration::from_secs(20) {
        match tokio::time::timeout(Duration::from_secs(5), sub.next()).await {
            Ok(Ok(SubscriptionItem::Event(e))) => {
                let payload = String::from_utf8(e.payload.to_vec()).unwrap();
                missing.remove(&(payload, e.offset.unwrap()));
            }
            other => panic!("{runtime}: reading the log back: {other:?}"),
        }
    }
    assert!(
        missing.is_empty(),
        "{runtime}: {} of {} acknowledged records lost, e.g. {:?}",
        missing.len(),
        acked.len(),
        missing.iter().next()
    );
    reader.close().await;
    broker.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_acked_publishing_loses_nothing_and_answers_everything_on_tokio() {
    drain_loses_nothing("tokio").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_acked_publishing_loses_nothing_and_answers_everything_on_smol() {
    drain_loses_nothing("smol").await;
}

/// A second signal during the drain exits at once with 128 + its number instead of 0.
/// SIGTERM then SIGINT: two different signals are never merged while pending, and with a
/// client connected the drain lasts at least its quiet period, so the second one lands in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_during_the_drain_exits_at_once() {
    let dir = TempDir(std::env::temp_dir().join(format!(
        "felix-drain-twice-{}-{}",
        std::process::id(),
        free_udp_port()
    )));
    std::fs::create_dir_all(&dir.0).unwrap();
    let (mut process, addr, ca, token) = spawn_broker(&dir.0, "tokio");
    let client = Client::connect(ClientConfig::new(addr, ca, "t1", &token))
        .await
        .unwrap();
    let mut child = process.0.take().expect("running");
    sigterm(&child);
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let status =
        tokio::task::spawn_blocking(move || wait_exit(&mut child, Duration::from_secs(20)))
            .await
            .unwrap();
    // 128 + SIGINT (2) or 128 + SIGTERM (15), whichever the signal thread saw second.
    assert!(
        matches!(status.code(), Some(130 | 143)),
        "exit status {status:?}"
    );
    client.close().await;
}
