//! Rotation without a restart: the broker watches its certificate, key and JWKS files and,
//! when they change, serves the new certificate to new connections and verifies new streams'
//! tokens against the new keys. A file that does not parse leaves the old one in place.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use felix_client::Client;
use felix_integration::{client_config, start_broker, unique, within, Claims, TokenMinter, TENANT};
use felix_runtime_tokio::config::Reload;
use felix_runtime_tokio::BrokerOptions;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

/// A CA (its PEM) and a `localhost` leaf it signs (chain PEM, key PEM).
fn ca_and_leaf(name: &str) -> (String, String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(rcgen::DnType::CommonName, name);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    leaf.subject_alt_names
        .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();
    (ca_cert.pem(), leaf_cert.pem(), leaf_key.serialize_pem())
}

/// Replaces a file the way operators and cert managers do: write beside it, rename over.
fn replace(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn connects(addr: std::net::SocketAddr, ca: &str, token: &str) -> bool {
    let mut config = client_config(addr, ca.as_bytes().to_vec(), token);
    config.connect_timeout = Duration::from_secs(2);
    match within(10, Client::connect(config)).await {
        Ok(c) => {
            c.close().await;
            true
        }
        Err(_) => false,
    }
}

/// Polls `check` until it holds (bounded).
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(10) {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what} did not happen within 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_and_jwks_files_are_rotated_while_running() {
    let dir: PathBuf = std::env::temp_dir().join(unique("ops-rotation"));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key, jwks) = (
        dir.join("cert.pem"),
        dir.join("key.pem"),
        dir.join("jwks.json"),
    );
    let (ca1, chain1, key1) = ca_and_leaf("first CA");
    let (ca2, chain2, key2) = ca_and_leaf("second CA");
    let (old_keys, new_keys) = (
        TokenMinter::new("k-old", [1; 32]),
        TokenMinter::new("k-new", [2; 32]),
    );
    let claims = Claims::new(TENANT, &["stream.publish:stream:t1/*/*"]);
    let (old_token, new_token) = (old_keys.mint(&claims), new_keys.mint(&claims));
    std::fs::write(&cert, &chain1).unwrap();
    std::fs::write(&key, &key1).unwrap();
    std::fs::write(&jwks, old_keys.jwks()).unwrap();

    let opts = BrokerOptions::ephemeral()
        .tls_pem(chain1.clone().into_bytes(), key1.clone().into_bytes())
        .jwks(old_keys.jwks());
    let mut broker = within(10, start_broker(opts)).await.unwrap();
    broker
        .watch_files(&Reload {
            tls: Some((cert.clone(), key.clone())),
            jwks: Some(jwks.clone()),
            interval: Some(Duration::from_millis(20)),
        })
        .unwrap();
    let addr = broker.local_addr();
    assert!(connects(addr, &ca1, &old_token).await);
    assert!(
        !connects(addr, &ca2, &old_token).await,
        "the second CA is not served yet"
    );
    assert!(
        !connects(addr, &ca1, &new_token).await,
        "the new key is not trusted yet"
    );

    // A half-written key (garbage) is not taken: the first certificate stays.
    let refused = broker.reload_refusals();
    replace(&key, b"not a key");
    // Wait until the watcher has looked at the garbage and refused it, not for a guessed time.
    eventually("the garbage key refused", async || {
        broker.reload_refusals() > refused
    })
    .await;
    assert!(connects(addr, &ca1, &old_token).await);

    replace(&cert, chain2.as_bytes());
    replace(&key, key2.as_bytes());
    eventually("the rotated certificate", async || {
        connects(addr, &ca2, &old_token).await
    })
    .await;
    assert!(
        !connects(addr, &ca1, &old_token).await,
        "the first certificate is retired"
    );

    replace(&jwks, &new_keys.jwks());
    eventually("the rotated JWKS", async || {
        connects(addr, &ca2, &new_token).await
    })
    .await;
    assert!(
        !connects(addr, &ca2, &old_token).await,
        "the old key is retired"
    );

    within(10, broker.shutdown()).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
