//! A stream nobody declared, first used in a cluster: the request waits for the cluster to place
//! the stream and is then served where placement put it; when the cluster cannot place it, the
//! request is refused `shard_unavailable` after exactly the forward timeout.

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

const N1: usize = 0;
const N2: usize = 1;
const N3: usize = 2;

fn ack(f: &Frame) -> PublishAck {
    PublishAck::decode(f.flags, &f.payload).expect("a binary ack")
}

fn owners(c: &mut ClusterNet, i: usize, stream: &str) -> String {
    let p = c.connect(i);
    let (id, _) = c.auth_stream(i, p);
    let ask = json_frame(&format!(
        r#"{{"type":"shard_owners","tenant_id":"t1","namespace":"default","name":"{stream}","kind":"stream","request_id":1}}"#
    ));
    text(&c.exchange(i, p, id, &ask)[0]).to_string()
}

#[test]
fn a_first_publish_to_an_undeclared_stream_waits_for_its_placement_and_is_acked() {
    let mut c = ClusterNet::started(&spec(), |_, _| {});
    assert_eq!(
        owners(&mut c, N3, "fresh"),
        r#"{"type":"shard_owners_view","request_id":1,"owners":[{"shard":0,"generation":0}]}"#,
        "no owner before its first use"
    );
    let p = c.connect(N1);
    let (id, _) = c.auth_stream(N1, p);
    let mut wire = binary_publish(Some(1), None, "fresh", &[b"first"]);
    wire.extend(binary_publish(Some(2), None, "fresh", &[b"second"]));
    c.nodes[N1].send(p, id, &wire);
    let waited = c.until(Duration::from_secs(5), |c| {
        c.nodes
            .iter()
            .map(|n| n.engine.stats().published_records)
            .sum::<u64>()
            == 2
    });
    c.run();
    let f = c.nodes[N1].read_frames(p, id);
    assert_eq!(f.len(), 2, "both answered, in order: {f:?}");
    for (frame, request_id) in f.iter().zip([1, 2]) {
        let a = ack(frame);
        assert_eq!(a.request_id, request_id);
        assert!(matches!(a.result, AckResult::Ok { .. }), "{a:?}");
    }
    assert!(
        waited < Duration::from_secs(1),
        "placed within the control plane's round trips, took {waited:?}"
    );
    // Every node now names the same owner for it.
    let view = owners(&mut c, N1, "fresh");
    assert!(view.contains(r#""shard":0"#), "{view}");
    assert_eq!(owners(&mut c, N2, "fresh"), view);
    assert_eq!(owners(&mut c, N3, "fresh"), view);
}

#[test]
fn a_first_use_the_cluster_cannot_place_is_refused_at_exactly_the_forward_timeout() {
    let timeout = Duration::from_secs(3);
    let mut c = ClusterNet::started(&spec(), |_, cfg: &mut EngineConfig| {
        cfg.cluster
            .as_mut()
            .expect("a cluster node")
            .forward_timeout = timeout;
    });
    let p = c.connect(N1);
    let (id, _) = c.auth_stream(N1, p);
    // n1 hears nobody and nobody hears it: no proposal of its can commit.
    for other in [N2, N3] {
        c.cut.insert((N1, other));
        c.cut.insert((other, N1));
    }
    assert!(c
        .exchange(N1, p, id, &binary_publish(Some(9), None, "lonely", &[b"x"]))
        .is_empty());
    c.advance(timeout - Duration::from_millis(1));
    assert!(
        c.nodes[N1].read_frames(p, id).is_empty(),
        "not before {timeout:?}"
    );
    c.advance(Duration::from_millis(1));
    let f = c.nodes[N1].read_frames(p, id);
    assert_eq!(f.len(), 1, "at {timeout:?}: {f:?}");
    let a = ack(&f[0]);
    assert_eq!(a.request_id, 9);
    match a.result {
        AckResult::Err {
            code: Some((code, _)),
            message,
            ..
        } => {
            assert_eq!(code, ErrorCode::ShardUnavailable);
            assert_eq!(
                message,
                "stream t1/default/lonely was not placed in the cluster in time; retry"
            );
        }
        other => panic!("expected a coded refusal, got {other:?}"),
    }
}

/// `cluster.place_streams_on_first_use = false`: only declared streams exist. A publish to any
/// other is refused `not_found` at once (nothing waits for a placement that will not come),
/// and `stream_shards` answers 0 for it, the declared width for a declared one.
#[test]
fn without_placement_on_first_use_an_undeclared_stream_is_not_found_and_has_no_shards() {
    let mut c = ClusterNet::started(&spec(), |_, cfg: &mut EngineConfig| {
        cfg.cluster.as_mut().unwrap().place_streams_on_first_use = false;
    });
    let p = c.connect(N2);
    let (id, _) = c.auth_stream(N2, p);
    let f = c.exchange(
        N2,
        p,
        id,
        &binary_publish(Some(1), None, "undeclared", &[b"x"]),
    );
    let a = ack(&f[0]);
    assert!(
        matches!(
            &a.result,
            AckResult::Err {
                code: Some((ErrorCode::NotFound, _)),
                ..
            }
        ),
        "{a:?}"
    );
    let shards = |c: &mut ClusterNet, stream: &str| {
        let ask = json_frame(&format!(
            r#"{{"type":"stream_shards","tenant_id":"t1","namespace":"default","stream":"{stream}","request_id":4}}"#
        ));
        text(&c.exchange(N2, p, id, &ask)[0]).to_string()
    };
    assert_eq!(
        shards(&mut c, "undeclared"),
        r#"{"type":"stream_shards_view","shards":0,"request_id":4}"#
    );
    assert_eq!(
        shards(&mut c, "orders"),
        r#"{"type":"stream_shards_view","shards":3,"request_id":4}"#
    );
    assert_eq!(
        owners(&mut c, N1, "undeclared"),
        r#"{"type":"shard_owners_view","request_id":1,"owners":[]}"#,
        "never placed, no shards"
    );
}

/// The default places on first use: `stream_shards` of a stream not seen yet is the width a
/// first publish would give it.
#[test]
fn with_placement_on_first_use_an_unseen_stream_has_the_default_width() {
    let mut c = ClusterNet::started(&spec(), |_, _| {});
    let p = c.connect(N2);
    let (id, _) = c.auth_stream(N2, p);
    let ask = json_frame(
        r#"{"type":"stream_shards","tenant_id":"t1","namespace":"default","stream":"unseen","request_id":4}"#,
    );
    assert_eq!(
        text(&c.exchange(N2, p, id, &ask)[0]),
        r#"{"type":"stream_shards_view","shards":1,"request_id":4}"#
    );
}
