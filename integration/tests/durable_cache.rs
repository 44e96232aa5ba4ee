//! A durable cache end to end: values, deletes and absolute TTLs as they were after a
//! restart.

use std::time::Duration;

use bytes::Bytes;
use felix_client::{CacheWatch, CacheWatchItem, WatchFilter, WatchStart};
use felix_integration::durable_support::*;
use felix_integration::{unique, within};

/// The absolute expiry (Unix ms) the next change of `watch` carries, for `key`.
async fn next_expiry(watch: &mut CacheWatch, key: &str) -> Option<u64> {
    match within(20, watch.next()).await.unwrap() {
        CacheWatchItem::Change(c) => {
            assert_eq!(c.key, key);
            c.expires_at_millis
        }
        other => panic!("expected {key}'s change, got {other:?}"),
    }
}

#[tokio::test]
async fn cache_values_and_expiries_survive_a_restart() {
    let dir = TempDir::new("durable-cache");
    let cache = unique("sessions");
    let broker = start(dir.path(), on_commit()).await;
    let c = client(&broker).await;
    let put = |key: &'static str, value: &'static str, ttl: Option<u64>| {
        let c = c.clone();
        let cache = cache.clone();
        async move {
            c.cache_put(
                "default",
                &cache,
                key,
                Bytes::from(value),
                ttl.map(Duration::from_millis),
            )
            .await
            .unwrap()
        }
    };
    // The broker's absolute expiries, read from a watch rather than guessed from our clock.
    let mut watch = c
        .watch_cache(
            "default",
            &cache,
            WatchFilter::Key("long".into()),
            WatchStart::Live,
        )
        .await
        .unwrap();
    put("forever", "v1", None).await;
    put("forever", "v2", None).await;
    put("long", "stays", Some(600_000)).await;
    let long_expiry = next_expiry(&mut watch, "long").await.expect("a TTL");
    drop(watch);
    put("short", "goes", Some(1_500)).await;
    put("deleted", "x", None).await;
    assert_eq!(
        c.cache_delete("default", &cache, "deleted").await.unwrap(),
        Some(Bytes::from("x"))
    );
    c.close().await;
    stop(broker).await;

    let broker = start(dir.path(), on_commit()).await;
    let c = client(&broker).await;
    let get = |key: &'static str| {
        let c = c.clone();
        let cache = cache.clone();
        async move { c.cache_get("default", &cache, key).await.unwrap() }
    };
    assert_eq!(get("forever").await, Some(Bytes::from("v2")));
    assert_eq!(get("long").await, Some(Bytes::from("stays")));
    assert_eq!(get("deleted").await, None);
    // The expiry is the one set before the restart, not a fresh TTL from it: the same
    // instant, to the millisecond (the engine's virtual-clock test
    // `durable::cache_values_and_absolute_expiries_survive_a_restart` pins the timing).
    let mut watch = c
        .watch_cache(
            "default",
            &cache,
            WatchFilter::Key("long".into()),
            WatchStart::Retained,
        )
        .await
        .unwrap();
    assert_eq!(next_expiry(&mut watch, "long").await, Some(long_expiry));
    drop(watch);
    // And a short TTL still ends after the restart: wait for it to, instead of sleeping a
    // guessed time (the deadline only fails a value that never expires).
    within(60, async {
        while get("short").await.is_some() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(get("long").await, Some(Bytes::from("stays")));
    c.close().await;
    stop(broker).await;
}
