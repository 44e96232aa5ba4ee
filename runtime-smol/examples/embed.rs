//! A real Felix broker inside a smol program (no tokio anywhere): real QUIC on an ephemeral loopback port,
//! durable logs in a directory, a client that publishes, subscribes and uses the cache, then
//! a clean shutdown by awaiting the handle.
//!
//! `cargo run -p felix-runtime-smol --example embed`; the test at the end runs the same
//! code under `cargo test`.

use std::error::Error;

use bytes::Bytes;
use felix_client::{Ack, Client, ClientConfig, Start, SubscriptionItem};
use felix_runtime_smol::BrokerOptions;

/// Starts a broker storing under `dir`, uses it, and shuts it down; returns what the
/// subscriber received.
pub async fn run(dir: &std::path::Path) -> Result<Vec<Bytes>, Box<dyn Error>> {
    // The builder: defaults everywhere, loopback port 0, logs under `dir`.
    let broker = felix_runtime_smol::start(
        BrokerOptions::ephemeral()
            .storage_dir(dir)
            .metrics_bind("127.0.0.1:0".parse()?),
    )
    .await?;
    println!(
        "broker on {} (metrics on {:?})",
        broker.local_addr(),
        broker.metrics_addr()
    );

    // Dev mode: the handle carries the CA to trust and a full-permission token for `t1`.
    let mut config = ClientConfig::new(
        broker.local_addr(),
        broker.ca_cert_pem().as_bytes().to_vec(),
        "t1",
        broker.dev_token().expect("dev mode"),
    );
    config.runtime = felix_client::Runtime::Smol;
    let client = Client::connect(config).await?;
    let mut sub = client.subscribe("app", "orders", Start::Latest).await?;
    let offset = client
        .publish(
            "app",
            "orders",
            vec![Bytes::from("order-1"), Bytes::from("order-2")],
            None,
            Ack::PerBatch,
        )
        .await?;
    println!("published at offset {offset:?}");
    let mut received = Vec::new();
    while received.len() < 2 {
        match sub.next().await? {
            SubscriptionItem::Event(event) => received.push(event.payload),
            SubscriptionItem::End(end) => return Err(format!("subscription ended: {end:?}").into()),
        }
    }
    client
        .cache_put("app", "sessions", "user-1", Bytes::from("token"), None)
        .await?;
    let cached = client.cache_get("app", "sessions", "user-1").await?;
    assert_eq!(cached.as_deref(), Some(&b"token"[..]));
    client.close().await;

    // Awaiting the handle closes every connection with code 0 and syncs the logs
    // (dropping it stops the broker too, without waiting).
    broker.await?;
    Ok(received)
}

fn main() -> Result<(), Box<dyn Error>> {
    let dir = std::env::temp_dir().join(format!("felix-embed-smol-{}", std::process::id()));
    let received = smol::block_on(run(&dir))?;
    println!("received {received:?}");
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

// The test lives here, in the example, rather than in `tests/`: cargo hands integration tests
// a binary's path (`CARGO_BIN_EXE_*`) but nothing for an example, running `cargo run
// --example` from inside a test would contend for the build lock, and compiling this file
// into a test by path is what the tidy test forbids. `test = true` on the `[[example]]` in
// Cargo.toml makes `cargo test` build this file with the test harness and run the test
// below, so the code a reader runs is the code the suite checks.
#[cfg(test)]
mod tests {
    /// On smol (broker and client), with no tokio runtime anywhere.
    #[test]
    fn the_embedding_example_runs_on_smol() {
        let dir =
            std::env::temp_dir().join(format!("felix-embed-test-smol-{}", std::process::id()));
        let received = smol::block_on(async {
            let deadline = async {
                smol::Timer::after(std::time::Duration::from_secs(30)).await;
                Err("timed out".into())
            };
            smol::future::or(super::run(&dir), deadline).await
        })
        .expect("the example runs in time");
        assert_eq!(received, vec!["order-1", "order-2"]);
        assert!(std::fs::read_dir(&dir).unwrap().next().is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
