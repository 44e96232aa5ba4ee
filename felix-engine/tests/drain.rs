//! Graceful drain on the engine: `drain` refuses new connections, `auth` on new streams and
//! new requests with `draining` [retry]; a publish held for its fsync is still acknowledged,
//! with its offset, and `is_drained` holds only once it has been; the metrics count the
//! refusals.

use felix_engine::{DurableConfig, FileOpKind, FsyncPolicy};
use felix_proto::binary::{AckResult, PublishAck};
use felix_proto::{ErrorCode, Frame};
use felix_testkit::*;

/// What one binary ack said: an offset (if any) or an error code (if any).
type AckOutcome = Result<Option<u64>, Option<ErrorCode>>;

/// (request id, outcome) of each binary ack.
fn acks(frames: &[Frame]) -> Vec<(u64, AckOutcome)> {
    frames
        .iter()
        .map(|f| {
            let ack = PublishAck::decode(f.flags, &f.payload).expect("a binary ack");
            let result = match ack.result {
                AckResult::Ok { offset } => Ok(offset),
                AckResult::Err { code, .. } => Err(code.map(|(c, _)| c)),
            };
            (ack.request_id, result)
        })
        .collect()
}

#[test]
fn draining_answers_what_is_owed_and_refuses_new_work() {
    let durable = {
        let mut durable_config = DurableConfig::default();
        durable_config.fsync = FsyncPolicy::OnCommit;
        durable_config
    };
    let mut net = Net::durable(durable, |_| {});
    let p = net.connect(&[]);
    let (sid, _) = net.auth_stream(p);
    // The first publish opens the shard's log; then syncs are held.
    net.send(p, sid, &binary_publish(Some(1), None, "orders", &[b"warm"]));
    net.run();
    assert_eq!(acks(&net.read_frames(p, sid)), [(1, Ok(Some(0)))]);
    net.hold = |k| matches!(k, FileOpKind::Sync { .. });
    net.send(p, sid, &binary_publish(Some(2), None, "orders", &[b"owed"]));
    net.run();
    assert!(net.read_frames(p, sid).is_empty(), "held until its fsync");

    net.engine.drain(net.now);
    net.run();
    assert!(
        !net.engine.is_drained(),
        "an answer is owed while the fsync is out"
    );
    net.release_held_ops();
    assert_eq!(
        acks(&net.read_frames(p, sid)),
        [(2, Ok(Some(1)))],
        "answered, not dropped"
    );
    assert!(net.engine.is_drained());

    // A new request on the open stream: refused, coded, retryable.
    net.send(p, sid, &binary_publish(Some(3), None, "orders", &[b"late"]));
    net.run();
    assert_eq!(
        acks(&net.read_frames(p, sid)),
        [(3, Err(Some(ErrorCode::Draining)))]
    );
    // `auth` on a new stream: refused `draining`, the stream ends.
    let fresh = net.open_bi(p);
    let frames = net.exchange(p, fresh, &real_client_auth("t1", &net.token()));
    assert_eq!(frames.len(), 1);
    assert!(
        text(&frames[0]).contains(r#""code":"draining""#),
        "{}",
        text(&frames[0])
    );
    // A new connection: refused in the handshake.
    let q = net.start_connect(&[]);
    net.run();
    assert!(!net.peers[q].connected);
    assert!(net.engine.is_drained());

    let m = net.engine.metrics();
    assert_eq!(m.errors.get("draining"), Some(&2));

    net.engine.shutdown(net.now);
    net.run();
    assert!(net.engine.storage_idle(), "every log synced");
    match &net.peers[p].lost {
        Some(quinn_proto::ConnectionError::ApplicationClosed(c)) => {
            assert_eq!(c.error_code.into_inner(), 0, "closed with code 0")
        }
        other => panic!("expected the broker's close, got {other:?}"),
    }
}
