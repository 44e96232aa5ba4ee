//! The cluster client's redirects and moves against three real `felix-broker` processes
//! (felix-chaos's cluster with every peer link through a relay, so a node can be cut off:
//! durable, fsync on commit, a 1 s lease, a 1-shard quorum stream and a cache replicated on
//! every node), on tokio and on smol:
//!
//! - the background `topology` refresh asks every known broker in turn, not only the entry
//!   (a client seeded with one node, making no call, comes to hold a connection to each);
//! - a subscription sent to a broker that does not lead its shard (the client offers
//!   `FEATURE_REDIRECT` but not `FEATURE_SHARD_OWNERS`, so it cannot route by itself) is
//!   answered `not_leader`, follows it to the leader, and starts at the offset it asked for;
//! - a cache watch on the cache's owner, whose leadership moves when that node is cut off
//!   from its peers, follows the move (`shard_moved`) to the new owner and delivers every
//!   change written there meanwhile, in order, with none missing;
//! - a `stream_read` entering through the stream's leader just after that leader is
//!   SIGKILLed is retried (a lost connection, then refusals and redirects to the dead node
//!   until another is elected) and answers with every record.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_chaos::cluster::{Cluster, NAMESPACE, NODES};
use felix_chaos::harness::until_async;
use felix_client::{
    CacheWatchItem, Client, Runtime, Start, SubscriptionItem, WatchFilter, WatchStart,
};
use felix_integration::client_cluster_support::{
    client_config, metric, on_smol, on_tokio, started, within, Rt, Spec,
};
use felix_proto::Features;
use felix_testkit::{Direction, Rule};

const STREAM: &str = "moves";
const CACHE: &str = "sessions";
/// Bound on every wait for an event below.
const LIMIT: Duration = Duration::from_secs(60);
/// The seed of the clients' backoff jitter.
const CLIENT_SEED: u64 = 11;

/// Asks `f` about the client's own state until it answers, every 100 ms, at most
/// [`felix_chaos::harness::LIMIT`] (no broker's change announces it).
async fn until_client<T, F: Future<Output = Option<T>>>(
    rt: &dyn Rt,
    what: &str,
    f: impl FnMut() -> F,
) -> T {
    felix_chaos::harness::until_slept(what, |d| rt.sleep(d), f).await
}

/// Cuts node `a` off from both peers, both directions (or heals those links).
fn cut(c: &Cluster, a: usize, on: bool) {
    for b in (0..NODES.len()).filter(|&b| b != a) {
        for (from, to) in [(a, b), (b, a)] {
            let relay = c.relays[from][to].as_ref().expect("relayed links");
            if on {
                relay.set(Direction::Forward, Rule::DropAll);
                relay.set(Direction::Backward, Rule::DropAll);
            } else {
                relay.heal();
            }
        }
    }
}

async fn scenario(rt: &dyn Rt, runtime: Runtime) {
    let cluster = started(&Spec {
        stream: STREAM,
        shards: 1,
        cache: CACHE,
        relays: true,
        prefix: "felix-client-moves",
    });
    let all: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.client).collect();
    let index = |addr: SocketAddr| all.iter().position(|a| *a == addr).expect("a node");

    // Place the stream and the cache, and learn who leads them.
    let probe = Client::connect(client_config(&cluster, all.clone(), runtime, CLIENT_SEED))
        .await
        .expect("connect");
    let mut acked = Vec::new();
    for i in 0..10 {
        let offset = probe
            .publish_at_least_once(NAMESPACE, STREAM, vec![Bytes::from(format!("r{i}"))], None)
            .await
            .expect("a publish")
            .expect("an offset");
        acked.push(offset);
    }
    assert_eq!(acked, (0..10).collect::<Vec<u64>>(), "a fresh stream");
    let leader =
        probe.shard_owners(NAMESPACE, STREAM).await.expect("owners")[0].expect("the shard is led");
    probe
        .cache_put(NAMESPACE, CACHE, "k", Bytes::from_static(b"v0"), None)
        .await
        .expect("place the cache");
    let owner =
        probe.cache_owners(NAMESPACE, CACHE).await.expect("owners")[0].expect("the cache is led");
    probe.close().await;

    // 0. The background `topology` refresh asks each known broker in turn, not only the
    // entry: a client seeded with one node and making no call comes to hold a connection to
    // every node (each opened to ask it), and still knows every node.
    let mut quick = client_config(&cluster, vec![all[0]], runtime, CLIENT_SEED);
    quick.topology_interval = Duration::from_millis(100);
    let client = Client::connect(quick).await.expect("connect");
    let mut want = all.clone();
    want.sort();
    until_client(rt, "every node asked topology", || async {
        (client.connected_brokers() == want).then_some(())
    })
    .await;
    let mut known = client.endpoints();
    known.sort();
    assert_eq!(known, want);
    client.close().await;

    // 1. A subscription redirected with its start offset. The client knows one broker that
    // does not lead the shard and cannot ask `shard_owners`, so its subscribe goes there, is
    // answered `not_leader`, and is sent on to the leader with the same start.
    let follower = *all.iter().find(|a| **a != leader).expect("a follower");
    let mut blind = client_config(&cluster, vec![follower], runtime, CLIENT_SEED);
    blind.offer.features = Features(blind.offer.features.0 & !Features::SHARD_OWNERS.0);
    let client = Client::connect(blind)
        .await
        .expect("connect to the follower");
    let mut sub = client
        .subscribe_shard(NAMESPACE, STREAM, Start::Offset(4), Some(0))
        .await
        .expect("subscribe through the follower");
    assert_eq!(sub.broker(), leader, "followed not_leader to the leader");
    assert_eq!(sub.start_offset(), Some(4), "the start offset carried");
    let mut got = Vec::new();
    while got.len() < 6 {
        match within(rt, LIMIT, sub.next()).await {
            Some(Ok(SubscriptionItem::Event(e))) => {
                got.push((e.offset.expect("durable offsets"), e.payload))
            }
            other => panic!("the redirected subscription: {other:?}"),
        }
    }
    let want: Vec<(u64, Bytes)> = (4..10).map(|i| (i, Bytes::from(format!("r{i}")))).collect();
    assert_eq!(got, want, "from the offset asked for, in order");
    drop(sub);
    client.close().await;

    // 2. A cache watch follows its cache's leadership to the new owner without a gap. The
    // client enters through another node, watches at the owner, and the owner is cut off
    // from its peers once a follower is level with it (a `leader` cache passes on only then).
    let o = index(owner);
    let entry = *all.iter().find(|a| **a != owner).expect("another node");
    let client = Client::connect(client_config(&cluster, vec![entry], runtime, CLIENT_SEED))
        .await
        .expect("connect");
    let mut watch = client
        .watch_cache(
            NAMESPACE,
            CACHE,
            WatchFilter::Key("k".into()),
            WatchStart::Live,
        )
        .await
        .expect("watch at the owner");
    assert_eq!(watch.broker(), owner, "the watch is at the cache's owner");
    client
        .cache_put(NAMESPACE, CACHE, "k", Bytes::from_static(b"v1"), None)
        .await
        .expect("cache_put");
    match within(rt, LIMIT, watch.next()).await {
        Some(Ok(CacheWatchItem::Change(c))) => assert_eq!(c.value.as_deref(), Some(&b"v1"[..])),
        other => panic!("the watch: {other:?}"),
    }
    until_async(&cluster, "the cache's leader is quiet", || async {
        (metric(cluster.nodes[o].ops, "felix_broker_leader_shards_quiet").unwrap_or(0.0) >= 1.0)
            .then_some(())
    })
    .await;
    cut(&cluster, o, true);
    let new_owner = until_async(&cluster, "another node leads the cache", || async {
        match client.cache_owners(NAMESPACE, CACHE).await {
            Ok(owners) => owners[0].filter(|a| *a != owner),
            Err(_) => None,
        }
    })
    .await;
    // Written at the new owner while the watch still sits on the old one.
    for v in ["v2", "v3", "v4"] {
        client
            .cache_put(NAMESPACE, CACHE, "k", Bytes::from(v), None)
            .await
            .expect("cache_put at the new owner");
    }
    cut(&cluster, o, false);
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match within(rt, LIMIT, watch.next()).await {
            Some(Ok(CacheWatchItem::Change(c))) => {
                assert_eq!(c.key, "k");
                seen.push(c.value.expect("a put"));
            }
            other => panic!("the watch across the move (seen {seen:?}): {other:?}"),
        }
    }
    assert_eq!(
        seen,
        ["v2", "v3", "v4"]
            .map(|v| Bytes::from_static(v.as_bytes()))
            .to_vec(),
        "every change made at the new owner, in order, none missing or repeated"
    );
    assert_eq!(
        watch.broker(),
        new_owner,
        "the watch moved to the new owner"
    );
    drop(watch);
    client.close().await;

    // 3. A one-request call rides through its broker's death: a client entering through the
    // stream's leader reads the shard just after that leader is SIGKILLed. The first attempt
    // meets the dead connection (noticed by the keep-alives), the next enter elsewhere and
    // are refused or redirected to the dead leader until a new one is elected; each is
    // retried with backoff, and the read answers with every record.
    let mut seeds = vec![leader];
    seeds.extend(all.iter().filter(|a| **a != leader));
    let client = Client::connect(client_config(&cluster, seeds, runtime, CLIENT_SEED))
        .await
        .expect("connect through the leader");
    let mut cluster = cluster;
    cluster.kill(index(leader)).expect("SIGKILL the leader");
    let killed = Instant::now();
    let page = client
        .stream_read(NAMESPACE, STREAM, 0, 0, Some(10), Some(100))
        .await
        .expect("stream_read across the leader's death");
    let got: Vec<(u64, Bytes)> = page
        .records
        .into_iter()
        .map(|r| (r.offset, r.payload))
        .collect();
    let want: Vec<(u64, Bytes)> = (0..10).map(|i| (i, Bytes::from(format!("r{i}")))).collect();
    assert_eq!(got, want, "every record, read from the new leader");
    eprintln!(
        "{runtime:?}: stream_read answered {:?} after its entry broker, the leader, was killed",
        killed.elapsed()
    );
    client.close().await;
    drop(cluster);
}

/// One cluster at a time: a layout's ports come from a window fixed by the process id.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn redirects_and_moves_are_followed_with_their_offsets_on_tokio() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    on_tokio(scenario);
}

#[test]
fn redirects_and_moves_are_followed_with_their_offsets_on_smol() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    on_smol(scenario);
}
