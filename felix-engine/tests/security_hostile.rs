//! Hostile frames, one stream each, with the exact answer each gets: frames whose boundaries
//! cannot be trusted end their stream (stopped with code 1, an `invalid_request` first);
//! whole frames with a bad inside are refused and the stream goes on. The connection and its
//! other streams never notice.

use felix_testkit::*;
use quinn_proto::{StreamId, VarInt};

const CACHE_GET: &str = r#"{"type":"cache_get","tenant_id":"t1","namespace":"default","cache":"c","key":"k","request_id":9}"#;

fn error_code(frame: &felix_proto::Frame) -> String {
    let v: serde_json::Value = serde_json::from_str(text(frame)).unwrap();
    assert_eq!(v["type"], "error", "{v}");
    v["code"].as_str().unwrap_or("none").to_owned()
}

fn ends_with_invalid_request(net: &mut Net, p: usize, bytes: &[u8], what: &str) {
    let (id, _) = net.auth_stream(p);
    let frames = net.exchange(p, id, bytes);
    assert_eq!(frames.len(), 1, "{what}: one answer");
    assert_eq!(error_code(&frames[0]), "invalid_request", "{what}");
    assert!(
        net.peers[p].finished.contains(&id),
        "{what}: the stream ends"
    );
    assert!(
        net.peers[p].stopped.contains(&(id, VarInt::from_u32(1))),
        "{what}: and is stopped with the protocol-error code"
    );
}

fn refused_and_kept(net: &mut Net, p: usize, id: StreamId, bytes: &[u8], code: &str, what: &str) {
    let frames = net.exchange(p, id, bytes);
    assert_eq!(frames.len(), 1, "{what}: one answer");
    assert_eq!(error_code(&frames[0]), code, "{what}");
    let frames = net.exchange(p, id, &json_frame(CACHE_GET));
    assert!(
        text(&frames[0]).starts_with(r#"{"type":"cache_value""#),
        "{what}: the stream goes on"
    );
}

#[test]
fn frames_that_break_framing_end_their_stream_only() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let mut bad_magic = json_frame("{}");
    bad_magic[..4].copy_from_slice(b"FLY1");
    ends_with_invalid_request(&mut net, p, &bad_magic, "bad magic");
    let mut bad_version = json_frame("{}");
    bad_version[5] = 2;
    ends_with_invalid_request(&mut net, p, &bad_version, "bad version");
    ends_with_invalid_request(&mut net, p, &binary_frame(0x8000, &[]), "unknown flag bit");
    ends_with_invalid_request(
        &mut net,
        p,
        &binary_frame(0x0008, &[0; 9]),
        "ack modifier without its publish base",
    );
    ends_with_invalid_request(
        &mut net,
        p,
        &binary_frame(0x0020, &[0; 8]),
        "offsets modifier without an event batch",
    );
    ends_with_invalid_request(
        &mut net,
        p,
        &binary_frame(0x0003, &[0; 8]),
        "two layouts at once",
    );
    // The connection is fine.
    let (id, _) = net.auth_stream(p);
    let frames = net.exchange(p, id, &json_frame(CACHE_GET));
    assert!(text(&frames[0]).starts_with(r#"{"type":"cache_value""#));
}

#[test]
fn frames_of_the_wrong_kind_are_refused_and_the_stream_goes_on() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let (id, _) = net.auth_stream(p);
    let cases: [(&[u8], &str); 6] = [
        (
            &binary_frame(0x0004, &[0, 0, 0, 0]),
            "a shared event batch on a request stream",
        ),
        (
            &binary_frame(0x0010, &[0; 9]),
            "a publish ack sent as a request",
        ),
        (
            &json_frame(r#"{"type":"event_stream_hello","subscription_id":1}"#),
            "an event-stream hello on a request stream",
        ),
        (
            &json_frame(r#"{"type":"subscribed","subscription_id":1}"#),
            "an answer sent as a request",
        ),
        (
            &json_frame(r#"{"type":"auth_ok","server_flags":0,"server_features":0}"#),
            "auth_ok sent by a client",
        ),
        (&json_frame(r#"{"type":"ok"}"#), "ok sent by a client"),
    ];
    for (bytes, what) in cases {
        refused_and_kept(&mut net, p, id, bytes, "invalid_request", what);
    }
}

#[test]
fn bodies_that_lie_about_their_lengths_are_refused_and_the_stream_goes_on() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let (id, _) = net.auth_stream(p);
    // An acked publish whose record count promises more than the frame holds.
    let mut lying = binary_publish(Some(3), None, "s", &[b"abc"]);
    let count_at = 12 + 8 + 1 + (2 + 2) + (2 + 7) + (2 + 1);
    lying[count_at..count_at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
    let frames = net.exchange(p, id, &lying);
    let ack = felix_proto::binary::PublishAck::decode(frames[0].flags, &frames[0].payload).unwrap();
    assert_eq!(ack.request_id, 3);
    assert!(matches!(
        ack.result,
        felix_proto::binary::AckResult::Err {
            code: Some((felix_proto::ErrorCode::InvalidRequest, _)),
            ..
        }
    ));
    // Unacked, the same publish is dropped without an answer (nobody waits for one).
    let mut unacked = binary_publish(None, None, "s", &[b"abc"]);
    let count_at = 12 + (2 + 2) + (2 + 7) + (2 + 1);
    unacked[count_at..count_at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(net.exchange(p, id, &unacked).is_empty());
    assert_eq!(net.engine.stats().published_records, 0);
    refused_and_kept(
        &mut net,
        p,
        id,
        &json_frame(
            r#"{"type":"cache_put","tenant_id":"t1","namespace":"default","cache":"c","key":"k","value":"%%%"}"#,
        ),
        "invalid_request",
        "invalid base64",
    );
    refused_and_kept(
        &mut net,
        p,
        id,
        &json_frame(r#"{"type":"cache_get","tenant_id":"t1""#),
        "invalid_request",
        "truncated JSON",
    );
}
