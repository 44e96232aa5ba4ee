//! Limits at their edges: at the limit a request passes, one past it is refused with its
//! code (or the connection is refused), and nothing else on the broker notices.
//!
//! Edges covered elsewhere: unauthenticated streams per connection, the auth timeout, stream
//! credit and `max_connections` (connection_lifecycle.rs), the publish window and the
//! per-connection buffer budget (backpressure.rs), subscriptions per connection
//! (requests.rs).

use std::time::Duration;

use felix_testkit::*;
use quinn_proto::{ConnectionError, Dir, TransportErrorCode};

fn json(frame: &felix_proto::Frame) -> serde_json::Value {
    serde_json::from_str(text(frame)).unwrap()
}

/// The code of a JSON `error` answer.
fn code(frame: &felix_proto::Frame) -> String {
    let v = json(frame);
    assert_eq!(v["type"], "error", "{v}");
    v["code"].as_str().unwrap().to_owned()
}

fn refused_in_handshake(net: &Net, p: usize) -> bool {
    matches!(
        &net.peers[p].lost,
        Some(ConnectionError::ConnectionClosed(c))
            if c.error_code == TransportErrorCode::CONNECTION_REFUSED
    )
}

#[test]
fn connections_per_source_ip_are_limited_and_released() {
    let mut net = Net::new(|c| c.max_connections_per_ip = 2);
    // Every peer of the test network shares one address.
    let a = net.connect(&[]);
    let b = net.connect(&[]);
    let third = net.start_connect(&[]);
    net.run();
    assert!(
        refused_in_handshake(&net, third),
        "{:?}",
        net.peers[third].lost
    );
    assert!(net.peers[a].lost.is_none() && net.peers[b].lost.is_none());
    assert_eq!(net.engine.stats().connections_refused, 1);
    // A closed connection gives its slot back once it has drained.
    let now = net.now;
    net.peers[a]
        .conn
        .close(now, quinn_proto::VarInt::from_u32(0), bytes::Bytes::new());
    net.advance(Duration::from_secs(5));
    assert_eq!(net.engine.connection_count(), 1);
    // The test client reuses the handles of drained connections: forget their peers.
    net.peers.remove(third);
    net.peers.remove(a);
    let again = net.connect(&[]);
    assert!(net.peers[again].lost.is_none());
    let (_, answer) = net.auth_stream(again);
    assert!(text(&answer).starts_with(r#"{"type":"auth_ok""#));
}

#[test]
fn streams_per_connection_stop_at_the_granted_credit() {
    let mut net = Net::new(|c| c.max_concurrent_bidi_streams = 4);
    let p = net.connect(&[]);
    let ids: Vec<_> = (0..4).map(|_| net.open_bi(p)).collect();
    assert!(
        net.peers[p].conn.streams().open(Dir::Bi).is_none(),
        "a fifth stream gets no credit"
    );
    let token = net.token();
    for id in &ids {
        let frames = net.exchange(p, *id, &real_client_auth("t1", &token));
        assert!(text(&frames[0]).starts_with(r#"{"type":"auth_ok""#));
    }
    // Ending one brings the credit back.
    net.finish(p, ids[0]);
    net.run();
    net.read_frames(p, ids[0]);
    net.advance(Duration::from_millis(200));
    assert!(net.peers[p].conn.streams().open(Dir::Bi).is_some());
}

/// An `auth` frame of exactly `len` payload bytes (JSON padded with spaces).
fn padded_auth(token: &str, len: usize) -> Vec<u8> {
    let body = format!(
        r#"{{"type":"auth","tenant_id":"t1","token":"{token}","client_flags":{REAL_CLIENT_FLAGS},"client_features":{REAL_CLIENT_FEATURES},"client_features_hi":{REAL_CLIENT_FEATURES_HI}}}"#
    );
    assert!(body.len() <= len, "auth is {} bytes", body.len());
    json_frame(&format!("{body}{}", " ".repeat(len - body.len())))
}

#[test]
fn frame_size_before_auth_at_and_past_the_limit() {
    const LIMIT: usize = 1024;
    let mut net = Net::new(|c| c.preauth_max_frame_bytes = LIMIT as u32);
    let p = net.connect(&[]);
    let token = net.token();
    let at = net.open_bi(p);
    let frames = net.exchange(p, at, &padded_auth(&token, LIMIT));
    assert!(text(&frames[0]).starts_with(r#"{"type":"auth_ok""#));

    let past = net.open_bi(p);
    let frames = net.exchange(p, past, &padded_auth(&token, LIMIT + 1));
    // Refused on the header: nothing was negotiated, so the error carries no code.
    assert_eq!(frames.len(), 1);
    let v = json(&frames[0]);
    assert_eq!(v["type"], "error");
    assert!(v.get("code").is_none(), "{v}");
    assert!(net.peers[p].finished.contains(&past), "the stream ends");
    assert_eq!(
        net.peers[p].stopped.iter().find(|(id, _)| *id == past),
        Some(&(past, quinn_proto::VarInt::from_u32(1))),
        "and is stopped with the protocol-error code"
    );
    // The connection goes on.
    let (_, answer) = net.auth_stream(p);
    assert!(text(&answer).starts_with(r#"{"type":"auth_ok""#));
}

/// A binary acked publish (request 7) whose frame payload is exactly `len` bytes.
fn publish_of_payload_len(len: usize) -> Vec<u8> {
    // Header: id 8 + mode 1 + three names (2+2, 2+7, 2+1) + count 4 + record length 4.
    let overhead = 8 + 1 + (2 + 2) + (2 + 7) + (2 + 1) + 4 + 4;
    let record = vec![b'r'; len - overhead];
    let frame = binary_publish(Some(7), None, "s", &[&record]);
    assert_eq!(frame.len(), 12 + len);
    frame
}

#[test]
fn frame_size_after_auth_at_and_past_the_limit() {
    const LIMIT: usize = 4096;
    let mut net = Net::new(|c| c.max_frame_bytes = LIMIT as u32);
    let p = net.connect(&[]);
    let (at, _) = net.auth_stream(p);
    let frames = net.exchange(p, at, &publish_of_payload_len(LIMIT));
    assert_eq!(frames.len(), 1);
    assert!(frames[0]
        .flags
        .contains(felix_proto::Flags::BINARY_PUBLISH_ACK));
    assert_eq!(net.engine.stats().published_records, 1);

    let (past, _) = net.auth_stream(p);
    let frames = net.exchange(p, past, &publish_of_payload_len(LIMIT + 1));
    assert_eq!(code(&frames[0]), "limit_exceeded");
    assert_eq!(json(&frames[0])["retry"], "fatal");
    assert!(net.peers[p].finished.contains(&past));
    assert_eq!(net.engine.stats().published_records, 1);
    // Other streams go on.
    let frames = net.exchange(p, at, &binary_publish(Some(8), None, "s", &[b"x"]));
    assert_eq!(frames.len(), 1);
}

#[test]
fn broker_buffer_budget_holds_hoarders_and_lets_others_through() {
    const BUDGET: usize = 64 * 1024;
    const FRAME: usize = 40 * 1024;
    const CHUNK: usize = 4 * 1024;
    let mut net = Net::new(|c| {
        c.max_buffered_bytes = BUDGET;
        c.max_frame_bytes = FRAME as u32;
        // Each connection alone could hold far more.
        c.max_connection_buffered_bytes = 16 * BUDGET;
        c.stream_receive_window = 16 * 1024;
        c.read_chunk_bytes = CHUNK;
    });
    let hoarder = net.connect(&[]);
    let honest = net.connect(&[]);
    // The hoarder starts three frames of the largest size and never completes them: 105 KiB
    // of partial frames if the broker read everything sent.
    let mut hoard = Vec::new();
    for _ in 0..3 {
        let (id, _) = net.auth_stream(hoarder);
        let mut wire = b"FLX1\x00\x01\x00\x00".to_vec();
        wire.extend_from_slice(&(FRAME as u32).to_be_bytes());
        wire.extend(vec![b'{'; 35 * 1024]);
        hoard.push((id, wire, 0usize));
    }
    for _ in 0..40 {
        for (id, wire, written) in &mut hoard {
            *written += net.send_some(hoarder, *id, &wire[*written..]);
        }
        net.run();
    }
    let held = net.engine.usage().buffered_bytes;
    assert!(held >= BUDGET, "the broker read up to its budget: {held}");
    assert!(
        held <= BUDGET + 3 * CHUNK,
        "and not past it (a chunk per stream): {held}"
    );

    // The other connection holds less than its share: small requests flow...
    let (small, _) = net.auth_stream(honest);
    for i in 0..10u64 {
        let acks = net.exchange(
            honest,
            small,
            &binary_publish(Some(i), None, "s", &[&vec![b'y'; 2000]]),
        );
        assert_eq!(acks.len(), 1, "publish {i} answered");
    }
    // ...and so does a frame of the largest size, while the hoard stays held.
    let (second, _) = net.auth_stream(honest);
    let overhead = 8 + 1 + (2 + 2) + (2 + 7) + (2 + 1) + 4 + 4;
    let frame = binary_publish(Some(99), None, "s", &[&vec![b'z'; FRAME - overhead]]);
    let mut sent = 0;
    for _ in 0..40 {
        if sent < frame.len() {
            sent += net.send_some(honest, second, &frame[sent..]);
        }
        net.run();
    }
    assert_eq!(sent, frame.len());
    let acks = net.read_frames(honest, second);
    assert_eq!(acks.len(), 1, "the largest frame was answered");
    assert!(
        net.engine.usage().buffered_bytes >= BUDGET,
        "the hoard is still held"
    );

    // Once the hoarder lets go, its bytes are released.
    for (id, _, _) in &hoard {
        net.peers[hoarder]
            .conn
            .send_stream(*id)
            .reset(quinn_proto::VarInt::from_u32(0))
            .unwrap();
    }
    net.run();
    assert_eq!(net.engine.usage().buffered_bytes, 0);
}

fn request(net: &mut Net, p: usize, id: quinn_proto::StreamId, json: &str) -> serde_json::Value {
    let frames = net.exchange(p, id, &json_frame(json));
    assert_eq!(frames.len(), 1, "one answer to {json}");
    serde_json::from_str(text(&frames[0])).unwrap()
}

#[test]
fn cache_key_and_value_sizes_at_and_past_the_limit() {
    let mut net = Net::new(|c| {
        c.cache_max_key_bytes = 16;
        c.cache_max_value_bytes = 30;
    });
    let p = net.connect(&[]);
    let (s, _) = net.auth_stream(p);
    let put = |key: &str, value_len: usize| {
        use base64::Engine as _;
        let value = base64::engine::general_purpose::STANDARD.encode(vec![b'v'; value_len]);
        format!(
            r#"{{"type":"cache_put","tenant_id":"t1","namespace":"default","cache":"c","key":"{key}","value":"{value}","request_id":1}}"#
        )
    };
    let key16 = "k".repeat(16);
    let key17 = "k".repeat(17);
    assert_eq!(
        request(&mut net, p, s, &put(&key16, 30))["type"],
        "cache_ok"
    );
    let v = request(&mut net, p, s, &put(&key17, 1));
    assert_eq!(
        (v["code"].as_str(), v["retry"].as_str()),
        (Some("limit_exceeded"), Some("fatal"))
    );
    let v = request(&mut net, p, s, &put(&key16, 31));
    assert_eq!(v["code"], "limit_exceeded", "{v}");
    // The value at the limit is still there, untouched by the refusals.
    let v = request(
        &mut net,
        p,
        s,
        &format!(
            r#"{{"type":"cache_get","tenant_id":"t1","namespace":"default","cache":"c","key":"{key16}","request_id":2}}"#
        ),
    );
    assert_eq!(v["type"], "cache_value");
    assert_eq!(v["value"].as_str().unwrap().len(), 40, "30 bytes in base64");
}

#[test]
fn names_at_and_past_their_length_and_outside_the_charset() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let (s, _) = net.auth_stream(p);
    let shards = |ns: &str, stream: &str| {
        format!(
            r#"{{"type":"stream_shards","tenant_id":"t1","namespace":"{ns}","stream":"{stream}","request_id":3}}"#
        )
    };
    let longest = "n".repeat(255);
    let v = request(&mut net, p, s, &shards("default", &longest));
    assert_eq!(v["type"], "stream_shards_view", "{v}");
    let v = request(&mut net, p, s, &shards(&longest, "x.y_z-1"));
    assert_eq!(v["type"], "stream_shards_view", "{v}");
    let v = request(&mut net, p, s, &shards("default", &(longest.clone() + "n")));
    assert_eq!(
        (v["code"].as_str(), v["retry"].as_str()),
        (Some("limit_exceeded"), Some("fatal"))
    );
    for bad in ["", "a b", "a:b", "a*", "caf\u{e9}", "a\\u0000"] {
        let v = request(&mut net, p, s, &shards("default", bad));
        assert_eq!(v["code"], "invalid_request", "{bad:?}: {v}");
    }
    // A publish to a bad name is refused the same way, in its own answer form.
    let frames = net.exchange(p, s, &binary_publish(Some(4), None, "bad name", &[b"x"]));
    let ack = felix_proto::binary::PublishAck::decode(frames[0].flags, &frames[0].payload).unwrap();
    match ack.result {
        felix_proto::binary::AckResult::Err { code, .. } => {
            assert_eq!(
                code.map(|c| c.0),
                Some(felix_proto::ErrorCode::InvalidRequest)
            )
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(net.engine.stats().published_records, 0);
}

#[test]
fn streams_per_broker_at_and_past_the_limit() {
    let mut net = Net::new(|c| c.max_streams = 3);
    let p = net.connect(&[]);
    let (s, _) = net.auth_stream(p);
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let frames = net.exchange(p, s, &binary_publish(Some(i as u64), None, name, &[b"x"]));
        let ack =
            felix_proto::binary::PublishAck::decode(frames[0].flags, &frames[0].payload).unwrap();
        assert!(
            matches!(ack.result, felix_proto::binary::AckResult::Ok { .. }),
            "{name}"
        );
    }
    let frames = net.exchange(p, s, &binary_publish(Some(9), None, "d", &[b"x"]));
    let ack = felix_proto::binary::PublishAck::decode(frames[0].flags, &frames[0].payload).unwrap();
    match ack.result {
        felix_proto::binary::AckResult::Err { code, .. } => assert_eq!(
            code,
            Some((
                felix_proto::ErrorCode::Overloaded,
                felix_proto::RetryClass::RetryAfter
            ))
        ),
        other => panic!("expected overloaded, got {other:?}"),
    }
    // Existing streams still take publishes.
    let frames = net.exchange(p, s, &binary_publish(Some(10), None, "a", &[b"x"]));
    let ack = felix_proto::binary::PublishAck::decode(frames[0].flags, &frames[0].payload).unwrap();
    assert!(matches!(
        ack.result,
        felix_proto::binary::AckResult::Ok { .. }
    ));
}

#[test]
fn subscriber_queue_capacity_is_granted_up_to_its_ceiling() {
    let mut net = Net::new(|c| {
        c.subscriber_queue_capacity = 4;
        c.subscriber_queue_capacity_max = 16;
    });
    let p = net.connect(&[]);
    let (s, _) = net.auth_stream(p);
    let subscribe = |q: u32| {
        format!(
            r#"{{"type":"subscribe","tenant_id":"t1","namespace":"default","stream":"q","queue_capacity":{q}}}"#
        )
    };
    let s2 = net.open_bi(p);
    let token = net.token();
    net.exchange(p, s2, &real_client_auth("t1", &token));
    let v = request(&mut net, p, s, &subscribe(16));
    assert_eq!(v["queue_capacity"], 16, "{v}");
    let v = request(&mut net, p, s2, &subscribe(17));
    assert_eq!(v["queue_capacity"], 16, "clamped to the ceiling: {v}");
    assert!(net.engine.usage().max_subscriber_queue <= 16);
}

#[test]
fn unwritten_answer_bytes_per_connection_are_bounded() {
    const BUDGET: usize = 64 * 1024;
    const VALUE: usize = 30_000;
    let mut net = Net::new(|c| {
        c.max_connection_unwritten_bytes = BUDGET;
        c.cache_max_value_bytes = VALUE;
    });
    // A client that reads slowly: 16 KiB of window per stream.
    net.client_stream_window = 16 * 1024;
    let p = net.connect(&[]);
    let (s0, _) = net.auth_stream(p);
    let value = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(vec![b'v'; VALUE])
    };
    let put = format!(
        r#"{{"type":"cache_put","tenant_id":"t1","namespace":"default","cache":"c","key":"k","value":"{value}","request_id":1}}"#
    );
    assert_eq!(request(&mut net, p, s0, &put)["type"], "cache_ok");
    let get = json_frame(
        r#"{"type":"cache_get","tenant_id":"t1","namespace":"default","cache":"c","key":"k"}"#,
    );
    // Forty gets of a 30 KB value (40 KB answered) on four streams, none read yet: 1.6 MB
    // of answers if the broker answered them all at once.
    let streams: Vec<_> = (0..4).map(|_| net.auth_stream(p).0).collect();
    for id in &streams {
        for _ in 0..10 {
            net.send(p, *id, &get);
        }
    }
    net.run();
    let held = net.engine.usage().max_connection_unwritten_bytes;
    assert!(held >= BUDGET, "answered up to the budget: {held}");
    assert!(
        held <= BUDGET + 41_000,
        "and one answer past it at most: {held}"
    );
    // Reading frees the budget; every get is answered in the end.
    let mut answers = 0;
    for _ in 0..200 {
        for id in &streams {
            for frame in net.read_frames(p, *id) {
                let v = json(&frame);
                assert_eq!(v["type"], "cache_value");
                assert_eq!(v["value"].as_str().unwrap(), value);
                answers += 1;
            }
        }
        net.run();
        if answers == 40 {
            break;
        }
    }
    assert_eq!(answers, 40);
    assert_eq!(net.engine.usage().max_connection_unwritten_bytes, 0);
}

/// The budget is freed by answers that complete off the connection's own events (here disk
/// reads; in a cluster, forwards answered by other nodes): a stream paused for it must be read
/// again then, though the client, waiting on its answers, sends nothing more (sim cluster seed
/// 3129: a publish stuck behind cache gets on another stream, never answered).
#[test]
fn a_stream_paused_for_the_answer_budget_resumes_when_answers_complete_off_its_events() {
    const VALUE: usize = 3_000;
    // A value not read yet counts as the largest one's answer: about 4.3 KB each.
    const BUDGET: usize = 10_000;
    let mut durable = felix_engine::DurableConfig::default();
    // Every get reads its value from the log.
    durable.tail_cache_bytes = 0;
    let mut net = Net::durable(durable, |c| {
        c.max_connection_unwritten_bytes = BUDGET;
        c.cache_max_value_bytes = VALUE;
    });
    let p = net.connect(&[]);
    let (s0, _) = net.auth_stream(p);
    let put = r#"{"type":"cache_put","tenant_id":"t1","namespace":"default","cache":"c","key":"k","value":"djE=","request_id":1}"#;
    assert_eq!(request(&mut net, p, s0, put)["type"], "cache_ok");
    net.hold = |k| matches!(k, felix_storage::ops::FileOpKind::Read { .. });
    let gets = net.auth_stream(p).0;
    let other = net.auth_stream(p).0;
    let get = json_frame(
        r#"{"type":"cache_get","tenant_id":"t1","namespace":"default","cache":"c","key":"k"}"#,
    );
    for _ in 0..4 {
        net.send(p, gets, &get);
    }
    net.run();
    assert!(net.engine.usage().max_connection_unwritten_bytes >= BUDGET);
    // Another stream's request is not read while the reads hold the budget...
    let put2 = json_frame(
        r#"{"type":"cache_put","tenant_id":"t1","namespace":"default","cache":"c","key":"k2","value":"djI=","request_id":2}"#,
    );
    net.send(p, other, &put2);
    net.run();
    assert!(net.read_frames(p, other).is_empty());
    // ...and is once they complete, with nothing more from the client.
    net.release_held_ops();
    let answers = net.read_frames(p, other);
    assert_eq!(answers.len(), 1);
    assert_eq!(json(&answers[0])["type"], "cache_ok");
    assert_eq!(net.read_frames(p, gets).len(), 4);
}

#[test]
fn event_bytes_queued_per_connection_are_bounded_and_others_unaffected() {
    const BUDGET: usize = 64 * 1024;
    let mut net = Net::new(|c| c.max_connection_event_bytes = BUDGET);
    // The slow connection grants 16 KiB of window per stream and never reads.
    net.client_stream_window = 16 * 1024;
    let slow = net.connect(&[]);
    net.client_stream_window = 1024 * 1024;
    let reader = net.connect(&[]);
    let publisher = net.connect(&[]);
    let subscribe = json_frame(
        r#"{"type":"subscribe","tenant_id":"t1","namespace":"default","stream":"busy"}"#,
    );
    // Three subscriptions on the slow connection, one on the reader.
    for _ in 0..3 {
        let (s, _) = net.auth_stream(slow);
        assert_eq!(net.exchange(slow, s, &subscribe).len(), 1);
    }
    let (s, _) = net.auth_stream(reader);
    assert_eq!(net.exchange(reader, s, &subscribe).len(), 1);
    let events = net.take_uni(reader);
    let (p, _) = net.auth_stream(publisher);
    // Twenty 8 KB batches, one per turn.
    for i in 0..20u64 {
        let acks = net.exchange(
            publisher,
            p,
            &binary_publish(Some(i), None, "busy", &[&vec![b'e'; 8000]]),
        );
        assert_eq!(acks.len(), 1);
    }
    let u = net.engine.usage();
    assert!(
        u.max_connection_event_bytes <= BUDGET,
        "queued for the slow connection: {u:?}"
    );
    assert!(
        u.max_connection_event_bytes >= BUDGET - 8100,
        "it filled up: {u:?}"
    );
    assert!(net.engine.stats().dropped_batches > 0);
    // The reader on another connection got all twenty.
    let frames = net.read_frames(reader, events);
    let records: usize = frames
        .iter()
        .filter(|f| !f.flags.is_empty())
        .map(|f| {
            felix_proto::binary::EventBatch::decode(f.flags, &f.payload)
                .unwrap()
                .events
                .len()
        })
        .sum();
    assert_eq!(records, 20);
}
