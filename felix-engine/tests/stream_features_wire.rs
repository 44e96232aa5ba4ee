//! The stream features at the wire, frame by frame: the binary idempotent frame (0x0109,
//! laid out as protocol.md and the real client's source give it) answered in JSON, a re-send
//! answered with the first copy's offset, a gap refused with the expected sequence; and the
//! exact answers to `publish_if`, `commit`, `state_get`, `stream_read` and `offset_for_time`.

use felix_engine::{DurableConfig, FsyncPolicy};
use felix_testkit::*;

fn on_commit() -> DurableConfig {
    let mut durable_config = DurableConfig::default();
    durable_config.fsync = FsyncPolicy::OnCommit;
    durable_config
}

/// `[u64 request_id][u8 ack=2][u64 producer][u64 sequence]` then the batch body for
/// tenant t1, namespace default, stream orders.
fn idempotent_frame(request_id: u64, producer: u64, sequence: u64, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&request_id.to_be_bytes());
    body.push(2);
    body.extend_from_slice(&producer.to_be_bytes());
    body.extend_from_slice(&sequence.to_be_bytes());
    for name in [&b"t1"[..], b"default", b"orders"] {
        body.extend_from_slice(&(name.len() as u16).to_be_bytes());
        body.extend_from_slice(name);
    }
    body.extend_from_slice(&1u32.to_be_bytes());
    body.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    body.extend_from_slice(payload);
    binary_frame(0x0109, &body)
}

#[test]
fn a_binary_idempotent_batch_is_answered_in_json_and_lands_once() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (id, auth_ok) = net.auth_stream(p);
    let v: serde_json::Value = serde_json::from_str(text(&auth_ok)).unwrap();
    assert_eq!(v["server_flags"].as_u64().unwrap() & 0x0100, 0x0100);
    assert_eq!(
        v["server_features"].as_u64().unwrap() & 0x200,
        0x200,
        "FEATURE_IDEMPOTENT_PRODUCER"
    );

    let f = net.exchange(p, id, &idempotent_frame(1, 0xfeed, 0, b"one"));
    assert_eq!(
        text(&f[0]),
        r#"{"type":"publish_ok","request_id":1,"offset":0}"#
    );
    let f = net.exchange(p, id, &idempotent_frame(2, 0xfeed, 1, b"two"));
    assert_eq!(
        text(&f[0]),
        r#"{"type":"publish_ok","request_id":2,"offset":1}"#
    );
    // The answer to the first was "lost": the re-send gets the first copy's offset.
    let f = net.exchange(p, id, &idempotent_frame(3, 0xfeed, 0, b"one"));
    assert_eq!(
        text(&f[0]),
        r#"{"type":"publish_ok","request_id":3,"offset":0}"#
    );
    let f = net.exchange(p, id, &idempotent_frame(4, 0xfeed, 5, b"five"));
    assert_eq!(
        text(&f[0]),
        r#"{"type":"publish_refused","request_id":4,"reason":{"sequence_gap":{"expected":2}},"message":"sequence gap: 2 is the next this producer may send"}"#
    );
    // The real client offered FEATURE_SEQUENCE_REUSED.
    let f = net.exchange(p, id, &idempotent_frame(5, 0xfeed, 1, b"not two"));
    let v: serde_json::Value = serde_json::from_str(text(&f[0])).unwrap();
    assert_eq!(v["reason"], "sequence_reused");

    // Two records, not three: the tail is 2.
    let f = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"publish_if","tenant_id":"t1","namespace":"default","stream":"orders","payloads":["eA=="],"expected_offset":0,"request_id":6}"#),
    );
    assert_eq!(
        text(&f[0]),
        r#"{"type":"publish_refused","request_id":6,"reason":{"offset_mismatch":{"tail":2}},"message":"the shard's next offset is 2"}"#
    );
    let f = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"publish_if","tenant_id":"t1","namespace":"default","stream":"orders","payloads":["eA=="],"expected_offset":2,"request_id":7}"#),
    );
    assert_eq!(
        text(&f[0]),
        r#"{"type":"publish_ok","request_id":7,"offset":2}"#
    );
}

#[test]
fn commit_state_get_and_bounded_reads_answer_exactly() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (id, _) = net.auth_stream(p);
    let f = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"commit","tenant_id":"t1","namespace":"default","stream":"games","entity_key":"ZzE=","event":"c3RhcnQ=","changes":[{"op":"put","key":"turn","value":"YQ=="}],"request_id":1}"#),
    );
    assert_eq!(
        text(&f[0]),
        r#"{"type":"commit_ok","request_id":1,"offset":0}"#
    );
    let f = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"state_get","tenant_id":"t1","namespace":"default","stream":"games","entity_key":"ZzE=","key":"turn","request_id":2}"#),
    );
    assert_eq!(
        text(&f[0]),
        r#"{"type":"state_value","value":"YQ==","version":0,"as_of":0,"request_id":2}"#
    );
    let f = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"stream_read","tenant_id":"t1","namespace":"default","stream":"games","shard":0,"from":0,"request_id":3}"#),
    );
    let v: serde_json::Value = serde_json::from_str(text(&f[0])).unwrap();
    assert_eq!(v["type"], "stream_records");
    assert_eq!(v["records"][0]["offset"], 0);
    assert_eq!(
        v["records"][0]["payload"], "c3RhcnQ=",
        "the commit's event is its record"
    );
    assert_eq!(v["next_offset"], 1);
    let f = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"offset_for_time","tenant_id":"t1","namespace":"default","stream":"games","shard":0,"at_micros":0,"request_id":4}"#),
    );
    assert_eq!(
        text(&f[0]),
        r#"{"type":"offset_value","offset":0,"request_id":4}"#
    );
    // Past the tail: a cursor error, as a subscribe gets.
    let f = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"stream_read","tenant_id":"t1","namespace":"default","stream":"games","shard":0,"from":5,"request_id":5}"#),
    );
    let v: serde_json::Value = serde_json::from_str(text(&f[0])).unwrap();
    assert_eq!(v["type"], "subscribe_cursor_error");
    assert_eq!(v["reason"], "in_future");
}
