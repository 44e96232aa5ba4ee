//! Connections: ALPN with and without, the authentication deadline, reaping abandoned
//! connections, stream credit that keeps coming, and shutdown.

use std::time::Duration;

use felix_testkit::*;
use quinn_proto::{ConnectionError, VarInt};

fn app_close(net: &Net, p: usize) -> Option<(u64, String)> {
    match &net.peers[p].lost {
        Some(ConnectionError::ApplicationClosed(close)) => Some((
            close.error_code.into_inner(),
            String::from_utf8_lossy(&close.reason).into_owned(),
        )),
        _ => None,
    }
}

#[test]
fn alpn_felix_v1_and_no_alpn_both_connect_other_alpn_is_refused() {
    let mut net = Net::new(|_| {});
    let plain = net.connect(&[]);
    let felix = net.connect(&[b"felix/1"]);
    let both = net.connect(&[b"h3", b"felix/1"]);
    for p in [plain, felix, both] {
        let (_, answer) = net.auth_stream(p);
        assert!(text(&answer).starts_with(r#"{"type":"auth_ok""#));
    }
    let selected = |net: &Net, p: usize| {
        net.peers[p]
            .conn
            .crypto_session()
            .handshake_data()
            .unwrap()
            .downcast::<quinn_proto::crypto::rustls::HandshakeData>()
            .unwrap()
            .protocol
    };
    assert_eq!(selected(&net, plain), None);
    assert_eq!(selected(&net, felix).as_deref(), Some(&b"felix/1"[..]));
    assert_eq!(selected(&net, both).as_deref(), Some(&b"felix/1"[..]));

    let other = net.start_connect(&[b"h3"]);
    net.run();
    match &net.peers[other].lost {
        // TLS alert no_application_protocol (120) as a QUIC crypto error: 0x100 + 120.
        Some(ConnectionError::ConnectionClosed(c)) => assert_eq!(u64::from(c.error_code), 0x178),
        other => panic!("expected a refused handshake, got {other:?}"),
    }
}

#[test]
fn a_connection_that_authenticates_nothing_is_closed_after_ten_seconds() {
    let mut net = Net::new(|_| {});
    net.client_keep_alive = Some(Duration::from_secs(2));
    let p = net.connect(&[]);
    let idle = net.connect(&[]);
    let id = net.open_bi(p);
    net.send(p, id, b"FLX1"); // a partial frame is not an auth
    net.advance(Duration::from_millis(9_900));
    assert!(net.peers[p].lost.is_none());
    net.advance(Duration::from_millis(200));
    assert_eq!(
        app_close(&net, p),
        Some((1, "authentication timeout".to_owned()))
    );
    assert_eq!(
        app_close(&net, idle),
        Some((1, "authentication timeout".to_owned()))
    );
}

#[test]
fn an_authenticated_connection_is_not_closed_by_the_auth_deadline() {
    let mut net = Net::new(|_| {});
    net.client_keep_alive = Some(Duration::from_secs(2));
    let p = net.connect(&[]);
    net.auth_stream(p);
    net.advance(Duration::from_secs(30));
    assert!(net.peers[p].lost.is_none());
}

#[test]
fn abandoned_connections_are_reaped_but_not_while_subscribed() {
    let mut net = Net::new(|_| {});
    // Like the real client: keep-alives forever, nothing else, never closed.
    net.client_keep_alive = Some(Duration::from_secs(2));
    let abandoned = net.connect(&[]);
    let subscribed = net.connect(&[]);
    net.auth_stream(abandoned);
    let (id, _) = net.auth_stream(subscribed);
    net.exchange(
        subscribed,
        id,
        &json_frame(r#"{"type":"subscribe","tenant_id":"t1","namespace":"default","stream":"s"}"#),
    );
    net.advance(Duration::from_secs(119));
    assert!(
        net.peers[abandoned].lost.is_none(),
        "not before idle_connection_reap"
    );
    net.advance(Duration::from_secs(2));
    assert_eq!(app_close(&net, abandoned), Some((0, "idle".to_owned())));
    net.advance(Duration::from_secs(300));
    assert!(
        net.peers[subscribed].lost.is_none(),
        "a live subscription keeps it"
    );
}

#[test]
fn felix_traffic_postpones_the_reap() {
    let mut net = Net::new(|c| c.idle_connection_reap = Duration::from_secs(5));
    net.client_keep_alive = Some(Duration::from_secs(2));
    let p = net.connect(&[]);
    let (id, _) = net.auth_stream(p);
    for i in 0..4 {
        net.advance(Duration::from_secs(3));
        net.exchange(p, id, &binary_publish(Some(i + 1), None, "s", &[b"x"]));
    }
    assert!(net.peers[p].lost.is_none());
    net.advance(Duration::from_secs(6));
    assert_eq!(app_close(&net, p), Some((0, "idle".to_owned())));
}

#[test]
fn finished_streams_return_their_credit() {
    let mut net = Net::new(|c| c.max_concurrent_bidi_streams = 16);
    let p = net.connect(&[]);
    // Far more streams than the limit, one after another: each is answered and finished.
    for i in 0..100u64 {
        let (id, _) = net.auth_stream(p);
        let frames = net.exchange(
            p,
            id,
            &json_frame(&format!(
                r#"{{"type":"stream_shards","tenant_id":"t1","namespace":"default","stream":"s","request_id":{i}}}"#
            )),
        );
        assert_eq!(frames.len(), 1);
        net.finish(p, id);
        net.run();
        net.read_frames(p, id);
        assert!(
            net.peers[p].finished.contains(&id),
            "stream {i} finished by the broker"
        );
        net.run();
    }
}

#[test]
fn unauthenticated_streams_per_connection_are_limited() {
    let mut net = Net::new(|c| c.preauth_max_streams_per_connection = 2);
    let p = net.connect(&[]);
    let ids: Vec<_> = (0..3).map(|_| net.open_bi(p)).collect();
    for id in &ids {
        net.send(p, *id, b"FLX1");
    }
    net.run();
    for id in &ids {
        net.read_frames(p, *id);
    }
    assert_eq!(net.peers[p].reset, vec![(ids[2], VarInt::from_u32(1))]);
    // Completing the first stream's auth frees a place: authenticated streams do not count.
    let token = net.token();
    let frames = net.exchange(p, ids[0], &real_client_auth("t1", &token)[4..]);
    assert!(text(&frames[0]).starts_with(r#"{"type":"auth_ok""#));
    let (_, answer) = net.auth_stream(p);
    assert!(text(&answer).starts_with(r#"{"type":"auth_ok""#));
}

#[test]
fn shutdown_closes_every_connection_with_code_zero() {
    let mut net = Net::new(|_| {});
    let a = net.connect(&[]);
    let b = net.connect(&[b"felix/1"]);
    net.auth_stream(a);
    let now = net.now;
    net.engine.shutdown(now);
    net.run();
    assert_eq!(app_close(&net, a), Some((0, "shutdown".to_owned())));
    assert_eq!(app_close(&net, b), Some((0, "shutdown".to_owned())));
    net.advance(Duration::from_secs(5));
    assert_eq!(net.engine.connection_count(), 0, "closed connections drain");
    // New connections are not accepted.
    let late = net.start_connect(&[]);
    net.advance(Duration::from_secs(1));
    assert!(!net.peers[late].connected);
}

#[test]
fn connections_past_the_limit_are_refused_in_the_handshake() {
    let mut net = Net::new(|c| c.max_connections = 1);
    let first = net.connect(&[]);
    let second = net.start_connect(&[]);
    net.run();
    assert!(net.peers[first].lost.is_none());
    match &net.peers[second].lost {
        Some(ConnectionError::ConnectionClosed(c)) => {
            assert_eq!(
                c.error_code,
                quinn_proto::TransportErrorCode::CONNECTION_REFUSED
            )
        }
        other => panic!("expected CONNECTION_REFUSED, got {other:?}"),
    }
    assert_eq!(net.engine.stats().connections_refused, 1);
}

#[test]
fn a_stream_the_client_finishes_and_stops_gives_its_credit_back() {
    // felix-client 0.6.2 lets a stream go with FIN and STOP_SENDING in one packet; the
    // broker must reset its stopped half, or quinn never frees the stream.
    let mut net = Net::new(|c| c.max_concurrent_bidi_streams = 4);
    let p = net.connect(&[]);
    for _ in 0..20 {
        let (id, _) = net.auth_stream(p);
        net.finish(p, id);
        net.stop(p, id);
        net.run();
    }
    let (_, answer) = net.auth_stream(p);
    assert!(text(&answer).contains("auth_ok"));
}
