//! `timestamp_micros` on a polled record: sent only to a client that offered
//! FEATURE_RECORD_TIMESTAMPS (0x400_0000), and it is the record's append time.

use std::time::Duration;

use felix_engine::{DurableConfig, FsyncPolicy};
use felix_testkit::*;
use quinn_proto::StreamId;
use serde_json::Value;

const RECORD_TIMESTAMPS: u64 = 0x400_0000;
/// The engine's wall clock at the start of a `Net` (2026-01-01T00:00:00Z).
const START_MICROS: u64 = 1_767_225_600_000_000;

fn auth_offering(net: &mut Net, p: usize, features: u64) -> StreamId {
    let token = net.token();
    let id = net.open_bi(p);
    let auth = json_frame(&format!(
        r#"{{"type":"auth","tenant_id":"t1","token":"{token}","client_flags":{REAL_CLIENT_FLAGS},"client_features":{features},"client_features_hi":{REAL_CLIENT_FEATURES_HI}}}"#
    ));
    let answer = net.exchange(p, id, &auth);
    let ok: Value = serde_json::from_str(text(&answer[0])).unwrap();
    assert_eq!(ok["type"], "auth_ok");
    id
}

fn poll(net: &mut Net, p: usize, sid: StreamId, group: &str, rid: u64) -> Value {
    let body = format!(
        r#"{{"type":"group_poll","tenant_id":"t1","namespace":"default","stream":"jobs","shard":0,"group":"{group}","max_records":8,"request_id":{rid}}}"#
    );
    let frames = net.exchange(p, sid, &json_frame(&body));
    assert_eq!(frames.len(), 1, "one answer to group_poll");
    serde_json::from_str(text(&frames[0])).unwrap()
}

#[test]
fn a_polled_record_carries_its_append_time_only_when_offered() {
    let durable = {
        let mut durable_config = DurableConfig::default();
        durable_config.fsync = FsyncPolicy::OnCommit;
        durable_config
    };
    let mut net = Net::durable(durable, |_| {});
    let p = net.connect(&[]);
    let (publisher, _) = net.auth_stream(p);
    net.advance(Duration::from_secs(3));
    net.send(
        p,
        publisher,
        &binary_publish(Some(1), None, "jobs", &[b"work"]),
    );
    net.run();

    let with = auth_offering(&mut net, p, REAL_CLIENT_FEATURES | RECORD_TIMESTAMPS);
    let answer = poll(&mut net, p, with, "timed", 5);
    let record = &answer["records"][0];
    assert_eq!(record["offset"], 0);
    let at = record["timestamp_micros"]
        .as_u64()
        .unwrap_or_else(|| panic!("timestamp_micros in {answer}"));
    // Appended after the clock moved 3 s on, and not from some other clock.
    assert!(
        (START_MICROS + 3_000_000..START_MICROS + 4_000_000).contains(&at),
        "{at}"
    );

    let without = auth_offering(&mut net, p, REAL_CLIENT_FEATURES);
    let answer = poll(&mut net, p, without, "untimed", 6);
    assert_eq!(answer["records"][0]["offset"], 0);
    assert!(
        answer["records"][0].get("timestamp_micros").is_none(),
        "{answer}"
    );
}
