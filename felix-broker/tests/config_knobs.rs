//! The issue-6 knobs, end to end through the `felix-broker` process: each variable reaches
//! the engine and changes what a client sees — `FELIX_TLS_REQUIRE_ALPN`,
//! `FELIX_TLS_CLIENT_CA` (client certificates) and `FELIX_MAX_CONNECTIONS_PER_IP`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use felix_client::{Client, ClientConfig, ClientError};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

struct Broker {
    child: Child,
    addr: SocketAddr,
    ca: Vec<u8>,
    token: String,
    dir: PathBuf,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_udp_port() -> u16 {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap().port()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "felix-knobs-{name}-{}-{}",
        std::process::id(),
        free_udp_port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn spawn(dir: PathBuf, vars: &[(&str, &str)]) -> Broker {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_udp_port()).parse().unwrap();
    let (ca, token) = (dir.join("ca.pem"), dir.join("token"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_felix-broker"));
    for (name, _) in std::env::vars() {
        if name.starts_with("FELIX_") {
            cmd.env_remove(name);
        }
    }
    cmd.env("FELIX_QUIC_BIND", addr.to_string())
        .env("FELIX_METRICS_BIND", "off")
        .env("FELIX_TLS_CERT_EXPORT", &ca)
        .env("FELIX_DEV_TOKEN_EXPORT", &token)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    // Polls for the exported files; the deadline is generous (a loaded machine starts slowly)
    // and only fails a broker that never starts.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the broker exited at start-up: {status}");
        }
        if let (Ok(ca), Ok(token)) = (std::fs::read(&ca), std::fs::read_to_string(&token)) {
            let token = token.trim().to_owned();
            if token.is_empty() {
                // Exported but not yet written.
                std::thread::sleep(Duration::from_millis(25));
                continue;
            }
            return Broker {
                child,
                addr,
                ca,
                token,
                dir,
            };
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the broker did not start");
}

impl Broker {
    fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new(self.addr, self.ca.clone(), "t1", &self.token);
        c.connect_timeout = Duration::from_secs(3);
        c
    }

    async fn connect(&self, adjust: impl FnOnce(&mut ClientConfig)) -> Result<Client, ClientError> {
        let mut config = self.config();
        adjust(&mut config);
        tokio::time::timeout(Duration::from_secs(10), Client::connect(config))
            .await
            .expect("connect settles in time")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_alpn_refuses_clients_that_offer_none() {
    let broker = spawn(temp_dir("alpn"), &[("FELIX_TLS_REQUIRE_ALPN", "true")]);
    // Refused by the TLS handshake with alert no_application_protocol (120), which QUIC
    // carries as crypto error 0x178: not a timeout, an auth refusal or any other failure.
    match broker.connect(|c| c.offer_alpn = false).await {
        Err(ClientError::Connection(m)) => assert!(
            m.starts_with("handshake:")
                && m.contains("the cryptographic handshake failed: error 120"),
            "{m}"
        ),
        Err(other) => panic!("expected the TLS alert, got {other:?}"),
        Ok(_) => panic!("connected without offering ALPN"),
    }
    broker
        .connect(|c| c.offer_alpn = true)
        .await
        .unwrap()
        .close()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_ip_are_limited() {
    let broker = spawn(temp_dir("per-ip"), &[("FELIX_MAX_CONNECTIONS_PER_IP", "1")]);
    let first = broker.connect(|_| {}).await.unwrap();
    // docs/limits.md: past the limit the handshake is refused with CONNECTION_REFUSED.
    match broker.connect(|_| {}).await {
        Err(ClientError::Connection(m)) => assert!(
            m.contains("the server refused to accept a new connection"),
            "{m}"
        ),
        Err(other) => panic!("expected CONNECTION_REFUSED, got {other:?}"),
        Ok(_) => panic!("a second connection from 127.0.0.1 was accepted"),
    }
    first.close().await;
}

/// A CA and a client certificate it signs (chain PEM, key PEM).
fn client_ca_and_cert() -> (String, String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec!["client.example".to_owned()]).unwrap();
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

/// A raw QUIC handshake, with a client certificate or without.
async fn handshake(addr: SocketAddr, server_ca: &[u8], client: Option<(&str, &str)>) -> bool {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(server_ca) {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots);
    let tls = match client {
        Some((chain, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(chain.as_bytes())
                    .map(Result::unwrap)
                    .collect(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let config = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ));
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(config);
    let result = tokio::time::timeout(Duration::from_secs(5), async {
        let conn = endpoint.connect(addr, "localhost").ok()?.await.ok()?;
        // The server's verdict on the client certificate arrives after the client's side
        // of the handshake completes: a stream round trip proves the connection is served.
        let (mut send, mut recv) = conn.open_bi().await.ok()?;
        send.write_all(b"FLX1\x00\x01\x00\x00\x00\x00\x00\x02{}")
            .await
            .ok()?;
        let mut header = [0u8; 4];
        recv.read_exact(&mut header).await.ok()?;
        Some(header == *b"FLX1")
    })
    .await;
    endpoint.close(0u32.into(), b"done");
    matches!(result, Ok(Some(true)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ca_makes_client_certificates_mandatory() {
    let dir = temp_dir("client-ca");
    let (ca, chain, key) = client_ca_and_cert();
    let ca_path = dir.join("clients-ca.pem");
    std::fs::write(&ca_path, &ca).unwrap();
    let broker = spawn(dir, &[("FELIX_TLS_CLIENT_CA", ca_path.to_str().unwrap())]);
    assert!(
        !handshake(broker.addr, &broker.ca, None).await,
        "no certificate: refused"
    );
    assert!(handshake(broker.addr, &broker.ca, Some((&chain, &key))).await);
    // Signed by another CA: refused.
    let (_, other_chain, other_key) = client_ca_and_cert();
    assert!(!handshake(broker.addr, &broker.ca, Some((&other_chain, &other_key))).await);
}
