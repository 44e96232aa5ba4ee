//! TLS and key rotation on a running engine: `require_alpn`, client certificates,
//! `set_tls_identity` (operator certificate rotation) and `set_jwks` (token key rotation).

use felix_auth::SigningKey;
use felix_engine::{AuthConfig, EngineError};
use felix_testkit::*;

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

/// A handshake with a client that presents `client_cert` (chain, key) to an engine that
/// requires certificates from `ca`; then one `auth` on one stream. Returns the answer's
/// `type`, or why the connection was lost. (The shared test network's client presents no
/// certificate, so this drives its own.)
fn mtls_session(
    server: felix_engine::TlsIdentity,
    trust: rustls_pki_types::CertificateDer<'static>,
    client_ca: rustls_pki_types::CertificateDer<'static>,
    client_cert: Option<(
        Vec<rustls_pki_types::CertificateDer<'static>>,
        rustls_pki_types::PrivateKeyDer<'static>,
    )>,
) -> Result<String, String> {
    use std::sync::Arc;
    use std::time::Instant;

    use bytes::BytesMut;
    use felix_engine::{Datagram, Engine, EngineConfig, Output};
    use quinn_proto::{DatagramEvent, Dir, Endpoint, EndpointConfig, Event};

    let mut config = EngineConfig::new(server, AuthConfig::Dev { seed: [7; 32] }, [9; 32]);
    config.client_ca = Some(vec![client_ca]);
    let now = Instant::now();
    let mut engine = Engine::new(config, now, 1_767_225_600_000_000).unwrap();
    let token = engine.dev_token().unwrap().to_owned();

    let mut roots = rustls::RootCertStore::empty();
    roots.add(trust).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots);
    let tls = match client_cert {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key).unwrap(),
        None => builder.with_no_client_auth(),
    };
    let client_config = quinn_proto::ClientConfig::new(Arc::new(
        quinn_proto::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ));
    let mut client = Endpoint::new(Arc::new(EndpointConfig::default()), None, true, None);
    let server_addr: std::net::SocketAddr = "127.0.0.1:5000".parse().unwrap();
    let client_addr: std::net::SocketAddr = "127.0.0.1:40000".parse().unwrap();
    let (ch, mut conn) = client
        .connect(now, client_config, server_addr, "localhost")
        .unwrap();
    let mut stream = None;
    let mut answer = felix_proto::FrameDecoder::new(1 << 20);
    let mut buf = Vec::new();
    for _ in 0..200 {
        while let Some(t) = conn.poll_transmit(now, 10, &mut buf) {
            let data = BytesMut::from(&buf[..t.size]);
            engine.handle_datagram(
                now,
                Datagram {
                    remote: client_addr,
                    local_ip: None,
                    ecn: None,
                    data,
                    segment_size: t.segment_size,
                },
            );
            buf.clear();
        }
        let mut out = Vec::new();
        while let Some(Output::Transmit(t)) = engine.poll_output(now, &mut out) {
            let segment = t.segment_size.unwrap_or(t.size);
            for d in out[..t.size].chunks(segment) {
                let mut resp = Vec::new();
                if let Some(DatagramEvent::ConnectionEvent(_, ev)) =
                    client.handle(now, server_addr, None, None, BytesMut::from(d), &mut resp)
                {
                    conn.handle_event(ev);
                }
            }
        }
        while let Some(ev) = conn.poll_endpoint_events() {
            if let Some(reply) = client.handle_event(ch, ev) {
                conn.handle_event(reply);
            }
        }
        while let Some(ev) = conn.poll() {
            match ev {
                Event::Connected => {
                    let id = conn.streams().open(Dir::Bi).unwrap();
                    conn.send_stream(id)
                        .write(&real_client_auth("t1", &token))
                        .unwrap();
                    stream = Some(id);
                }
                Event::ConnectionLost { reason } => return Err(reason.to_string()),
                _ => {}
            }
        }
        if let Some(id) = stream {
            if let Ok(mut chunks) = conn.recv_stream(id).read(true) {
                while let Ok(Some(chunk)) = chunks.next(usize::MAX) {
                    answer.feed_bytes(chunk.bytes);
                }
                let _ = chunks.finalize();
            }
            if let Some(frame) = answer.next_frame().unwrap() {
                let v: serde_json::Value = serde_json::from_slice(&frame.payload).unwrap();
                return Ok(v["type"].as_str().unwrap().to_owned());
            }
        }
    }
    Err("no answer".into())
}

#[test]
fn a_client_certificate_from_the_trusted_ca_is_accepted_and_others_are_not() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use rustls_pki_types::PrivateKeyDer;
    let ca = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        (cert.der().clone(), Issuer::new(params, key))
    };
    let leaf = |issuer: &Issuer<'_, KeyPair>, name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&key, issuer)
            .unwrap();
        (
            vec![cert.der().clone()],
            PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
    };
    let (server_ca, server_issuer) = ca("server CA");
    let (client_ca, client_issuer) = ca("client CA");
    let (_, stranger_issuer) = ca("stranger CA");
    let (chain, key) = leaf(&server_issuer, "localhost");
    let server = felix_engine::TlsIdentity {
        cert_chain: chain,
        key,
    };

    let trusted = leaf(&client_issuer, "client-1");
    assert_eq!(
        mtls_session(
            server.clone(),
            server_ca.clone(),
            client_ca.clone(),
            Some(trusted)
        ),
        Ok("auth_ok".to_owned())
    );
    let stranger = leaf(&stranger_issuer, "client-2");
    let refused = mtls_session(
        server.clone(),
        server_ca.clone(),
        client_ca.clone(),
        Some(stranger),
    );
    let why = refused.unwrap_err();
    assert!(
        why.contains("crypto") || why.contains("certificate"),
        "{why}"
    );
    let refused = mtls_session(server, server_ca, client_ca, None);
    let why = refused.unwrap_err();
    assert!(why.contains("no certificates"), "{why}");
}
