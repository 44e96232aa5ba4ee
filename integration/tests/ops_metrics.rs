//! `/metrics` counts what clients did: a publish, a subscription's delivery, cache puts,
//! hits, misses and deletes, accepted and refused auths, and errors by code — each moved by
//! exactly the amount done. `/livez` and `/readyz` answer on the same endpoint.

use bytes::Bytes;
use felix_client::{Ack, Client, Start};
use felix_integration::ops_support::{get, scrape, value};
use felix_integration::{client_config, next_event, start_broker, unique, within};
use felix_runtime_tokio::BrokerOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_move_by_what_clients_did() {
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().unwrap());
    opts.metrics_bind = Some("127.0.0.1:0".parse().unwrap());
    let broker = within(10, start_broker(opts)).await.unwrap();
    let http = broker.metrics_addr().expect("metrics endpoint enabled");
    assert_eq!(get(http, "/livez").unwrap().0, 200);
    assert_eq!(get(http, "/readyz").unwrap().0, 200);
    assert_eq!(get(http, "/nowhere").unwrap().0, 404);

    let before = scrape(http);
    assert_eq!(value(&before, "felix_broker_ready"), 1.0);
    assert_eq!(value(&before, "felix_broker_connections_open"), 0.0);

    let config = client_config(
        broker.local_addr(),
        broker.ca_cert_pem().as_bytes().to_vec(),
        broker.dev_token().unwrap(),
    );
    let client = within(10, Client::connect(config.clone())).await.unwrap();
    let stream = unique("metrics");
    let mut sub = within(10, client.subscribe("default", &stream, Start::Latest))
        .await
        .unwrap();
    let payloads: Vec<Bytes> = vec![
        Bytes::from_static(b"a"),
        Bytes::from_static(b"bb"),
        Bytes::from_static(b"cccc"),
    ];
    within(
        10,
        client.publish("default", &stream, payloads, None, Ack::PerBatch),
    )
    .await
    .unwrap();
    for _ in 0..3 {
        next_event(&mut sub).await;
    }
    let cache = unique("metrics-cache");
    client
        .cache_put("default", &cache, "k", Bytes::from_static(b"value"), None)
        .await
        .unwrap();
    assert!(client
        .cache_get("default", &cache, "k")
        .await
        .unwrap()
        .is_some());
    assert!(client
        .cache_get("default", &cache, "absent")
        .await
        .unwrap()
        .is_none());
    assert!(client
        .cache_delete("default", &cache, "k")
        .await
        .unwrap()
        .is_some());

    // A token that does not verify: one refused auth, one `unauthenticated` error.
    let mut bad = config.clone();
    bad.token = "not-a-token".into();
    assert!(within(15, Client::connect(bad)).await.is_err());

    let after = scrape(http);
    let delta = |name: &str| value(&after, name) - value(&before, name);
    assert_eq!(
        delta("felix_broker_published_records_total{encoding=\"binary\"}"),
        3.0
    );
    assert_eq!(
        delta("felix_broker_published_bytes_total{encoding=\"binary\"}"),
        7.0
    );
    assert_eq!(
        delta("felix_broker_published_records_total{encoding=\"json\"}"),
        0.0
    );
    assert_eq!(
        delta("felix_broker_json_publishes_total{frame=\"publish\"}"),
        0.0
    );
    // The three records were published in one request, so they reach the subscriber as
    // one batch.
    assert_eq!(delta("felix_broker_deliveries_total"), 1.0);
    assert_eq!(delta("felix_broker_subscriptions_total"), 1.0);
    assert_eq!(value(&after, "felix_broker_subscriptions_open"), 1.0);
    assert_eq!(
        delta("felix_broker_cache_operations_total{op=\"put\"}"),
        1.0
    );
    assert_eq!(
        delta("felix_broker_cache_operations_total{op=\"get_hit\"}"),
        1.0
    );
    assert_eq!(
        delta("felix_broker_cache_operations_total{op=\"get_miss\"}"),
        1.0
    );
    assert_eq!(
        delta("felix_broker_cache_operations_total{op=\"delete\"}"),
        1.0
    );
    assert!(delta("felix_broker_auth_total{code=\"ok\"}") >= 1.0);
    assert_eq!(
        delta("felix_broker_auth_total{code=\"unauthenticated\"}"),
        1.0
    );
    assert_eq!(
        delta("felix_broker_errors_total{code=\"unauthenticated\"}"),
        1.0
    );
    assert!(value(&after, "felix_broker_connections_open") >= 1.0);
    assert!(value(&after, "felix_broker_streams_open") >= 1.0);
    assert_eq!(
        value(&after, "felix_broker_log_bytes"),
        0.0,
        "in memory: no logs"
    );

    client.close().await;
    within(10, broker.shutdown()).await.unwrap();
    assert!(
        get(http, "/livez").is_none(),
        "the endpoint stops with the broker"
    );
}
