//! Every reference vector passes, and the runner notices a broken one.

use std::path::PathBuf;

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/reference/felix/vectors")
}

#[test]
fn every_reference_vector_passes() {
    let results = felix_conformance::vectors::check_dir(&vectors_dir()).unwrap();
    assert!(
        results.len() >= 17,
        "expected the 17 reference vectors, found {}",
        results.len()
    );
    let failures: Vec<String> = results
        .iter()
        .filter_map(|r| r.outcome.as_ref().err().map(|e| format!("{}: {e}", r.name)))
        .collect();
    assert!(
        failures.is_empty(),
        "failing vectors:\n{}",
        failures.join("\n")
    );
}

#[test]
fn a_corrupted_vector_fails_and_is_named() {
    let text = std::fs::read_to_string(vectors_dir().join("cache_value.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    // Flip the last byte of the framed bytes: the runner must report a mismatch.
    let frame = v["frame_hex"].as_str().unwrap().to_owned();
    let broken = format!("{}00", &frame[..frame.len() - 2]);
    v["frame_hex"] = serde_json::Value::String(broken);
    let outcome = felix_conformance::vectors::check_value(&v);
    assert!(outcome.unwrap_err().contains("framed bytes differ"));

    // A binary vector whose decoded field disagrees.
    let text = std::fs::read_to_string(vectors_dir().join("binary_publish_acked.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["stream"] = serde_json::Value::String("other".into());
    assert!(felix_conformance::vectors::check_value(&v)
        .unwrap_err()
        .contains("stream"));
}
