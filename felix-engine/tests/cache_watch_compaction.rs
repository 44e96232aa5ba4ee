//! A cache watch whose client stops reading while it catches up must not keep its cache
//! log from compacting: once a pass is due, the watch ends with `cache_watch_lagged` after
//! the frames it holds, naming the first offset it did not get, and the pass runs.

use std::time::Duration;

use felix_engine::{DurableConfig, FsyncPolicy};
use felix_proto::Frame;
use felix_testkit::*;
use serde_json::Value;

fn json(frame: &Frame) -> Value {
    serde_json::from_str(text(frame)).unwrap()
}

/// `n` puts of the key `k` with a 300-byte value, one request each, answered once durable.
fn overwrite(net: &mut Net, p: usize, n: u64, first_rid: u64) {
    let (sid, _) = net.auth_stream(p);
    let value = "A".repeat(400); // 300 bytes in base64
    let mut wire = Vec::new();
    for rid in first_rid..first_rid + n {
        wire.extend(json_frame(&format!(
            r#"{{"type":"cache_put","tenant_id":"t1","namespace":"default","cache":"c","key":"k","value":"{value}","request_id":{rid}}}"#
        )));
    }
    net.send(p, sid, &wire);
    let mut answers = 0;
    for _ in 0..10_000 {
        if answers == n as usize {
            return;
        }
        net.advance(Duration::from_millis(50));
        answers += net.read_frames(p, sid).len();
    }
    panic!("{answers} of {n} puts answered");
}

#[test]
fn a_watch_that_stops_reading_its_replay_ends_lagged_when_compaction_must_pass_it() {
    let mut durable = DurableConfig::default();
    durable.fsync = FsyncPolicy::Periodic(Duration::from_millis(250));
    durable.segment_max_bytes = 64 * 1024;
    let mut net = Net::durable(durable, |_| {});
    // The event stream takes a few frames, then QUIC holds the rest in the broker.
    net.client_stream_window = 8 * 1024;
    let p = net.connect(&[]);

    // 2000 records of about 330 bytes: under the 1 MiB below which nothing is compacted.
    overwrite(&mut net, p, 2000, 1);
    let (w, _) = net.auth_stream(p);
    let started = net.exchange(
        p,
        w,
        &json_frame(
            r#"{"type":"cache_watch","tenant_id":"t1","namespace":"default","cache":"c","key":"k","from_offset":0}"#,
        ),
    );
    assert_eq!(
        text(&started[0]),
        r#"{"type":"cache_watch_started","subscription_id":1,"resume_offset":2000}"#
    );
    let uni = net.take_uni(p);
    let mut frames = net.read_frames(p, uni);
    assert_eq!(
        text(&frames.remove(0)),
        r#"{"type":"event_stream_hello","subscription_id":1}"#
    );

    // 2000 more take the log past 1 MiB and four times its one live value: a pass is due,
    // and the watch, which has stopped reading, must not hold it off.
    overwrite(&mut net, p, 2000, 2001);
    for _ in 0..10_000 {
        let more = net.read_frames(p, uni);
        frames.extend(more);
        if net.peers[p].finished.contains(&uni) {
            break;
        }
        net.advance(Duration::from_millis(10));
    }
    assert!(net.peers[p].finished.contains(&uni), "the watch ended");
    let last = json(frames.last().unwrap());
    assert_eq!(last["type"], "cache_watch_lagged", "{last}");
    let resume = last["resume_from"].as_u64().unwrap();
    // What came before it is the replay, gapless from 0 up to the resume offset.
    let offsets: Vec<u64> = frames[..frames.len() - 1]
        .iter()
        .map(|f| json(f)["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, (0..resume).collect::<Vec<_>>());
    assert!(
        (256..2000).contains(&resume),
        "ended mid-replay, its read-ahead full: {resume}"
    );

    // The pass ran: history at the resume offset is gone, so a re-watch from it is a
    // resnapshot of the current value (the newest put, offset 3999), then live.
    let (w2, _) = net.auth_stream(p);
    let again = net.exchange(
        p,
        w2,
        &json_frame(&format!(
            r#"{{"type":"cache_watch","tenant_id":"t1","namespace":"default","cache":"c","key":"k","from_offset":{resume}}}"#
        )),
    );
    assert_eq!(
        text(&again[0]),
        r#"{"type":"cache_watch_started","subscription_id":2,"resume_offset":4000,"resnapshot":true}"#
    );
    let uni2 = net.take_uni(p);
    let mut got = Vec::new();
    for _ in 0..100 {
        got.extend(net.read_frames(p, uni2));
        if got.len() >= 2 {
            break;
        }
        net.advance(Duration::from_millis(10));
    }
    assert_eq!(got.len(), 2, "the hello and the one current value");
    assert_eq!(json(&got[1])["offset"], 3999);
}
