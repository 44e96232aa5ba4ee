//! `/metrics` counts consumer-group requests by operation: a poll, two acks and a describe
//! move `felix_broker_group_operations_total` by exactly that.

use bytes::Bytes;
use felix_client::{Ack, PollOptions};
use felix_integration::durable_support::*;
use felix_integration::ops_support::{scrape, value};
use felix_integration::{start_broker, unique, within};
use felix_runtime_tokio::BrokerOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_requests_are_counted_by_operation() {
    let dir = TempDir::new("ops-metrics-groups");
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().unwrap());
    opts.storage_dir = Some(dir.path().to_path_buf());
    opts.durable = on_commit();
    opts.metrics_bind = Some("127.0.0.1:0".parse().unwrap());
    let broker = within(20, start_broker(opts)).await.unwrap();
    let http = broker.metrics_addr().expect("metrics endpoint enabled");
    let c = client(&broker).await;
    let stream = unique("metered-jobs");
    c.publish(
        "default",
        &stream,
        vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")],
        None,
        Ack::PerMessage,
    )
    .await
    .unwrap();

    let before = scrape(http);
    let group = c.group("default", &stream, 0, "workers");
    let polled = within(
        10,
        group.poll(&PollOptions {
            max_records: 10,
            ..PollOptions::default()
        }),
    )
    .await
    .unwrap();
    assert_eq!(polled.len(), 2);
    for r in &polled {
        group.ack(r.offset).await.unwrap();
    }
    group.describe().await.unwrap();

    let after = scrape(http);
    let delta = |op: &str| {
        let name = format!("felix_broker_group_operations_total{{op=\"{op}\"}}");
        value(&after, &name) - value(&before, &name)
    };
    assert_eq!(delta("poll"), 1.0);
    assert_eq!(delta("ack"), 2.0);
    assert_eq!(delta("describe"), 1.0);
    assert_eq!(delta("nack"), 0.0);
    broker.shutdown().await.expect("the broker stops cleanly");
}
