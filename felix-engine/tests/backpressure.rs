//! Nothing buffers without a bound: a subscriber that stops reading loses batches (its queue
//! drops new ones) while publishers keep getting acks, and a publisher that stops reading its
//! acks stops being read at the publish window.

use felix_testkit::*;

fn subscribe(net: &mut Net, p: usize, stream: &str) -> quinn_proto::StreamId {
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
    let uni = net.take_uni(p);
    assert_eq!(net.read_frames(p, uni).len(), 1, "hello");
    uni
}

fn ack_ids(frames: &[felix_proto::Frame]) -> Vec<u64> {
    frames
        .iter()
        .map(|f| {
            assert_eq!(f.flags.bits(), 0x0010, "an ok ack");
            assert_eq!(f.payload[0], 0, "status ok");
            u64::from_be_bytes(f.payload[1..9].try_into().unwrap())
        })
        .collect()
}

#[test]
fn slow_subscriber_drops_batches_while_the_publisher_keeps_getting_acks() {
    const PUBLISHES: u64 = 60;
    let mut net = Net::new(|c| c.subscriber_queue_capacity = 4);
    net.client_stream_window = 4 * 1024;
    let slow = net.connect(&[]);
    net.client_stream_window = 1024 * 1024;
    let publisher = net.connect(&[]);
    let uni = subscribe(&mut net, slow, "orders");
    let (pid, _) = net.auth_stream(publisher);

    // One publish per turn, so one batch each; 1 KiB payloads fill the 4 KiB window fast.
    for i in 0..PUBLISHES {
        let mut payload = vec![b'.'; 1024];
        payload[..8].copy_from_slice(&i.to_be_bytes());
        let acks = net.exchange(
            publisher,
            pid,
            &binary_publish(Some(i + 1), None, "orders", &[&payload]),
        );
        assert_eq!(ack_ids(&acks), [i + 1], "every publish is acked at once");
    }
    let dropped = net.engine.stats().dropped_batches;
    assert!(dropped > 0, "the full queue dropped batches");

    // Now read everything the subscriber was sent: an in-order prefix-free subsequence.
    let mut seen = Vec::new();
    for _ in 0..100 {
        let frames = net.read_frames(slow, uni);
        net.run();
        if frames.is_empty() {
            break;
        }
        for f in frames {
            let batch = felix_proto::binary::EventBatch::decode(f.flags, &f.payload).unwrap();
            for e in batch.events {
                seen.push(u64::from_be_bytes(e.payload[..8].try_into().unwrap()));
            }
        }
    }
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "order kept: {seen:?}");
    assert_eq!(seen[0], 0, "nothing before the first drop is lost");
    assert_eq!(
        seen.len() as u64 + dropped,
        PUBLISHES,
        "every batch was delivered or counted as dropped"
    );

    // The subscription survives its drops and gets what comes next.
    let acks = net.exchange(
        publisher,
        pid,
        &binary_publish(Some(1000), None, "orders", &[b"after"]),
    );
    assert_eq!(ack_ids(&acks), [1000]);
    let frames = net.read_frames(slow, uni);
    assert_eq!(frames.len(), 1);
    assert!(frames[0].payload.ends_with(b"after"));
}

#[test]
fn a_publisher_that_reads_no_acks_is_not_read_past_its_window() {
    const WINDOW: usize = 8;
    const TOTAL: u64 = 400;
    let mut net = Net::new(|c| {
        c.publish_window = WINDOW as u32;
        c.stream_receive_window = 8 * 1024;
        c.read_chunk_bytes = 1024;
    });
    net.client_stream_window = 1024; // room for 44 acks of 23 bytes
    let p = net.connect(&[]);
    let (id, _) = net.auth_stream(p);

    let mut wire = Vec::new();
    for i in 1..=TOTAL {
        wire.extend(binary_publish(Some(i), None, "s", &[b"12345678"]));
    }
    let frame_len = wire.len() / TOTAL as usize;
    // Write until flow control stops the client (a few rounds: each read grants credit).
    let mut written = 0;
    for _ in 0..20 {
        let n = net.send_some(p, id, &wire[written..]);
        net.run();
        written += n;
        if n == 0 {
            break;
        }
    }
    assert_eq!(
        net.send_some(p, id, &wire[written..]),
        0,
        "flow control holds the client back"
    );
    let processed = net.engine.stats().publishes as usize;
    let unacked_room = 1024 / 23 + 1; // acks that fit the client's window, plus a partial one
    assert!(
        processed <= unacked_room + WINDOW,
        "stopped reading at the window: {processed}"
    );
    // What the broker holds unread is bounded by one read chunk plus its stream window.
    let held = written - processed * frame_len;
    assert!(held <= 1024 + 8 * 1024 + frame_len, "{held} bytes held");
    assert!(
        (written / frame_len) < TOTAL as usize,
        "the client could not send everything"
    );

    // Reading the acks lets everything through, answered in stream order.
    let mut acked = Vec::new();
    for _ in 0..10_000 {
        if written < wire.len() {
            written += net.send_some(p, id, &wire[written..]);
        }
        net.run();
        acked.extend(ack_ids(&net.read_frames(p, id)));
        net.run();
        if acked.len() as u64 == TOTAL {
            break;
        }
    }
    assert_eq!(acked, (1..=TOTAL).collect::<Vec<_>>());
}

#[test]
fn partial_frames_are_held_to_the_connection_budget() {
    const BUDGET: usize = 64 * 1024;
    let mut net = Net::new(|c| {
        c.max_connection_buffered_bytes = BUDGET;
        c.stream_receive_window = 16 * 1024;
        c.read_chunk_bytes = 4 * 1024;
    });
    let p = net.connect(&[]);
    // One stream sends a 1 MiB frame, slowly: header and 200 KiB of payload, never the rest.
    let (big, _) = net.auth_stream(p);
    let mut wire = b"FLX1\x00\x01\x00\x00".to_vec();
    wire.extend_from_slice(&(1024 * 1024u32).to_be_bytes());
    wire.extend(vec![b'{'; 200 * 1024]);
    let mut written = 0;
    for _ in 0..100 {
        let n = net.send_some(p, big, &wire[written..]);
        net.run();
        written += n;
        if n == 0 {
            break;
        }
    }
    // The broker read up to its budget (plus a chunk), then let flow control hold the rest.
    let window_and_chunk = 16 * 1024 + 4 * 1024;
    assert!(
        written <= BUDGET + window_and_chunk + 12,
        "client wrote {written} bytes"
    );
    assert!(written >= BUDGET, "client wrote {written} bytes");

    // Small requests on other streams still flow.
    let (other, _) = net.auth_stream(p);
    let acks = net.exchange(p, other, &binary_publish(Some(1), None, "s", &[b"x"]));
    assert_eq!(acks.len(), 1);

    // A second big frame waits while the first holds the budget...
    let (second, _) = net.auth_stream(p);
    let frame = binary_publish(None, None, "s", &[&vec![b'z'; 40 * 1024]]);
    let mut sent = 0;
    for _ in 0..20 {
        sent += net.send_some(p, second, &frame[sent..]);
        net.run();
    }
    let before = net.engine.stats().published_records;
    assert!(sent < frame.len(), "held back: {sent} of {}", frame.len());
    // ...until the client abandons the first: its bytes are released and the second completes.
    net.peers[p]
        .conn
        .send_stream(big)
        .reset(quinn_proto::VarInt::from_u32(0))
        .unwrap();
    net.run();
    for _ in 0..20 {
        if sent < frame.len() {
            sent += net.send_some(p, second, &frame[sent..]);
        }
        net.run();
    }
    assert_eq!(sent, frame.len());
    assert_eq!(net.engine.stats().published_records, before + 1);
}
