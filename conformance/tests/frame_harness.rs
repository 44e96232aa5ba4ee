//! The frame harness the `engine_frames` fuzz target drives reaches the broker: answers come
//! back, held answers wait for the disk, subscriptions get event streams, and a deleted
//! stream ends them. Without this a harness that answered nothing would fuzz nothing and
//! still pass every corpus replay.

use std::time::Instant;

use felix_engine::fuzzing::{FrameHarness, Written};
use felix_engine::{AuthConfig, DurableConfig, EngineConfig, FsyncPolicy};
use felix_proto::message::Message;
use felix_proto::{Decoded, FrameDecoder};
use felix_testkit::{binary_publish, json_frame, real_client_auth, shared_tls, MemFs};

fn decode(frame: &bytes::Bytes) -> Decoded {
    let mut d = FrameDecoder::new(u32::MAX);
    d.feed_bytes(frame.clone());
    let frame = d.next_frame().expect("decodes").expect("one whole frame");
    felix_proto::decode_frame(&frame).expect("decodes")
}

fn complete_all(h: &mut FrameHarness, disk: &mut MemFs) {
    for _ in 0..10_000 {
        let Some(op) = h.poll_file_op() else {
            return;
        };
        h.handle_file_completion(disk.execute(op).expect("disk alive"));
    }
    panic!("file ops never stopped");
}

#[test]
fn answers_wait_for_the_disk_and_subscriptions_end_on_delete() {
    let mut config = EngineConfig::new(
        shared_tls().identity.clone(),
        AuthConfig::Dev { seed: [7; 32] },
        [9; 32],
    );
    let mut durable = DurableConfig::default();
    durable.fsync = FsyncPolicy::OnCommit;
    config.durable = Some(durable);
    let mut h = FrameHarness::new(config, Instant::now(), 1_767_225_600_000_000).unwrap();
    let mut disk = MemFs::new();
    complete_all(&mut h, &mut disk);
    assert!(h.is_ready());
    let token = h.dev_token().unwrap().to_owned();

    let c = h.connect();
    let s = h.open_stream(c).unwrap();
    let auth = real_client_auth("t1", &token);
    h.send(c, s, &auth);
    let w = h.take_written();
    assert!(
        matches!(&w[..], [Written::Answer { frame, .. }]
            if matches!(decode(frame), Decoded::Json(Message::AuthOk(_)))),
        "{w:?}"
    );

    // A subscription on its own stream: a hello first.
    let sub = h.open_stream(c).unwrap();
    h.send(c, sub, &auth);
    let subscribe =
        r#"{"type":"subscribe","tenant_id":"t1","namespace":"default","stream":"s","shard":0}"#;
    h.send(c, sub, &json_frame(subscribe));
    complete_all(&mut h, &mut disk);
    let w = h.take_written();
    let hello = w.iter().find_map(|w| match w {
        Written::Event { events, frame, .. } => Some((*events, decode(frame))),
        _ => None,
    });
    let Some((events, Decoded::Json(Message::EventStreamHello(_)))) = hello else {
        panic!("no event stream hello in {w:?}");
    };

    // An acked publish under on_commit: its ack is held until the disk has the record.
    h.send(
        c,
        s,
        &binary_publish(Some(1), None, "s", &[b"x".as_slice()]),
    );
    let before: Vec<_> = h
        .take_written()
        .into_iter()
        .filter(|w| matches!(w, Written::Answer { stream, .. } if *stream == s))
        .collect();
    assert!(before.is_empty(), "acked before the write: {before:?}");
    complete_all(&mut h, &mut disk);
    let after = h.take_written();
    assert!(
        after
            .iter()
            .any(|w| matches!(w, Written::Answer { stream, .. } if *stream == s)),
        "no ack once the write completed: {after:?}"
    );

    // Deleting the stream ends the subscription.
    h.delete_stream("t1", "default", "s").unwrap();
    complete_all(&mut h, &mut disk);
    let w = h.take_written();
    assert!(
        w.iter()
            .any(|w| matches!(w, Written::EventsEnded { events: e, .. } if *e == events)),
        "the subscription outlived its stream: {w:?}"
    );
    assert!(h.event_streams(c).is_empty());
}
