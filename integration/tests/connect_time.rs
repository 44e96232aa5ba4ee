//! Connect cost: the reference client opens 40 streams one after another at connect, each
//! waiting for its auth answer. The benchmark prints the exact figure; this test only
//! guards against a broker that makes it slow (the target is < 100 ms on loopback).

use std::time::{Duration, Instant};

use felix_integration::broker;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_sequential_auth_streams_connect_quickly() {
    let broker = broker().await;
    // Warm up TLS and the broker's first-connection paths.
    drop(broker.client().await);

    let started = Instant::now();
    let client = broker
        .client_with(|c| c.connect_streams = 40)
        .await
        .expect("connects");
    let elapsed = started.elapsed();
    println!("connect with 40 sequential auth streams: {elapsed:?}");
    assert!(elapsed < Duration::from_secs(1), "connect took {elapsed:?}");

    // All 40 streams were authenticated and serve requests (round-robin over them).
    for i in 0..40 {
        let key = format!("k{i}");
        client
            .cache_put(
                "default",
                "connect",
                &key,
                bytes::Bytes::from(key.clone()),
                None,
            )
            .await
            .unwrap();
    }
    broker.shutdown().await;
}
