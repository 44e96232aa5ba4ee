//! Binary codec throughput: decode and encode a 64 × 1 KiB acked publish batch and a
//! 64 × 1 KiB shared event batch with offsets.
//!
//! Run with `cargo bench -p felix-proto --bench codec`. Prints ns per batch and GB/s of
//! record payload (10^9 bytes/s), one line per case.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_proto::binary::{
    encode_event_batch_frame, encode_publish_batch_frame, AckMode, AckedPrefix, EventBatch,
    EventBatchHeader, PublishBatch, PublishBatchHeader,
};
use felix_proto::frame::HEADER_LEN;
use felix_proto::Flags;

const RECORDS: usize = 64;
const RECORD_BYTES: usize = 1024;
/// Each case runs at least this long after warm-up.
const MEASURE_FOR: Duration = Duration::from_millis(700);

/// Runs `op` in rounds until `MEASURE_FOR` has passed; returns mean ns per call.
fn measure(mut op: impl FnMut()) -> f64 {
    for _ in 0..1_000 {
        op();
    }
    let mut calls = 0u64;
    let start = Instant::now();
    loop {
        for _ in 0..1_000 {
            op();
        }
        calls += 1_000;
        let elapsed = start.elapsed();
        if elapsed >= MEASURE_FOR {
            return elapsed.as_nanos() as f64 / calls as f64;
        }
    }
}

fn report(name: &str, ns: f64) {
    let payload_bytes = (RECORDS * RECORD_BYTES) as f64;
    println!(
        "{name:<44} {ns:>10.1} ns/op {:>9.2} GB/s",
        payload_bytes / ns
    );
}

fn machine_note() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("machine: {cpu}, {cores} cores visible, single-threaded run")
}

fn main() {
    let payloads: Vec<Bytes> = (0..RECORDS)
        .map(|i| Bytes::from(vec![i as u8; RECORD_BYTES]))
        .collect();

    let publish_header = PublishBatchHeader {
        acked: Some(AckedPrefix {
            request_id: 42,
            ack_mode: AckMode::PerBatch,
        }),
        idempotent: None,
        key: None,
        tenant_id: "t1",
        namespace: "default",
        stream: "orders",
    };
    let publish_frame = encode_publish_batch_frame(&publish_header, &payloads);
    let publish_flags = Flags(0x0009);
    let publish_payload = publish_frame.slice(HEADER_LEN..);
    assert_eq!(
        PublishBatch::decode(publish_flags, &publish_payload)
            .unwrap()
            .payloads,
        payloads
    );

    let event_header = EventBatchHeader {
        base_offset: Some(1_000_000),
        ..Default::default()
    };
    let event_frame = encode_event_batch_frame(&event_header, payloads.iter().map(|p| (0, &p[..])));
    let event_flags = Flags(0x0024);
    let event_payload = event_frame.slice(HEADER_LEN..);
    assert_eq!(
        EventBatch::decode(event_flags, &event_payload)
            .unwrap()
            .events
            .len(),
        RECORDS
    );

    println!(
        "felix-proto binary codec, {RECORDS} x {} KiB records per batch",
        RECORD_BYTES / 1024
    );
    report(
        "publish batch 0x0009 decode (owned, no copy)",
        measure(|| {
            black_box(
                PublishBatch::decode(black_box(publish_flags), black_box(&publish_payload))
                    .unwrap(),
            );
        }),
    );
    report(
        "publish batch 0x0009 encode (one alloc)",
        measure(|| {
            black_box(encode_publish_batch_frame(
                black_box(&publish_header),
                black_box(&payloads),
            ));
        }),
    );
    report(
        "event batch 0x0024 decode (owned, no copy)",
        measure(|| {
            black_box(
                EventBatch::decode(black_box(event_flags), black_box(&event_payload)).unwrap(),
            );
        }),
    );
    report(
        "event batch 0x0024 encode (one alloc)",
        measure(|| {
            let events = black_box(&payloads).iter().map(|p| (0, &p[..]));
            black_box(encode_event_batch_frame(black_box(&event_header), events));
        }),
    );
    println!("{}", machine_note());
}
