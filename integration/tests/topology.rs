//! Routing answers from a lone broker: `topology` names no other broker, `stream_shards`
//! and `shard_owners` agree on the width, and the in-memory broker does not claim the
//! log-backed features.

use felix_client::{Offer, Start};
use felix_integration::{broker_with, declare_stream, unique};
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
    assert!(features.contains(Features::IDEMPOTENT_PRODUCER));
    assert!(
        !features.contains(Features::STREAM_READ) && !features.contains(Features::ATOMIC_COMMIT),
        "an in-memory broker has no log to read or commit to"
    );
    let view = c.topology().await.unwrap();
    assert!(view.brokers.is_empty(), "no other broker to name");
    assert_eq!(c.stream_shards("default", &stream).await.unwrap(), 4);
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
