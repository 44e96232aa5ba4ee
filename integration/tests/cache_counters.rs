//! Counters end to end over real QUIC with our client: an add answers the sum including
//! it, a counter never written reads as absent (not zero), concurrent adds all count, and
//! the sums survive a broker restart on the same storage.

mod durable_support;

use durable_support::*;
use felix_integration::unique;

#[tokio::test]
async fn counters_answer_their_sums_and_survive_a_restart() {
    let dir = TempDir::new("counters");
    let cache = unique("stats");
    let broker = start(dir.path(), on_commit()).await;
    let c = client(&broker).await;
    assert_eq!(
        c.counter_get("default", &cache, "hits").await.unwrap(),
        None
    );
    assert_eq!(
        c.counter_add("default", &cache, "hits", 5).await.unwrap(),
        5
    );
    assert_eq!(
        c.counter_add("default", &cache, "hits", -2).await.unwrap(),
        3
    );
    assert_eq!(
        c.counter_add("default", &cache, "zero", 0).await.unwrap(),
        0
    );
    assert_eq!(
        c.counter_get("default", &cache, "zero").await.unwrap(),
        Some(0)
    );
    // A counter and a cache value may share a key and are unrelated.
    c.cache_put("default", &cache, "hits", "v".into(), None)
        .await
        .unwrap();
    assert_eq!(
        c.counter_get("default", &cache, "hits").await.unwrap(),
        Some(3)
    );

    // 8 tasks × 50 adds of 1, racing on one counter: every add counts once.
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let c = c.clone();
            let cache = cache.clone();
            tokio::spawn(async move {
                let mut sums = Vec::new();
                for _ in 0..50 {
                    sums.push(c.counter_add("default", &cache, "race", 1).await.unwrap());
                }
                sums
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    assert_eq!(
        all,
        (1..=400).collect::<Vec<i64>>(),
        "each add saw its own sum"
    );
    // Overflow is refused and changes nothing.
    c.counter_add("default", &cache, "max", i64::MAX)
        .await
        .unwrap();
    assert!(c.counter_add("default", &cache, "max", 1).await.is_err());
    c.close().await;
    stop(broker).await;

    let broker = start(dir.path(), on_commit()).await;
    let c = client(&broker).await;
    assert_eq!(
        c.counter_get("default", &cache, "hits").await.unwrap(),
        Some(3)
    );
    assert_eq!(
        c.counter_get("default", &cache, "race").await.unwrap(),
        Some(400)
    );
    assert_eq!(
        c.counter_get("default", &cache, "max").await.unwrap(),
        Some(i64::MAX)
    );
    assert_eq!(
        c.counter_get("default", &cache, "never").await.unwrap(),
        None
    );
    assert_eq!(
        c.counter_add("default", &cache, "hits", 10).await.unwrap(),
        13
    );
    assert_eq!(
        c.cache_get("default", &cache, "hits").await.unwrap(),
        Some(bytes::Bytes::from("v"))
    );
    c.close().await;
    stop(broker).await;
}

#[tokio::test]
async fn an_in_memory_broker_does_not_offer_counters() {
    let broker = felix_integration::broker().await;
    let c = broker.client().await;
    let err = c.counter_add("default", "c", "k", 1).await.unwrap_err();
    assert!(
        matches!(err, felix_client::ClientError::Usage(_)),
        "{err:?}"
    );
    broker.shutdown().await;
}
