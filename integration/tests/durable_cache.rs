//! A durable cache end to end: values, deletes and absolute TTLs as they were after a
//! restart.

use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_integration::durable_support::*;
use felix_integration::unique;

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
    put("forever", "v1", None).await;
    put("forever", "v2", None).await;
    put("long", "stays", Some(600_000)).await;
    let short_at = Instant::now();
    put("short", "goes", Some(1_500)).await;
    put("deleted", "x", None).await;
    assert_eq!(
        c.cache_delete("default", &cache, "deleted").await.unwrap(),
        Some(Bytes::from("x"))
    );
    assert_eq!(
        c.cache_get("default", &cache, "short").await.unwrap(),
        Some(Bytes::from("goes"))
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
    if short_at.elapsed() < Duration::from_millis(1_200) {
        assert_eq!(
            get("short").await,
            Some(Bytes::from("goes")),
            "not expired yet"
        );
    }
    // The expiry is the one set before the restart, not a fresh TTL from it.
    let expiry = short_at + Duration::from_millis(1_600);
    tokio::time::sleep_until(expiry.into()).await;
    assert_eq!(get("short").await, None);
    assert_eq!(get("long").await, Some(Bytes::from("stays")));
    c.close().await;
    stop(broker).await;
}
