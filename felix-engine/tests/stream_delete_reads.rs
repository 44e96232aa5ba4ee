//! A `stream_read` whose file read is still out when its stream is deleted is answered with
//! an error at once, never left waiting for a read that will not land.

use felix_engine::{DurableConfig, FileOpKind, FsyncPolicy};
use felix_testkit::*;
use serde_json::Value;

fn on_commit() -> DurableConfig {
    let mut durable_config = DurableConfig::default();
    durable_config.fsync = FsyncPolicy::OnCommit;
    durable_config
}

#[test]
fn a_read_in_flight_on_a_deleted_stream_is_answered_with_an_error() {
    let mut net = Net::durable(on_commit(), |_| {});
    let p = net.connect(&[]);
    let (pid, _) = net.auth_stream(p);
    net.send(
        p,
        pid,
        &binary_publish(Some(1), None, "orders", &[b"a", b"b"]),
    );
    net.run();
    assert_eq!(net.read_frames(p, pid).len(), 1, "the publish is acked");

    // After a restart the tail is on disk only, so a read is a file op, held here.
    let disk = std::mem::take(&mut net.disk);
    drop(net);
    let mut net = Net::durable_on(disk, on_commit(), |_| {});
    let p = net.connect(&[]);
    let (rid, _) = net.auth_stream(p);
    net.hold = |k| matches!(k, FileOpKind::Read { .. });
    net.send(
        p,
        rid,
        &json_frame(r#"{"type":"stream_read","tenant_id":"t1","namespace":"default","stream":"orders","shard":0,"from":0,"request_id":9}"#),
    );
    net.run();
    assert!(net.read_frames(p, rid).is_empty(), "the read is out");

    net.engine
        .delete_stream(net.now, "t1", "default", "orders")
        .unwrap();
    net.run();
    let answers: Vec<Value> = net
        .read_frames(p, rid)
        .iter()
        .map(|f| serde_json::from_str(text(f)).unwrap())
        .collect();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["type"], "error", "{answers:?}");
    assert!(
        answers[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("deleted")),
        "{answers:?}"
    );
    // The held read lands late and changes nothing.
    net.release_held_ops();
    assert!(net.read_frames(p, rid).is_empty());
}
