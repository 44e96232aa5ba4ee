//! Routing answers from a lone broker: `topology` names no other broker, `stream_shards`
//! and `shard_owners` agree on the width, and the in-memory broker does not claim the
//! log-backed features.

use felix_client::{Offer, Start};
use felix_integration::{broker_with, declare_stream, unique, within, TENANT};
use felix_proto::message::{self, Message, ShardKind};
use felix_proto::Features;

#[tokio::test]
async fn a_lone_broker_answers_routing_questions_truthfully() {
    let stream = unique("wide");
    let declared = stream.clone();
    let broker = broker_with(move |c| declare_stream(c, "default", &declared, 4)).await;
    // The offer the real client makes: every feature it knows.
    let c = broker
        .client_with(|c| c.offer = Offer::reference_client())
        .await
        .unwrap();
    let features = c.capabilities().features();
    assert!(features.contains(Features::TOPOLOGY));
    assert!(features.contains(Features::SHARD_OWNERS));
    assert!(features.contains(Features::IDEMPOTENT_PRODUCER));
    assert!(
        !features.contains(Features::STREAM_READ) && !features.contains(Features::ATOMIC_COMMIT),
        "an in-memory broker has no log to read or commit to"
    );
    let view = c.topology().await.unwrap();
    assert!(view.brokers.is_empty(), "no other broker to name");
    assert_eq!(c.stream_shards("default", &stream).await.unwrap(), 4);
    // The client has no call for `shard_owners`, so it goes as a hand-made frame on one of
    // its authenticated streams.
    let ask = Message::ShardOwners(message::ShardOwners {
        tenant_id: TENANT.into(),
        namespace: "default".into(),
        name: stream.clone(),
        kind: ShardKind::Stream,
        request_id: 5,
    });
    let mut raw = c.open_raw_stream(true).await.unwrap();
    raw.send(ask.to_frame().to_bytes()).await.unwrap();
    let frame = within(10, raw.recv_frame())
        .await
        .unwrap()
        .expect("an answer");
    let Message::ShardOwnersView(view) = Message::decode(&frame.payload).unwrap() else {
        panic!("expected shard_owners_view")
    };
    assert_eq!(view.request_id, 5);
    let shards: Vec<u64> = view.owners.iter().map(|o| o.shard).collect();
    assert_eq!(
        shards,
        [0, 1, 2, 3],
        "one entry per shard, as wide as stream_shards"
    );
    for o in &view.owners {
        // Outside a cluster the broker serves every shard itself.
        assert_eq!(o.node_id, None);
        assert_eq!(o.generation, Some(0));
        assert_eq!(o.unavailable, None);
    }
    raw.finish();
    // A stream this broker has never seen gets the default width when first used.
    assert_eq!(c.stream_shards("default", &unique("new")).await.unwrap(), 1);
    // Reading needs a log: an in-memory broker says so rather than answering empty.
    let err = c
        .stream_read("default", &stream, 0, 0, None, None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("in-memory"), "{err}");
    let _sub = c
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    c.close().await;
    broker.shutdown().await;
}
