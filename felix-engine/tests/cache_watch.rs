//! Cache watches, counters and conditional writes through the engine with the file ops on
//! an in-memory disk: the exact frames, a replay whose disk read is held while writes land
//! (joined with live delivery without a gap or a duplicate), the watch queue limit at its
//! edge, and the requests refused.

use std::time::Duration;

use felix_engine::{DurableConfig, FileOpKind, FsyncPolicy};
use felix_proto::Frame;
use felix_testkit::*;
use quinn_proto::StreamId;
use serde_json::Value;

fn periodic() -> DurableConfig {
    let mut durable_config = DurableConfig::default();
    durable_config.fsync = FsyncPolicy::Periodic(Duration::from_millis(250));
    durable_config
}

fn json(frame: &Frame) -> Value {
    serde_json::from_str(text(frame)).unwrap()
}

fn put(key: &str, value_b64: &str, rid: u64) -> Vec<u8> {
    json_frame(&format!(
        r#"{{"type":"cache_put","tenant_id":"t1","namespace":"default","cache":"c","key":"{key}","value":"{value_b64}","request_id":{rid},"ttl_ms":null}}"#
    ))
}

/// Sends `cache_watch` with `extra` fields; returns the answer and, when granted, the event
/// stream and the frames after its hello.
fn watch(net: &mut Net, p: usize, extra: &str) -> (Value, Option<(StreamId, Vec<Frame>)>) {
    let (id, _) = net.auth_stream(p);
    let frames = net.exchange(
        p,
        id,
        &json_frame(&format!(
            r#"{{"type":"cache_watch","tenant_id":"t1","namespace":"default","cache":"c"{extra}}}"#
        )),
    );
    assert_eq!(frames.len(), 1, "one answer to cache_watch");
    let answer = json(&frames[0]);
    if answer["type"] != "cache_watch_started" {
        return (answer, None);
    }
    let uni = net.take_uni(p);
    let mut frames = net.read_frames(p, uni);
    assert_eq!(
        text(&frames.remove(0)),
        format!(
            r#"{{"type":"event_stream_hello","subscription_id":{}}}"#,
            answer["subscription_id"]
        )
    );
    (answer, Some((uni, frames)))
}

#[test]
fn a_key_watch_sends_each_change_as_exact_frames() {
    let mut net = Net::durable(periodic(), |_| {});
    let p = net.connect(&[]);
    let (answer, events) = watch(&mut net, p, r#","key":"k""#);
    let (uni, frames) = events.unwrap();
    assert!(frames.is_empty());
    assert_eq!(answer["resume_offset"], 0);
    assert!(answer.get("retained_count").is_none() && answer.get("resnapshot").is_none());

    let (sid, _) = net.auth_stream(p);
    let mut wire = put("k", "djE=", 1);
    wire.extend(put("other", "eA==", 2));
    wire.extend(json_frame(
        r#"{"type":"cache_delete","tenant_id":"t1","namespace":"default","cache":"c","key":"k","request_id":3}"#,
    ));
    net.exchange(p, sid, &wire);
    let got: Vec<String> = net
        .read_frames(p, uni)
        .iter()
        .map(|f| text(f).to_owned())
        .collect();
    assert_eq!(
        got,
        vec![
            r#"{"type":"cache_event","key":"k","value":"djE=","offset":0}"#.to_owned(),
            r#"{"type":"cache_event","key":"k","offset":2}"#.to_owned(),
        ]
    );
}

#[test]
fn a_replay_held_on_the_disk_joins_live_changes_without_gap_or_duplicate() {
    let mut net = Net::durable(periodic(), |c| {
        c.durable.as_mut().unwrap().tail_cache_bytes = 0
    });
    let p = net.connect(&[]);
    let (sid, _) = net.auth_stream(p);
    for i in 0..5u64 {
        net.exchange(p, sid, &put(&format!("p{i}"), "eA==", i + 1));
    }
    // The replay's read of the log waits while more writes land and are applied.
    net.hold = |k| matches!(k, FileOpKind::Read { .. });
    let (answer, events) = watch(&mut net, p, r#","prefix":"p","from_offset":1"#);
    let (uni, mut frames) = events.unwrap();
    assert_eq!(answer["resume_offset"], 5);
    for i in 5..8u64 {
        net.hold = |k| matches!(k, FileOpKind::Read { .. });
        net.exchange(p, sid, &put(&format!("p{i}"), "eA==", i + 1));
    }
    net.release_held_ops();
    net.exchange(p, sid, &put("p8", "eA==", 9));
    frames.extend(net.read_frames(p, uni));
    let offsets: Vec<u64> = frames
        .iter()
        .map(|f| json(f)["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, (1..9).collect::<Vec<_>>());
}

#[test]
fn a_watch_queue_holds_its_capacity_and_the_next_change_ends_it_lagged() {
    const CAPACITY: usize = 3;
    let mut net = Net::durable(periodic(), |c| c.cache_watch_queue_capacity = CAPACITY);
    let p = net.connect(&[]);
    let (_, events) = watch(&mut net, p, r#","key":"k""#);
    let (uni, _) = events.unwrap();
    let (sid, _) = net.auth_stream(p);
    // Ten puts in one turn share one write: they are applied together, so the watch's queue
    // takes three and the fourth finds it full.
    let mut wire = Vec::new();
    for i in 0..10u64 {
        wire.extend(put("k", "eA==", i + 1));
    }
    net.exchange(p, sid, &wire);
    let frames = net.read_frames(p, uni);
    let got: Vec<Value> = frames.iter().map(json).collect();
    assert_eq!(got.len(), CAPACITY + 1, "{got:?}");
    for (i, change) in got[..CAPACITY].iter().enumerate() {
        assert_eq!(change["offset"], i as u64);
    }
    assert_eq!(
        text(&frames[CAPACITY]),
        format!(r#"{{"type":"cache_watch_lagged","resume_from":{CAPACITY}}}"#)
    );
    assert!(net.peers[p].finished.contains(&uni), "the stream ends");
    // Re-watching from there is gapless.
    let (_, events) = watch(
        &mut net,
        p,
        &format!(r#","key":"k","from_offset":{CAPACITY}"#),
    );
    let offsets: Vec<u64> = events
        .unwrap()
        .1
        .iter()
        .map(|f| json(f)["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, (CAPACITY as u64..10).collect::<Vec<_>>());
}

#[test]
fn retained_counts_and_refusals() {
    let mut net = Net::durable(periodic(), |_| {});
    let p = net.connect(&[]);
    let (answer, _) = watch(&mut net, p, r#","key":"nobody","retained":true"#);
    assert_eq!(answer["retained_count"], 0);
    let (sid, _) = net.auth_stream(p);
    net.exchange(p, sid, &put("a", "eA==", 1));
    net.exchange(p, sid, &put("b", "eA==", 2));
    let (answer, events) = watch(&mut net, p, r#","prefix":"","retained":true"#);
    assert_eq!(
        (
            answer["retained_count"].as_u64(),
            answer["resume_offset"].as_u64()
        ),
        (Some(2), Some(2))
    );
    assert_eq!(events.unwrap().1.len(), 2);

    for (extra, why) in [
        (
            r#","key":"a","prefix":"a""#,
            "exactly one of key and prefix",
        ),
        (r#""#, "exactly one of key and prefix"),
        (r#","key":"a","retained":true,"from_offset":0"#, "twice"),
        (r#","prefix":"a","shard":1"#, "out of range"),
    ] {
        let (answer, events) = watch(&mut net, p, extra);
        assert!(events.is_none());
        assert_eq!(answer["type"], "error", "{extra}");
        assert!(
            answer["message"].as_str().unwrap().contains(why),
            "{answer}"
        );
    }
    let (answer, _) = watch(&mut net, p, r#","key":"a","from_offset":3"#);
    assert_eq!(
        answer,
        serde_json::json!({"type":"subscribe_cursor_error","reason":"in_future","requested":3,"available":2})
    );
}

#[test]
fn an_in_memory_broker_answers_watches_and_counters_unsupported() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let (answer, _) = watch(&mut net, p, r#","key":"a""#);
    assert_eq!(answer["type"], "unsupported");
    assert_eq!(answer["request_type"], "cache_watch");
    let (sid, _) = net.auth_stream(p);
    let f = net.exchange(
        p,
        sid,
        &json_frame(
            r#"{"type":"counter_add","tenant_id":"t1","namespace":"default","cache":"c","key":"k","delta":1,"request_id":7}"#,
        ),
    );
    assert_eq!(json(&f[0])["type"], "unsupported");
    assert_eq!(json(&f[0])["request_id"], 7);
}

#[test]
fn counters_and_conditional_writes_answer_exactly() {
    let mut net = Net::durable(periodic(), |_| {});
    let p = net.connect(&[]);
    let (sid, _) = net.auth_stream(p);
    let req = |body: &str, rid: u64| {
        json_frame(&format!(
            r#"{{"tenant_id":"t1","namespace":"default","cache":"c","request_id":{rid},{body}}}"#
        ))
    };
    let ask = |net: &mut Net, body: &str, rid: u64| -> String {
        let f = net.exchange(p, sid, &req(body, rid));
        assert_eq!(f.len(), 1);
        text(&f[0]).to_owned()
    };
    assert_eq!(
        ask(&mut net, r#""type":"counter_get","key":"n""#, 1),
        r#"{"type":"counter_value","request_id":1}"#
    );
    assert_eq!(
        ask(&mut net, r#""type":"counter_add","key":"n","delta":-4"#, 2),
        r#"{"type":"counter_value","value":-4,"request_id":2}"#
    );
    assert_eq!(
        ask(
            &mut net,
            r#""type":"cache_put_if","key":"l","value":"eA==","condition":"absent""#,
            3
        ),
        r#"{"type":"cache_condition_result","applied":true,"version":0,"request_id":3}"#
    );
    assert_eq!(
        ask(
            &mut net,
            r#""type":"cache_put_if","key":"l","value":"eQ==","condition":"absent""#,
            4
        ),
        r#"{"type":"cache_condition_result","applied":false,"version":0,"request_id":4}"#
    );
    assert_eq!(
        ask(&mut net, r#""type":"cache_get","key":"l""#, 5),
        r#"{"type":"cache_value","tenant_id":"t1","namespace":"default","cache":"c","key":"l","value":"eA==","request_id":5,"version":0}"#
    );
    assert_eq!(
        ask(
            &mut net,
            r#""type":"cache_put_if","key":"l","value":"eQ==","condition":{"version":0}"#,
            6
        ),
        r#"{"type":"cache_condition_result","applied":true,"version":1,"request_id":6}"#
    );
    assert_eq!(
        ask(
            &mut net,
            r#""type":"cache_delete_if","key":"l","version":0"#,
            7
        ),
        r#"{"type":"cache_condition_result","applied":false,"version":1,"request_id":7}"#
    );
    assert_eq!(
        ask(
            &mut net,
            r#""type":"cache_delete_if","key":"l","version":1"#,
            8
        ),
        r#"{"type":"cache_condition_result","applied":true,"request_id":8}"#
    );
}

#[test]
fn an_expired_key_reaches_its_watchers_as_a_delete() {
    let mut net = Net::durable(periodic(), |_| {});
    let p = net.connect(&[]);
    let (_, events) = watch(&mut net, p, r#","prefix":"s/""#);
    let (uni, _) = events.unwrap();
    let (sid, _) = net.auth_stream(p);
    let f = net.exchange(
        p,
        sid,
        &json_frame(
            r#"{"type":"cache_put","tenant_id":"t1","namespace":"default","cache":"c","key":"s/1","value":"eA==","request_id":1,"ttl_ms":1500}"#,
        ),
    );
    assert_eq!(json(&f[0])["type"], "cache_ok");
    let put = json(&net.read_frames(p, uni)[0]);
    assert_eq!(put["offset"], 0);
    let expires = put["expires_at_millis"].as_u64().expect("the put's expiry");
    net.advance(Duration::from_millis(1000));
    assert!(net.read_frames(p, uni).is_empty(), "not due yet");
    // The pass after the TTL writes the delete.
    net.advance(Duration::from_millis(1600));
    let got: Vec<String> = net
        .read_frames(p, uni)
        .iter()
        .map(|f| text(f).to_owned())
        .collect();
    assert_eq!(
        got,
        vec![r#"{"type":"cache_event","key":"s/1","offset":1}"#.to_owned()]
    );
    assert!(expires > 0);
    // Written once: later passes find nothing.
    net.advance(Duration::from_millis(3000));
    assert!(net.read_frames(p, uni).is_empty());
}
