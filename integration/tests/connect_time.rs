//! Connect: the reference client opens 40 streams one after another at connect, each
//! waiting for its auth answer. How long that takes is a benchmark figure
//! (`cargo run --release -p felix-integration --example bench -- connect` prints it; the
//! target is < 100 ms on loopback), not a pass/fail line: a wall-clock bound here failed
//! under load and passed for a slow broker on a fast machine. This test checks the outcome.

use felix_integration::broker;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_sequential_auth_streams_all_connect_and_serve() {
    let broker = broker().await;
    let client = broker
        .client_with(|c| c.connect_streams = 40)
        .await
        .expect("connects");

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
