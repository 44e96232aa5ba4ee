//! A settle's `attempts` names the delivery it settles. The wire carries a 64-bit number and
//! a delivery count is 32 bits: a number past that range names no delivery and is answered
//! `stale_claim`, where a truncating cast once read 2^32 + 1 as delivery 1 and took it.

use felix_engine::{DurableConfig, FsyncPolicy};
use felix_testkit::*;
use quinn_proto::StreamId;

const ADDR: &str =
    r#""tenant_id":"t1","namespace":"default","stream":"jobs","shard":0,"group":"g""#;

fn ask(net: &mut Net, p: usize, sid: StreamId, body: &str) -> Vec<String> {
    net.send(p, sid, &json_frame(body));
    net.run();
    net.read_frames(p, sid)
        .iter()
        .map(|f| text(f).to_owned())
        .collect()
}

#[test]
fn attempts_past_the_delivery_count_range_are_stale_not_truncated() {
    let mut durable = DurableConfig::default();
    durable.fsync = FsyncPolicy::OnCommit;
    let mut net = Net::durable(durable, |_| {});
    let p = net.connect(&[]);
    let (publisher, _) = net.auth_stream(p);
    net.send(
        p,
        publisher,
        &binary_publish(Some(1), None, "jobs", &[b"work"]),
    );
    net.run();
    let (s, _) = net.auth_stream(p);
    assert_eq!(
        ask(
            &mut net,
            p,
            s,
            &format!(r#"{{"type":"group_poll",{ADDR},"max_records":1,"request_id":1}}"#)
        ),
        vec![
            r#"{"type":"group_records","records":[{"offset":0,"payload":"d29yaw==","attempts":1}],"request_id":1}"#
        ]
    );
    let wrapped = (1u64 << 32) + 1;
    // (The session answers settle errors without the request id.)
    let stale = |_rid: u64| {
        format!(
            r#"{{"type":"error","message":"the claim on offset 0 from delivery {wrapped} no longer stands","code":"stale_claim","retry":"fatal"}}"#
        )
    };
    assert_eq!(
        ask(
            &mut net,
            p,
            s,
            &format!(
                r#"{{"type":"group_extend",{ADDR},"offset":0,"attempts":{wrapped},"extend_ms":1000,"request_id":2}}"#
            )
        ),
        vec![stale(2)]
    );
    assert_eq!(
        ask(
            &mut net,
            p,
            s,
            &format!(
                r#"{{"type":"group_nack",{ADDR},"offset":0,"attempts":{wrapped},"request_id":3}}"#
            )
        ),
        vec![stale(3)]
    );
    // The claim stands: the delivery it was made with still settles it.
    assert_eq!(
        ask(
            &mut net,
            p,
            s,
            &format!(r#"{{"type":"group_nack",{ADDR},"offset":0,"attempts":1,"request_id":4}}"#)
        ),
        vec![r#"{"type":"cache_ok","request_id":4}"#]
    );
}
