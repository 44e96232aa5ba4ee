//! The forwarding path's limits at their edges, on felix-testkit's `ClusterNet` and its
//! virtual clock: the forward timeout, the per-peer forward window, the leader's channel cap,
//! channels closed when their client session ends, and the peer links' own limits.
//! Placement (see cluster_frames.rs): `orders` shard 0 is led by n2, shard 1 by n3.

use std::time::Duration;

use felix_engine::{DeclaredStream, EngineConfig};
use felix_proto::binary::{AckResult, PublishAck};
use felix_proto::{ErrorCode, Frame};
use felix_testkit::*;

fn spec() -> ClusterSpec {
    let mut s = ClusterSpec::default();
    s.streams
        .push(DeclaredStream::new("t1", "default", "orders", 3));
    s
}

/// A cluster with `tweak` applied to node `on`'s cluster settings only.
fn cluster(on: usize, tweak: impl Fn(&mut felix_engine::ClusterConfig)) -> ClusterNet {
    ClusterNet::started(&spec(), |i, c: &mut EngineConfig| {
        if i == on {
            tweak(c.cluster.as_mut().expect("a cluster node"));
        }
    })
}

const N1: usize = 0;
const N2: usize = 1;
const N3: usize = 2;

/// An acked publish to shard 0 (unkeyed), which n2 leads.
fn publish(request_id: u64) -> Vec<u8> {
    binary_publish(Some(request_id), None, "orders", &[b"r"])
}

/// An acked JSON publish to shard 1, which n3 leads.
fn publish_shard1(request_id: u64) -> Vec<u8> {
    json_frame(&format!(
        r#"{{"type":"publish","tenant_id":"t1","namespace":"default","stream":"orders","shard":1,"payload":"aGk=","request_id":{request_id},"ack":"per_message"}}"#
    ))
}

fn ack(f: &Frame) -> PublishAck {
    PublishAck::decode(f.flags, &f.payload).expect("a binary ack")
}

fn assert_ok_ack(f: &Frame, request_id: u64) {
    let a = ack(f);
    assert_eq!(a.request_id, request_id);
    assert!(matches!(a.result, AckResult::Ok { .. }), "{a:?}");
    assert_eq!(a.owner.expect("forwarded: the owner hint").node_id, "n2");
}

fn assert_failed_ack(f: &Frame, request_id: u64, code: ErrorCode, message: &str) {
    let a = ack(f);
    assert_eq!(a.request_id, request_id);
    match a.result {
        AckResult::Err {
            message: m,
            code: Some((c, _)),
            ..
        } => {
            assert_eq!(c, code);
            assert_eq!(m, message);
        }
        other => panic!("expected a coded failure, got {other:?}"),
    }
}

#[test]
fn a_silent_leader_costs_exactly_the_forward_timeout() {
    for (timeout, knob) in [
        (Duration::from_secs(3), true),
        (Duration::from_secs(10), false),
    ] {
        let mut c = cluster(N1, |cfg| {
            if knob {
                cfg.forward_timeout = timeout;
            }
        });
        let p = c.connect(N1);
        let (id, _) = c.auth_stream(N1, p);
        // n2 hears n1 but is never heard back.
        c.cut.insert((N2, N1));
        assert!(c.exchange(N1, p, id, &publish(1)).is_empty());
        c.advance(timeout - Duration::from_millis(1));
        assert!(
            c.nodes[N1].read_frames(p, id).is_empty(),
            "not before {timeout:?}"
        );
        c.advance(Duration::from_millis(1));
        let f = c.nodes[N1].read_frames(p, id);
        assert_eq!(f.len(), 1, "at {timeout:?}");
        let why = format!(
            "no answer from n2 within {timeout:?}; the request may or may not have been applied"
        );
        assert_failed_ack(&f[0], 1, ErrorCode::Unacknowledged, &why);
        // The leader did take it: outcome unknown, not refused.
        assert_eq!(c.nodes[N2].engine.stats().forwards_served, 1);
    }
}

#[test]
fn past_the_forward_window_forwards_wait_in_order_until_an_answer_returns() {
    let mut c = cluster(N1, |cfg| cfg.forward_window = 2);
    let p = c.connect(N1);
    let (id, _) = c.auth_stream(N1, p);
    c.cut.insert((N2, N1));
    let mut wire = publish(1);
    wire.extend(publish(2));
    wire.extend(publish(3));
    assert!(c.exchange(N1, p, id, &wire).is_empty());
    // Two in flight on the n1 → n2 link, the third waits on n1.
    assert_eq!(c.nodes[N2].engine.stats().forwards_served, 2);
    assert_eq!(c.nodes[N1].engine.stats().forwards_waiting, 1);
    // The window is per peer: a forward to n3 goes at once.
    let (id3, _) = c.auth_stream(N1, p);
    let f = c.exchange(N1, p, id3, &publish_shard1(7));
    assert_eq!(text(&f[0]), r#"{"type":"publish_ok","request_id":7}"#);

    // n2 is heard again: its two answers return, the third is sent, all three acked in order.
    c.cut.clear();
    c.settle(|c| c.nodes[N2].engine.stats().forwards_served == 3);
    assert_eq!(c.nodes[N1].engine.stats().forwards_waiting, 0);
    c.advance(Duration::from_millis(500));
    let f = c.nodes[N1].read_frames(p, id);
    assert_eq!(f.len(), 3, "{f:?}");
    for (i, frame) in f.iter().enumerate() {
        assert_ok_ack(frame, i as u64 + 1);
    }
}

#[test]
fn a_forward_that_waits_past_its_timeout_is_refused_as_not_applied() {
    let timeout = Duration::from_secs(3);
    let mut c = cluster(N1, |cfg| {
        cfg.forward_window = 1;
        cfg.forward_timeout = timeout;
    });
    let p = c.connect(N1);
    let (id, _) = c.auth_stream(N1, p);
    c.cut.insert((N2, N1));
    let mut wire = publish(1);
    wire.extend(publish(2));
    assert!(c.exchange(N1, p, id, &wire).is_empty());
    c.advance(timeout - Duration::from_millis(1));
    assert!(c.nodes[N1].read_frames(p, id).is_empty());
    c.advance(Duration::from_millis(1));
    let f = c.nodes[N1].read_frames(p, id);
    assert_eq!(f.len(), 2, "{f:?}");
    let sent = format!(
        "no answer from n2 within {timeout:?}; the request may or may not have been applied"
    );
    assert_failed_ack(&f[0], 1, ErrorCode::Unacknowledged, &sent);
    let waited = format!(
        "n2 did not take the forwarded request within {timeout:?} (its forward window stayed \
         full); it was not applied"
    );
    assert_failed_ack(&f[1], 2, ErrorCode::ShardUnavailable, &waited);
    assert_eq!(c.nodes[N2].engine.stats().forwards_served, 1);
}

/// A node stopped past a waiting forward's deadline, and woken by the answer that frees its
/// window, answers that forward as not applied instead of sending it late (where it would
/// land after whatever its session was served since).
#[test]
fn a_forward_past_its_timeout_when_the_window_opens_is_refused_not_sent() {
    let timeout = Duration::from_secs(3);
    let mut c = cluster(N1, |cfg| {
        cfg.forward_window = 1;
        cfg.forward_timeout = timeout;
    });
    let p = c.connect(N1);
    let (id, _) = c.auth_stream(N1, p);
    // n2's answers are lost until n1 is stopped; its QUIC sends them again after.
    c.cut.insert((N2, N1));
    let mut wire = publish(1);
    wire.extend(publish(2));
    assert!(c.exchange(N1, p, id, &wire).is_empty());
    assert_eq!(c.nodes[N1].engine.stats().forwards_waiting, 1);
    c.advance(Duration::from_secs(1));
    c.freeze(N1);
    c.cut.clear();
    c.advance(timeout);
    // Resumed past both deadlines, n1 reads the first answer before its clock.
    c.thaw(N1);
    let f = c.nodes[N1].read_frames(p, id);
    assert_eq!(f.len(), 2, "{f:?}");
    assert_ok_ack(&f[0], 1);
    let waited = format!(
        "n2 did not take the forwarded request within {timeout:?} (its forward window stayed \
         full); it was not applied"
    );
    assert_failed_ack(&f[1], 2, ErrorCode::ShardUnavailable, &waited);
    c.advance(Duration::from_secs(1));
    assert_eq!(c.nodes[N2].engine.stats().forwards_served, 1);
    assert_eq!(c.nodes[N2].engine.stats().published_records, 1);
}

#[test]
fn past_the_channel_cap_the_idle_channel_is_closed_and_reopened_on_its_next_forward() {
    let mut c = cluster(N2, |cfg| cfg.max_forward_channels = 2);
    let p = c.connect(N1);
    let mut streams = Vec::new();
    for (n, want) in [(1, 1), (2, 2), (3, 2)] {
        let (id, _) = c.auth_stream(N1, p);
        let f = c.exchange(N1, p, id, &publish(n));
        assert_ok_ack(&f[0], n);
        assert_eq!(c.nodes[N2].engine.stats().forwarded_sessions, want);
        streams.push(id);
    }
    // The first session's channel was the idle one closed; its next publish still lands.
    let f = c.exchange(N1, p, streams[0], &publish(4));
    assert_ok_ack(&f[0], 4);
    assert_eq!(c.nodes[N2].engine.stats().forwarded_sessions, 2);
    assert_eq!(c.nodes[N2].engine.stats().published_records, 4);
}

#[test]
fn a_client_session_that_ends_closes_its_channels_on_the_leader() {
    let mut c = ClusterNet::started(&spec(), |_, _| {});
    let p = c.connect(N1);
    let (a, _) = c.auth_stream(N1, p);
    let (b, _) = c.auth_stream(N1, p);
    assert_ok_ack(&c.exchange(N1, p, a, &publish(1))[0], 1);
    assert_ok_ack(&c.exchange(N1, p, b, &publish(2))[0], 2);
    // Stream b also forwards to n3.
    let f = c.exchange(N1, p, b, &publish_shard1(3));
    assert_eq!(text(&f[0]), r#"{"type":"publish_ok","request_id":3}"#);
    assert_eq!(c.nodes[N2].engine.stats().forwarded_sessions, 2);
    assert_eq!(c.nodes[N3].engine.stats().forwarded_sessions, 1);

    // The client ends stream a: its session ends, and so does its channel on n2.
    c.nodes[N1].finish(p, a);
    c.run();
    c.nodes[N1].read_frames(p, a);
    // The session is over once the client has acknowledged the broker's FIN (its ACK may
    // be delayed): bounded by the settle limit.
    c.settle(|c| c.nodes[N2].engine.stats().forwarded_sessions == 1);
    assert_eq!(
        c.nodes[N3].engine.stats().forwarded_sessions,
        1,
        "b's channel stays"
    );

    // The connection closes: every channel it had goes.
    let now = c.now;
    c.nodes[N1].peers[p]
        .conn
        .close(now, quinn_proto::VarInt::from_u32(0), bytes::Bytes::new());
    c.settle(|c| c.nodes[N1].engine.connection_count() == 0);
    c.run();
    assert_eq!(c.nodes[N2].engine.stats().forwarded_sessions, 0);
    assert_eq!(c.nodes[N3].engine.stats().forwarded_sessions, 0);
}

#[test]
fn a_cluster_runs_on_one_peer_stream_per_link() {
    // The edge of `peer_max_streams`: 1, the one stream a link uses, on every node.
    let mut c = ClusterNet::started(&spec(), |_, cfg| {
        cfg.cluster.as_mut().unwrap().peer_max_streams = 1;
    });
    let p = c.connect(N1);
    let (id, _) = c.auth_stream(N1, p);
    assert_ok_ack(&c.exchange(N1, p, id, &publish(1))[0], 1);
}

#[test]
fn a_silent_peer_link_is_lost_at_its_idle_timeout() {
    // n1's links take 1 s (the smaller side's timeout wins on a QUIC connection); the
    // default, 5 s, holds between n2 and n3. QUIC restarts the idle timer on the last packet
    // received and on the first one sent after it, and keep-alives go every third of the
    // timeout: a link silenced at T is lost between T + 2/3 and T + 4/3 of the timeout.
    let window = |idle: Duration| (idle - idle / 3 - Duration::from_millis(1), idle / 3 * 2);
    let idle = Duration::from_secs(1);
    let mut c = cluster(N1, |cfg| cfg.peer_idle_timeout = idle);
    assert_eq!(c.nodes[N1].engine.stats().peer_links, 4);
    c.cut.insert((N1, N3));
    c.cut.insert((N3, N1));
    let (before, then) = window(idle);
    c.advance(before);
    assert_eq!(c.nodes[N1].engine.stats().peer_links, 4, "not before");
    c.advance(then + Duration::from_millis(2));
    assert_eq!(
        c.nodes[N1].engine.stats().peer_links,
        2,
        "both links with n3 lost"
    );
    assert_eq!(c.nodes[N3].engine.stats().peer_links, 2);
    assert_eq!(c.nodes[N2].engine.stats().peer_links, 4);

    let idle = felix_engine::DEFAULT_PEER_IDLE_TIMEOUT;
    c.cut.insert((N2, N3));
    c.cut.insert((N3, N2));
    let (before, then) = window(idle);
    c.advance(before);
    assert_eq!(c.nodes[N2].engine.stats().peer_links, 4, "not before");
    c.advance(then + Duration::from_millis(2));
    assert_eq!(c.nodes[N2].engine.stats().peer_links, 2);
}
