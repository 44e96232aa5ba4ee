//! Consumer groups through the engine, file ops on the in-memory disk and time on the fake
//! clock: the exact answers the real client expects, a waiting poll answered in the turn
//! its record is released, and a wait that ends empty at its deadline.

use std::time::Duration;

use felix_engine::{DurableConfig, FsyncPolicy, GroupConfig};
use felix_testkit::*;
use quinn_proto::StreamId;
use serde_json::Value;

fn on_commit() -> DurableConfig {
    let mut durable_config = DurableConfig::default();
    durable_config.fsync = FsyncPolicy::OnCommit;
    durable_config
}

fn json(net: &mut Net, p: usize, sid: StreamId) -> Vec<Value> {
    net.read_frames(p, sid)
        .iter()
        .map(|f| serde_json::from_str(text(f)).unwrap())
        .collect()
}

fn request(net: &mut Net, p: usize, sid: StreamId, body: &str) {
    net.send(p, sid, &json_frame(body));
    net.run();
}

/// Two `group_poll`s (request ids 1 and 2) of up to `max_records` each, back to back.
fn poll_twice(net: &mut Net, p: usize, sid: StreamId, max_records: usize) {
    for request_id in [1, 2] {
        let body = format!(
            r#"{{"type":"group_poll",{ADDR},"max_records":{max_records},"request_id":{request_id}}}"#
        );
        request(net, p, sid, &body);
    }
}

const ADDR: &str =
    r#""tenant_id":"t1","namespace":"default","stream":"jobs","shard":0,"group":"g""#;

#[test]
fn a_waiting_poll_is_answered_when_its_record_is_released_and_settles_answer_cache_ok() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (publisher, auth_ok) = net.auth_stream(p);
    let features = serde_json::from_str::<Value>(text(&auth_ok)).unwrap()["server_features"]
        .as_u64()
        .unwrap();
    // CONSUMER_GROUP, GROUP_DEAD_LETTERS, GROUP_CONSUMER, GROUP_CLAIM_CONTROL, GROUP_ADMIN.
    for bit in [0x8, 0x10, 0x10_0000, 0x800_0000, 0x100_0000] {
        assert_ne!(features & bit, 0, "feature {bit:#x} is advertised");
    }
    let (poller, _) = net.auth_stream(p);
    request(
        &mut net,
        p,
        poller,
        &format!(r#"{{"type":"group_poll",{ADDR},"max_records":8,"wait_ms":5000,"request_id":7}}"#),
    );
    assert!(json(&mut net, p, poller).is_empty(), "the poll waits");

    net.send(
        p,
        publisher,
        &binary_publish(Some(1), None, "jobs", &[b"work"]),
    );
    net.run();
    let answers = json(&mut net, p, poller);
    assert_eq!(
        answers,
        vec![serde_json::json!({
            "type": "group_records",
            "records": [{"offset": 0, "payload": "d29yaw==", "attempts": 1}],
            "request_id": 7
        })]
    );

    request(
        &mut net,
        p,
        poller,
        &format!(r#"{{"type":"group_ack",{ADDR},"offset":0,"request_id":8}}"#),
    );
    assert_eq!(
        json(&mut net, p, poller),
        vec![serde_json::json!({"type": "cache_ok", "request_id": 8})]
    );
    request(
        &mut net,
        p,
        poller,
        &format!(r#"{{"type":"group_describe",{ADDR},"request_id":9}}"#),
    );
    assert_eq!(
        json(&mut net, p, poller),
        vec![serde_json::json!({
            "type": "group_info", "committed": 1, "tail": 1, "in_flight": 0, "owed": 0,
            "dead_letters": 0, "request_id": 9
        })]
    );
}

#[test]
fn a_wait_with_nothing_to_find_ends_empty_at_its_deadline() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (poller, _) = net.auth_stream(p);
    request(
        &mut net,
        p,
        poller,
        &format!(r#"{{"type":"group_poll",{ADDR},"max_records":8,"wait_ms":2000,"request_id":1}}"#),
    );
    net.advance(Duration::from_millis(1_999));
    assert!(json(&mut net, p, poller).is_empty(), "still waiting");
    net.advance(Duration::from_millis(1));
    assert_eq!(
        json(&mut net, p, poller),
        vec![serde_json::json!({"type": "group_records", "records": [], "request_id": 1})]
    );
}

#[test]
fn a_consumer_name_is_taken_up_to_128_bytes_and_refused_beyond() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (poller, _) = net.auth_stream(p);
    // 128 is the broker's MAX_CONSUMER_BYTES.
    for (len, request_id) in [(128, 1), (129, 2)] {
        let name = "c".repeat(len);
        request(
            &mut net,
            p,
            poller,
            &format!(
                r#"{{"type":"group_poll",{ADDR},"max_records":1,"consumer":"{name}","request_id":{request_id}}}"#
            ),
        );
    }
    let answers = json(&mut net, p, poller);
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_eq!(
        answers[0],
        serde_json::json!({"type": "group_records", "records": [], "request_id": 1})
    );
    assert_eq!(answers[1]["type"], "error", "{answers:?}");
    assert!(
        answers[1]["message"]
            .as_str()
            .is_some_and(|m| m.contains("1 to 128 bytes")),
        "{answers:?}"
    );
}

#[test]
fn a_poll_hands_out_at_most_1000_records_whatever_it_asks_for() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (publisher, _) = net.auth_stream(p);
    let payloads: Vec<&[u8]> = vec![b"w"; 1_001];
    net.send(
        p,
        publisher,
        &binary_publish(Some(1), None, "jobs", &payloads),
    );
    net.run();
    let (poller, _) = net.auth_stream(p);
    // 1000 is the broker's MAX_POLL_RECORDS.
    poll_twice(&mut net, p, poller, 5000);
    let answers = json(&mut net, p, poller);
    let counts: Vec<usize> = answers
        .iter()
        .map(|a| a["records"].as_array().map_or(0, Vec::len))
        .collect();
    assert_eq!(
        counts,
        vec![1_000, 1],
        "{:?}",
        answers.iter().map(|a| &a["type"]).collect::<Vec<_>>()
    );
}

#[test]
fn a_shard_takes_10000_groups_and_refuses_one_more() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (poller, _) = net.auth_stream(p);
    let addr = |g: u64| {
        format!(
            r#""tenant_id":"t1","namespace":"default","stream":"jobs","shard":0,"group":"g{g}""#
        )
    };
    // 10000 is the broker's MAX_GROUPS_PER_SHARD.
    for g in 0..10_000u64 {
        net.send(
            p,
            poller,
            &json_frame(&format!(
                r#"{{"type":"group_poll",{},"max_records":1,"request_id":{g}}}"#,
                addr(g)
            )),
        );
        if g % 500 == 499 {
            net.run();
            let answers = json(&mut net, p, poller);
            assert_eq!(answers.len(), 500);
            assert!(
                answers.iter().all(|a| a["type"] == "group_records"),
                "{:?}",
                answers.last()
            );
        }
    }
    request(
        &mut net,
        p,
        poller,
        &format!(
            r#"{{"type":"group_poll",{},"max_records":1,"request_id":10000}}"#,
            addr(10_000)
        ),
    );
    request(
        &mut net,
        p,
        poller,
        &format!(
            r#"{{"type":"group_poll",{},"max_records":1,"request_id":10001}}"#,
            addr(0)
        ),
    );
    let answers = json(&mut net, p, poller);
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_eq!(answers[0]["type"], "error", "{answers:?}");
    assert!(
        answers[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("limit of 10000 groups")),
        "{answers:?}"
    );
    assert_eq!(
        answers[1]["type"], "group_records",
        "a known group still polls: {answers:?}"
    );
}

#[test]
fn a_poll_answers_about_4_mib_of_payload_and_leaves_the_rest_owed() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (publisher, _) = net.auth_stream(p);
    let half_mib = vec![b'w'; 512 << 10];
    for i in 0..9 {
        net.send(
            p,
            publisher,
            &binary_publish(Some(i), None, "jobs", &[&half_mib[..]]),
        );
        net.run();
    }
    let (poller, _) = net.auth_stream(p);
    // 4 MiB is the broker's MAX_POLL_BYTES: the record that reaches it is the last one.
    poll_twice(&mut net, p, poller, 20);
    // The answers are larger than the stream window: read while the broker sends, bounded.
    let mut answers = Vec::new();
    for _ in 0..100 {
        answers.extend(json(&mut net, p, poller));
        if answers.len() == 2 {
            break;
        }
        net.run();
    }
    let offsets: Vec<Vec<u64>> = answers
        .iter()
        .map(|a| {
            a["records"].as_array().map_or(Vec::new(), |r| {
                r.iter().map(|r| r["offset"].as_u64().unwrap()).collect()
            })
        })
        .collect();
    assert_eq!(
        offsets,
        vec![(0..8).collect::<Vec<u64>>(), vec![8]],
        "{:?}",
        answers.iter().map(|a| &a["type"]).collect::<Vec<_>>()
    );
}

#[test]
fn polls_wait_up_to_the_limit_and_one_more_is_answered_at_once() {
    let durable = {
        let mut durable_config = on_commit();
        durable_config.groups = {
            let mut group_config = GroupConfig::default();
            group_config.max_waiting_polls = 3;
            group_config
        };
        durable_config
    };
    let mut net = Net::durable(durable, |_| {});
    let p = net.connect(&[]);
    let (publisher, _) = net.auth_stream(p);
    let poll = |rid: u64| {
        format!(
            r#"{{"type":"group_poll",{ADDR},"max_records":1,"wait_ms":5000,"request_id":{rid}}}"#
        )
    };
    // A poll holds its stream's answers, so each waiting one gets a stream of its own.
    let waiters: Vec<StreamId> = (1..=3)
        .map(|rid| {
            let (sid, _) = net.auth_stream(p);
            request(&mut net, p, sid, &poll(rid));
            sid
        })
        .collect();
    for &sid in &waiters {
        assert!(
            json(&mut net, p, sid).is_empty(),
            "at the limit, polls wait"
        );
    }

    let (extra, _) = net.auth_stream(p);
    request(&mut net, p, extra, &poll(4));
    assert_eq!(
        json(&mut net, p, extra),
        vec![serde_json::json!({"type": "group_records", "records": [], "request_id": 4})],
        "one past the limit is answered at once, not refused"
    );
    for &sid in &waiters {
        assert!(json(&mut net, p, sid).is_empty(), "the three still wait");
    }

    // A record wakes one waiter; the slot it leaves lets the next poll wait again.
    net.send(
        p,
        publisher,
        &binary_publish(Some(1), None, "jobs", &[b"work"]),
    );
    net.run();
    let woken: Vec<Value> = waiters
        .iter()
        .flat_map(|&sid| json(&mut net, p, sid))
        .collect();
    assert_eq!(woken.len(), 1, "{woken:?}");
    assert_eq!(woken[0]["records"][0]["offset"], 0, "{woken:?}");
    request(&mut net, p, extra, &poll(5));
    assert!(json(&mut net, p, extra).is_empty(), "a freed slot is taken");

    net.advance(Duration::from_secs(5));
    let mut ended: Vec<Value> = waiters
        .iter()
        .chain([&extra])
        .flat_map(|&sid| json(&mut net, p, sid))
        .collect();
    ended.sort_by_key(|a| a["request_id"].as_u64());
    assert_eq!(ended.len(), 3, "{ended:?}");
    assert!(
        ended.iter().all(|a| a["records"] == serde_json::json!([])),
        "{ended:?}"
    );
    assert_eq!(ended[2]["request_id"], 5);
}
