//! Turns a byte stream into messages: the frames the real client sends when it connects and
//! publishes, fed to a `FrameDecoder` in awkward 7-byte chunks, as a socket might deliver them.
//!
//! Run with `cargo run -p felix-proto --example decode_stream`.

use felix_proto::binary::BinaryFrame;
use felix_proto::frame::{FrameDecoder, DEFAULT_PREAUTH_MAX_FRAME_BYTES};
use felix_proto::{decode_frame, Decoded};

/// `auth` then an acked publish of "hello" (request_id 1), exactly as felix-client 0.6.2 sends them.
const WIRE: &str = concat!(
    "464c5831000100000000007f7b2274797065223a2261757468222c2274656e616e745f6964223a227431222c",
    "22746f6b656e223a2270726f62652d746f6b656e222c22636c69656e745f666c616773223a383139312c2263",
    "6c69656e745f6665617475726573223a343231383934353533352c22636c69656e745f66656174757265735f",
    "6869223a31357d",
    "464c5831000100090000002b000000000000000101000274310007",
    "64656661756c7400066f72646572730000000100000005",
    "68656c6c6f",
);

fn main() {
    let bytes = hex_decode(WIRE);
    // Before auth a stream may send at most 64 KiB per frame; raise the limit once it authenticates.
    let mut decoder = FrameDecoder::new(DEFAULT_PREAUTH_MAX_FRAME_BYTES);
    for chunk in bytes.chunks(7) {
        decoder.feed(chunk);
        while let Some(frame) = decoder.next_frame().expect("a well-formed stream") {
            match decode_frame(&frame).expect("a valid payload") {
                Decoded::Json(message) => {
                    println!("json   {:<12} {:?}", message.type_name(), message);
                    decoder.set_max_payload(felix_proto::frame::DEFAULT_MAX_FRAME_BYTES);
                }
                Decoded::Binary(BinaryFrame::Publish(batch)) => println!(
                    "binary publish to {}/{}/{}: {} record(s), acked {:?}",
                    batch.tenant_id,
                    batch.namespace,
                    batch.stream,
                    batch.payloads.len(),
                    batch.acked
                ),
                Decoded::Binary(other) => println!("binary {other:?}"),
            }
        }
    }
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}
