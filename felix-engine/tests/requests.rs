//! Requests on authenticated streams: the cache (with TTL on the fake clock), routing
//! answers, requests this broker does not serve, and frames that cannot be read.

use std::time::Duration;

use felix_engine::DeclaredStream;
use felix_testkit::*;

#[test]
fn cache_put_get_delete_with_ttl() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let (id, _) = net.auth_stream(p);
    let put = |key: &str, value: &str, rid: u64, ttl: &str| {
        json_frame(&format!(
            r#"{{"type":"cache_put","tenant_id":"t1","namespace":"default","cache":"c1","key":"{key}","value":"{value}","request_id":{rid},"ttl_ms":{ttl}}}"#
        ))
    };
    let get = |key: &str, rid: u64| {
        json_frame(&format!(
            r#"{{"type":"cache_get","tenant_id":"t1","namespace":"default","cache":"c1","key":"{key}","request_id":{rid}}}"#
        ))
    };
    let f = net.exchange(p, id, &put("k", "djE=", 2, "null"));
    assert_eq!(text(&f[0]), r#"{"type":"cache_ok","request_id":2}"#);
    let f = net.exchange(p, id, &get("k", 4));
    // The real client offers FEATURE_CACHE_CONDITIONAL: a hit carries its version.
    let mut hit: serde_json::Value = serde_json::from_str(text(&f[0])).unwrap();
    assert!(hit["version"].as_u64().is_some(), "{hit}");
    hit.as_object_mut().unwrap().remove("version");
    assert_eq!(
        hit,
        serde_json::from_str::<serde_json::Value>(
            r#"{"type":"cache_value","tenant_id":"t1","namespace":"default","cache":"c1","key":"k","value":"djE=","request_id":4}"#
        )
        .unwrap()
    );
    let f = net.exchange(p, id, &get("absent", 5));
    assert_eq!(
        text(&f[0]),
        r#"{"type":"cache_value","tenant_id":"t1","namespace":"default","cache":"c1","key":"absent","value":null,"request_id":5}"#
    );

    // Pipelined on one stream, answered in order by request_id.
    let mut wire = put("t", "c2hvcnQ=", 6, "300");
    wire.extend(get("t", 7));
    let f = net.exchange(p, id, &wire);
    assert_eq!(text(&f[0]), r#"{"type":"cache_ok","request_id":6}"#);
    assert!(text(&f[1]).contains(r#""value":"c2hvcnQ=","request_id":7"#));
    net.advance(Duration::from_millis(299));
    assert!(text(&net.exchange(p, id, &get("t", 8))[0]).contains(r#""value":"c2hvcnQ=""#));
    net.advance(Duration::from_millis(2));
    assert!(text(&net.exchange(p, id, &get("t", 9))[0]).contains(r#""value":null"#));

    let delete = json_frame(
        r#"{"type":"cache_delete","tenant_id":"t1","namespace":"default","cache":"c1","key":"k","request_id":10}"#,
    );
    let f = net.exchange(p, id, &delete);
    assert!(
        text(&f[0]).contains(r#""value":"djE=","request_id":10"#),
        "delete returns the removed value"
    );
    let f = net.exchange(p, id, &delete);
    assert!(text(&f[0]).contains(r#""value":null"#));

    // No request_id: plain ok.
    let f = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"cache_put","tenant_id":"t1","namespace":"default","cache":"c1","key":"k","value":"","ttl_ms":null}"#),
    );
    assert_eq!(text(&f[0]), r#"{"type":"ok"}"#);
}

#[test]
fn cache_of_another_tenant_is_forbidden_and_the_stream_goes_on() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let (id, _) = net.auth_stream(p);
    let f = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"cache_get","tenant_id":"t2","namespace":"default","cache":"c1","key":"k","request_id":1}"#),
    );
    let v: serde_json::Value = serde_json::from_str(text(&f[0])).unwrap();
    assert_eq!(
        (v["type"].as_str(), v["code"].as_str(), v["retry"].as_str()),
        (Some("error"), Some("forbidden"), Some("fatal"))
    );
    let f = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"cache_get","tenant_id":"t1","namespace":"default","cache":"c1","key":"k","request_id":2}"#),
    );
    assert!(text(&f[0]).starts_with(r#"{"type":"cache_value""#));
}

#[test]
fn routing_answers_for_a_single_broker() {
    let mut net = Net::new(|c| {
        c.declared_streams
            .push(DeclaredStream::new("t1", "default", "wide", 3))
    });
    let p = net.connect(&[]);
    let (id, _) = net.auth_stream(p);
    let ask = |kind: &str, name: &str, rid: u64| {
        json_frame(&format!(
            r#"{{"type":"{kind}","tenant_id":"t1","namespace":"default","stream":"{name}","cache":"{name}","request_id":{rid}}}"#
        ))
    };
    let f = net.exchange(p, id, &ask("stream_shards", "orders", 1));
    assert_eq!(
        text(&f[0]),
        r#"{"type":"stream_shards_view","shards":1,"request_id":1}"#
    );
    let f = net.exchange(p, id, &ask("stream_shards", "wide", 2));
    assert_eq!(
        text(&f[0]),
        r#"{"type":"stream_shards_view","shards":3,"request_id":2}"#
    );
    let f = net.exchange(p, id, &ask("cache_shards", "c1", 3));
    assert_eq!(
        text(&f[0]),
        r#"{"type":"cache_shards_view","shards":1,"request_id":3}"#
    );
    let f = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"shard_owners","tenant_id":"t1","namespace":"default","name":"wide","kind":"stream","request_id":4}"#),
    );
    assert_eq!(
        text(&f[0]),
        r#"{"type":"shard_owners_view","request_id":4,"owners":[{"shard":0,"generation":0},{"shard":1,"generation":0},{"shard":2,"generation":0}]}"#
    );
}

#[test]
fn unknown_requests_are_unsupported_or_close_the_stream() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let (id, _) = net.auth_stream(p);
    let f = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"frobnicate","request_id":5}"#),
    );
    assert_eq!(
        text(&f[0]),
        r#"{"type":"unsupported","request_type":"frobnicate","request_id":5}"#
    );
    // A lone broker answers `topology` naming no other broker.
    let f = net.exchange(p, id, &json_frame(r#"{"type":"topology"}"#));
    assert_eq!(text(&f[0]), r#"{"type":"topology_view","brokers":[]}"#);
    // Known but not served here.
    let f = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"counter_get","tenant_id":"t1","namespace":"default","cache":"c","key":"k","request_id":6}"#),
    );
    assert_eq!(
        text(&f[0]),
        r#"{"type":"unsupported","request_type":"counter_get","request_id":6}"#
    );
    // `publish_width` is accepted and never answered.
    let f = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"publish_width","tenant_id":"t1","namespace":"default","stream":"s","shards":1}"#),
    );
    assert!(f.is_empty());

    // A client that did not offer UNSUPPORTED: an error, then the stream ends.
    let id = net.open_bi(p);
    let token = net.token();
    net.exchange(
        p,
        id,
        &json_frame(&format!(r#"{{"type":"auth","tenant_id":"t1","token":"{token}","client_flags":63,"client_features":2048}}"#)),
    );
    let f = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"frobnicate","request_id":5}"#),
    );
    let v: serde_json::Value = serde_json::from_str(text(&f[0])).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["code"], "invalid_request");
    assert!(net.peers[p].finished.contains(&id));

    // Counted by type, the one this broker does not know as `unknown` (a bounded label set).
    let (id, _) = net.auth_stream(p);
    net.exchange(p, id, &binary_publish(Some(7), None, "s", &[b"x"]));
    let requests = net.engine.metrics().requests;
    let count = |t: &str| requests.get(t).copied().unwrap_or(0);
    assert_eq!(count("unknown"), 2, "{requests:?}");
    assert_eq!(count("topology"), 1);
    assert_eq!(count("counter_get"), 1);
    assert_eq!(count("publish_width"), 1);
    assert_eq!(count("binary_publish"), 1);
    assert_eq!(count("auth"), 0, "authentication is not a request");
}

#[test]
fn unreadable_frames_end_their_stream_only() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let (good, _) = net.auth_stream(p);
    for bad in [
        b"GLX1\x00\x01\x00\x00\x00\x00\x00\x00".to_vec(), // magic
        b"FLX1\x00\x02\x00\x00\x00\x00\x00\x00".to_vec(), // version
        binary_frame(0x8000, b""),                        // unknown flag
    ] {
        let (id, _) = net.auth_stream(p);
        let f = net.exchange(p, id, &bad);
        let v: serde_json::Value = serde_json::from_str(text(&f[0])).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["code"], "invalid_request");
        assert!(
            net.peers[p].finished.contains(&id),
            "the bad stream is finished"
        );
        assert!(
            net.peers[p].stopped.iter().any(|(s, _)| *s == id),
            "and no longer read"
        );
    }
    // Bad JSON keeps the stream: frame boundaries are intact.
    let f = net.exchange(p, good, &json_frame("{not json"));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(text(&f[0])).unwrap()["code"],
        "invalid_request"
    );
    let f = net.exchange(p, good, &binary_publish(Some(1), None, "s", &[b"x"]));
    assert_eq!(f[0].flags.bits(), 0x0010);
    assert!(net.peers[p].lost.is_none());
}

#[test]
fn subscriptions_are_checked_and_limited_per_connection() {
    let mut net = Net::new(|c| c.max_subscriptions_per_connection = 2);
    let p = net.connect(&[]);
    let subscribe = |tenant: &str| {
        json_frame(&format!(
            r#"{{"type":"subscribe","tenant_id":"{tenant}","namespace":"default","stream":"s"}}"#
        ))
    };
    let (id, _) = net.auth_stream(p);
    let f = net.exchange(p, id, &subscribe("t2"));
    let v: serde_json::Value = serde_json::from_str(text(&f[0])).unwrap();
    assert_eq!(
        (v["type"].as_str(), v["code"].as_str()),
        (Some("error"), Some("forbidden"))
    );
    for expect in 1..=2 {
        let (id, _) = net.auth_stream(p);
        let f = net.exchange(p, id, &subscribe("t1"));
        assert_eq!(
            text(&f[0]),
            format!(r#"{{"type":"subscribed","subscription_id":{expect}}}"#)
        );
    }
    let (id, _) = net.auth_stream(p);
    let f = net.exchange(p, id, &subscribe("t1"));
    let v: serde_json::Value = serde_json::from_str(text(&f[0])).unwrap();
    assert_eq!(
        (v["code"].as_str(), v["retry"].as_str()),
        (Some("limit_exceeded"), Some("fatal"))
    );
    assert_eq!(net.peers[p].incoming_uni.len(), 2);
    // Ending one subscription frees its place.
    let uni = net.take_uni(p);
    net.stop(p, uni);
    net.run();
    let (id, _) = net.auth_stream(p);
    let f = net.exchange(p, id, &subscribe("t1"));
    assert!(text(&f[0]).starts_with(r#"{"type":"subscribed""#));
}
