//! `auth` on every stream: what the broker advertises to the real client's offer, plain `ok`
//! to a client that offers nothing, and refusals.

use felix_testkit::*;

/// Frame flags served (0x1F7F) and features served, as the real client's offer is answered:
/// the low word with the EXTENDED marker, and STREAM_DELETED (0x2) in the extended word.
const AUTH_OK_FOR_REAL_CLIENT: &str = r#"{"type":"auth_ok","server_flags":8063,"server_features":3255234085,"server_features_hi":2,"publish_window":256}"#;

#[test]
fn real_client_offer_gets_exact_auth_ok() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let (_, answer) = net.auth_stream(p);
    assert_eq!(text(&answer), AUTH_OK_FOR_REAL_CLIENT);
    // Feature bits by name: served and nothing else.
    let v: serde_json::Value = serde_json::from_str(text(&answer)).unwrap();
    let features = v["server_features"].as_u64().unwrap();
    assert_eq!(
        features & 0x1,
        0x1,
        "TOPOLOGY: a lone broker answers it (no other brokers)"
    );
    assert_eq!(features & 0x2, 0, "no REDIRECT");
    let hi = v["server_features_hi"].as_u64().unwrap();
    assert_eq!(
        (features & 0x7FFF_FFFF) | hi << 32,
        felix_engine::SERVED_FEATURES.0
    );
}

#[test]
fn every_stream_authenticates_on_its_own() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    for _ in 0..40 {
        let (_, answer) = net.auth_stream(p);
        assert_eq!(text(&answer), AUTH_OK_FOR_REAL_CLIENT);
    }
    assert_eq!(net.engine.stats().auths_accepted, 40);
}

#[test]
fn client_without_flags_gets_plain_ok() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let id = net.open_bi(p);
    let token = net.token();
    let frames = net.exchange(
        p,
        id,
        &json_frame(&format!(
            r#"{{"type":"auth","tenant_id":"t1","token":"{token}"}}"#
        )),
    );
    assert_eq!(frames.len(), 1);
    assert_eq!(text(&frames[0]), r#"{"type":"ok"}"#);
}

#[test]
fn window_zero_withdraws_the_pipeline_features() {
    let mut net = Net::new(|c| c.publish_window = 0);
    let p = net.connect(&[]);
    let (_, answer) = net.auth_stream(p);
    let v: serde_json::Value = serde_json::from_str(text(&answer)).unwrap();
    assert!(v.get("publish_window").is_none());
    assert_eq!(
        v["server_features"].as_u64().unwrap() & (0x8000 | 0x2_0000),
        0
    );
}

#[test]
fn refused_token_is_a_coded_error_then_the_stream_ends() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let id = net.open_bi(p);
    let frames = net.exchange(p, id, &real_client_auth("t1", "not-a-jwt"));
    assert_eq!(frames.len(), 1);
    let v: serde_json::Value = serde_json::from_str(text(&frames[0])).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["code"], "unauthenticated");
    assert_eq!(v["retry"], "fatal");
    assert!(v["message"].as_str().unwrap().contains("token"));
    assert!(
        net.peers[p].finished.contains(&id),
        "the broker finishes a refused stream"
    );
    assert_eq!(net.engine.stats().auths_refused, 1);
}

#[test]
fn refusal_is_uncoded_without_error_codes_and_tenant_must_match() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let id = net.open_bi(p);
    let token = net.token();
    // A valid token for t1, used for t2, from a client that offered flags but no features.
    let frames = net.exchange(
        p,
        id,
        &json_frame(&format!(
            r#"{{"type":"auth","tenant_id":"t2","token":"{token}","client_flags":63}}"#
        )),
    );
    let v: serde_json::Value = serde_json::from_str(text(&frames[0])).unwrap();
    assert_eq!(v["type"], "error");
    assert!(v.get("code").is_none() && v.get("retry").is_none(), "{v}");
}

#[test]
fn the_first_frame_must_be_auth() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let id = net.open_bi(p);
    let frames = net.exchange(p, id, &binary_publish(Some(1), None, "orders", &[b"x"]));
    let v: serde_json::Value = serde_json::from_str(text(&frames[0])).unwrap();
    assert_eq!(v["type"], "error");
    assert!(net.peers[p].finished.contains(&id));
    // The connection and its other streams are unaffected.
    let (_, answer) = net.auth_stream(p);
    assert_eq!(text(&answer), AUTH_OK_FOR_REAL_CLIENT);
}

#[test]
fn preauth_frames_are_limited_to_64_kib() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let id = net.open_bi(p);
    // A header announcing one byte over the limit is refused on the header alone.
    let mut header = b"FLX1\x00\x01\x00\x00".to_vec();
    header.extend_from_slice(&(64 * 1024 + 1u32).to_be_bytes());
    let frames = net.exchange(p, id, &header);
    let v: serde_json::Value = serde_json::from_str(text(&frames[0])).unwrap();
    assert_eq!(v["type"], "error");
    assert!(
        v["message"].as_str().unwrap().contains("exceeds the limit"),
        "{v}"
    );
    assert!(net.peers[p].finished.contains(&id));
}
