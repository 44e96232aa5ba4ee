//! The runtimes end to end on loopback: the library API (`start`, `RunningBroker`) of both
//! adapters and the `felix-broker` binary on both (`--runtime`, `FELIX_RUNTIME`), driven by a
//! real QUIC client (quinn), with and without ALPN.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use felix_runtime_tokio::{BrokerOptions, RunningBroker};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

const TIMEOUT: Duration = Duration::from_secs(10);

/// Every test runs on each of these.
const RUNTIMES: [&str; 2] = ["tokio", "smol"];

async fn start(runtime: &str, opts: BrokerOptions) -> std::io::Result<RunningBroker> {
    let broker = match runtime {
        "tokio" => felix_runtime_tokio::start(opts).await?,
        "smol" => felix_runtime_smol::start(opts).await?,
        other => panic!("no runtime {other}"),
    };
    assert_eq!(broker.runtime(), runtime);
    Ok(broker)
}

fn client_endpoint(ca_pem: &str, alpn: Option<&[u8]>) -> quinn::Endpoint {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = alpn.map(|a| vec![a.to_vec()]).unwrap_or_default();
    let config = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ));
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(config);
    endpoint
}

fn json_frame(json: &str) -> Vec<u8> {
    let mut v = b"FLX1\x00\x01\x00\x00".to_vec();
    v.extend_from_slice(&(json.len() as u32).to_be_bytes());
    v.extend_from_slice(json.as_bytes());
    v
}

async fn read_frame(recv: &mut quinn::RecvStream) -> serde_json::Value {
    let mut header = [0u8; 12];
    recv.read_exact(&mut header).await.unwrap();
    assert_eq!(&header[..4], b"FLX1");
    let len = u32::from_be_bytes(header[8..12].try_into().unwrap()) as usize;
    let mut payload = vec![0; len];
    recv.read_exact(&mut payload).await.unwrap();
    serde_json::from_slice(&payload).unwrap()
}

/// The protocol the handshake selected, if any.
fn negotiated_alpn(conn: &quinn::Connection) -> Option<Vec<u8>> {
    conn.handshake_data()
        .unwrap()
        .downcast::<quinn::crypto::rustls::HandshakeData>()
        .unwrap()
        .protocol
}

/// Connects, authenticates one stream with the real client's offer, and returns the answer.
async fn connect_and_auth(
    addr: SocketAddr,
    ca_pem: &str,
    alpn: Option<&[u8]>,
    token: &str,
) -> (quinn::Connection, serde_json::Value) {
    let endpoint = client_endpoint(ca_pem, alpn);
    let conn = tokio::time::timeout(TIMEOUT, endpoint.connect(addr, "localhost").unwrap())
        .await
        .expect("handshake in time")
        .expect("handshake");
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let auth = format!(
        r#"{{"type":"auth","tenant_id":"t1","token":"{token}","client_flags":8191,"client_features":4218945535,"client_features_hi":15}}"#
    );
    send.write_all(&json_frame(&auth)).await.unwrap();
    let answer = tokio::time::timeout(TIMEOUT, read_frame(&mut recv))
        .await
        .expect("auth answered");
    (conn, answer)
}

#[tokio::test]
async fn in_process_broker_serves_both_alpn_modes_and_shuts_down_with_code_zero() {
    for runtime in RUNTIMES {
        serves_both_alpn_modes_and_shuts_down_with_code_zero(runtime).await;
    }
}

async fn serves_both_alpn_modes_and_shuts_down_with_code_zero(runtime: &str) {
    let broker = start(runtime, BrokerOptions::new("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let addr = broker.local_addr();
    assert_ne!(addr.port(), 0);
    let token = broker
        .dev_token()
        .expect("dev mode without a JWKS")
        .to_owned();
    let ca = broker.ca_cert_pem().to_owned();

    let (plain, answer) = connect_and_auth(addr, &ca, None, &token).await;
    assert_eq!(answer["type"], "auth_ok");
    assert_eq!(negotiated_alpn(&plain), None);
    let (felix, answer) = connect_and_auth(addr, &ca, Some(b"felix/1"), &token).await;
    assert_eq!(answer["type"], "auth_ok");
    assert_eq!(negotiated_alpn(&felix).as_deref(), Some(&b"felix/1"[..]));

    // Connect is 40 sequential authenticated streams for the real client: each is answered.
    // How long they take is a benchmark figure (`bench -- connect`), not a pass/fail line.
    for _ in 0..40 {
        let (mut send, mut recv) = plain.open_bi().await.unwrap();
        let auth =
            format!(r#"{{"type":"auth","tenant_id":"t1","token":"{token}","client_flags":8191}}"#);
        send.write_all(&json_frame(&auth)).await.unwrap();
        assert_eq!(read_frame(&mut recv).await["type"], "auth_ok");
    }

    broker.shutdown().await.unwrap();
    for conn in [plain, felix] {
        match tokio::time::timeout(TIMEOUT, conn.closed()).await.unwrap() {
            quinn::ConnectionError::ApplicationClosed(close) => {
                assert_eq!(close.error_code, quinn::VarInt::from_u32(0));
                assert_eq!(&close.reason[..], b"shutdown");
            }
            other => panic!("expected an application close, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn jwks_mode_has_no_dev_token_and_a_bad_jwks_fails_to_start() {
    for runtime in RUNTIMES {
        jwks_mode(runtime).await;
    }
}

async fn jwks_mode(runtime: &str) {
    // RFC 8037 A.2's Ed25519 public key.
    let jwks = br#"{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"k1","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#;
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().unwrap());
    opts.jwks = Some(jwks.to_vec());
    let broker = start(runtime, opts).await.unwrap();
    assert!(broker.dev_token().is_none());
    let (_conn, answer) =
        connect_and_auth(broker.local_addr(), broker.ca_cert_pem(), None, "a.b.c").await;
    assert_eq!(answer["type"], "error");
    assert_eq!(answer["code"], "unauthenticated");
    broker.shutdown().await.unwrap();

    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().unwrap());
    opts.jwks = Some(b"{}".to_vec());
    // Refused for the JWKS, not for some other start-up failure (a port, a certificate).
    let Err(err) = start(runtime, opts).await else {
        panic!("{runtime}: a JWKS without keys is refused");
    };
    assert_eq!(
        err.kind(),
        std::io::ErrorKind::InvalidInput,
        "{runtime}: {err}"
    );
    assert!(
        err.to_string()
            .starts_with("auth configuration: unusable JWKS"),
        "{runtime}: {err}"
    );
}

#[tokio::test]
async fn engine_overrides_apply_and_dropping_the_handle_stops_the_broker() {
    for runtime in RUNTIMES {
        let opts = BrokerOptions::new("127.0.0.1:0".parse().unwrap())
            .configure_engine(|c| c.publish_window = 7);
        let broker = start(runtime, opts).await.unwrap();
        let token = broker.dev_token().unwrap().to_owned();
        let (conn, answer) =
            connect_and_auth(broker.local_addr(), broker.ca_cert_pem(), None, &token).await;
        assert_eq!(answer["publish_window"], 7);
        drop(broker);
        match tokio::time::timeout(TIMEOUT, conn.closed()).await {
            Ok(quinn::ConnectionError::ApplicationClosed(close)) => {
                assert_eq!(close.error_code, quinn::VarInt::from_u32(0), "{runtime}")
            }
            other => panic!("{runtime}: expected a close after the drop, got {other:?}"),
        }
    }
}

fn wait_for_file(path: &Path, child: &mut std::process::Child) -> String {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if !s.is_empty() {
                return s;
            }
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the broker exited early"
        );
        assert!(
            Instant::now() < deadline,
            "{} was not written in time",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn the_binary_exports_ca_and_token_and_exits_zero_on_sigterm() {
    // The flag, and the variable, pick the runtime; the log line names it.
    binary_on(&["--runtime", "smol"], &[], "smol").await;
    binary_on(&[], &[("FELIX_RUNTIME", "smol")], "smol").await;
    binary_on(&[], &[], "tokio").await;
}

#[test]
fn the_binary_refuses_an_unknown_runtime_with_exit_code_two() {
    let output = Command::new(env!("CARGO_BIN_EXE_felix-broker"))
        .args(["--runtime", "async-std"])
        .env("FELIX_QUIC_BIND", "127.0.0.1:0")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown runtime \"async-std\""), "{stderr}");
}

async fn binary_on(args: &[&str], vars: &[(&str, &str)], runtime: &str) {
    let dir = std::env::temp_dir().join(format!(
        "felix-runtime-test-{}-{runtime}-{}",
        std::process::id(),
        args.len()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca_path, token_path) = (dir.join("ca.pem"), dir.join("token"));
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let log = dir.join("log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_felix-broker"))
        .args(args)
        .envs(vars.iter().copied())
        .env("FELIX_QUIC_BIND", addr.to_string())
        .env("FELIX_TLS_CERT_EXPORT", &ca_path)
        .env("FELIX_DEV_TOKEN_EXPORT", &token_path)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let ca = wait_for_file(&ca_path, &mut child);
    let token = wait_for_file(&token_path, &mut child);

    for alpn in [None, Some(&b"felix/1"[..])] {
        let (conn, answer) = connect_and_auth(addr, &ca, alpn, token.trim()).await;
        assert_eq!(answer["type"], "auth_ok");
        assert_eq!(
            negotiated_alpn(&conn).as_deref(),
            alpn,
            "the offer is echoed"
        );
        drop(conn);
    }
    let (conn, _) = connect_and_auth(addr, &ca, None, token.trim()).await;

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    match tokio::time::timeout(TIMEOUT, conn.closed()).await.unwrap() {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(close.error_code, quinn::VarInt::from_u32(0))
        }
        other => panic!("expected an application close, got {other:?}"),
    }
    let deadline = Instant::now() + TIMEOUT;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the broker did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(code.success(), "exit status {code:?}");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains(&format!("runtime=\"{runtime}\""))
            || log.contains(&format!("runtime={runtime}")),
        "the log names the runtime {runtime}: {log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn temp_storage(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("felix-rt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[tokio::test]
async fn a_durable_broker_recovers_before_serving_and_refuses_a_corrupt_log() {
    for runtime in RUNTIMES {
        durable_recovery(runtime).await;
    }
}

async fn durable_recovery(runtime: &str) {
    let dir = temp_storage(&format!("recover-{runtime}"));
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().unwrap());
    opts.storage_dir = Some(dir.clone());
    let broker = start(runtime, opts).await.unwrap();
    assert!(broker.file_stats().is_some(), "a file executor runs");
    let (conn, answer) = connect_and_auth(
        broker.local_addr(),
        broker.ca_cert_pem(),
        None,
        broker.dev_token().unwrap(),
    )
    .await;
    let features = answer["server_features"].as_u64().unwrap();
    assert_ne!(
        features & 0x8_0000,
        0,
        "a durable broker advertises ack-on-commit"
    );
    conn.close(0u32.into(), b"done");
    broker.shutdown().await.unwrap();

    // A damaged segment with a newer one after it is not a torn tail but corruption: the
    // broker must not start, and says which file.
    let shard = dir.join("streams/t1/default/orders/0");
    std::fs::create_dir_all(&shard).unwrap();
    std::fs::write(
        shard.join("00000000000000000000.seg"),
        b"not a segment header",
    )
    .unwrap();
    std::fs::write(shard.join("00000000000000000007.seg"), b"nor this").unwrap();
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().unwrap());
    opts.storage_dir = Some(dir.clone());
    let err = start(runtime, opts).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    assert!(
        err.to_string().contains("00000000000000000000.seg"),
        "names the file: {err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
