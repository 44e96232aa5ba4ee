//! TLS and key rotation on a running engine: `require_alpn`, client certificates,
//! `set_tls_identity` (operator certificate rotation) and `set_jwks` (token key rotation).

mod common;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use common::*;
use ed25519_dalek::{Signer, SigningKey};
use felix_engine::{AuthConfig, EngineError};

fn handshake_failed(net: &Net, p: usize) -> bool {
    !net.peers[p].connected && net.peers[p].lost.is_some()
}

#[test]
fn require_alpn_refuses_clients_that_offer_none() {
    let mut net = Net::new(|c| c.require_alpn = true);
    let without = net.start_connect(&[]);
    net.run();
    assert!(
        handshake_failed(&net, without),
        "{:?}",
        net.peers[without].lost
    );
    let with = net.connect(&[b"felix/1"]);
    let (_, answer) = net.auth_stream(with);
    assert!(text(&answer).starts_with(r#"{"type":"auth_ok""#));
}

#[test]
fn a_client_ca_makes_certificates_mandatory() {
    let other = tls();
    let mut net = Net::new(|c| c.client_ca = Some(vec![other.ca.clone()]));
    // The test client presents no certificate. In TLS 1.3 the client finishes its side
    // first; the broker then closes with the TLS alert.
    let p = net.start_connect(&[]);
    net.run();
    match &net.peers[p].lost {
        Some(quinn_proto::ConnectionError::ConnectionClosed(c)) => {
            assert!(c.error_code.to_string().contains("crypto"), "{c:?}");
            assert!(
                String::from_utf8_lossy(&c.reason).contains("no certificates"),
                "{c:?}"
            );
        }
        other => panic!("expected a TLS refusal, got {other:?}"),
    }
    assert_eq!(net.engine.stats().streams_accepted, 0);
}

#[test]
fn a_rotated_certificate_serves_new_handshakes_and_spares_open_connections() {
    let mut net = Net::new(|_| {});
    let before = net.connect(&[]);
    let (stream, _) = net.auth_stream(before);
    // A certificate from another CA, which the test client does not trust: a handshake that
    // fails proves the new one is what is served.
    let rotated = tls();
    net.engine.set_tls_identity(rotated.identity).unwrap();
    let after = net.start_connect(&[]);
    net.run();
    assert!(handshake_failed(&net, after), "{:?}", net.peers[after].lost);
    // The connection made before goes on, on its old session.
    let acks = net.exchange(before, stream, &binary_publish(Some(1), None, "s", &[b"x"]));
    assert_eq!(acks.len(), 1);
    let (_, answer) = net.auth_stream(before);
    assert!(text(&answer).starts_with(r#"{"type":"auth_ok""#));
}

fn jwks(keys: &[(&str, &SigningKey)]) -> Vec<u8> {
    let keys: Vec<_> = keys
        .iter()
        .map(|(kid, key)| {
            serde_json::json!({"kty": "OKP", "crv": "Ed25519", "kid": kid,
                "x": URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes())})
        })
        .collect();
    serde_json::json!({ "keys": keys }).to_string().into_bytes()
}

fn token(kid: &str, key: &SigningKey) -> String {
    // The test network's engine starts at 2026-01-01T00:00:00Z.
    let now = 1_767_225_600u64;
    let header = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"EdDSA","kid":"{kid}"}}"#));
    let claims = URL_SAFE_NO_PAD.encode(
        serde_json::json!({"iss": "felix-auth", "aud": "felix-broker", "tid": "t1",
            "iat": now, "exp": now + 3600, "perms": ["stream.publish:stream:t1/*"]})
        .to_string(),
    );
    let signing_input = format!("{header}.{claims}");
    let signature = URL_SAFE_NO_PAD.encode(key.sign(signing_input.as_bytes()).to_bytes());
    format!("{signing_input}.{signature}")
}

fn auth(net: &mut Net, p: usize, token: &str) -> (quinn_proto::StreamId, serde_json::Value) {
    let id = net.open_bi(p);
    let frames = net.exchange(p, id, &real_client_auth("t1", token));
    (id, serde_json::from_str(text(&frames[0])).unwrap())
}

#[test]
fn a_new_jwks_verifies_later_auths_and_spares_authenticated_streams() {
    let old = SigningKey::from_bytes(&[1; 32]);
    let new = SigningKey::from_bytes(&[2; 32]);
    let mut net = Net::new(|c| c.auth = AuthConfig::Jwks(jwks(&[("old", &old)])));
    let p = net.connect(&[]);
    let (kept, answer) = auth(&mut net, p, &token("old", &old));
    assert_eq!(answer["type"], "auth_ok");
    let (_, answer) = auth(&mut net, p, &token("new", &new));
    assert_eq!(answer["code"], "unauthenticated", "not trusted yet");

    // A bad document changes nothing.
    assert!(matches!(
        net.engine.set_jwks(b"{\"keys\":[]}"),
        Err(EngineError::Auth(_))
    ));
    let (_, answer) = auth(&mut net, p, &token("old", &old));
    assert_eq!(answer["type"], "auth_ok");

    net.engine.set_jwks(&jwks(&[("new", &new)])).unwrap();
    let (_, answer) = auth(&mut net, p, &token("new", &new));
    assert_eq!(answer["type"], "auth_ok");
    let (_, answer) = auth(&mut net, p, &token("old", &old));
    assert_eq!(answer["code"], "unauthenticated", "the retired key is gone");
    // A stream that proved itself under the old key keeps its identity.
    let acks = net.exchange(p, kept, &binary_publish(Some(1), None, "s", &[b"x"]));
    let ack = felix_proto::binary::PublishAck::decode(acks[0].flags, &acks[0].payload).unwrap();
    assert!(matches!(
        ack.result,
        felix_proto::binary::AckResult::Ok { .. }
    ));
}

#[test]
fn dev_mode_has_no_jwks_to_replace() {
    let mut net = Net::new(|_| {});
    let old = SigningKey::from_bytes(&[1; 32]);
    assert!(matches!(
        net.engine.set_jwks(&jwks(&[("k", &old)])),
        Err(EngineError::Config(_))
    ));
}
