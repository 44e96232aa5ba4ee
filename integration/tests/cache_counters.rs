//! Counters end to end over real QUIC with our client: an add answers the sum including
//! it, a counter never written reads as absent (not zero), concurrent adds all count, and
//! the sums survive a broker restart on the same storage.

use felix_integration::durable_support::*;
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
    // Refused as an invalid request (the sum leaves the 64-bit range), not as any other
    // failure: a dropped connection or a refused permission is not this promise.
    let err = c
        .counter_add("default", &cache, "max", 1)
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some(&felix_client::ErrorCode::InvalidRequest),
        "{err}"
    );
    assert!(err.to_string().contains("leaves the 64-bit range"), "{err}");
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

/// Sums kept through the counter log's compaction (which keeps each counter's newest record
/// and drops the rest) and a restart after it: compaction must keep sums, not deltas.
#[tokio::test]
async fn sums_survive_compaction_and_a_restart_after_it() {
    let dir = TempDir::new("counters-compact");
    let cache = unique("compacted");
    // Small segments, so sealed ones fill with superseded records and compaction runs.
    let durable = || {
        let mut durable_config = periodic();
        durable_config.segment_max_bytes = 64 * 1024;
        durable_config
    };
    // Long keys make each record a few hundred bytes: ~1 MiB of log in a few thousand adds.
    let key = |i: usize| format!("{i}-{}", "k".repeat(300));
    const KEYS: usize = 4;
    const TASKS: usize = 8;
    const ADDS: usize = 600;
    let broker = start(dir.path(), durable()).await;
    let c = client(&broker).await;
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (c, cache) = (c.clone(), cache.clone());
            tokio::spawn(async move {
                for n in 0..ADDS {
                    let k = key((t + n) % KEYS);
                    c.counter_add("default", &cache, &k, 1).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let expected = (TASKS * ADDS / KEYS) as i64;
    for i in 0..KEYS {
        let sum = c.counter_get("default", &cache, &key(i)).await.unwrap();
        assert_eq!(sum, Some(expected), "counter {i} before the restart");
    }
    c.close().await;
    stop(broker).await;

    // Compaction ran: what the counter logs hold on disk is far below what was written.
    let written = (TASKS * ADDS * 300) as u64;
    let on_disk = dir_bytes(&dir.path().join("counters"));
    assert!(
        on_disk < written / 2,
        "compaction dropped superseded records: {on_disk} bytes on disk for {written} written"
    );

    let broker = start(dir.path(), durable()).await;
    let c = client(&broker).await;
    for i in 0..KEYS {
        let sum = c.counter_get("default", &cache, &key(i)).await.unwrap();
        assert_eq!(
            sum,
            Some(expected),
            "counter {i} after compaction and a restart"
        );
    }
    let next = c.counter_add("default", &cache, &key(0), 1).await.unwrap();
    assert_eq!(next, expected + 1);
    c.close().await;
    stop(broker).await;
}

/// Bytes in every file below `dir`.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}
