//! Deleting a stream (an operator command): subscriptions end with `stream_deleted` for a
//! client that offered FEATURE_STREAM_DELETED and just finish for one that did not; the
//! stream comes back afresh; a durable stream's files are retired and stay gone.

use std::time::Duration;

use felix_engine::{DeleteStreamError, DurableConfig, FsyncPolicy};
use felix_proto::binary::{AckResult, EventBatch, PublishAck};
use felix_proto::frame::Frame;
use felix_proto::{ErrorCode, RetryClass};
use felix_testkit::*;
use quinn_proto::StreamId;

/// The real client's auth, with or without its extended feature word (0xF holds
/// STREAM_DELETED 0x2). Without it the client also lacks the EXTENDED marker.
fn auth(token: &str, extended: bool) -> Vec<u8> {
    if extended {
        return real_client_auth("t1", token);
    }
    let features = REAL_CLIENT_FEATURES & !0x8000_0000;
    json_frame(&format!(
        r#"{{"type":"auth","tenant_id":"t1","token":"{token}","client_flags":{REAL_CLIENT_FLAGS},"client_features":{features}}}"#
    ))
}

/// Subscribes from `start`; returns the subscription id and its event stream after the hello.
fn subscribe(net: &mut Net, p: usize, extended: bool, stream: &str) -> (u64, StreamId) {
    let token = net.token();
    let id = net.open_bi(p);
    let answer = net.exchange(p, id, &auth(&token, extended));
    assert!(text(&answer[0]).contains("auth_ok"), "{}", text(&answer[0]));
    net.send(
        p,
        id,
        &json_frame(&format!(
            r#"{{"type":"subscribe","tenant_id":"t1","namespace":"default","stream":"{stream}"}}"#
        )),
    );
    net.finish(p, id);
    net.run();
    let frames = net.read_frames(p, id);
    let answer: serde_json::Value = serde_json::from_str(text(&frames[0])).unwrap();
    assert_eq!(answer["type"], "subscribed", "{answer}");
    net.stop(p, id);
    net.run();
    let uni = net.take_uni(p);
    let hello = net.read_frames(p, uni);
    assert!(text(&hello[0]).contains("event_stream_hello"));
    (answer["subscription_id"].as_u64().unwrap(), uni)
}

/// Publishes acked batches of one record each; returns their offsets.
fn publish(
    net: &mut Net,
    p: usize,
    sid: StreamId,
    first_id: u64,
    items: &[&[u8]],
) -> Vec<Option<u64>> {
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
    net.read_frames(p, sid)
        .iter()
        .map(
            |f| match PublishAck::decode(f.flags, &f.payload).unwrap().result {
                AckResult::Ok { offset } => offset,
                AckResult::Err { message, .. } => panic!("publish refused: {message}"),
            },
        )
        .collect()
}

fn payloads(frames: &[Frame]) -> Vec<Vec<u8>> {
    frames
        .iter()
        .flat_map(|f| {
            EventBatch::decode(f.flags, &f.payload)
                .unwrap()
                .events
                .iter()
                .map(|e| e.payload.to_vec())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn the_feature_is_advertised_in_the_extended_word() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let (_, answer) = net.auth_stream(p);
    let v: serde_json::Value = serde_json::from_str(text(&answer)).unwrap();
    assert_eq!(v["server_features_hi"].as_u64().unwrap() & 0x2, 0x2, "{v}");
}

#[test]
fn subscriptions_end_with_stream_deleted_only_for_clients_that_offered_it() {
    let mut net = Net::new(|_| {});
    let (with, without, publisher) = (net.connect(&[]), net.connect(&[]), net.connect(&[]));
    let (id_with, uni_with) = subscribe(&mut net, with, true, "orders");
    let (_, uni_without) = subscribe(&mut net, without, false, "orders");
    let (pid, _) = net.auth_stream(publisher);
    publish(&mut net, publisher, pid, 1, &[b"before"]);

    net.engine
        .delete_stream(net.now, "t1", "default", "orders")
        .unwrap();
    net.run();

    // Everything queued first, then the one frame, then FIN.
    let frames = net.read_frames(with, uni_with);
    assert_eq!(payloads(&frames[..1]), [b"before".to_vec()]);
    assert_eq!(frames.len(), 2);
    assert_eq!(
        text(&frames[1]),
        format!(r#"{{"type":"stream_deleted","subscription_id":{id_with}}}"#)
    );
    assert!(net.peers[with].finished.contains(&uni_with));
    // Byte for byte as before: the event, then FIN, nothing else.
    let frames = net.read_frames(without, uni_without);
    assert_eq!(frames.len(), 1);
    assert_eq!(payloads(&frames), [b"before".to_vec()]);
    assert!(net.peers[without].finished.contains(&uni_without));

    assert_eq!(
        net.engine.usage().streams,
        0,
        "a deleted stream is not counted"
    );
    // Gone: a second delete finds nothing; a new subscriber sees only new records.
    assert_eq!(
        net.engine.delete_stream(net.now, "t1", "default", "orders"),
        Err(DeleteStreamError::NotFound)
    );
    let (_, uni) = subscribe(&mut net, with, true, "orders");
    publish(&mut net, publisher, pid, 2, &[b"after"]);
    assert_eq!(payloads(&net.read_frames(with, uni)), [b"after".to_vec()]);
}

#[test]
fn a_token_needs_stream_manage_on_the_stream() {
    let mut net = Net::new(|_| {});
    let p = net.connect(&[]);
    let (pid, _) = net.auth_stream(p);
    publish(&mut net, p, pid, 1, &[b"x"]);
    let now = net.now;
    let err = net
        .engine
        .delete_stream_as(now, "not-a-token", "t1", "default", "orders");
    assert!(
        matches!(err, Err(DeleteStreamError::Unauthorized(_))),
        "{err:?}"
    );
    let token = net.token();
    // The dev token is for tenant t1: another tenant's stream does not authenticate.
    let err = net
        .engine
        .delete_stream_as(now, &token, "t2", "default", "orders");
    assert!(
        matches!(err, Err(DeleteStreamError::Unauthorized(_))),
        "{err:?}"
    );
    assert_eq!(
        net.engine
            .delete_stream_as(now, &token, "t1", "default", "nope"),
        Err(DeleteStreamError::NotFound)
    );
    assert_eq!(
        net.engine
            .delete_stream_as(now, &token, "t1", "default", "orders"),
        Ok(())
    );
}

/// Directories of a tombstone still on the disk (none once a delete is finished).
fn tombstone_dirs(disk: &felix_storage::memfs::MemFs) -> Vec<&String> {
    disk.dirs()
        .iter()
        .filter(|d| d.contains(".deleted."))
        .collect()
}

fn on_commit() -> DurableConfig {
    let mut durable_config = DurableConfig::default();
    durable_config.fsync = FsyncPolicy::OnCommit;
    durable_config
}

#[test]
fn a_durable_stream_is_retired_and_starts_again_from_offset_zero() {
    let mut net = Net::durable(on_commit(), |_| {});
    let (s, p) = (net.connect(&[]), net.connect(&[]));
    let (sid, uni) = subscribe(&mut net, s, true, "orders");
    let (pid, _) = net.auth_stream(p);
    assert_eq!(
        publish(&mut net, p, pid, 1, &[b"a", b"b", b"c"]),
        [Some(0), Some(1), Some(2)]
    );
    net.engine
        .delete_stream(net.now, "t1", "default", "orders")
        .unwrap();
    // A publish right away waits for the rename, then lands in a new log.
    assert_eq!(publish(&mut net, p, pid, 4, &[b"new"]), [Some(0)]);
    let frames = net.read_frames(s, uni);
    assert_eq!(
        payloads(&frames[..frames.len() - 1]),
        [b"a", b"b", b"c"].map(|b| b.to_vec())
    );
    assert_eq!(
        text(frames.last().unwrap()),
        format!(r#"{{"type":"stream_deleted","subscription_id":{sid}}}"#)
    );
    net.advance(Duration::from_millis(10));
    // The old files are gone, and so are the tombstone's directories, down to its own.
    let old: Vec<_> = net
        .disk
        .files()
        .into_keys()
        .filter(|f| f.contains(".deleted."))
        .collect();
    assert!(old.is_empty(), "{old:?}");
    assert_eq!(tombstone_dirs(&net.disk), Vec::<&String>::new());
    assert!(
        net.disk.has_dir("streams/t1/default/orders/0"),
        "the new log's"
    );

    // After a restart the stream holds only what came after the delete.
    let disk = std::mem::take(&mut net.disk);
    drop(net);
    let mut net = Net::durable_on(disk, on_commit(), |_| {});
    let (s, p) = (net.connect(&[]), net.connect(&[]));
    let (pid, _) = net.auth_stream(p);
    assert_eq!(publish(&mut net, p, pid, 1, &[b"next"]), [Some(1)]);
    let _ = s;
}

#[test]
fn a_tombstone_left_by_a_crash_is_finished_at_startup_and_never_opened() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (pid, _) = net.auth_stream(p);
    publish(&mut net, p, pid, 1, &[b"a", b"b"]);
    let mut disk = std::mem::take(&mut net.disk);
    drop(net);
    // A crash right after the rename: the tombstone still holds the shard's files. One more
    // shard's directory is already empty, as a crash part way through the removal leaves it.
    disk.plant_dir("streams/t1/default/.deleted.1.1/7");
    let moved: Vec<(String, Vec<u8>)> = disk
        .files()
        .iter()
        .filter(|(f, _)| f.starts_with("streams/t1/default/orders/"))
        .map(|(f, d)| (f.replace("/orders/", "/.deleted.1.1/"), d.to_vec()))
        .collect();
    assert!(!moved.is_empty());
    disk.retain_files(|f| !f.starts_with("streams/t1/default/orders/"));
    disk.retain_dirs(|d| !d.starts_with("streams/t1/default/orders"));
    for (f, d) in moved {
        let dir = f.rsplit_once('/').unwrap().0.to_owned();
        disk.plant_dir(dir.rsplit_once('/').unwrap().0);
        disk.plant_dir(&dir);
        disk.plant_file(&f, d);
    }

    let mut net = Net::durable_on(disk, on_commit(), |_| {});
    assert!(
        !net.disk.files().keys().any(|f| f.contains(".deleted.")),
        "startup removed the tombstone's files: {:?}",
        net.disk.files().keys().collect::<Vec<_>>()
    );
    assert_eq!(tombstone_dirs(&net.disk), Vec::<&String>::new());
    assert!(net.disk.has_dir("streams/t1/default"));
    let p = net.connect(&[]);
    let (pid, _) = net.auth_stream(p);
    assert_eq!(publish(&mut net, p, pid, 1, &[b"fresh"]), [Some(0)]);
}

#[test]
fn a_groups_tombstone_left_by_a_crash_is_removed_at_startup() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (pid, _) = net.auth_stream(p);
    publish(&mut net, p, pid, 1, &[b"a"]);
    let mut disk = std::mem::take(&mut net.disk);
    drop(net);
    // A crash after the groups directory's rename: its tombstone holds a group's log. A live
    // stream's groups directory beside it is left alone.
    let tomb = "groups/t1/default/.deleted.1.2/0/workers/00000000000000000000.seg";
    let live = "groups/t1/default/orders/0/workers/00000000000000000000.seg";
    for f in [tomb, live] {
        let mut dir = f;
        while let Some((parent, _)) = dir.rsplit_once('/') {
            disk.plant_dir(parent);
            dir = parent;
        }
        disk.plant_file(f, b"group log bytes".to_vec());
    }

    let net = Net::durable_on(disk, on_commit(), |_| {});
    let files = net.disk.files();
    let files: Vec<&String> = files.keys().collect();
    assert!(
        !files.iter().any(|f| f.contains(".deleted.")),
        "startup removed the groups tombstone's files: {files:?}"
    );
    assert!(files.iter().any(|f| *f == live), "{files:?}");
    assert_eq!(tombstone_dirs(&net.disk), Vec::<&String>::new());
    assert!(net.disk.has_dir("groups/t1/default/orders/0/workers"));
}

#[test]
fn a_publish_during_the_rename_waits_for_it_and_never_sees_the_old_log() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (pid, _) = net.auth_stream(p);
    assert_eq!(
        publish(&mut net, p, pid, 1, &[b"a", b"b"]),
        [Some(0), Some(1)]
    );
    net.hold = |k| matches!(k, felix_engine::FileOpKind::Rename { .. });
    net.engine
        .delete_stream(net.now, "t1", "default", "orders")
        .unwrap();
    net.run();
    assert_eq!(
        publish(&mut net, p, pid, 3, &[b"new"]),
        [],
        "stalled on the rename"
    );
    assert!(
        net.disk
            .files()
            .keys()
            .any(|f| f.starts_with("streams/t1/default/orders/")),
        "the old files are still in place"
    );
    net.release_held_ops();
    let acks: Vec<_> = net
        .read_frames(p, pid)
        .iter()
        .map(
            |f| match PublishAck::decode(f.flags, &f.payload).unwrap().result {
                AckResult::Ok { offset } => offset,
                AckResult::Err { message, .. } => panic!("publish refused: {message}"),
            },
        )
        .collect();
    assert_eq!(acks, [Some(0)], "a new log, from offset 0");
}

/// Every answer on `sid`, decoded: (request id, offset) or the refusal.
fn answers(net: &mut Net, p: usize, sid: StreamId) -> Vec<PublishAck> {
    net.read_frames(p, sid)
        .iter()
        .map(|f| PublishAck::decode(f.flags, &f.payload).expect("a binary ack"))
        .collect()
}

fn ok(request_id: u64, offset: u64) -> PublishAck {
    PublishAck {
        request_id,
        result: AckResult::Ok {
            offset: Some(offset),
        },
        owner: None,
    }
}

#[test]
fn deleting_a_stream_ends_every_answer_waiting_for_its_write_with_not_found() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (pid, _) = net.auth_stream(p);
    assert_eq!(publish(&mut net, p, pid, 1, &[b"a"]), [Some(0)]);
    let mut warm = binary_publish(Some(10), None, "other", &[b"x"]);
    assert_eq!(
        {
            net.send(p, pid, &std::mem::take(&mut warm));
            net.run();
            answers(&mut net, p, pid)
        },
        [ok(10, 0)]
    );

    // Two publishes wait for their fsync; a publish to another stream queues behind them.
    net.hold = |k| matches!(k, felix_engine::FileOpKind::Sync { .. });
    let mut wire = binary_publish(Some(2), None, "orders", &[b"b"]);
    wire.extend(binary_publish(Some(3), None, "orders", &[b"c"]));
    wire.extend(binary_publish(Some(4), None, "other", &[b"y"]));
    net.send(p, pid, &wire);
    net.run();
    assert!(answers(&mut net, p, pid).is_empty(), "all wait for fsyncs");

    net.engine
        .delete_stream(net.now, "t1", "default", "orders")
        .unwrap();
    net.run();
    let deleted = |request_id| PublishAck {
        request_id,
        result: AckResult::Err {
            message: "the stream was deleted before the write became durable".into(),
            code: Some((ErrorCode::NotFound, RetryClass::RetryAfter)),
            detail: None,
        },
        owner: None,
    };
    assert_eq!(
        answers(&mut net, p, pid),
        [deleted(2), deleted(3)],
        "the deleted stream's answers end at once; the other stream's still waits"
    );

    net.release_held_ops();
    assert_eq!(answers(&mut net, p, pid), [ok(4, 1)], "then it is answered");
    // A publish after the deletion gets its normal answer, from a new log.
    assert_eq!(publish(&mut net, p, pid, 5, &[b"new"]), [Some(0)]);
}

#[test]
fn under_periodic_an_answer_waiting_for_its_write_ends_when_the_stream_is_deleted() {
    // Under periodic the answer waits for the write, not an fsync; the deletion ends it too.
    let mut durable_config = DurableConfig::default();
    durable_config.fsync = FsyncPolicy::Periodic(Duration::from_millis(250));
    let mut net = Net::durable(durable_config, |_| {});
    let p = net.connect(&[]);
    let (pid, _) = net.auth_stream(p);
    assert_eq!(publish(&mut net, p, pid, 1, &[b"a"]), [Some(0)]);

    net.hold = |k| matches!(k, felix_engine::FileOpKind::Append { path, .. } if path.starts_with("streams/"));
    net.send(p, pid, &binary_publish(Some(2), None, "orders", &[b"b"]));
    net.run();
    assert!(net.read_frames(p, pid).is_empty(), "waits for its write");
    net.engine
        .delete_stream(net.now, "t1", "default", "orders")
        .unwrap();
    net.run();
    let got = answers(&mut net, p, pid);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].request_id, 2);
    assert!(
        matches!(
            got[0].result,
            AckResult::Err {
                code: Some((ErrorCode::NotFound, _)),
                ..
            }
        ),
        "{got:?}"
    );
}

const GROUP: &str =
    r#""tenant_id":"t1","namespace":"default","stream":"orders","shard":0,"group":"g""#;

fn group_request(net: &mut Net, p: usize, sid: StreamId, body: &str) -> Vec<serde_json::Value> {
    net.send(p, sid, &json_frame(body));
    net.run();
    net.read_frames(p, sid)
        .iter()
        .map(|f| serde_json::from_str(text(f)).unwrap())
        .collect()
}

#[test]
fn a_deleted_streams_groups_go_with_it() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (pid, _) = net.auth_stream(p);
    let (gid, _) = net.auth_stream(p);
    publish(&mut net, p, pid, 1, &[b"a", b"b"]);
    let poll = |id: u64, wait: u64| {
        format!(
            r#"{{"type":"group_poll",{GROUP},"max_records":8,"wait_ms":{wait},"request_id":{id}}}"#
        )
    };
    let got = group_request(&mut net, p, gid, &poll(1, 0));
    assert_eq!(got[0]["records"].as_array().unwrap().len(), 2, "{got:?}");
    for (i, offset) in [(2, 0), (3, 1)] {
        let ack = format!(r#"{{"type":"group_ack",{GROUP},"offset":{offset},"request_id":{i}}}"#);
        group_request(&mut net, p, gid, &ack);
    }
    // A poll waiting on the stream is answered when it goes.
    assert!(group_request(&mut net, p, gid, &poll(4, 5000)).is_empty());
    net.engine
        .delete_stream(net.now, "t1", "default", "orders")
        .unwrap();
    net.run();
    let answers: Vec<serde_json::Value> = net
        .read_frames(p, gid)
        .iter()
        .map(|f| serde_json::from_str(text(f)).unwrap())
        .collect();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["type"], "error", "{answers:?}");
    assert!(
        answers[0].to_string().contains("the stream was deleted"),
        "{answers:?}"
    );
    assert!(
        !net.disk
            .files()
            .keys()
            .any(|f| f.starts_with("groups/t1/default/orders/")),
        "the group log moved away"
    );
    // Both tombstones, the stream's and its groups', are gone with their directories.
    assert_eq!(tombstone_dirs(&net.disk), Vec::<&String>::new());

    // The recreated stream's group starts afresh: offset 0 of the new log is delivered,
    // not skipped by the old cursor.
    assert_eq!(publish(&mut net, p, pid, 3, &[b"new"]), [Some(0)]);
    let got = group_request(&mut net, p, gid, &poll(5, 0));
    assert_eq!(got[0]["records"][0]["offset"], 0, "{got:?}");
    assert_eq!(got[0]["records"][0]["payload"], "bmV3", "{got:?}");
}

/// A cache's (or its counters') tombstone left by a crash during a cluster-wide cache delete
/// is removed at startup and never opened as a log, like a stream's.
#[test]
fn a_cache_tombstone_left_by_a_crash_is_removed_at_startup() {
    let mut net = Net::durable(on_commit(), |_| {});
    let mut disk = std::mem::take(&mut net.disk);
    drop(net);
    for root in ["caches", "counters"] {
        let dir = format!("{root}/t1/default/.deleted.1.3/0");
        disk.plant_dir(&format!("{root}/t1/default"));
        disk.plant_dir(&format!("{root}/t1/default/.deleted.1.3"));
        disk.plant_dir(&dir);
        disk.plant_file(&format!("{dir}/00000000000000000000.seg"), b"old".to_vec());
    }
    let net = Net::durable_on(disk, on_commit(), |_| {});
    assert!(
        !net.disk.files().keys().any(|f| f.contains(".deleted.")),
        "startup removed the tombstones' files: {:?}",
        net.disk.files().keys().collect::<Vec<_>>()
    );
    assert_eq!(tombstone_dirs(&net.disk), Vec::<&String>::new());
}
