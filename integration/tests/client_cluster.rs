//! The cluster client against three real `felix-broker` processes (felix-chaos's cluster:
//! durable, fsync on commit, a 1 s lease, one 3-shard quorum stream and one cache, each
//! replicated on every node), on tokio and on smol.
//!
//! The client is seeded with one node only: one that leads a stream shard, and the cache's
//! owner when that node leads a shard too. It must learn the others, send keyed publishes
//! straight to their owners (no node forwards one), and survive losing its seed: that node is
//! SIGKILLed under load from `publish_at_least_once` and `publish` producers on every shard,
//! with a `subscribe_sharded` from the first record and a cache watch open. Afterwards every
//! shard is read back through the same client and checked against what the producers were
//! told: every acknowledged record is at its acknowledged offset, no plain `publish` record
//! is there twice, every `publish_at_least_once` call ended acknowledged, and the sharded
//! subscription saw every shard contiguously. Unrouted calls reach the new entry, the cache
//! reads back, and the watch sees a write made after the kill. The time from the kill to the
//! next acknowledgement on the killed leader's shards is printed (docs/client.md).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_chaos::cluster::NAMESPACE;
use felix_client::{Ack, Client, ClientError, Runtime, Start};
use felix_integration::client_cluster_support::{
    client_config, metric, on_smol, on_tokio, started, within, BoxFuture, Rt, Spec,
};
use felix_integration::join_all;
use felix_proto::routing::{shard_for_key, RoutingMapping};

const STREAM: &str = "orders";
const CACHE: &str = "sessions";
const SHARDS: u32 = 3;
/// Acknowledgements per shard before the kill, and after it, before the run stops.
const ACKS_BEFORE: usize = 30;
const ACKS_AFTER: usize = 30;
/// Bound on the whole load phase; a run that has not met its counts by then fails.
const RUN_LIMIT: Duration = Duration::from_secs(90);
/// Bound on reading one shard back.
const READ_LIMIT: Duration = Duration::from_secs(30);
/// The seed of the clients' backoff jitter.
const CLIENT_SEED: u64 = 7;

/// Takes what the sharded subscription has within a second into `seen`.
async fn consume(
    rt: &dyn Rt,
    sharded: &mut felix_client::ShardedSubscription,
    seen: &mut [Vec<(u64, Bytes)>],
) {
    match within(rt, Duration::from_secs(1), sharded.next()).await {
        None => {}
        Some(Ok(ev)) => match ev.item {
            felix_client::SubscriptionItem::Event(e) => {
                seen[ev.shard as usize].push((e.offset.expect("durable offsets"), e.payload))
            }
            felix_client::SubscriptionItem::End(end) => {
                panic!("shard {} ended: {end:?}", ev.shard)
            }
        },
        Some(Err(e)) => panic!("the sharded subscription: {e}"),
    }
}

/// A key for each shard.
fn keys() -> Vec<Bytes> {
    (0..SHARDS)
        .map(|shard| {
            (0..10_000)
                .map(|i| format!("key-{i}"))
                .find(|k| {
                    shard_for_key(Some(k.as_bytes()), SHARDS, RoutingMapping::Modulo) == shard
                })
                .map(Bytes::from)
                .expect("a key for every shard")
        })
        .collect()
}

/// What one call was told.
#[derive(Debug)]
struct Outcome {
    shard: u32,
    at_least_once: bool,
    payload: String,
    result: Result<Option<u64>, ClientError>,
    /// When the answer came.
    at: Instant,
}

/// What the load phase's controller hands back: every outcome, when the seed was killed,
/// and the forwards counted just before.
type RunResult = (Vec<Outcome>, Instant, f64);

async fn scenario(rt: &dyn Rt, runtime: Runtime) {
    let mut cluster = started(&Spec {
        stream: STREAM,
        shards: SHARDS,
        cache: CACHE,
        relays: false,
        prefix: "felix-client-cluster",
    });
    let all: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.client).collect();

    // Who leads what. The stream is placed on first use: one acknowledged publish per
    // shard places it and has every shard led.
    let keys = keys();
    let probe = Client::connect(client_config(&cluster, all.clone(), runtime, CLIENT_SEED))
        .await
        .expect("connect");
    for key in &keys {
        probe
            .publish_at_least_once(
                NAMESPACE,
                STREAM,
                vec![Bytes::from_static(b"probe")],
                Some(key.clone()),
            )
            .await
            .expect("the probe publish");
    }
    let owners = probe.shard_owners(NAMESPACE, STREAM).await.expect("owners");
    assert_eq!(owners.len(), SHARDS as usize, "{owners:?}");
    assert!(
        owners.iter().all(Option::is_some),
        "every shard led: {owners:?}"
    );
    // The victim: the cache's owner when it also leads a stream shard (so the watch must be
    // made again elsewhere too), else shard 0's leader.
    let cache_owner = probe
        .cache_owners(NAMESPACE, CACHE)
        .await
        .expect("cache owners")
        .first()
        .copied()
        .flatten()
        .expect("the cache is placed");
    let victim_addr = if owners.contains(&Some(cache_owner)) {
        cache_owner
    } else {
        owners[0].expect("shard 0 is led")
    };
    let victim = all
        .iter()
        .position(|a| *a == victim_addr)
        .expect("a node's address");
    let victim_shards: Vec<u32> = (0..SHARDS)
        .filter(|s| owners[*s as usize] == Some(victim_addr))
        .collect();
    probe.close().await;
    let forwards_before: f64 = cluster
        .nodes
        .iter()
        .map(|n| metric(n.ops, "felix_broker_forwards_sent_total").expect("metrics answer"))
        .sum();

    // The client knows only the victim.
    let client = Client::connect(client_config(
        &cluster,
        vec![victim_addr],
        runtime,
        CLIENT_SEED,
    ))
    .await
    .expect("connect through one seed");
    let mut known = client.endpoints();
    known.sort();
    let mut want = all.clone();
    want.sort();
    assert_eq!(known, want, "learned every broker from its one seed");
    // Cache calls go to the cache's owner, whichever broker that is; so does a watch.
    let mut watch = client
        .watch_cache(
            NAMESPACE,
            CACHE,
            felix_client::WatchFilter::Key("k".into()),
            felix_client::WatchStart::Live,
        )
        .await
        .expect("watch at the cache's owner");
    client
        .cache_put(NAMESPACE, CACHE, "k", Bytes::from_static(b"v"), None)
        .await
        .expect("cache_put");
    let got = client
        .cache_get(NAMESPACE, CACHE, "k")
        .await
        .expect("cache_get");
    assert_eq!(got.as_deref(), Some(&b"v"[..]));
    match within(rt, READ_LIMIT, watch.next()).await {
        Some(Ok(felix_client::CacheWatchItem::Change(c))) => {
            assert_eq!((c.key.as_str(), c.value.as_deref()), ("k", Some(&b"v"[..])));
        }
        other => panic!("the watch: {other:?}"),
    }
    assert_eq!(client.counter_add(NAMESPACE, CACHE, "n", 2).await, Ok(2));
    assert_eq!(client.counter_add(NAMESPACE, CACHE, "n", 3).await, Ok(5));
    assert_eq!(client.counter_get(NAMESPACE, CACHE, "n").await, Ok(Some(5)));
    // Every shard, from its first record, across the kill.
    let mut sharded = client
        .subscribe_sharded(NAMESPACE, STREAM, Start::Earliest, &HashMap::new())
        .await
        .expect("subscribe to every shard");
    assert_eq!(sharded.shards(), SHARDS as usize);

    let stop = Arc::new(AtomicBool::new(false));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Outcome>();
    let mut producers: Vec<BoxFuture<'_, ()>> = Vec::new();
    for shard in 0..SHARDS {
        for at_least_once in [true, false] {
            let (client, key, stop, tx) = (
                client.clone(),
                keys[shard as usize].clone(),
                stop.clone(),
                tx.clone(),
            );
            producers.push(Box::pin(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let payload = format!("{}{shard}-{i}", if at_least_once { "L" } else { "P" });
                    let body = vec![Bytes::from(payload.clone())];
                    let result = if at_least_once {
                        client
                            .publish_at_least_once(NAMESPACE, STREAM, body, Some(key.clone()))
                            .await
                    } else {
                        client
                            .publish(NAMESPACE, STREAM, body, Some(key.clone()), Ack::PerMessage)
                            .await
                    };
                    let _ = tx.send(Outcome {
                        shard,
                        at_least_once,
                        payload,
                        result,
                        at: Instant::now(),
                    });
                    i += 1;
                }
            }));
        }
    }
    drop(tx);

    // The controller: kill the seed once every shard has its acks, stop once every shard
    // has as many again.
    let began = Instant::now();
    let control = async {
        let mut outcomes = Vec::new();
        let mut killed_at: Option<Instant> = None;
        let mut forwards_at_kill = 0.0;
        loop {
            let Some(o) = rx.recv().await else { break };
            outcomes.push(o);
            let acks = |after: Option<Instant>| -> Vec<usize> {
                (0..SHARDS)
                    .map(|s| {
                        outcomes
                            .iter()
                            .filter(|o| o.shard == s && o.result.is_ok())
                            .filter(|o| after.is_none_or(|t| o.at > t))
                            .count()
                    })
                    .collect()
            };
            match killed_at {
                // A `leader` cache passes on only once its leader had a follower recorded
                // level with it (docs/replication.md, "Who may lead a `leader` shard"): the
                // cache is idle after its puts, so that comes within the quiet spell.
                None if acks(None).iter().all(|n| *n >= ACKS_BEFORE)
                    && (victim_addr != cache_owner
                        || metric(
                            cluster.nodes[victim].ops,
                            "felix_broker_leader_shards_quiet",
                        )
                        .expect("metrics answer")
                            >= 1.0) =>
                {
                    forwards_at_kill = cluster
                        .nodes
                        .iter()
                        .map(|n| {
                            metric(n.ops, "felix_broker_forwards_sent_total")
                                .expect("metrics answer")
                        })
                        .sum();
                    cluster.kill(victim).expect("SIGKILL the seed");
                    killed_at = Some(Instant::now());
                }
                Some(t) if acks(Some(t)).iter().all(|n| *n >= ACKS_AFTER) => break,
                _ => {}
            }
            if began.elapsed() > RUN_LIMIT {
                stop.store(true, Ordering::Relaxed);
                panic!(
                    "the run did not meet its counts in {RUN_LIMIT:?} (killed: {killed_at:?}); \
                     acks {:?}\n{}",
                    acks(killed_at),
                    cluster.diagnose()
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
        // The producers' last calls.
        while let Some(o) = rx.recv().await {
            outcomes.push(o);
        }
        (outcomes, killed_at.expect("killed"), forwards_at_kill)
    };
    let mut seen: Vec<Vec<(u64, Bytes)>> = vec![Vec::new(); SHARDS as usize];
    let consumer = async {
        while !stop.load(Ordering::Relaxed) {
            consume(rt, &mut sharded, &mut seen).await;
        }
    };
    let mut all_futs: Vec<BoxFuture<'_, Option<RunResult>>> = vec![
        Box::pin(async { Some(control.await) }),
        Box::pin(async {
            consumer.await;
            None
        }),
    ];
    for p in producers {
        all_futs.push(Box::pin(async move {
            p.await;
            None
        }));
    }
    let (outcomes, killed_at, forwards_at_kill) = join_all(all_futs)
        .await
        .into_iter()
        .flatten()
        .next()
        .expect("the controller's result");

    // Keyed publishes went straight to their owners while the cluster was whole.
    assert_eq!(
        forwards_at_kill - forwards_before,
        0.0,
        "no publish was forwarded before the kill"
    );

    // The failover gap on the killed leader's shards: the longest time without an
    // acknowledgement across the kill.
    for shard in &victim_shards {
        let mut acked: Vec<Instant> = outcomes
            .iter()
            .filter(|o| o.shard == *shard && o.result.is_ok())
            .map(|o| o.at)
            .collect();
        acked.sort();
        let from = acked.iter().rposition(|t| *t <= killed_at).unwrap_or(0);
        let (gap, gap_ends) = acked[from..]
            .windows(2)
            .map(|w| (w[1] - w[0], w[1]))
            .max()
            .expect("acks after the kill");
        eprintln!(
            "{runtime:?}: shard {shard} (led by the killed seed): longest time without an \
             acknowledgement across the kill {gap:?}, ending {:?} after the kill",
            gap_ends - killed_at
        );
    }

    // The history: read every shard back from its first record, through the same client.
    let mut logs: Vec<HashMap<u64, Bytes>> = Vec::new();
    for shard in 0..SHARDS {
        let last = outcomes
            .iter()
            .filter(|o| o.shard == shard)
            .filter_map(|o| o.result.as_ref().ok().copied().flatten())
            .max()
            .expect("acks on every shard");
        let mut sub = client
            .subscribe_shard(NAMESPACE, STREAM, Start::Earliest, Some(shard))
            .await
            .expect("subscribe for the read-back");
        let mut log = HashMap::new();
        let read = within(rt, READ_LIMIT, async {
            while log.len() as u64 <= last {
                match sub.next().await.expect("the read-back") {
                    felix_client::SubscriptionItem::Event(e) => {
                        log.insert(e.offset.expect("durable offsets"), e.payload);
                    }
                    felix_client::SubscriptionItem::End(end) => panic!("ended: {end:?}"),
                }
            }
        })
        .await;
        assert!(
            read.is_some(),
            "shard {shard}: read {} of {} records",
            log.len(),
            last + 1
        );
        logs.push(log);
    }

    // The sharded subscription: every shard contiguous from its first record, no gap and no
    // repeat across the failover, and the same records the read-back found.
    let began = Instant::now();
    for shard in 0..SHARDS as usize {
        let last = logs[shard].len() as u64 - 1;
        while seen[shard].last().is_none_or(|(o, _)| *o < last) {
            assert!(
                began.elapsed() < READ_LIMIT,
                "the sharded subscription's shard {shard} stopped at {:?} of {last}",
                seen[shard].last().map(|(o, _)| o)
            );
            consume(rt, &mut sharded, &mut seen).await;
        }
    }
    for (shard, events) in seen.iter().enumerate() {
        for (i, (offset, payload)) in events.iter().enumerate() {
            assert_eq!(*offset, i as u64, "shard {shard}: contiguous from 0");
            if let Some(logged) = logs[shard].get(offset) {
                assert_eq!(logged, payload, "shard {shard} offset {offset}");
            }
        }
    }

    // Calls that are not routed go to the current entry: the seed they first went to is dead.
    assert_eq!(
        client.stream_shards(NAMESPACE, STREAM).await,
        Ok(u64::from(SHARDS))
    );
    let view = client.topology().await.expect("topology after the kill");
    assert!(!view.brokers.is_empty());
    // The cache after the kill (replicated on every node): what was written stays readable.
    let got = client
        .cache_get(NAMESPACE, CACHE, "k")
        .await
        .expect("cache_get after");
    assert_eq!(got.as_deref(), Some(&b"v"[..]));
    assert_eq!(client.counter_get(NAMESPACE, CACHE, "n").await, Ok(Some(5)));
    eprintln!(
        "{runtime:?}: the cache's owner before the kill: {cache_owner} (the killed seed: \
         {victim_addr})"
    );
    // The watch made before the kill sees a write made after it (made again at the owner
    // if it was on the dead node), and nothing in between is repeated.
    client
        .cache_put(NAMESPACE, CACHE, "k", Bytes::from_static(b"v2"), None)
        .await
        .expect("cache_put after the kill");
    match within(rt, READ_LIMIT, watch.next()).await {
        Some(Ok(felix_client::CacheWatchItem::Change(c))) => {
            assert_eq!(
                (c.key.as_str(), c.value.as_deref()),
                ("k", Some(&b"v2"[..]))
            );
        }
        other => panic!("the watch after the kill: {other:?}"),
    }
    drop(watch);

    // Resumed from per-shard positions: each shard starts right after its position, the
    // shards not listed from the start given.
    let positions: HashMap<u32, u64> = [(0, seen[0].len() as u64 / 2), (1, 0)].into();
    let mut resumed = client
        .subscribe_sharded(NAMESPACE, STREAM, Start::Earliest, &positions)
        .await
        .expect("resume every shard");
    let mut first: HashMap<u32, u64> = HashMap::new();
    let began = Instant::now();
    while first.len() < SHARDS as usize {
        assert!(
            began.elapsed() < READ_LIMIT,
            "resumed shards so far: {first:?}"
        );
        if let Some(Ok(ev)) = within(rt, Duration::from_secs(1), resumed.next()).await {
            if let felix_client::SubscriptionItem::Event(e) = ev.item {
                first.entry(ev.shard).or_insert(e.offset.expect("offsets"));
            }
        }
    }
    assert_eq!(first[&0], positions[&0] + 1);
    assert_eq!(first[&1], 1);
    assert_eq!(first[&2], 0, "a shard not listed starts at the start given");
    drop(resumed);

    let mut acked = 0;
    let mut unknown_plain = 0;
    for o in &outcomes {
        match &o.result {
            Ok(offset) => {
                acked += 1;
                let offset = offset.expect("an acknowledged publish carries its offset");
                assert_eq!(
                    logs[o.shard as usize].get(&offset).map(|b| &b[..]),
                    Some(o.payload.as_bytes()),
                    "{} acknowledged at {offset} of shard {}",
                    o.payload,
                    o.shard
                );
            }
            Err(e) => {
                assert!(
                    !o.at_least_once,
                    "publish_at_least_once gave up: {} {e}",
                    o.payload
                );
                unknown_plain += 1;
            }
        }
    }
    let mut copies: HashMap<&[u8], usize> = HashMap::new();
    for log in &logs {
        for payload in log.values() {
            *copies.entry(&payload[..]).or_default() += 1;
        }
    }
    let plain_twice: Vec<_> = copies
        .iter()
        .filter(|(p, n)| p.starts_with(b"P") && **n > 1)
        .collect();
    assert!(
        plain_twice.is_empty(),
        "plain publishes written twice: {plain_twice:?}"
    );
    let duplicated = copies
        .iter()
        .filter(|(p, n)| p.starts_with(b"L") && **n > 1)
        .count();
    eprintln!(
        "{runtime:?}: {acked} acknowledged, {unknown_plain} plain publishes reported with an \
         unknown outcome, {duplicated} at-least-once records written twice"
    );
    client.close().await;
    cluster.stop_all();
}

/// One cluster at a time: two would share this machine's cores with each other.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_one_seed_client_rides_through_its_seed_leaders_sigkill_on_tokio() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    on_tokio(scenario);
}

#[test]
fn a_one_seed_client_rides_through_its_seed_leaders_sigkill_on_smol() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    on_smol(scenario);
}
