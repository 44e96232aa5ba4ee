//! Cache watches end to end over real QUIC with our client: key and prefix watches, each
//! change in order with its offset (a delete without a value), retained state first, a
//! gapless resume under concurrent writes, a resnapshot after compaction, and a watch that
//! falls behind ending with `cache_watch_lagged`.

use std::time::Duration;

use bytes::Bytes;
use felix_client::{CacheChange, CacheWatch, CacheWatchItem, Client, WatchFilter, WatchStart};
use felix_integration::durable_support::*;
use felix_integration::{unique, within};
use felix_runtime_tokio::{BrokerOptions, RunningBroker};

async fn change(w: &mut CacheWatch) -> CacheChange {
    match within(10, w.next()).await.expect("watch item") {
        CacheWatchItem::Change(c) => c,
        other => panic!("expected a change, got {other:?}"),
    }
}

async fn put(c: &Client, cache: &str, key: &str, value: &str) {
    c.cache_put("default", cache, key, Bytes::from(value.to_owned()), None)
        .await
        .unwrap();
}

fn val(c: &CacheChange) -> Option<&[u8]> {
    c.value.as_deref()
}

/// The writers here put decimal counters: the number a change carries.
fn number(c: &CacheChange) -> usize {
    std::str::from_utf8(val(c).expect("a put"))
        .unwrap()
        .parse()
        .unwrap()
}

async fn watch(c: &Client, cache: &str, filter: WatchFilter, start: WatchStart) -> CacheWatch {
    c.watch_cache("default", cache, filter, start)
        .await
        .expect("watch starts")
}

/// As `start` with `periodic()`, with a watch queue of `capacity` changes.
async fn start_with_watch_queue(dir: &std::path::Path, capacity: usize) -> RunningBroker {
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().unwrap());
    opts.storage_dir = Some(dir.to_path_buf());
    opts.durable = periodic();
    opts = opts.configure_engine(move |c| c.cache_watch_queue_capacity = capacity);
    within(20, felix_integration::start_broker(opts))
        .await
        .expect("broker starts")
}

#[tokio::test]
async fn key_and_prefix_watches_see_each_write_in_order_with_offsets() {
    let dir = TempDir::new("watch-basic");
    let broker = start(dir.path(), periodic()).await;
    let c = client(&broker).await;
    let cache = unique("room");
    let mut by_key = watch(&c, &cache, WatchFilter::Key("a".into()), WatchStart::Live).await;
    let mut by_prefix = watch(
        &c,
        &cache,
        WatchFilter::Prefix("p/".into()),
        WatchStart::Live,
    )
    .await;
    assert_eq!(by_key.retained_count(), None);
    put(&c, &cache, "a", "a1").await;
    put(&c, &cache, "p/1", "x").await;
    put(&c, &cache, "q", "ignored").await;
    put(&c, &cache, "p/2", "y").await;
    put(&c, &cache, "a", "a2").await;
    assert_eq!(
        c.cache_delete("default", &cache, "p/1").await.unwrap(),
        Some(Bytes::from("x"))
    );

    let a1 = change(&mut by_key).await;
    let a2 = change(&mut by_key).await;
    assert_eq!((a1.key.as_str(), val(&a1)), ("a", Some(&b"a1"[..])));
    assert_eq!((a2.key.as_str(), val(&a2)), ("a", Some(&b"a2"[..])));
    // Offsets are the log's: a1 was the first write, a2 the fifth.
    assert_eq!(a2.offset - a1.offset, 4);

    let p1 = change(&mut by_prefix).await;
    let p2 = change(&mut by_prefix).await;
    let gone = change(&mut by_prefix).await;
    assert_eq!((p1.key.as_str(), val(&p1)), ("p/1", Some(&b"x"[..])));
    assert_eq!((p2.key.as_str(), val(&p2)), ("p/2", Some(&b"y"[..])));
    assert_eq!((gone.key.as_str(), gone.value.clone()), ("p/1", None));
    assert!(p1.offset < p2.offset && p2.offset < gone.offset);
    assert_eq!(p1.offset, a1.offset + 1);
    c.close().await;
    stop(broker).await;
}

#[tokio::test]
async fn retained_delivers_current_values_first_and_zero_for_an_empty_key() {
    let dir = TempDir::new("watch-retained");
    let broker = start(dir.path(), periodic()).await;
    let c = client(&broker).await;
    let cache = unique("presence");
    let mut empty = watch(
        &c,
        &cache,
        WatchFilter::Key("nobody".into()),
        WatchStart::Retained,
    )
    .await;
    assert_eq!(
        empty.retained_count(),
        Some(0),
        "an empty key is a definite 0"
    );

    put(&c, &cache, "u/alice", "old").await;
    put(&c, &cache, "u/alice", "here").await;
    put(&c, &cache, "u/bob", "here").await;
    put(&c, &cache, "u/carol", "x").await;
    c.cache_delete("default", &cache, "u/carol").await.unwrap();
    put(&c, &cache, "other", "x").await;

    let mut full = watch(
        &c,
        &cache,
        WatchFilter::Prefix("u/".into()),
        WatchStart::Retained,
    )
    .await;
    assert_eq!(full.retained_count(), Some(2));
    let mut state: Vec<(String, Option<Bytes>)> = Vec::new();
    let mut last = 0;
    for _ in 0..2 {
        let ch = change(&mut full).await;
        assert!(ch.offset < full.resume_offset());
        assert!(ch.offset >= last);
        last = ch.offset;
        state.push((ch.key, ch.value));
    }
    state.sort();
    assert_eq!(
        state,
        vec![
            ("u/alice".into(), Some(Bytes::from("here"))),
            ("u/bob".into(), Some(Bytes::from("here")))
        ]
    );
    // Then live changes, from the resume offset on.
    put(&c, &cache, "u/dave", "new").await;
    let live = change(&mut full).await;
    assert_eq!(live.key, "u/dave");
    assert!(live.offset >= full.resume_offset());

    put(&c, &cache, "nobody", "somebody").await;
    let first = change(&mut empty).await;
    assert_eq!(val(&first), Some(&b"somebody"[..]));
    c.close().await;
    stop(broker).await;
}

#[tokio::test]
async fn a_resumed_watch_misses_nothing_under_concurrent_writes() {
    let dir = TempDir::new("watch-resume");
    let broker = start(dir.path(), periodic()).await;
    let c = client(&broker).await;
    let cache = unique("counter-ish");
    const WRITES: usize = 300;
    let mut w = watch(
        &c,
        &cache,
        WatchFilter::Prefix("k".into()),
        WatchStart::Live,
    )
    .await;
    let writer = {
        let c = c.clone();
        let cache = cache.clone();
        tokio::spawn(async move {
            for i in 0..WRITES {
                // Two keys interleaved plus one outside the prefix: offsets are sparse.
                put(&c, &cache, &format!("k{}", i % 2), &i.to_string()).await;
                if i % 10 == 0 {
                    put(&c, &cache, "zz", "noise").await;
                }
            }
        })
    };
    let mut seen: Vec<usize> = Vec::new();
    let mut next_from = 0;
    // Read some, drop the watch, resume from the last offset + 1; three times.
    for round in 0..3 {
        for _ in 0..40 {
            let ch = change(&mut w).await;
            seen.push(number(&ch));
            next_from = ch.offset + 1;
        }
        drop(w);
        tokio::time::sleep(Duration::from_millis(20 * round)).await;
        w = watch(
            &c,
            &cache,
            WatchFilter::Prefix("k".into()),
            WatchStart::From(next_from),
        )
        .await;
        assert!(!w.resnapshot());
    }
    within(30, writer).await.unwrap();
    while seen.len() < WRITES {
        let ch = change(&mut w).await;
        seen.push(number(&ch));
    }
    assert_eq!(
        seen,
        (0..WRITES).collect::<Vec<_>>(),
        "every write once, in order"
    );
    c.close().await;
    stop(broker).await;
}

#[tokio::test]
async fn a_resume_into_compacted_history_is_a_marked_resnapshot() {
    let dir = TempDir::new("watch-compact");
    let durable = {
        let mut durable_config = periodic();
        durable_config.segment_max_bytes = 64 * 1024;
        durable_config
    };
    let broker = start(dir.path(), durable).await;
    let c = client(&broker).await;
    let cache = unique("compacted");
    put(&c, &cache, "keep", "kept").await;
    // Overwrite one key with ~2 MiB of 16 KiB values: the log holds far more than its live
    // bytes and compaction rewrites the sealed segments.
    let big = "v".repeat(16 * 1024);
    for i in 0..130 {
        put(&c, &cache, "hot", &format!("{i}{big}")).await;
    }
    put(&c, &cache, "hot", "last").await;
    put(&c, &cache, "nudge", "x").await;
    let mut compacted = None;
    for _ in 0..100 {
        let w = watch(
            &c,
            &cache,
            WatchFilter::Prefix(String::new()),
            WatchStart::From(1),
        )
        .await;
        if w.resnapshot() {
            compacted = Some(w);
            break;
        }
        drop(w);
        // Each write's durability is where compaction may start.
        put(&c, &cache, "nudge", "x").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut w = compacted.expect("compaction collapsed offset 1 within the time given");
    let mut state = std::collections::BTreeMap::new();
    // The current value of each key, not the collapsed history.
    for _ in 0..3 {
        let ch = change(&mut w).await;
        assert!(ch.offset < w.resume_offset());
        state.insert(ch.key, ch.value.unwrap());
    }
    assert_eq!(state["keep"], Bytes::from("kept"));
    assert_eq!(state["hot"], Bytes::from("last"));
    assert_eq!(state["nudge"], Bytes::from("x"));
    put(&c, &cache, "after", "live").await;
    assert_eq!(change(&mut w).await.key, "after");
    c.close().await;
    stop(broker).await;
}

#[tokio::test]
async fn a_watch_that_falls_behind_ends_lagged_and_resumes_gaplessly() {
    let dir = TempDir::new("watch-lag");
    let broker = start_with_watch_queue(dir.path(), 8).await;
    // A small receive window: what the watcher does not read stays queued at the broker.
    let slow = client_with(&broker, |c| c.stream_receive_window = 2048).await;
    let c = client(&broker).await;
    let cache = unique("busy");
    let mut w = watch(
        &slow,
        &cache,
        WatchFilter::Key("k".into()),
        WatchStart::Live,
    )
    .await;
    const WRITES: usize = 200;
    for i in 0..WRITES {
        put(&c, &cache, "k", &format!("{i:0>100}")).await;
    }
    let mut seen = Vec::new();
    let resume_from = loop {
        match within(10, w.next()).await.unwrap() {
            CacheWatchItem::Change(ch) => seen.push(ch),
            CacheWatchItem::Lagged { resume_from } => break resume_from,
            CacheWatchItem::End => panic!("ended without saying it lagged"),
        }
    };
    assert!(seen.len() < WRITES, "the watch fell behind");
    assert_eq!(resume_from, seen.last().map_or(0, |c| c.offset + 1));
    let mut again = watch(
        &slow,
        &cache,
        WatchFilter::Key("k".into()),
        WatchStart::From(resume_from),
    )
    .await;
    while seen.len() < WRITES {
        seen.push(change(&mut again).await);
    }
    let values: Vec<usize> = seen.iter().map(number).collect();
    assert_eq!(
        values,
        (0..WRITES).collect::<Vec<_>>(),
        "lagged, then resumed without a gap"
    );
    slow.close().await;
    c.close().await;
    stop(broker).await;
}
