//! Durable streams through the engine, with the file ops performed on an in-memory disk:
//! acks that wait for the write (and under `on_commit` for the fsync, one fsync releasing
//! many), offsets on acks and events, replay from the log joined with live delivery, cursor
//! errors, and records surviving a restart.

use std::time::Duration;

use felix_engine::{DurableConfig, FileOpKind, FsyncPolicy};
use felix_proto::binary::{AckResult, EventBatch, PublishAck};
use felix_proto::{Flags, Frame};
use felix_testkit::*;
use quinn_proto::StreamId;
use serde_json::Value;

fn on_commit() -> DurableConfig {
    let mut durable_config = DurableConfig::default();
    durable_config.fsync = FsyncPolicy::OnCommit;
    durable_config
}

fn periodic() -> DurableConfig {
    let mut durable_config = DurableConfig::default();
    durable_config.fsync = FsyncPolicy::Periodic(Duration::from_millis(250));
    durable_config
}

fn is_sync(kind: &FileOpKind) -> bool {
    matches!(kind, FileOpKind::Sync { .. })
}

fn json(frame: &Frame) -> Value {
    serde_json::from_str(text(frame)).unwrap()
}

/// The ok acks in `frames`: (request id, offset).
fn acks(frames: &[Frame]) -> Vec<(u64, Option<u64>)> {
    frames
        .iter()
        .map(|f| {
            let ack = PublishAck::decode(f.flags, &f.payload).expect("a binary ack");
            match ack.result {
                AckResult::Ok { offset } => (ack.request_id, offset),
                AckResult::Err { message, .. } => panic!("publish refused: {message}"),
            }
        })
        .collect()
}

/// Events on an event stream: (offset, payload).
fn events(frames: &[Frame]) -> Vec<(Option<u64>, Vec<u8>)> {
    let mut out = Vec::new();
    for f in frames {
        let batch = EventBatch::decode(f.flags, &f.payload).expect("an event batch");
        for (i, e) in batch.events.iter().enumerate() {
            out.push((batch.base_offset.map(|b| b + i as u64), e.payload.to_vec()));
        }
    }
    out
}

/// Subscribes with `start` (a JSON value or none); returns the `subscribed` answer, the
/// event stream and the frames that came after its hello, or the refusal.
fn subscribe(
    net: &mut Net,
    p: usize,
    stream: &str,
    start: Option<&str>,
) -> Result<(Value, StreamId, Vec<Frame>), Value> {
    let (id, _) = net.auth_stream(p);
    let start = start.map_or(String::new(), |s| format!(r#","start":{s}"#));
    net.send(
        p,
        id,
        &json_frame(&format!(
            r#"{{"type":"subscribe","tenant_id":"t1","namespace":"default","stream":"{stream}"{start}}}"#
        )),
    );
    net.finish(p, id);
    net.run();
    let frames = net.read_frames(p, id);
    assert_eq!(frames.len(), 1, "one answer to subscribe");
    let answer = json(&frames[0]);
    if answer["type"] != "subscribed" {
        return Err(answer);
    }
    net.stop(p, id);
    net.run();
    let uni = net.take_uni(p);
    let mut frames = net.read_frames(p, uni);
    assert_eq!(json(&frames.remove(0))["type"], "event_stream_hello");
    Ok((answer, uni, frames))
}

fn payloads(prefix: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("{prefix}{i}").into_bytes())
        .collect()
}

/// Publishes each payload as its own acked batch (request ids from `first_id`) in one write.
fn publish_each(net: &mut Net, p: usize, sid: StreamId, first_id: u64, items: &[Vec<u8>]) {
    let mut wire = Vec::new();
    for (i, item) in items.iter().enumerate() {
        wire.extend(binary_publish(
            Some(first_id + i as u64),
            None,
            "orders",
            &[item],
        ));
    }
    net.send(p, sid, &wire);
    net.run();
}

#[test]
fn under_on_commit_acks_wait_for_the_fsync_and_carry_offsets() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (sid, auth_ok) = net.auth_stream(p);
    let features = json(&auth_ok)["server_features"].as_u64().unwrap();
    assert_ne!(
        features & 0x8_0000,
        0,
        "FEATURE_ACK_ON_COMMIT is advertised"
    );
    assert_ne!(
        features & 0x20_0000,
        0,
        "FEATURE_SUBSCRIPTION_LAGGED is advertised"
    );

    // The first publish opens the shard's log; let that finish before holding syncs.
    publish_each(&mut net, p, sid, 1, &[b"warm".to_vec()]);
    assert_eq!(acks(&net.read_frames(p, sid)), [(1, Some(0))]);

    net.hold = is_sync;
    publish_each(&mut net, p, sid, 2, &[b"a".to_vec(), b"b".to_vec()]);
    assert!(
        net.read_frames(p, sid).is_empty(),
        "no ack before the fsync completes"
    );
    assert!(net.pending_ops.iter().any(|op| is_sync(&op.kind)));
    net.release_held_ops();
    let got = acks(&net.read_frames(p, sid));
    assert_eq!(
        got,
        [(2, Some(1)), (3, Some(2))],
        "acked after the fsync, with offsets"
    );
    assert!(net.disk.files().values().any(|f| !f.is_empty()));
}

#[test]
fn one_fsync_releases_every_waiter_queued_behind_it() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (sid, _) = net.auth_stream(p);
    publish_each(&mut net, p, sid, 1, &[b"warm".to_vec()]);
    assert_eq!(acks(&net.read_frames(p, sid)).len(), 1);

    // One publish whose sync is held; forty more arrive while it is in flight. Their write
    // may go out beside that sync (it vouches only for writes done before it was issued).
    net.hold = is_sync;
    publish_each(&mut net, p, sid, 2, &[b"first".to_vec()]);
    let appends_before = net.disk.count("append");
    publish_each(&mut net, p, sid, 3, &payloads("queued-", 40));
    assert!(net.read_frames(p, sid).is_empty());
    let syncs_before = net.disk.count("sync");
    net.release_held_ops();

    let got = acks(&net.read_frames(p, sid));
    let ids: Vec<u64> = got.iter().map(|a| a.0).collect();
    assert_eq!(
        ids,
        (2..=42).collect::<Vec<_>>(),
        "every waiter answered, in order"
    );
    let offsets: Vec<u64> = got.iter().map(|a| a.1.unwrap()).collect();
    assert_eq!(offsets, (1..=41).collect::<Vec<_>>(), "contiguous offsets");
    // The held sync, then one write and one sync for all forty that queued behind it.
    assert_eq!(net.disk.count("sync") - syncs_before, 2, "group commit");
    assert_eq!(net.disk.count("append") - appends_before, 1);
}

fn is_append(kind: &FileOpKind) -> bool {
    matches!(kind, FileOpKind::Append { .. })
}

#[test]
fn periodic_acks_wait_for_the_write_and_carry_offsets() {
    let mut net = Net::durable(periodic(), |_| {});
    let p = net.connect(&[]);
    let (sid, _) = net.auth_stream(p);
    publish_each(&mut net, p, sid, 1, &[b"warm".to_vec()]);
    assert_eq!(acks(&net.read_frames(p, sid)), [(1, Some(0))]);

    net.hold = is_append;
    publish_each(&mut net, p, sid, 2, &[b"x".to_vec(), b"y".to_vec()]);
    assert!(
        net.read_frames(p, sid).is_empty(),
        "no ack before the write reaches the file"
    );
    assert!(net.pending_ops.iter().any(|op| is_append(&op.kind)));
    net.release_held_ops();
    assert_eq!(
        acks(&net.read_frames(p, sid)),
        [(2, Some(1)), (3, Some(2))],
        "acked after the write, with offsets, long before any periodic fsync"
    );
}

#[test]
fn ack_before_write_acks_on_arrival_without_offsets_unless_the_client_asks_for_commit_acks() {
    let mut config = periodic();
    config.ack_before_write = true;
    let mut net = Net::durable(config, |_| {});
    let p = net.connect(&[]);
    let (sid, _) = net.auth_stream(p);
    publish_each(&mut net, p, sid, 1, &[b"warm".to_vec()]);
    net.read_frames(p, sid);

    net.hold = |_| true;
    publish_each(&mut net, p, sid, 2, &[b"x".to_vec()]);
    assert_eq!(
        acks(&net.read_frames(p, sid)),
        [(2, None)],
        "acked before the write, so without an offset"
    );
    net.release_held_ops();

    // A client that offers FEATURE_ACK_ON_COMMIT gets its acks after the write.
    let token = net.token();
    let sid2 = net.open_bi(p);
    let auth = json_frame(&format!(
        r#"{{"type":"auth","tenant_id":"t1","token":"{token}","client_flags":8191,"client_features":{}}}"#,
        0x8_0000u64 | 0x8000
    ));
    let answer = net.exchange(p, sid2, &auth);
    assert_eq!(json(&answer[0])["type"], "auth_ok");
    net.hold = is_append;
    publish_each(&mut net, p, sid2, 7, &[b"y".to_vec()]);
    assert!(net.read_frames(p, sid2).is_empty(), "waits for the write");
    net.release_held_ops();
    assert_eq!(acks(&net.read_frames(p, sid2)), [(7, Some(2))]);
}

#[test]
fn ack_before_write_is_refused_with_on_commit() {
    for (fsync, ack_on_commit) in [(FsyncPolicy::OnCommit, false), (periodic().fsync, true)] {
        let mut config = DurableConfig::default();
        config.fsync = fsync;
        config.ack_on_commit = ack_on_commit;
        config.ack_before_write = true;
        let identity = tls().identity;
        let auth = felix_engine::AuthConfig::Dev { seed: [7; 32] };
        let mut engine_config = felix_engine::EngineConfig::new(identity, auth, [9; 32]);
        engine_config.durable = Some(config);
        let now = std::time::Instant::now();
        let Err(err) = felix_engine::Engine::new(engine_config, now, 1_767_225_600_000_000) else {
            panic!("ack_before_write with {fsync:?}, ack_on_commit {ack_on_commit} was accepted");
        };
        assert!(
            err.to_string()
                .contains("ack_before_write cannot be combined"),
            "{err}"
        );
    }
}

#[test]
fn ack_before_write_is_refused_on_a_cluster_node() {
    // A cluster's `quorum` publish would be answered on arrival, before any follower holds it.
    let mut config = periodic();
    config.ack_before_write = true;
    let identity = tls().identity;
    let auth = felix_engine::AuthConfig::Dev { seed: [7; 32] };
    let mut engine_config = felix_engine::EngineConfig::new(identity, auth, [9; 32]);
    engine_config.durable = Some(config);
    let peers = ["n1", "n2", "n3"]
        .iter()
        .enumerate()
        .map(|(i, id)| felix_engine::PeerAddr {
            node_id: (*id).into(),
            addr: format!("127.0.0.1:{}", 7101 + i).parse().unwrap(),
        })
        .collect();
    engine_config.cluster = Some(felix_engine::ClusterConfig::new("n1", peers));
    let now = std::time::Instant::now();
    let Err(err) = felix_engine::Engine::new(engine_config, now, 1_767_225_600_000_000) else {
        panic!("ack_before_write on a cluster node was accepted");
    };
    assert!(
        err.to_string()
            .contains("ack_before_write cannot be used on a cluster node"),
        "{err}"
    );
}

/// Everything the log holds after a restart over `disk`, from `earliest`: (offset, payload).
fn recovered(
    disk: felix_storage::memfs::MemFs,
    config: DurableConfig,
) -> Vec<(Option<u64>, Vec<u8>)> {
    let mut net = Net::durable_on(disk, config, |_| {});
    let s = net.connect(&[]);
    let (_, uni, mut frames) = subscribe(&mut net, s, "orders", Some(r#""earliest""#)).unwrap();
    net.run();
    frames.extend(net.read_frames(s, uni));
    events(&frames)
}

#[test]
fn a_process_crash_after_a_periodic_ack_never_loses_the_acked_record() {
    let mut net = Net::durable(periodic(), |_| {});
    let p = net.connect(&[]);
    let (sid, _) = net.auth_stream(p);
    publish_each(&mut net, p, sid, 1, &[b"warm".to_vec()]);
    let mut acked = acks(&net.read_frames(p, sid));
    // The next writes never reach the page cache: the process dies with them in flight.
    net.hold = is_append;
    publish_each(&mut net, p, sid, 2, &payloads("in-flight-", 3));
    acked.extend(acks(&net.read_frames(p, sid)));
    let mut disk = std::mem::take(&mut net.disk);
    drop(net);
    disk.crash(felix_storage::memfs::Crash::Process);

    let log = recovered(disk, periodic());
    let mut sent = vec![b"warm".to_vec()];
    sent.extend(payloads("in-flight-", 3));
    for (request_id, offset) in &acked {
        let payload = &sent[(*request_id - 1) as usize];
        assert!(
            log.iter()
                .any(|(o, p)| p == payload && (offset.is_none() || *o == *offset)),
            "request {request_id} was acked (offset {offset:?}) but {:?} is not in the recovered log {log:?}",
            String::from_utf8_lossy(payload)
        );
    }
    assert_eq!(acked, [(1, Some(0))], "only the written record was acked");
}

#[test]
fn live_events_carry_offsets_and_wait_for_durability() {
    let mut net = Net::durable(on_commit(), |_| {});
    let (s, p) = (net.connect(&[]), net.connect(&[]));
    let (answer, uni, _) = subscribe(&mut net, s, "orders", None).unwrap();
    assert_eq!(answer["start_offset"], 0);
    assert_eq!(answer["live_offset"], 0);

    let (sid, _) = net.auth_stream(p);
    net.hold = is_sync;
    publish_each(&mut net, p, sid, 1, &payloads("e", 3));
    assert!(
        net.read_frames(s, uni).is_empty(),
        "no subscriber sees a record before it is durable"
    );
    net.release_held_ops();
    let frames = net.read_frames(s, uni);
    assert!(frames
        .iter()
        .all(|f| f.flags.contains(Flags::EVENT_BATCH_OFFSETS)));
    let got = events(&frames);
    let want: Vec<_> = payloads("e", 3)
        .into_iter()
        .enumerate()
        .map(|(i, p)| (Some(i as u64), p))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn replay_from_earliest_and_from_an_offset_joins_live_with_no_gap_or_duplicate() {
    let mut net = Net::durable(periodic(), |c| {
        // Small replay frames, so the catch-up takes several reads and frames.
        c.event_batch_max_records = 7;
    });
    let (s1, s2, p) = (net.connect(&[]), net.connect(&[]), net.connect(&[]));
    let (sid, _) = net.auth_stream(p);
    let history = payloads("h", 50);
    publish_each(&mut net, p, sid, 1, &history);
    assert_eq!(net.read_frames(p, sid).len(), 50);

    let (a1, u1, f1) = subscribe(&mut net, s1, "orders", Some(r#""earliest""#)).unwrap();
    assert_eq!(
        (a1["start_offset"].as_u64(), a1["live_offset"].as_u64()),
        (Some(0), Some(50))
    );
    let (a2, u2, f2) = subscribe(&mut net, s2, "orders", Some(r#"{"offset":45}"#)).unwrap();
    assert_eq!(
        (a2["start_offset"].as_u64(), a2["live_offset"].as_u64()),
        (Some(45), Some(50))
    );

    // Live publishes while (and after) the replays run.
    let live = payloads("l", 10);
    publish_each(&mut net, p, sid, 100, &live);
    net.run();

    let all: Vec<Vec<u8>> = history.iter().chain(&live).cloned().collect();
    for (peer, uni, mut frames, from) in [(s1, u1, f1, 0usize), (s2, u2, f2, 45)] {
        frames.extend(net.read_frames(peer, uni));
        let got = events(&frames);
        let want: Vec<_> = all
            .iter()
            .enumerate()
            .skip(from)
            .map(|(i, p)| (Some(i as u64), p.clone()))
            .collect();
        assert_eq!(got, want, "subscriber from {from}");
    }
}

#[test]
fn records_appended_while_a_replay_reads_the_disk_arrive_once_and_in_order() {
    // No tail cache: every replay read is a file read, which the test holds.
    let durable = {
        let mut durable_config = periodic();
        durable_config.tail_cache_bytes = 0;
        durable_config
    };
    let mut net = Net::durable(durable, |c| c.event_batch_max_records = 5);
    let (s, p) = (net.connect(&[]), net.connect(&[]));
    let (sid, _) = net.auth_stream(p);
    publish_each(&mut net, p, sid, 1, &payloads("h", 12));
    assert_eq!(net.read_frames(p, sid).len(), 12);

    net.hold = |k| matches!(k, FileOpKind::Read { .. });
    let (a, uni, mut frames) = subscribe(&mut net, s, "orders", Some(r#""earliest""#)).unwrap();
    assert_eq!(a["live_offset"], 12);
    assert!(frames.is_empty(), "the replay waits for its read");
    // Written and released to live subscribers while the replay has not read anything.
    net.hold = |k| matches!(k, FileOpKind::Read { .. });
    publish_each(&mut net, p, sid, 100, &payloads("m", 6));
    assert_eq!(net.read_frames(p, sid).len(), 6);
    net.release_held_ops();
    publish_each(&mut net, p, sid, 200, &payloads("z", 3));
    frames.extend(net.read_frames(s, uni));

    let all: Vec<Vec<u8>> = [payloads("h", 12), payloads("m", 6), payloads("z", 3)].concat();
    let want: Vec<_> = all
        .into_iter()
        .enumerate()
        .map(|(i, p)| (Some(i as u64), p))
        .collect();
    assert_eq!(events(&frames), want);
    assert!(net.disk.count("read") >= 1, "the replay read the disk");
}

#[test]
fn cursor_errors_name_what_is_available() {
    let mut net = Net::durable(periodic(), |_| {});
    let (s, p) = (net.connect(&[]), net.connect(&[]));
    let (sid, _) = net.auth_stream(p);
    publish_each(&mut net, p, sid, 1, &payloads("x", 5));
    net.read_frames(p, sid);

    let e = subscribe(&mut net, s, "orders", Some(r#"{"offset":6}"#)).unwrap_err();
    assert_eq!(e["type"], "subscribe_cursor_error");
    assert_eq!(e["reason"], "in_future");
    assert_eq!(
        (e["requested"].as_u64(), e["available"].as_u64()),
        (Some(6), Some(5))
    );
    // The tail itself is fine: nothing to replay, live from there.
    let (a, _, _) = subscribe(&mut net, s, "orders", Some(r#"{"offset":5}"#)).unwrap();
    assert_eq!(a["start_offset"], 5);
}

#[test]
fn records_survive_a_restart_and_offsets_go_on() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (sid, _) = net.auth_stream(p);
    publish_each(&mut net, p, sid, 1, &payloads("r", 20));
    assert_eq!(acks(&net.read_frames(p, sid)).len(), 20);
    let disk = std::mem::take(&mut net.disk);
    drop(net);

    let mut net = Net::durable_on(disk, on_commit(), |_| {});
    let (s, p) = (net.connect(&[]), net.connect(&[]));
    let (a, uni, mut frames) = subscribe(&mut net, s, "orders", Some(r#""earliest""#)).unwrap();
    assert_eq!(
        (a["start_offset"].as_u64(), a["live_offset"].as_u64()),
        (Some(0), Some(20))
    );
    let (sid, _) = net.auth_stream(p);
    publish_each(&mut net, p, sid, 1, &[b"after".to_vec()]);
    assert_eq!(acks(&net.read_frames(p, sid)), [(1, Some(20))]);
    frames.extend(net.read_frames(s, uni));
    let got = events(&frames);
    let mut want: Vec<_> = payloads("r", 20)
        .into_iter()
        .enumerate()
        .map(|(i, p)| (Some(i as u64), p))
        .collect();
    want.push((Some(20), b"after".to_vec()));
    assert_eq!(got, want);
}

#[test]
fn a_corrupt_log_stops_the_engine_from_becoming_ready() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (sid, _) = net.auth_stream(p);
    publish_each(&mut net, p, sid, 1, &payloads("c", 3));
    assert_eq!(acks(&net.read_frames(p, sid)).len(), 3);
    let mut disk = std::mem::take(&mut net.disk);
    drop(net);
    // Flip a byte inside the first record (past the 32-byte segment header).
    let (path, bytes) = disk
        .files()
        .into_iter()
        .find(|(p, _)| p.ends_with(".seg"))
        .unwrap();
    let mut bytes = bytes.to_vec();
    bytes[40] ^= 0xff;
    disk.put_file(&path, bytes);

    let mut net = Net::new(|c| c.durable = Some(on_commit()));
    net.disk = disk;
    net.run();
    assert!(!net.engine.is_ready());
    let e = net.engine.storage_error().expect("refuses to start");
    assert!(e.contains(&path), "names the file: {e}");
}

#[test]
fn a_publish_to_a_new_stream_waits_for_its_log_to_open() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (sid, _) = net.auth_stream(p);
    // Hold everything: the log cannot even create its directory.
    net.hold = |_| true;
    publish_each(&mut net, p, sid, 1, &[b"one".to_vec()]);
    publish_each(&mut net, p, sid, 2, &[b"two".to_vec()]);
    assert!(net.read_frames(p, sid).is_empty());
    net.release_held_ops();
    assert_eq!(acks(&net.read_frames(p, sid)), [(1, Some(0)), (2, Some(1))]);
}

/// Sends one JSON request on `sid` and returns the single answer.
fn ask(net: &mut Net, p: usize, sid: StreamId, json_text: &str) -> Value {
    let frames = net.exchange(p, sid, &json_frame(json_text));
    assert_eq!(frames.len(), 1, "one answer to {json_text}");
    json(&frames[0])
}

fn put(net: &mut Net, p: usize, sid: StreamId, key: &str, value: &str, ttl_ms: Option<u64>) {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(value);
    let ttl = ttl_ms.map_or("null".to_owned(), |t| t.to_string());
    let answer = ask(
        net,
        p,
        sid,
        &format!(
            r#"{{"type":"cache_put","tenant_id":"t1","namespace":"default","cache":"c","key":"{key}","value":"{b64}","request_id":1,"ttl_ms":{ttl}}}"#
        ),
    );
    assert_eq!(answer["type"], "cache_ok", "{answer}");
}

fn get(net: &mut Net, p: usize, sid: StreamId, kind: &str, key: &str) -> Option<String> {
    use base64::Engine as _;
    let answer = ask(
        net,
        p,
        sid,
        &format!(
            r#"{{"type":"{kind}","tenant_id":"t1","namespace":"default","cache":"c","key":"{key}","request_id":2}}"#
        ),
    );
    assert_eq!(answer["type"], "cache_value", "{answer}");
    answer["value"].as_str().map(|v| {
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(v).unwrap()).unwrap()
    })
}

#[test]
fn cache_writes_wait_for_durability_and_reads_come_from_the_log() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (sid, _) = net.auth_stream(p);
    assert_eq!(
        get(&mut net, p, sid, "cache_get", "k"),
        None,
        "no such cache yet"
    );
    put(&mut net, p, sid, "k", "v1", None);

    net.hold = is_sync;
    let frames = net.exchange(
        p,
        sid,
        &json_frame(r#"{"type":"cache_put","tenant_id":"t1","namespace":"default","cache":"c","key":"k","value":"djI=","request_id":9,"ttl_ms":null}"#),
    );
    assert!(
        frames.is_empty(),
        "a cache write is acknowledged once durable"
    );
    net.release_held_ops();
    assert_eq!(json(&net.read_frames(p, sid)[0])["type"], "cache_ok");

    assert_eq!(
        get(&mut net, p, sid, "cache_get", "k").as_deref(),
        Some("v2")
    );
    assert_eq!(
        get(&mut net, p, sid, "cache_delete", "k").as_deref(),
        Some("v2")
    );
    assert_eq!(get(&mut net, p, sid, "cache_get", "k"), None);
    assert_eq!(get(&mut net, p, sid, "cache_delete", "k"), None);
}

#[test]
fn cache_values_and_absolute_expiries_survive_a_restart() {
    let t0 = 1_767_225_600_000_000u64;
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (sid, _) = net.auth_stream(p);
    put(&mut net, p, sid, "forever", "a", None);
    put(&mut net, p, sid, "minute", "b", Some(60_000));
    put(&mut net, p, sid, "brief", "c", Some(10_000));
    put(&mut net, p, sid, "gone", "d", None);
    assert_eq!(
        get(&mut net, p, sid, "cache_delete", "gone").as_deref(),
        Some("d")
    );
    put(&mut net, p, sid, "forever", "a2", None);
    let disk = std::mem::take(&mut net.disk);
    drop(net);

    // Thirty seconds later by the wall clock.
    let mut net = Net::durable_on_at(t0 + 30_000_000, disk, on_commit(), |_| {});
    net.client_keep_alive = Some(Duration::from_secs(2));
    let p = net.connect(&[]);
    let (sid, _) = net.auth_stream(p);
    assert_eq!(
        get(&mut net, p, sid, "cache_get", "forever").as_deref(),
        Some("a2")
    );
    assert_eq!(
        get(&mut net, p, sid, "cache_get", "minute").as_deref(),
        Some("b")
    );
    assert_eq!(
        get(&mut net, p, sid, "cache_get", "brief"),
        None,
        "expired at +10 s"
    );
    assert_eq!(
        get(&mut net, p, sid, "cache_get", "gone"),
        None,
        "the delete held"
    );
    // Past the minute: the expiry was absolute, not restarted by the restart.
    net.advance(Duration::from_secs(31));
    assert_eq!(get(&mut net, p, sid, "cache_get", "minute"), None);
    assert_eq!(
        get(&mut net, p, sid, "cache_get", "forever").as_deref(),
        Some("a2")
    );
}

#[test]
fn retention_removes_whole_old_segments_and_moves_earliest() {
    let durable = {
        let mut durable_config = periodic();
        durable_config.segment_max_bytes = 256;
        durable_config.retention_bytes = Some(600);
        durable_config.retention_check_interval = Duration::from_secs(1);
        durable_config
    };
    let mut net = Net::durable(durable, |_| {});
    net.client_keep_alive = Some(Duration::from_secs(2));
    let (s, p) = (net.connect(&[]), net.connect(&[]));
    let (sid, _) = net.auth_stream(p);
    publish_each(&mut net, p, sid, 1, &payloads("retained-record-", 40));
    assert_eq!(net.read_frames(p, sid).len(), 40);
    let segments = |net: &Net| {
        net.disk
            .files()
            .keys()
            .filter(|k| k.ends_with(".seg"))
            .count()
    };
    let before = segments(&net);
    assert!(before > 3, "small segments roll over: {before}");
    net.advance(Duration::from_secs(2));
    let after = segments(&net);
    assert!(
        after < before,
        "whole segments removed: {before} -> {after}"
    );

    let (a, _, frames) = subscribe(&mut net, s, "orders", Some(r#""earliest""#)).unwrap();
    let earliest = a["start_offset"].as_u64().unwrap();
    assert!(earliest > 0, "earliest is the oldest retained record");
    let got = events(&frames);
    assert_eq!(got.first().map(|e| e.0), Some(Some(earliest)));
    assert_eq!(got.last().map(|e| e.0), Some(Some(39)));
    let e = subscribe(&mut net, s, "orders", Some(r#"{"offset":0}"#)).unwrap_err();
    assert_eq!(e["reason"], "too_old");
    assert_eq!(e["available"].as_u64(), Some(earliest));
}

#[test]
fn an_overwritten_cache_is_compacted_and_keeps_its_values() {
    use base64::Engine as _;
    let durable = {
        let mut durable_config = on_commit();
        durable_config.segment_max_bytes = 16 * 1024;
        durable_config
    };
    let mut net = Net::durable(durable.clone(), |_| {});
    let p = net.connect(&[]);
    let (sid, _) = net.auth_stream(p);
    let cache_bytes = |net: &Net| -> usize {
        net.disk
            .files()
            .iter()
            .filter(|(k, _)| k.starts_with("caches/"))
            .map(|(_, v)| v.len())
            .sum()
    };
    put(&mut net, p, sid, "stable", "kept", None);
    let mut peak = 0;
    for i in 0..400 {
        let value = format!("{i:04}{}", "x".repeat(4000));
        let b64 = base64::engine::general_purpose::STANDARD.encode(&value);
        let answer = ask(
            &mut net,
            p,
            sid,
            &format!(
                r#"{{"type":"cache_put","tenant_id":"t1","namespace":"default","cache":"c","key":"hot","value":"{b64}","request_id":1,"ttl_ms":null}}"#
            ),
        );
        assert_eq!(answer["type"], "cache_ok");
        peak = peak.max(cache_bytes(&net));
    }
    let now = cache_bytes(&net);
    let written = 400 * 4000;
    // Without compaction the log would hold all of it; it saws between ~0 and the 1 MiB
    // threshold instead.
    assert!(
        peak <= (1 << 20) + 16 * 1024 && now < written / 2,
        "compaction dropped superseded puts: {written} written, at most {peak} held, {now} now"
    );
    let last = get(&mut net, p, sid, "cache_get", "hot").unwrap();
    assert!(last.starts_with("0399"));
    assert_eq!(
        get(&mut net, p, sid, "cache_get", "stable").as_deref(),
        Some("kept")
    );

    let disk = std::mem::take(&mut net.disk);
    drop(net);
    let mut net = Net::durable_on(disk, durable, |_| {});
    let p = net.connect(&[]);
    let (sid, _) = net.auth_stream(p);
    assert!(get(&mut net, p, sid, "cache_get", "hot")
        .unwrap()
        .starts_with("0399"));
    assert_eq!(
        get(&mut net, p, sid, "cache_get", "stable").as_deref(),
        Some("kept")
    );
}

#[test]
fn a_lagging_subscriber_that_asked_for_it_ends_with_subscription_lagged() {
    let mut net = Net::durable(periodic(), |c| c.subscriber_queue_capacity = 4);
    net.client_stream_window = 4 * 1024;
    let slow = net.connect(&[]);
    net.client_stream_window = 1024 * 1024;
    let p = net.connect(&[]);
    // The real client's offer includes FEATURE_SUBSCRIPTION_LAGGED and 0x0020.
    let (_, uni, _) = subscribe(&mut net, slow, "orders", None).unwrap();
    let (sid, _) = net.auth_stream(p);
    for i in 0..40u64 {
        publish_each(&mut net, p, sid, i + 1, &[vec![b'.'; 1024]]);
    }
    let mut frames = Vec::new();
    for _ in 0..100 {
        let got = net.read_frames(slow, uni);
        net.run();
        if got.is_empty() {
            break;
        }
        frames.extend(got);
    }
    let last = frames.pop().expect("frames");
    let lagged = json(&last);
    assert_eq!(lagged["type"], "subscription_lagged");
    let delivered = events(&frames);
    let offsets: Vec<u64> = delivered.iter().map(|e| e.0.unwrap()).collect();
    assert_eq!(
        offsets,
        (0..offsets.len() as u64).collect::<Vec<_>>(),
        "no gap before it"
    );
    assert_eq!(
        lagged["resume_from"].as_u64(),
        Some(offsets.len() as u64),
        "resume from the first record not delivered"
    );
    assert!(
        net.peers[slow].finished.contains(&uni),
        "the stream ends after it"
    );
}

#[test]
fn a_graceful_stop_syncs_stream_and_cache_logs_whatever_the_mode() {
    for fsync in [
        FsyncPolicy::None,
        FsyncPolicy::Periodic(Duration::from_secs(3600)),
    ] {
        let mut net = Net::durable(
            {
                let mut durable_config = DurableConfig::default();
                durable_config.fsync = fsync;
                durable_config
            },
            |_| {},
        );
        let p = net.connect(&[]);
        let (sid, _) = net.auth_stream(p);
        publish_each(&mut net, p, sid, 1, &[b"record".to_vec()]);
        assert_eq!(acks(&net.read_frames(p, sid)).len(), 1);
        put(&mut net, p, sid, "k", "v", None);
        let syncs_before = net.disk.count("sync");
        net.engine.shutdown(net.now);
        net.run();
        assert!(net.engine.storage_idle(), "{fsync:?}: every log synced");
        assert_eq!(
            net.disk.count("sync") - syncs_before,
            2,
            "{fsync:?}: one sync for the stream's log, one for the cache's"
        );
    }
}
