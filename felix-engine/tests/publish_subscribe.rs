//! A publish is acked in its own encoding and reaches every subscriber as one shared event
//! batch on the subscription's event stream.

use felix_proto::binary::EventBatch;
use felix_proto::Flags;
use felix_testkit::*;

/// Subscribes the way the real client does: `subscribe` then FIN, read `subscribed`, then
/// STOP_SENDING the control stream. Returns the event stream after its hello.
fn subscribe(net: &mut Net, p: usize, stream: &str, expect_id: u64) -> quinn_proto::StreamId {
    let (id, _) = net.auth_stream(p);
    net.send(
        p,
        id,
        &json_frame(&format!(
            r#"{{"type":"subscribe","tenant_id":"t1","namespace":"default","stream":"{stream}"}}"#
        )),
    );
    net.finish(p, id);
    net.run();
    let frames = net.read_frames(p, id);
    assert_eq!(frames.len(), 1);
    assert_eq!(
        text(&frames[0]),
        format!(r#"{{"type":"subscribed","subscription_id":{expect_id}}}"#)
    );
    assert!(
        net.peers[p].finished.contains(&id),
        "the broker finishes the control stream"
    );
    net.stop(p, id);
    net.run();
    let uni = net.take_uni(p);
    let hello = net.read_frames(p, uni);
    assert_eq!(hello.len(), 1);
    assert_eq!(
        text(&hello[0]),
        format!(r#"{{"type":"event_stream_hello","subscription_id":{expect_id}}}"#)
    );
    uni
}

#[test]
fn acked_publish_gets_its_ack_and_subscribers_one_shared_batch() {
    let mut net = Net::new(|_| {});
    let (a, b, publisher) = (net.connect(&[]), net.connect(&[]), net.connect(&[]));
    let ua = subscribe(&mut net, a, "orders", 1);
    let ub = subscribe(&mut net, b, "orders", 2);

    let (pid, _) = net.auth_stream(publisher);
    let acks = net.exchange(
        publisher,
        pid,
        &binary_publish(Some(1), None, "orders", &[b"hello"]),
    );
    assert_eq!(acks.len(), 1);
    // peer-client-wire.md §5, "ok": status 0, request_id 1, empty message.
    assert_eq!(
        hex::encode(bytes_of(&acks[0])),
        "464c5831000100100000000b0000000000000000010000"
    );

    // Shared batch 0x0004: [u32 count][u32 len][payload], no subscription id, no offsets.
    let expected_event =
        "464c5831000100040000000d".to_owned() + "00000001" + "00000005" + "68656c6c6f";
    for (peer, uni) in [(a, ua), (b, ub)] {
        let frames = net.read_frames(peer, uni);
        assert_eq!(frames.len(), 1, "one batch per subscriber");
        assert_eq!(hex::encode(bytes_of(&frames[0])), expected_event);
        let batch = EventBatch::decode(frames[0].flags, &frames[0].payload).unwrap();
        assert_eq!(batch.events.len(), 1);
        assert_eq!(
            frames[0].flags,
            Flags::BINARY_EVENT_BATCH_SHARED,
            "no offsets for in-memory streams"
        );
    }
    assert_eq!(net.engine.stats().publishes, 1);
}

#[test]
fn publishes_of_one_turn_coalesce_and_keep_order() {
    let mut net = Net::new(|_| {});
    let (sub, publisher) = (net.connect(&[]), net.connect(&[]));
    let uni = subscribe(&mut net, sub, "orders", 1);
    let (pid, _) = net.auth_stream(publisher);
    // Three frames in one write: they arrive in one datagram, so one engine turn.
    let mut wire = binary_publish(Some(1), None, "orders", &[b"a1"]);
    wire.extend(binary_publish(None, None, "orders", &[b"u2"]));
    wire.extend(binary_publish(
        Some(2),
        Some(b"k1"),
        "orders",
        &[b"k3", b"k4"],
    ));
    wire.extend(binary_publish(None, Some(b"k1"), "orders", &[b"k5"]));
    let acks = net.exchange(publisher, pid, &wire);
    let ids: Vec<u64> = acks
        .iter()
        .map(|f| {
            assert_eq!(f.flags.bits(), 0x0010);
            assert_eq!(f.payload[0], 0, "ok");
            u64::from_be_bytes(f.payload[1..9].try_into().unwrap())
        })
        .collect();
    assert_eq!(ids, [1, 2], "acked publishes only, in stream order");

    let frames = net.read_frames(sub, uni);
    assert_eq!(frames.len(), 1, "one turn, one batch");
    let batch = EventBatch::decode(frames[0].flags, &frames[0].payload).unwrap();
    let payloads: Vec<&[u8]> = batch.events.iter().map(|e| &e.payload[..]).collect();
    assert_eq!(payloads, [&b"a1"[..], b"u2", b"k3", b"k4", b"k5"]);
}

#[test]
fn subscription_outlives_its_control_stream_and_ends_with_its_event_stream() {
    let mut net = Net::new(|_| {});
    let (sub, publisher) = (net.connect(&[]), net.connect(&[]));
    let uni = subscribe(&mut net, sub, "orders", 1);
    let (pid, _) = net.auth_stream(publisher);
    net.exchange(
        publisher,
        pid,
        &binary_publish(Some(1), None, "orders", &[b"one"]),
    );
    assert_eq!(net.read_frames(sub, uni).len(), 1);

    // The client stops reading the event stream: the subscription ends.
    net.stop(sub, uni);
    net.run();
    net.exchange(
        publisher,
        pid,
        &binary_publish(Some(2), None, "orders", &[b"two"]),
    );
    assert!(net.read_frames(sub, uni).is_empty());
    assert_eq!(net.engine.stats().published_records, 2);
}

#[test]
fn stop_sending_on_the_control_stream_before_the_answer_keeps_the_subscription() {
    let mut net = Net::new(|_| {});
    let (sub, publisher) = (net.connect(&[]), net.connect(&[]));
    let (id, _) = net.auth_stream(sub);
    net.send(
        sub,
        id,
        &json_frame(r#"{"type":"subscribe","tenant_id":"t1","namespace":"default","stream":"s"}"#),
    );
    net.finish(sub, id);
    net.stop(sub, id);
    net.run();
    let uni = net.take_uni(sub);
    assert_eq!(
        text(&net.read_frames(sub, uni)[0]),
        r#"{"type":"event_stream_hello","subscription_id":1}"#
    );
    let (pid, _) = net.auth_stream(publisher);
    net.exchange(
        publisher,
        pid,
        &binary_publish(Some(1), None, "s", &[b"still here"]),
    );
    let frames = net.read_frames(sub, uni);
    assert_eq!(frames.len(), 1);
    assert!(frames[0].payload.ends_with(b"still here"));
}

#[test]
fn json_publish_is_answered_in_json() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let (id, _) = net.auth_stream(p);
    let frames = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"publish","tenant_id":"t1","namespace":"default","stream":"s","payload":"aGk=","request_id":9,"ack":"per_message"}"#),
    );
    assert_eq!(text(&frames[0]), r#"{"type":"publish_ok","request_id":9}"#);
    let frames = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"publish_batch","tenant_id":"t2","namespace":"default","stream":"s","payloads":["aGk="],"request_id":10,"ack":"per_batch"}"#),
    );
    let v: serde_json::Value = serde_json::from_str(text(&frames[0])).unwrap();
    assert_eq!(v["type"], "publish_error");
    assert_eq!(v["request_id"], 10);
    assert_eq!(v["code"], "forbidden", "a t1 token may not publish to t2");
    // Fire-and-forget JSON publishes get no answer.
    let frames = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"publish","tenant_id":"t1","namespace":"default","stream":"s","payload":"aGk="}"#),
    );
    assert!(frames.is_empty());
}

#[test]
fn failed_binary_publishes_get_coded_error_acks() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let (id, _) = net.auth_stream(p);
    // Another tenant's stream: forbidden, coded because the client offered 0x0200.
    let mut wire = binary_publish(Some(5), None, "orders", &[b"x"]);
    let tenant_at = 12 + 9 + 2; // header, acked prefix, tenant length
    wire[tenant_at + 1] = b'9'; // "t9"
    let acks = net.exchange(p, id, &wire);
    assert_eq!(acks[0].flags.bits(), 0x0210);
    let payload = &acks[0].payload;
    assert_eq!(payload[0], 1, "error status");
    assert_eq!(u64::from_be_bytes(payload[1..9].try_into().unwrap()), 5);
    let msg_len = u16::from_be_bytes([payload[9], payload[10]]) as usize;
    let tail = &payload[11 + msg_len..];
    assert_eq!(tail, [0, 2, 5], "forbidden (2), fatal (5)");

    // Malformed but with a readable request id: an error ack, not silence.
    let mut bad = binary_publish(Some(6), None, "orders", &[b"x"]);
    let len = bad.len();
    bad.truncate(len - 1);
    let new_len = (bad.len() - 12) as u32;
    bad[8..12].copy_from_slice(&new_len.to_be_bytes());
    let acks = net.exchange(p, id, &bad);
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].payload[0], 1);
    assert_eq!(
        u64::from_be_bytes(acks[0].payload[1..9].try_into().unwrap()),
        6
    );
    assert_eq!(
        &acks[0].payload[acks[0].payload.len() - 3..],
        [0, 4, 5],
        "invalid_request, fatal"
    );

    // The stream still works.
    let acks = net.exchange(p, id, &binary_publish(Some(7), None, "orders", &[b"x"]));
    assert_eq!(
        hex::encode(bytes_of(&acks[0])),
        "464c5831000100100000000b0000000000000000070000"
    );
}

#[test]
fn replay_is_refused_on_in_memory_streams() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let (id, _) = net.auth_stream(p);
    let frames = net.exchange(
        p,
        id,
        &json_frame(r#"{"type":"subscribe","tenant_id":"t1","namespace":"default","stream":"s","start":"earliest"}"#),
    );
    let v: serde_json::Value = serde_json::from_str(text(&frames[0])).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["code"], "invalid_request");
    assert!(net.peers[p].incoming_uni.is_empty());
}

/// Pins the order within a turn: the delivery leaves before the publisher's ack, so the
/// ack's send (and its handling, by a client in the same process) is not between a publish
/// and its delivery (docs/performance.md, batch 1).
#[test]
fn a_delivery_leaves_before_the_ack_of_its_publish() {
    let mut net = Net::new(|_| {});
    let (publisher, subscriber) = (net.connect(&[]), net.connect(&[]));
    let events = subscribe(&mut net, subscriber, "s", 1);
    let (pid, _) = net.auth_stream(publisher);
    for round in 1..=3u64 {
        net.engine_transmits.clear();
        net.engine_transmit_peers.clear();
        net.send(
            publisher,
            pid,
            &binary_publish(Some(round), None, "s", &[b"m"]),
        );
        net.run();
        assert_eq!(
            net.read_frames(publisher, pid).len(),
            1,
            "round {round}: one ack"
        );
        assert_eq!(
            net.read_frames(subscriber, events).len(),
            1,
            "round {round}: one event"
        );
        let first = net.engine_transmit_peers.iter().flatten().next().copied();
        assert_eq!(
            first,
            Some(subscriber),
            "round {round}: {:?}",
            net.engine_transmit_peers
        );
    }
}
