//! Felix frames as the real client writes them, and reading answers back.

use bytes::Bytes;
use felix_proto::Frame;

/// The offer felix-client 0.6.2 sends on every stream (peer-client-wire.md §3), minus the token.
pub const REAL_CLIENT_FLAGS: u64 = 8191;
pub const REAL_CLIENT_FEATURES: u64 = 4_218_945_535;
pub const REAL_CLIENT_FEATURES_HI: u64 = 15;

/// A JSON frame.
pub fn json_frame(json: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(12 + json.len());
    v.extend_from_slice(b"FLX1");
    v.extend_from_slice(&1u16.to_be_bytes());
    v.extend_from_slice(&0u16.to_be_bytes());
    v.extend_from_slice(&(json.len() as u32).to_be_bytes());
    v.extend_from_slice(json.as_bytes());
    v
}

/// A binary frame with the given flags.
pub fn binary_frame(flags: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(12 + payload.len());
    v.extend_from_slice(b"FLX1");
    v.extend_from_slice(&1u16.to_be_bytes());
    v.extend_from_slice(&flags.to_be_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// The `auth` felix-client 0.6.2 sends, byte for byte.
pub fn real_client_auth(tenant: &str, token: &str) -> Vec<u8> {
    json_frame(&format!(
        r#"{{"type":"auth","tenant_id":"{tenant}","token":"{token}","client_flags":{REAL_CLIENT_FLAGS},"client_features":{REAL_CLIENT_FEATURES},"client_features_hi":{REAL_CLIENT_FEATURES_HI}}}"#
    ))
}

/// A binary publish as the real client encodes it: acked (0x0009) when `request_id` is set,
/// keyed (0x0040) when `key` is.
pub fn binary_publish(
    request_id: Option<u64>,
    key: Option<&[u8]>,
    stream: &str,
    payloads: &[&[u8]],
) -> Vec<u8> {
    let mut flags = 0x0001u16;
    let mut p = Vec::new();
    if let Some(id) = request_id {
        flags |= 0x0008;
        p.extend_from_slice(&id.to_be_bytes());
        p.push(1);
    }
    if let Some(k) = key {
        flags |= 0x0040;
        p.extend_from_slice(&(k.len() as u16).to_be_bytes());
        p.extend_from_slice(k);
    }
    for s in ["t1", "default", stream] {
        p.extend_from_slice(&(s.len() as u16).to_be_bytes());
        p.extend_from_slice(s.as_bytes());
    }
    p.extend_from_slice(&(payloads.len() as u32).to_be_bytes());
    for payload in payloads {
        p.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        p.extend_from_slice(payload);
    }
    binary_frame(flags, &p)
}

/// The frame's payload as text (for JSON frames).
pub fn text(frame: &Frame) -> &str {
    assert_eq!(
        frame.flags.bits(),
        0,
        "expected a JSON frame, got flags {:#06x}",
        frame.flags.bits()
    );
    std::str::from_utf8(&frame.payload).unwrap()
}

/// A whole frame as bytes.
pub fn bytes_of(frame: &Frame) -> Bytes {
    frame.to_bytes()
}
