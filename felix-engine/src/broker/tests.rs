use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_proto::features::Features;
use felix_proto::{ErrorCode, Flags};

use super::*;

/// What the real client offers on event batches (0x1FFF): offsets and skipped, no publisher.
const CLIENT_FLAGS: Flags = Flags(0x1FFF);

fn orders() -> StreamKey {
    StreamKey::new("t1", "default", "orders")
}

fn opts(subscription_id: u64) -> SubscribeOpts {
    SubscribeOpts::negotiated(
        subscription_id,
        CLIENT_FLAGS,
        Features::SUBSCRIPTION_LAGGED | Features::SUBSCRIBE_QUEUE,
        None,
    )
}

fn sub(b: &mut Broker, now: Instant, o: SubscribeOpts) -> SubscriberId {
    b.subscribe(now, &orders(), 0, Start::Latest, o)
        .expect("subscribe")
        .id
}

fn publish(b: &mut Broker, now: Instant, payloads: &[&'static [u8]]) -> Published {
    let payloads = payloads.iter().map(|p| Bytes::from_static(p)).collect();
    b.publish(
        now,
        1_700_000_000_000_000,
        &orders(),
        None,
        None,
        payloads,
        None,
    )
    .expect("publish")
}

fn drain(b: &mut Broker, id: SubscriberId) -> Vec<Delivery> {
    std::iter::from_fn(|| b.next_delivery(id))
        .take(10_000)
        .collect()
}

fn frame(d: &Delivery) -> &Bytes {
    match d {
        Delivery::Frame(f) => f,
        Delivery::Final(f) => panic!("unexpected final frame {f:?}"),
    }
}

/// A decoded shared event batch: flags, base offset, publisher, times, payloads.
#[derive(Debug, PartialEq)]
struct Decoded {
    flags: u16,
    base_offset: Option<u64>,
    publisher: Option<String>,
    times: Vec<u64>,
    payloads: Vec<Vec<u8>>,
}

fn decode(f: &[u8]) -> Decoded {
    let take = |pos: &mut usize, n: usize| {
        let s = &f[*pos..*pos + n];
        *pos += n;
        s
    };
    assert_eq!(&f[..4], b"FLX1");
    let flags = u16::from_be_bytes([f[6], f[7]]);
    let len = u32::from_be_bytes(f[8..12].try_into().unwrap()) as usize;
    assert_eq!(f.len(), 12 + len, "header length matches the payload");
    let mut pos = 12;
    let u64_at = |pos: &mut usize| u64::from_be_bytes(take(pos, 8).try_into().unwrap());
    let u32_at = |pos: &mut usize| u32::from_be_bytes(take(pos, 4).try_into().unwrap());
    let base_offset = (flags & 0x0020 != 0).then(|| u64_at(&mut pos));
    let publisher = (flags & 0x2000 != 0).then(|| {
        let n = take(&mut pos, 1)[0] as usize;
        String::from_utf8(take(&mut pos, n).to_vec()).unwrap()
    });
    let count = u32_at(&mut pos);
    let mut times = Vec::new();
    let mut payloads = Vec::new();
    for _ in 0..count {
        if flags & 0x4000 != 0 {
            times.push(u64_at(&mut pos));
        }
        let n = u32_at(&mut pos) as usize;
        payloads.push(take(&mut pos, n).to_vec());
    }
    assert_eq!(pos, f.len(), "no trailing bytes");
    Decoded {
        flags,
        base_offset,
        publisher,
        times,
        payloads,
    }
}

#[test]
fn one_turn_of_publishes_is_one_frame_shared_by_every_subscriber() {
    let now = Instant::now();
    let mut b = Broker::new(BrokerConfig::default());
    let ids: Vec<_> = (0..5).map(|i| sub(&mut b, now, opts(100 + i))).collect();
    publish(&mut b, now, &[b"e1", b"e2"]);
    publish(&mut b, now, &[b"e3"]);
    assert_eq!(
        b.poll_ready(),
        None,
        "nothing is delivered before the turn ends"
    );
    b.flush(now);

    let mut ready = Vec::new();
    while let Some(id) = b.poll_ready() {
        ready.push(id);
    }
    ready.sort();
    assert_eq!(ready, ids, "each subscriber named exactly once");

    let frames: Vec<Bytes> = ids
        .iter()
        .map(|&id| {
            let d = drain(&mut b, id);
            assert_eq!(d.len(), 1);
            frame(&d[0]).clone()
        })
        .collect();
    for f in &frames {
        assert_eq!(
            f.as_ptr(),
            frames[0].as_ptr(),
            "one allocation shared, not copies"
        );
    }
    // In memory: exactly 0x0004 even though every subscriber offered 0x0020.
    let d = decode(&frames[0]);
    assert_eq!(d.flags, 0x0004);
    assert_eq!(
        d.payloads,
        vec![b"e1".to_vec(), b"e2".to_vec(), b"e3".to_vec()]
    );
    let s = b.stats();
    assert_eq!((s.frames_encoded, s.deliveries), (1, 5));
    assert_eq!((s.published_records, s.published_bytes), (3, 6));
    assert_eq!(s.subscribers_open, 5);
}

#[test]
fn poll_ready_names_only_subscribers_with_deliveries() {
    let now = Instant::now();
    let mut b = Broker::new(BrokerConfig::default());
    let on_orders = sub(&mut b, now, opts(1));
    let other = StreamKey::new("t1", "default", "idle");
    for i in 0..50 {
        b.subscribe(now, &other, 0, Start::Latest, opts(10 + i))
            .unwrap();
    }
    publish(&mut b, now, &[b"x"]);
    b.flush(now);
    publish(&mut b, now, &[b"y"]);
    b.flush(now);
    assert_eq!(b.poll_ready(), Some(on_orders));
    assert_eq!(b.poll_ready(), None, "two batches, one notification");
    assert_eq!(drain(&mut b, on_orders).len(), 2);
    // An idle flush does nothing.
    b.flush(now);
    assert_eq!(b.poll_ready(), None);
}

#[test]
fn a_full_queue_drops_new_batches_for_that_subscriber_only() {
    let now = Instant::now();
    let mut b = Broker::new(BrokerConfig::default());
    let mut small = opts(1);
    small.queue_capacity = Some(2);
    let slow = sub(&mut b, now, small);
    let fast = sub(&mut b, now, opts(2));
    for p in [&b"a"[..], b"b", b"c", b"d"] {
        // The publisher is never refused or blocked by a full subscriber.
        publish(&mut b, now, &[p]);
        b.flush(now);
    }
    let slow_frames = drain(&mut b, slow);
    let kept: Vec<_> = slow_frames
        .iter()
        .map(|d| decode(frame(d)).payloads)
        .collect();
    assert_eq!(
        kept,
        vec![vec![b"a".to_vec()], vec![b"b".to_vec()]],
        "newest dropped"
    );
    assert_eq!(b.subscriber_drops(slow), Some(2));
    assert_eq!(drain(&mut b, fast).len(), 4);
    assert_eq!(b.subscriber_drops(fast), Some(0));
    let s = b.stats();
    assert_eq!(
        (s.dropped_batches, s.dropped_records, s.deliveries),
        (2, 2, 6)
    );
    assert_eq!(
        s.lagged_subscriptions, 0,
        "in memory: a drop never ends the subscription"
    );

    // Once drained, the slow subscriber receives again.
    publish(&mut b, now, &[b"e"]);
    b.flush(now);
    assert_eq!(drain(&mut b, slow).len(), 1);
}

#[test]
fn queue_capacity_is_clamped_and_echoed_only_when_asked() {
    let now = Instant::now();
    let cfg = BrokerConfig {
        subscriber_queue_capacity: 3,
        subscriber_queue_capacity_max: 5,
        ..BrokerConfig::default()
    };
    let mut b = Broker::new(cfg);
    let grant = |b: &mut Broker, asked: Option<u32>| {
        let mut o = opts(1);
        o.queue_capacity = asked;
        b.subscribe(now, &orders(), 0, Start::Latest, o).unwrap()
    };
    assert_eq!(grant(&mut b, Some(0)).queue_capacity, Some(1));
    assert_eq!(grant(&mut b, Some(4)).queue_capacity, Some(4));
    assert_eq!(grant(&mut b, Some(5)).queue_capacity, Some(5));
    assert_eq!(grant(&mut b, Some(u32::MAX)).queue_capacity, Some(5));
    let default = grant(&mut b, None);
    assert_eq!(default.queue_capacity, None);

    // The default capacity (3) is what a subscriber that did not ask gets.
    for _ in 0..4 {
        publish(&mut b, now, &[b"x"]);
        b.flush(now);
    }
    assert_eq!(drain(&mut b, default.id).len(), 3);
    assert_eq!(b.subscriber_drops(default.id), Some(1));
}

#[test]
fn shard_counts_unknown_declared_and_created() {
    let declared = StreamKey::new("t1", "default", "wide");
    let cfg = BrokerConfig {
        default_shards: 2,
        declared_streams: vec![(declared.clone(), 4)],
        ..BrokerConfig::default()
    };
    let mut b = Broker::new(cfg);
    let now = Instant::now();
    assert_eq!(b.shard_count(&orders()), None);
    assert_eq!(b.shard_count(&declared), Some(4));
    publish(&mut b, now, &[b"x"]);
    assert_eq!(
        b.shard_count(&orders()),
        Some(2),
        "created on first use with default_shards"
    );
    assert_eq!(b.stats().streams, 1);

    // A keyed publish lands where routing.md says: "user-42" over 4 shards is 3.
    let p = b
        .publish(
            now,
            0,
            &declared,
            Some(b"user-42"),
            None,
            vec![Bytes::from_static(b"v")],
            None,
        )
        .unwrap();
    assert_eq!(
        p,
        Published {
            shard: 3,
            first_offset: None,
            durable_at: None,
        }
    );
    // No key: shard 0. Explicit shard wins over the key.
    let p = b
        .publish(now, 0, &declared, None, None, vec![], None)
        .unwrap();
    assert_eq!(p.shard, 0);
    let p = b
        .publish(now, 0, &declared, Some(b"user-42"), Some(1), vec![], None)
        .unwrap();
    assert_eq!(p.shard, 1);
}

#[test]
fn out_of_range_shards_are_invalid_requests() {
    let now = Instant::now();
    let mut b = Broker::new(BrokerConfig::default());
    let err = b
        .publish(
            now,
            0,
            &orders(),
            None,
            Some(1),
            vec![Bytes::from_static(b"x")],
            None,
        )
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidRequest);
    assert_eq!(
        b.shard_count(&orders()),
        None,
        "a refused publish creates nothing"
    );
    assert_eq!(b.stats().published_records, 0);

    let err = b
        .subscribe(now, &orders(), 1, Start::Latest, opts(1))
        .unwrap_err();
    assert!(matches!(
        err,
        SubscribeError::Broker(BrokerError {
            code: ErrorCode::InvalidRequest,
            ..
        })
    ));
    assert!(b
        .publish(now, 0, &orders(), None, Some(0), vec![], None)
        .is_ok());
}

#[test]
fn replay_on_an_in_memory_stream_is_refused_not_served_as_latest() {
    let now = Instant::now();
    let mut b = Broker::new(BrokerConfig::default());
    for start in [Start::Earliest, Start::Offset(0), Start::Offset(7)] {
        match b.subscribe(now, &orders(), 0, start, opts(1)) {
            Err(SubscribeError::Broker(e)) => {
                assert_eq!(e.code, ErrorCode::InvalidRequest);
                assert!(
                    e.message.contains("replay needs durable storage"),
                    "{}",
                    e.message
                );
            }
            other => panic!("{start:?}: {other:?}"),
        }
    }
    assert_eq!(b.stats().subscribers_open, 0);
    let s = b
        .subscribe(now, &orders(), 0, Start::Latest, opts(1))
        .unwrap();
    assert_eq!(
        (s.start_offset, s.live_offset),
        (None, None),
        "no offsets in memory"
    );
}

#[test]
fn a_new_subscriber_does_not_see_records_published_before_it_in_the_same_turn() {
    let now = Instant::now();
    let mut b = Broker::new(BrokerConfig::default());
    let early = sub(&mut b, now, opts(1));
    publish(&mut b, now, &[b"before"]);
    let late = sub(&mut b, now, opts(2));
    publish(&mut b, now, &[b"after"]);
    b.flush(now);
    let early_payloads: Vec<_> = drain(&mut b, early)
        .iter()
        .flat_map(|d| decode(frame(d)).payloads)
        .collect();
    assert_eq!(early_payloads, vec![b"before".to_vec(), b"after".to_vec()]);
    let late_payloads: Vec<_> = drain(&mut b, late)
        .iter()
        .flat_map(|d| decode(frame(d)).payloads)
        .collect();
    assert_eq!(late_payloads, vec![b"after".to_vec()]);
}

#[test]
fn open_batches_seal_early_at_their_record_and_byte_limits() {
    let now = Instant::now();
    let cfg = BrokerConfig {
        event_batch_max_records: 3,
        event_batch_max_bytes: 10,
        ..Default::default()
    };
    let mut b = Broker::new(cfg);
    let id = sub(&mut b, now, opts(1));
    publish(&mut b, now, &[b"1", b"2", b"3", b"4", b"5", b"6", b"7"]);
    // Two full batches went out during the publish, before any flush.
    assert_eq!(b.poll_ready(), Some(id));
    b.flush(now);
    let sizes: Vec<_> = drain(&mut b, id)
        .iter()
        .map(|d| decode(frame(d)).payloads.len())
        .collect();
    assert_eq!(sizes, vec![3, 3, 1]);

    // Bytes: 6 + 6 would pass 10, so the second record starts a new batch.
    publish(&mut b, now, &[b"aaaaaa", b"bbbbbb", b"cccc"]);
    b.flush(now);
    let batches: Vec<_> = drain(&mut b, id)
        .iter()
        .map(|d| decode(frame(d)).payloads)
        .collect();
    assert_eq!(
        batches,
        vec![
            vec![b"aaaaaa".to_vec()],
            vec![b"bbbbbb".to_vec(), b"cccc".to_vec()]
        ],
        "6+4 = 10 reaches the limit and seals"
    );
}

#[test]
fn unsubscribed_subscribers_get_nothing_and_are_not_named() {
    let now = Instant::now();
    let mut b = Broker::new(BrokerConfig::default());
    let a = sub(&mut b, now, opts(1));
    let c = sub(&mut b, now, opts(2));
    publish(&mut b, now, &[b"x"]);
    b.flush(now);
    b.unsubscribe(a);
    b.unsubscribe(a); // twice is harmless
    assert_eq!(b.poll_ready(), Some(c));
    assert_eq!(b.poll_ready(), None);
    assert_eq!(b.next_delivery(a), None);
    publish(&mut b, now, &[b"y"]);
    b.flush(now);
    assert_eq!(b.stats().deliveries, 3);
    assert_eq!(b.stats().subscribers_open, 1);
}

#[test]
fn with_offsets_subscribers_get_the_variant_they_negotiated() {
    let now = Instant::now();
    let mut b = Broker::new(BrokerConfig::default());
    b.set_offsets_for_test(&orders(), true);
    publish(&mut b, now, &[b"old1", b"old2"]); // offsets 0, 1 before anyone subscribed
    let with = b
        .subscribe(now, &orders(), 0, Start::Latest, opts(1))
        .unwrap();
    assert_eq!((with.start_offset, with.live_offset), (Some(2), Some(2)));
    let plain_opts = SubscribeOpts::negotiated(2, Flags(0x0007), Features::NONE, None);
    let without = b
        .subscribe(now, &orders(), 0, Start::Latest, plain_opts)
        .unwrap();
    assert_eq!((without.start_offset, without.live_offset), (None, None));

    let p = publish(&mut b, now, &[b"e2", b"e3"]);
    assert_eq!(p.first_offset, Some(2));
    b.flush(now);
    let f_with = drain(&mut b, with.id);
    let f_without = drain(&mut b, without.id);
    let d = decode(frame(&f_with[0]));
    assert_eq!((d.flags, d.base_offset), (0x0024, Some(2)));
    assert!(d.times.is_empty(), "no timestamps unless negotiated");
    let d = decode(frame(&f_without[0]));
    assert_eq!((d.flags, d.base_offset), (0x0004, None));
    assert_eq!(
        b.stats().frames_encoded,
        2,
        "one encode per variant, not per subscriber"
    );

    let p = publish(&mut b, now, &[b"e4"]);
    assert_eq!(p.first_offset, Some(4));

    // Timestamps ride only where times are stored (shards with offsets) and were asked for.
    let ts_opts = SubscribeOpts::negotiated(3, Flags(0x4024), Features::NONE, None);
    let ts = b
        .subscribe(now, &orders(), 0, Start::Latest, ts_opts)
        .unwrap();
    publish(&mut b, now, &[b"e5"]);
    b.flush(now);
    let d = decode(frame(&drain(&mut b, ts.id)[0]));
    assert_eq!(
        (d.flags, d.base_offset, d.times.clone()),
        (0x4024, Some(5), vec![1_700_000_000_000_000])
    );
}

#[test]
fn with_offsets_cursor_errors_name_what_is_available() {
    let now = Instant::now();
    let mut b = Broker::new(BrokerConfig::default());
    b.set_offsets_for_test(&orders(), true);
    publish(&mut b, now, &[b"a", b"b", b"c"]);
    assert_eq!(
        b.subscribe(now, &orders(), 0, Start::Offset(4), opts(1))
            .unwrap_err(),
        SubscribeError::Cursor {
            reason: CursorReason::InFuture,
            requested: 4,
            available: 3
        }
    );
    assert_eq!(
        b.subscribe(now, &orders(), 0, Start::Offset(1), opts(1))
            .unwrap_err(),
        SubscribeError::Cursor {
            reason: CursorReason::TooOld,
            requested: 1,
            available: 3
        }
    );
    let s = b
        .subscribe(now, &orders(), 0, Start::Offset(3), opts(1))
        .unwrap();
    assert_eq!(s.start_offset, Some(3));
}

#[test]
fn with_offsets_the_first_drop_ends_a_lag_aware_subscription() {
    let now = Instant::now();
    let mut b = Broker::new(BrokerConfig::default());
    b.set_offsets_for_test(&orders(), true);
    let mut o = opts(77);
    o.queue_capacity = Some(1);
    let lagging = sub(&mut b, now, o);
    // Same capacity, but no FEATURE_SUBSCRIPTION_LAGGED: it keeps its subscription.
    let mut o = SubscribeOpts::negotiated(78, CLIENT_FLAGS, Features::NONE, Some(1));
    o.queue_capacity = Some(1);
    let tolerant = sub(&mut b, now, o);

    publish(&mut b, now, &[b"a", b"b"]); // offsets 0..2, queued
    b.flush(now);
    publish(&mut b, now, &[b"c"]); // offset 2, dropped
    b.flush(now);
    publish(&mut b, now, &[b"d"]); // offset 3: the lagged one is gone from the shard
    b.flush(now);

    let out = drain(&mut b, lagging);
    assert_eq!(out.len(), 2);
    assert_eq!(decode(frame(&out[0])).base_offset, Some(0));
    match &out[1] {
        Delivery::Final(f) => assert_eq!(
            &f[12..],
            br#"{"type":"subscription_lagged","subscription_id":77,"resume_from":2}"#
        ),
        other => panic!("expected the lagged frame, got {other:?}"),
    }
    assert_eq!(b.next_delivery(lagging), None);
    assert_eq!(
        b.subscriber_drops(lagging),
        None,
        "the subscription is gone"
    );

    assert_eq!(drain(&mut b, tolerant).len(), 1);
    assert_eq!(b.subscriber_drops(tolerant), Some(2));
    let s = b.stats();
    assert_eq!(
        (
            s.lagged_subscriptions,
            s.dropped_batches,
            s.subscribers_open
        ),
        (1, 3, 1)
    );
}

#[test]
fn publisher_variant_only_for_those_who_asked_and_batches_split_on_publisher() {
    let now = Instant::now();
    let mut b = Broker::new(BrokerConfig::default());
    let wants = sub(
        &mut b,
        now,
        SubscribeOpts::negotiated(1, Flags(0x2004), Features::NONE, None),
    );
    let plain = sub(&mut b, now, opts(2));
    for (p, who) in [(&b"a"[..], "alice"), (b"b", "alice"), (b"c", "bob")] {
        b.publish(
            now,
            0,
            &orders(),
            None,
            None,
            vec![Bytes::from_static(p)],
            Some(who),
        )
        .unwrap();
    }
    let too_long = "x".repeat(256);
    b.publish(
        now,
        0,
        &orders(),
        None,
        None,
        vec![Bytes::from_static(b"d")],
        Some(&too_long),
    )
    .unwrap();
    b.flush(now);
    let got: Vec<_> = drain(&mut b, wants)
        .iter()
        .map(|d| decode(frame(d)))
        .collect();
    let summary: Vec<_> = got
        .iter()
        .map(|d| (d.flags, d.publisher.clone(), d.payloads.len()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (0x2004, Some("alice".to_string()), 2),
            (0x2004, Some("bob".to_string()), 1),
            (0x0004, None, 1), // over 255 bytes: not recorded
        ]
    );
    let plain: Vec<_> = drain(&mut b, plain)
        .iter()
        .map(|d| decode(frame(d)).flags)
        .collect();
    assert_eq!(plain, vec![0x0004; 3]);
}

#[test]
fn stream_count_is_limited() {
    let now = Instant::now();
    let mut b = Broker::new(BrokerConfig {
        max_streams: 1,
        ..Default::default()
    });
    publish(&mut b, now, &[b"x"]);
    let err = b
        .publish(
            now,
            0,
            &StreamKey::new("t1", "default", "second"),
            None,
            None,
            vec![],
            None,
        )
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Overloaded);
    publish(&mut b, now, &[b"y"]);
}

#[test]
fn cache_through_the_broker_with_stats_and_sweep_timer() {
    let t0 = Instant::now();
    let mut b = Broker::new(BrokerConfig {
        cache_max_key_bytes: 3,
        ..Default::default()
    });
    let c = CacheKey::new("t1", "default", "c1");
    assert_eq!(b.poll_timeout(), None);
    b.cache_put(t0, 0, &c, "k", Bytes::from_static(b"v1"), Some(1000))
        .unwrap();
    assert_eq!(b.poll_timeout(), Some(t0 + Duration::from_secs(1)));
    assert_eq!(
        b.cache_get(t0, 0, &c, "k").unwrap().now().as_deref(),
        Some(&b"v1"[..])
    );
    assert_eq!(b.cache_get(t0, 0, &c, "nope").unwrap().now(), None);
    assert_eq!(
        b.cache_put(t0, 0, &c, "long", Bytes::new(), None)
            .unwrap_err()
            .code,
        ErrorCode::LimitExceeded
    );
    b.handle_timeout(t0 + Duration::from_secs(1), 0);
    assert_eq!(b.poll_timeout(), None);
    let s = b.stats();
    assert_eq!((s.cache_puts, s.cache_hits, s.cache_misses), (1, 1, 1));
    assert_eq!((s.cache_expired, s.cache_entries, s.cache_bytes), (1, 0, 0));
    b.cache_put(t0, 0, &c, "k", Bytes::from_static(b"v2"), None)
        .unwrap();
    assert_eq!(
        b.cache_delete(t0, 0, &c, "k").unwrap().now().as_deref(),
        Some(&b"v2"[..])
    );
    assert_eq!(b.stats().cache_deletes, 1);
}
