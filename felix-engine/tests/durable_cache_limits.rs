//! The limits on what durable caches and counters hold, each at its edge through the engine
//! with the file ops on an in-memory disk: the number of cache logs and counter logs, the
//! keys over all of them, and their live bytes. Past each one the answer is exactly one
//! `limit_exceeded` [fatal] error frame, nothing is written, and the stream goes on.

use std::time::Duration;

use felix_engine::{DurableConfig, EngineConfig, FsyncPolicy};
use felix_storage::cache_log::put_entry_bytes;
use felix_storage::counter_log::add_entry_bytes;
use felix_testkit::*;
use quinn_proto::StreamId;

fn durable(tweak: impl FnOnce(&mut EngineConfig)) -> Net {
    let mut d = DurableConfig::default();
    d.fsync = FsyncPolicy::Periodic(Duration::from_millis(250));
    Net::durable(d, tweak)
}

/// Sends one request and returns its one answer's text.
fn ask(net: &mut Net, p: usize, s: StreamId, cache: &str, body: &str, rid: u64) -> String {
    let frames = net.exchange(
        p,
        s,
        &json_frame(&format!(
            r#"{{"tenant_id":"t1","namespace":"default","cache":"{cache}","request_id":{rid},{body}}}"#
        )),
    );
    assert_eq!(frames.len(), 1, "one answer to {body}");
    text(&frames[0]).to_owned()
}

fn put(key: &str, value_b64: &str) -> String {
    format!(r#""type":"cache_put","key":"{key}","value":"{value_b64}""#)
}

fn add(key: &str) -> String {
    format!(r#""type":"counter_add","key":"{key}","delta":1"#)
}

fn ok(rid: u64) -> String {
    format!(r#"{{"type":"cache_ok","request_id":{rid}}}"#)
}

/// The error a refused write is answered with. (The session answers cache errors without
/// the request's `request_id`; `rid` names the request for the reader.)
fn refused(message: &str, _rid: u64) -> String {
    format!(r#"{{"type":"error","message":"{message}","code":"limit_exceeded","retry":"fatal"}}"#)
}

#[test]
fn cache_and_counter_logs_at_and_past_their_limits() {
    let mut net = durable(|c| {
        c.durable_cache_max_logs = 2;
        c.counter_max_logs = 1;
    });
    let p = net.connect(&[]);
    let (s, _) = net.auth_stream(p);
    assert_eq!(ask(&mut net, p, s, "a", &put("k", "eA=="), 1), ok(1));
    assert_eq!(ask(&mut net, p, s, "b", &put("k", "eA=="), 2), ok(2));
    let full = "the broker holds 2 durable caches: one more exceeds durable_cache_max_logs (2)";
    assert_eq!(
        ask(&mut net, p, s, "c", &put("k", "eA=="), 3),
        refused(full, 3)
    );
    // A watch would create the log too; a put_if as well.
    let v = ask(&mut net, p, s, "c", r#""type":"cache_watch","key":"k""#, 4);
    assert_eq!(v, refused(full, 4));
    assert_eq!(
        ask(
            &mut net,
            p,
            s,
            "c",
            r#""type":"cache_put_if","key":"k","value":"eA==","condition":"absent""#,
            5
        ),
        refused(full, 5)
    );
    // The caches already there take writes; the refused one was never created.
    assert_eq!(ask(&mut net, p, s, "a", &put("k2", "eA=="), 6), ok(6));
    assert_eq!(
        ask(&mut net, p, s, "c", r#""type":"cache_get","key":"k""#, 7),
        r#"{"type":"cache_value","tenant_id":"t1","namespace":"default","cache":"c","key":"k","value":null,"request_id":7}"#
    );

    assert_eq!(
        ask(&mut net, p, s, "a", &add("n"), 8),
        r#"{"type":"counter_value","value":1,"request_id":8}"#
    );
    assert_eq!(
        ask(&mut net, p, s, "b", &add("n"), 9),
        refused(
            "the broker holds 1 counter logs: one more exceeds counter_max_logs (1)",
            9
        )
    );
    assert_eq!(
        ask(&mut net, p, s, "a", &add("n"), 10),
        r#"{"type":"counter_value","value":2,"request_id":10}"#
    );
}

#[test]
fn keys_over_every_durable_cache_and_counter_at_and_past_the_limit() {
    let mut net = durable(|c| c.durable_cache_max_keys = 3);
    let p = net.connect(&[]);
    let (s, _) = net.auth_stream(p);
    assert_eq!(ask(&mut net, p, s, "a", &put("k1", "eA=="), 1), ok(1));
    assert_eq!(ask(&mut net, p, s, "b", &put("k2", "eA=="), 2), ok(2));
    assert_eq!(
        ask(&mut net, p, s, "a", &add("n1"), 3),
        r#"{"type":"counter_value","value":1,"request_id":3}"#
    );
    let full =
        "durable caches and counters hold 3 keys: a new one exceeds durable_cache_max_keys (3)";
    assert_eq!(
        ask(&mut net, p, s, "a", &put("k3", "eA=="), 4),
        refused(full, 4)
    );
    assert_eq!(ask(&mut net, p, s, "a", &add("n2"), 5), refused(full, 5));
    // Writes to keys already held create none.
    assert_eq!(ask(&mut net, p, s, "a", &put("k1", "eQ=="), 6), ok(6));
    assert_eq!(
        ask(&mut net, p, s, "a", &add("n1"), 7),
        r#"{"type":"counter_value","value":2,"request_id":7}"#
    );
    // A delete makes room once it is applied (its answer waits for that).
    assert_eq!(
        ask(
            &mut net,
            p,
            s,
            "b",
            r#""type":"cache_delete","key":"k2""#,
            8
        ),
        r#"{"type":"cache_value","tenant_id":"t1","namespace":"default","cache":"b","key":"k2","value":"eA==","request_id":8}"#
    );
    assert_eq!(ask(&mut net, p, s, "a", &put("k3", "eA=="), 9), ok(9));
}

#[test]
fn live_bytes_over_every_durable_cache_and_counter_at_and_past_the_limit() {
    // Two keys of two bytes with ten-byte values, and one counter, fill it exactly.
    let max = 2 * put_entry_bytes(2, 10) + add_entry_bytes(1);
    let mut net = durable(|c| c.durable_cache_max_total_bytes = max);
    let p = net.connect(&[]);
    let (s, _) = net.auth_stream(p);
    let ten = "MDEyMzQ1Njc4OQ=="; // "0123456789"
    let nine = "MDEyMzQ1Njc4"; // "012345678"
    let eleven = "MDEyMzQ1Njc4OUE="; // "0123456789A"
    assert_eq!(ask(&mut net, p, s, "a", &put("k1", ten), 1), ok(1));
    assert_eq!(ask(&mut net, p, s, "b", &put("k2", ten), 2), ok(2));
    assert_eq!(
        ask(&mut net, p, s, "a", &add("n"), 3),
        r#"{"type":"counter_value","value":1,"request_id":3}"#
    );
    // Full to the byte: anything that grows it is refused, with the total it would reach.
    let grown = |n: u64| {
        format!(
            "durable caches and counters would hold {n} bytes, past durable_cache_max_total_bytes ({max})"
        )
    };
    assert_eq!(
        ask(&mut net, p, s, "a", &put("k3", ""), 4),
        refused(&grown(max + put_entry_bytes(2, 0)), 4)
    );
    assert_eq!(
        ask(&mut net, p, s, "a", &put("k1", eleven), 5),
        refused(&grown(max + 1), 5)
    );
    assert_eq!(
        ask(&mut net, p, s, "b", &add("m"), 6),
        refused(&grown(max + add_entry_bytes(1)), 6)
    );
    // An overwrite of the same size, or a smaller one, goes through.
    assert_eq!(ask(&mut net, p, s, "a", &put("k1", ten), 7), ok(7));
    assert_eq!(ask(&mut net, p, s, "a", &put("k1", nine), 8), ok(8));
    // Now one byte is free.
    assert_eq!(ask(&mut net, p, s, "b", &put("k2", eleven), 9), ok(9));
    assert_eq!(
        ask(&mut net, p, s, "b", &put("k2", "MDEyMzQ1Njc4OUFC"), 10),
        refused(&grown(max + 1), 10)
    );
}
