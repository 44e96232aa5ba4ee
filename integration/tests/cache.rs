//! The cache: put/get, miss, TTL expiry, delete returning the removed value, and many
//! requests pipelined on one stream.

use std::time::Duration;

use bytes::Bytes;
use felix_integration::{broker, join_all, unique, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_then_get_and_miss() {
    let broker = broker().await;
    let client = broker.client().await;
    let cache = unique("cache");
    // Binary values survive the base64 round trip.
    let value = Bytes::from((0..=255u8).collect::<Vec<_>>());
    client
        .cache_put("default", &cache, "k", value.clone(), None)
        .await
        .unwrap();
    assert_eq!(
        client.cache_get("default", &cache, "k").await.unwrap(),
        Some(value)
    );
    assert_eq!(
        client.cache_get("default", &cache, "absent").await.unwrap(),
        None
    );
    // Caches are separate namespaces of keys.
    assert_eq!(
        client
            .cache_get("default", &unique("other"), "k")
            .await
            .unwrap(),
        None
    );
    // A put overwrites.
    client
        .cache_put("default", &cache, "k", Bytes::from_static(b"v2"), None)
        .await
        .unwrap();
    assert_eq!(
        client
            .cache_get("default", &cache, "k")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"v2"[..])
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expires_the_value() {
    let broker = broker().await;
    let client = broker.client().await;
    let cache = unique("ttl");
    client
        .cache_put(
            "default",
            &cache,
            "short",
            Bytes::from_static(b"v"),
            Some(Duration::from_millis(200)),
        )
        .await
        .unwrap();
    client
        .cache_put(
            "default",
            &cache,
            "long",
            Bytes::from_static(b"v"),
            Some(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    // Wait for the expiry itself rather than sleeping past it and hoping: the deadline only
    // fails a value that never expires. (Reading "short" as present first would race its
    // 200 ms against a loaded machine; "long" is the value read before its expiry, and the
    // engine's virtual-clock test `requests::cache_put_get_delete_with_ttl` pins the instant.)
    within(60, async {
        while client
            .cache_get("default", &cache, "short")
            .await
            .unwrap()
            .is_some()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // Expiring one key took no other with it.
    assert!(client
        .cache_get("default", &cache, "long")
        .await
        .unwrap()
        .is_some());
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_returns_the_removed_value() {
    let broker = broker().await;
    let client = broker.client().await;
    let cache = unique("delete");
    client
        .cache_put("default", &cache, "k", Bytes::from_static(b"old"), None)
        .await
        .unwrap();
    let removed = client.cache_delete("default", &cache, "k").await.unwrap();
    assert_eq!(removed.as_deref(), Some(&b"old"[..]));
    assert_eq!(
        client.cache_get("default", &cache, "k").await.unwrap(),
        None
    );
    // Deleting what is not there is an answer, not an error.
    assert_eq!(
        client.cache_delete("default", &cache, "k").await.unwrap(),
        None
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_on_one_stream_are_matched_by_request_id() {
    let broker = broker().await;
    // One request stream: every operation below shares it.
    let client = broker.client_with(|c| c.connect_streams = 1).await.unwrap();
    let cache = unique("pipelined");
    let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    let puts = keys
        .iter()
        .enumerate()
        .map(|(i, k)| client.cache_put("default", &cache, k, Bytes::from(format!("v{i}")), None));
    for r in within(20, join_all(puts)).await {
        r.unwrap();
    }
    let gets = keys.iter().map(|k| client.cache_get("default", &cache, k));
    for (i, r) in within(20, join_all(gets)).await.into_iter().enumerate() {
        assert_eq!(r.unwrap(), Some(Bytes::from(format!("v{i}"))), "key k{i}");
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_write_without_request_id_is_answered_plain_ok() {
    use felix_proto::message::{self, Message};
    let broker = broker().await;
    let client = broker.client().await;
    let cache = unique("no-id");
    let mut raw = client.open_raw_stream(true).await.unwrap();
    let put = Message::CachePut(message::CachePut {
        tenant_id: "t1".into(),
        namespace: "default".into(),
        cache: cache.clone(),
        key: "k".into(),
        value: Bytes::from_static(b"v"),
        request_id: None,
        ttl_ms: None,
    });
    raw.send(put.to_frame().to_bytes()).await.unwrap();
    let frame = within(10, raw.recv_frame())
        .await
        .unwrap()
        .expect("an answer");
    assert_eq!(Message::decode(&frame.payload).unwrap(), Message::Ok);
    assert_eq!(
        client
            .cache_get("default", &cache, "k")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"v"[..])
    );
    broker.shutdown().await;
}
