//! The reference wire vectors: each `<name>.json` describes one frame (a JSON message or a
//! binary layout), its payload bytes and its framed bytes; `<name>.hex`, when present, holds the
//! framed bytes again. A vector passes when its payload decodes to the fields it lists,
//! re-encodes byte for byte, and frames to exactly `frame_hex`.

use std::fs;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use felix_proto::binary::{AckMode, AckResult, PublishAck, PublishBatch};
use felix_proto::message::Message;
use felix_proto::{Flags, Frame};
use serde_json::Value;

/// The outcome of one vector.
#[derive(Debug)]
pub struct VectorResult {
    /// The vector's name (its file stem).
    pub name: String,
    /// `Ok` or the first mismatch, in words.
    pub outcome: Result<(), String>,
}

/// Checks every `*.json` vector in `dir`, in name order.
pub fn check_dir(dir: &Path) -> std::io::Result<Vec<VectorResult>> {
    let mut paths: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    Ok(paths.iter().map(|p| check_file(p)).collect())
}

/// Checks one vector file.
pub fn check_file(path: &Path) -> VectorResult {
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let outcome = fs::read_to_string(path)
        .map_err(|e| format!("cannot read: {e}"))
        .and_then(|text| serde_json::from_str::<Value>(&text).map_err(|e| format!("not JSON: {e}")))
        .and_then(|v| check_value(&v))
        .and_then(|()| check_hex_partner(path));
    VectorResult { name, outcome }
}

fn check_hex_partner(json_path: &Path) -> Result<(), String> {
    let hex_path = json_path.with_extension("hex");
    let Ok(text) = fs::read_to_string(&hex_path) else {
        return Ok(()); // Not every vector has one.
    };
    let vector: Value = serde_json::from_str(&fs::read_to_string(json_path).unwrap_or_default())
        .map_err(|e| e.to_string())?;
    let frame_hex = str_field(&vector, "frame_hex")?;
    if text.trim() != frame_hex {
        return Err(format!("{} differs from frame_hex", hex_path.display()));
    }
    Ok(())
}

/// Checks one parsed vector.
pub fn check_value(v: &Value) -> Result<(), String> {
    let payload =
        hex::decode(str_field(v, "payload_hex")?).map_err(|e| format!("payload_hex: {e}"))?;
    let frame_hex = str_field(v, "frame_hex")?;
    let kind = v
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("json_message");
    let frame = match kind {
        "json_message" => check_json(v, &payload)?,
        "binary_publish_batch" | "binary_acked_publish_batch" => check_publish(v, kind, &payload)?,
        "binary_publish_ack" => check_ack(v, &payload)?,
        other => return Err(format!("unknown vector kind {other:?}")),
    };
    let framed = hex::encode(frame.to_bytes());
    if framed != frame_hex {
        return Err(format!(
            "framed bytes differ:\n  got  {framed}\n  want {frame_hex}"
        ));
    }
    Ok(())
}

fn check_json(v: &Value, payload: &[u8]) -> Result<Frame, String> {
    if let Some(text) = v.get("payload_json").and_then(Value::as_str) {
        if text.as_bytes() != payload {
            return Err("payload_json and payload_hex disagree".into());
        }
    }
    let message = Message::decode(payload).map_err(|e| format!("decode: {e}"))?;
    let encoded = message.encode();
    if encoded != payload {
        return Err(format!(
            "re-encoded JSON differs:\n  got  {}\n  want {}",
            String::from_utf8_lossy(&encoded),
            String::from_utf8_lossy(payload)
        ));
    }
    Ok(message.to_frame())
}

fn vector_flags(v: &Value) -> Result<Flags, String> {
    let flags = v
        .get("flags")
        .and_then(Value::as_u64)
        .ok_or("missing flags")?;
    u16::try_from(flags)
        .map(Flags)
        .map_err(|_| format!("flags {flags} exceed u16"))
}

fn check_publish(v: &Value, kind: &str, payload: &[u8]) -> Result<Frame, String> {
    let flags = vector_flags(v)?;
    let bytes = Bytes::copy_from_slice(payload);
    let batch = PublishBatch::decode(flags, &bytes).map_err(|e| format!("decode: {e}"))?;
    expect_eq(
        "tenant_id",
        batch.tenant_id.as_str(),
        str_field(v, "tenant_id")?,
    )?;
    expect_eq(
        "namespace",
        batch.namespace.as_str(),
        str_field(v, "namespace")?,
    )?;
    expect_eq("stream", batch.stream.as_str(), str_field(v, "stream")?)?;
    let key = batch
        .key
        .as_deref()
        .map(|k| String::from_utf8_lossy(k).into_owned());
    let want_key = v.get("key_utf8").and_then(Value::as_str).map(str::to_owned);
    expect_eq("key", &key, &want_key)?;
    let payloads: Vec<String> = batch
        .payloads
        .iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    let want_payloads: Vec<String> = v
        .get("payloads_utf8")
        .and_then(Value::as_array)
        .ok_or("missing payloads_utf8")?
        .iter()
        .map(|p| p.as_str().unwrap_or_default().to_owned())
        .collect();
    expect_eq("payloads", &payloads, &want_payloads)?;
    match (kind, &batch.acked) {
        ("binary_acked_publish_batch", Some(acked)) => {
            let rid = v
                .get("request_id")
                .and_then(Value::as_u64)
                .ok_or("missing request_id")?;
            expect_eq("request_id", &acked.request_id, &rid)?;
            let mode = match str_field(v, "ack_mode")? {
                "per_message" => AckMode::PerMessage,
                "per_batch" => AckMode::PerBatch,
                other => return Err(format!("unknown ack_mode {other}")),
            };
            expect_eq("ack_mode", &acked.ack_mode, &mode)?;
        }
        ("binary_publish_batch", None) => {}
        _ => return Err("acked prefix does not match the vector kind".into()),
    }
    reencode(&batch.to_frame(), flags, payload)
}

fn check_ack(v: &Value, payload: &[u8]) -> Result<Frame, String> {
    let flags = vector_flags(v)?;
    let bytes = Bytes::copy_from_slice(payload);
    let ack = PublishAck::decode(flags, &bytes).map_err(|e| format!("decode: {e}"))?;
    let rid = v
        .get("request_id")
        .and_then(Value::as_u64)
        .ok_or("missing request_id")?;
    expect_eq("request_id", &ack.request_id, &rid)?;
    match (str_field(v, "status")?, &ack.result) {
        ("ok", AckResult::Ok { .. }) => {}
        ("error", AckResult::Err { message, .. }) => {
            expect_eq("message", message.as_str(), str_field(v, "message")?)?;
        }
        (status, result) => return Err(format!("status {status} but decoded {result:?}")),
    }
    reencode(&ack.to_frame(), flags, payload)
}

fn reencode(frame: &Frame, flags: Flags, payload: &[u8]) -> Result<Frame, String> {
    if frame.flags != flags {
        return Err(format!(
            "re-encoded flags {:?}, vector has {flags:?}",
            frame.flags
        ));
    }
    if frame.payload != payload {
        return Err(format!(
            "re-encoded payload differs:\n  got  {}\n  want {}",
            hex::encode(&frame.payload),
            hex::encode(payload)
        ));
    }
    Ok(frame.clone())
}

fn str_field<'a>(v: &'a Value, field: &str) -> Result<&'a str, String> {
    v.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("missing string field {field}"))
}

fn expect_eq<T: PartialEq + std::fmt::Debug + ?Sized>(
    what: &str,
    got: &T,
    want: &T,
) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: decoded {got:?}, vector has {want:?}"))
    }
}
