//! The client SDK on both of its runtimes: every scenario here runs once with
//! `Runtime::Tokio` (polled by the tokio test) and once with `Runtime::Smol` (polled by
//! `smol::block_on` on a thread of its own, so nothing of tokio drives it), against a broker
//! on the suite's runtime. The surface — connect, publish returning the offset, subscription
//! as a stream, cache operations, typed errors — and the promise that a lost broker is
//! reported to a subscription, never left silent: after a clean restart, and after a
//! `kill -9` that sends nothing.

use std::future::Future;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_client::{
    Ack, Client, ClientConfig, ClientError, ErrorCode, Runtime, Start, SubscriptionItem,
};
use felix_integration::{
    broker_binary, broker_runtime, client_config, free_udp_port, start_broker, unique,
};
use felix_runtime_tokio::felix_engine::{DurableConfig, FsyncPolicy};
use felix_runtime_tokio::{BrokerOptions, RunningBroker};

const CLIENT_RUNTIMES: [Runtime; 2] = [Runtime::Tokio, Runtime::Smol];

/// Runs `scenario` on the client runtime `runtime`: the tokio one in this test's runtime,
/// the smol one under `smol::block_on` on a blocking thread.
async fn on<F, Fut>(runtime: Runtime, scenario: F)
where
    F: FnOnce(Runtime) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    match runtime {
        Runtime::Smol => tokio::task::spawn_blocking(move || smol::block_on(scenario(runtime)))
            .await
            .expect("the smol scenario passes"),
        _ => scenario(runtime).await,
    }
}

/// `fut`, or a panic after `secs`: the timer is async-io's, which works under either runtime.
async fn bounded<T>(secs: u64, fut: impl Future<Output = T>) -> T {
    smol::future::or(fut, async {
        smol::Timer::after(Duration::from_secs(secs)).await;
        panic!("timed out after {secs}s")
    })
    .await
}

fn config_for(broker: &RunningBroker, runtime: Runtime) -> ClientConfig {
    let mut config = client_config(
        broker.local_addr(),
        broker.ca_cert_pem().as_bytes().to_vec(),
        broker.dev_token().expect("dev mode"),
    );
    config.runtime = runtime;
    config
}

struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(prefix: &str) -> TempDir {
        let dir = std::env::temp_dir().join(unique(prefix));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn durable(dir: &TempDir, bind: SocketAddr) -> BrokerOptions {
    let mut opts = BrokerOptions::new(bind);
    opts.storage_dir = Some(dir.0.clone());
    opts.durable = {
        let mut durable_config = DurableConfig::default();
        durable_config.fsync = FsyncPolicy::OnCommit;
        durable_config.ack_on_commit = true;
        durable_config
    };
    opts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_surface_on_both_client_runtimes() {
    let dir = TempDir::new("sdk-surface");
    let broker = start_broker(durable(&dir, "127.0.0.1:0".parse().unwrap()))
        .await
        .expect("broker starts");
    for runtime in CLIENT_RUNTIMES {
        let config = config_for(&broker, runtime);
        on(runtime, move |runtime| sdk_surface(runtime, config)).await;
    }
    broker.shutdown().await.unwrap();
}

async fn sdk_surface(runtime: Runtime, config: ClientConfig) {
    let client = bounded(15, Client::connect(config))
        .await
        .expect("connects");
    let stream = unique("sdk");
    let mut sub = bounded(10, client.subscribe("default", &stream, Start::Latest))
        .await
        .unwrap();

    // Publishing returns the offset of each batch's first record; the events carry them.
    let mut offsets = Vec::new();
    for batch in 0..3u8 {
        let payloads = vec![Bytes::from(vec![batch; 3]), Bytes::from(vec![batch; 5])];
        let offset = bounded(
            10,
            client.publish("default", &stream, payloads, None, Ack::PerMessage),
        )
        .await
        .unwrap();
        offsets.push(offset.expect("a durable broker gives offsets"));
    }
    assert_eq!(offsets, [0, 2, 4], "{runtime:?}");
    for expected in 0..6u64 {
        match bounded(10, sub.next()).await.unwrap() {
            SubscriptionItem::Event(event) => {
                assert_eq!(event.offset, Some(expected), "{runtime:?}");
                assert_eq!(event.payload[0] as u64, expected / 2);
            }
            other => panic!("{runtime:?}: expected an event, got {other:?}"),
        }
    }

    // Cache operations.
    let cache = unique("sdk-cache");
    bounded(
        10,
        client.cache_put("default", &cache, "k", Bytes::from_static(b"v1"), None),
    )
    .await
    .unwrap();
    let got = bounded(10, client.cache_get("default", &cache, "k"))
        .await
        .unwrap();
    assert_eq!(got.as_deref(), Some(&b"v1"[..]), "{runtime:?}");
    let deleted = bounded(10, client.cache_delete("default", &cache, "k"))
        .await
        .unwrap();
    assert_eq!(deleted.as_deref(), Some(&b"v1"[..]));
    let gone = bounded(10, client.cache_get("default", &cache, "k"))
        .await
        .unwrap();
    assert_eq!(gone, None);

    // A refusal is typed by its code; the connection carries on.
    let err = bounded(
        10,
        client.subscribe("default", &stream, Start::Offset(1 << 40)),
    )
    .await
    .err()
    .expect("an offset in the future is refused");
    assert!(
        matches!(err, ClientError::Server { code: Some(_), .. }),
        "{runtime:?}: {err:?}"
    );
    assert_ne!(err.code(), Some(&ErrorCode::Internal), "{err:?}");
    let too_big = Bytes::from(vec![0u8; 1024 * 1024 + 1]);
    let err = bounded(
        10,
        client.cache_put("default", &cache, "big", too_big, None),
    )
    .await
    .expect_err("an oversize value is refused");
    assert!(err.code().is_some(), "{runtime:?}: {err:?}");
    bounded(5, client.close()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_is_told_when_the_broker_restarts() {
    for runtime in CLIENT_RUNTIMES {
        on(runtime, clean_restart).await;
    }
}

/// The broker stops cleanly and comes back on the same port: the subscription ends in an
/// error (the broker's close), and a new client is served by the new broker.
async fn clean_restart(runtime: Runtime) {
    let dir = TempDir::new("sdk-restart");
    let bind: SocketAddr = format!("127.0.0.1:{}", free_udp_port()).parse().unwrap();
    let broker = bounded(20, start_broker(durable(&dir, bind)))
        .await
        .expect("broker starts");
    let client = bounded(15, Client::connect(config_for(&broker, runtime)))
        .await
        .unwrap();
    let stream = unique("restart");
    let mut sub = bounded(10, client.subscribe("default", &stream, Start::Latest))
        .await
        .unwrap();
    bounded(
        10,
        client.publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"before")],
            None,
            Ack::PerMessage,
        ),
    )
    .await
    .unwrap();
    assert!(matches!(
        bounded(10, sub.next()).await,
        Ok(SubscriptionItem::Event(_))
    ));

    bounded(20, broker.shutdown()).await.unwrap();
    let broker = bounded(20, start_broker(durable(&dir, bind)))
        .await
        .expect("broker restarts on the same port");

    let reported = bounded(10, sub.next()).await;
    assert!(
        matches!(reported, Err(ClientError::Connection(_))),
        "{runtime:?}: the subscription must report the lost broker, got {reported:?}"
    );
    // Later calls on the old connection fail the same way rather than hang.
    let publish = bounded(
        10,
        client.publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"lost")],
            None,
            Ack::PerMessage,
        ),
    )
    .await;
    assert!(
        matches!(publish, Err(ClientError::Connection(_))),
        "{publish:?}"
    );

    // The restarted broker serves a new client, with the record from before.
    let client = bounded(15, Client::connect(config_for(&broker, runtime)))
        .await
        .unwrap();
    let mut sub = bounded(10, client.subscribe("default", &stream, Start::Earliest))
        .await
        .unwrap();
    match bounded(10, sub.next()).await.unwrap() {
        SubscriptionItem::Event(event) => assert_eq!(&event.payload[..], b"before"),
        other => panic!("expected the record from before the restart, got {other:?}"),
    }
    bounded(5, client.close()).await;
    bounded(20, broker.shutdown()).await.unwrap();
}

/// Runs the broker binary on the suite's runtime at `addr`; returns once it exported its CA
/// and token (read from `dir`).
// The child is returned to the caller, which reaps it.
#[allow(clippy::zombie_processes)]
fn spawn_binary(dir: &std::path::Path, addr: SocketAddr) -> (Child, Vec<u8>, String) {
    let (ca, token) = (dir.join("ca.pem"), dir.join("token"));
    let _ = std::fs::remove_file(&ca);
    let _ = std::fs::remove_file(&token);
    let mut child = Command::new(broker_binary())
        .env("FELIX_RUNTIME", broker_runtime())
        .env("FELIX_QUIC_BIND", addr.to_string())
        .env("FELIX_TLS_CERT_EXPORT", &ca)
        .env("FELIX_DEV_TOKEN_EXPORT", &token)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start felix-broker");
    // Generous: a loaded machine starts slowly; only a broker that never starts fails here.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let (Ok(ca), Ok(token)) = (std::fs::read(&ca), std::fs::read_to_string(&token)) {
            if !token.trim().is_empty() {
                return (child, ca, token.trim().to_owned());
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("felix-broker did not export its CA and token within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_is_told_when_the_broker_is_killed() {
    // Built (if needed) before any clock starts.
    let _ = tokio::task::spawn_blocking(broker_binary).await;
    for runtime in CLIENT_RUNTIMES {
        on(runtime, killed_broker).await;
    }
}

/// `kill -9` sends no CONNECTION_CLOSE and the broker that replaces it knows nothing of the
/// connection: only the client's idle timeout can notice, and it must. That it is *this
/// client's* timeout (1 s) that decides is shown by order, not by a wall-clock ceiling: a
/// second client whose own timeout is an hour (so the broker's 30 s applies) has not noticed
/// yet when the first reports. The deadline only fails a subscription never told.
async fn killed_broker(runtime: Runtime) {
    let dir = TempDir::new("sdk-killed");
    let addr: SocketAddr = format!("127.0.0.1:{}", free_udp_port()).parse().unwrap();
    let (mut child, ca, token) = spawn_binary(&dir.0, addr);
    let subscribed = |idle: Duration| {
        let mut config = client_config(addr, ca.clone(), &token);
        config.runtime = runtime;
        config.idle_timeout = idle;
        async move {
            let client = bounded(60, Client::connect(config)).await.unwrap();
            let stream = unique("killed");
            let sub = bounded(60, client.subscribe("default", &stream, Start::Latest))
                .await
                .unwrap();
            (client, sub)
        }
    };
    let (_client, mut sub) = subscribed(Duration::from_secs(1)).await;
    let (_slow_client, mut slow_sub) = subscribed(Duration::from_secs(3_600)).await;

    child.kill().expect("kill -9");
    child.wait().expect("reaped");
    let (mut child, ..) = spawn_binary(&dir.0, addr);

    let reported = bounded(60, sub.next()).await;
    let slow_reported = smol::future::poll_once(slow_sub.next()).await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        matches!(reported, Err(ClientError::Connection(_))),
        "{runtime:?}: the subscription must report the lost broker, got {reported:?}"
    );
    assert!(
        slow_reported.is_none(),
        "{runtime:?}: the client with the longer idle timeout noticed as soon: {slow_reported:?}"
    );
}
