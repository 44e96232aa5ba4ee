//! Three brokers on loopback as one cluster, in this process: they join through their peer
//! links, every node answers `topology` and `shard_owners` from the same metadata, a reader
//! that reaches a node not leading its shard is redirected to the one that does, and a node
//! that stops leaves the topology and rejoins when it comes back.

use felix_client::{Offer, Start};
use felix_integration::cluster_support::{Cluster, NODES};
use felix_integration::{within, TENANT};
use felix_proto::message::{self, Message};
use felix_proto::ErrorCode;

fn subscribe(stream: &str, shard: u64) -> Message {
    Message::Subscribe(message::Subscribe {
        tenant_id: TENANT.into(),
        namespace: "default".into(),
        stream: stream.into(),
        shard: Some(shard),
        start: Some(message::Start::Earliest),
        subscription_id: None,
        queue_capacity: None,
    })
}

#[tokio::test]
async fn three_nodes_agree_on_topology_and_owners_and_redirect_readers() {
    let c = Cluster::start(6).await;
    for (i, name) in NODES.iter().enumerate() {
        assert_eq!(
            c.topology(i).await,
            c.expected_topology(None),
            "topology from {name}"
        );
    }
    let owners = c.owners(0).await;
    assert_eq!(owners.len(), 6);
    for i in 1..3 {
        assert_eq!(
            c.owners(i).await,
            owners,
            "every node names the same owners"
        );
    }
    let mut led = std::collections::BTreeMap::new();
    for o in &owners {
        let node = o.node_id.clone().expect("every shard has a leader");
        let at = c.nodes.iter().find(|n| n.id == node).unwrap();
        assert_eq!(o.addr.as_deref(), Some(at.client.to_string().as_str()));
        assert_eq!(o.generation, Some(1));
        *led.entry(node).or_insert(0) += 1;
    }
    // Each node exports what it leads: two shards of the stream each, and the one cache shard
    // on whichever node placement gave it.
    let mut stream_and_cache = 0.0;
    for (i, n) in c.nodes.iter().enumerate() {
        let ops = n.ops;
        let samples =
            tokio::task::spawn_blocking(move || felix_integration::ops_support::scrape(ops))
                .await
                .unwrap();
        let led_here =
            felix_integration::ops_support::value(&samples, "felix_broker_cluster_shards_led");
        let want = led[NODES[i]] as f64;
        assert!(
            led_here == want || led_here == want + 1.0,
            "{}: {led_here}",
            NODES[i]
        );
        assert_eq!(
            felix_integration::ops_support::value(&samples, "felix_broker_cluster_shards_followed"),
            0.0
        );
        stream_and_cache += led_here;
    }
    assert_eq!(
        stream_and_cache, 7.0,
        "six stream shards and one cache shard, each led once"
    );
    assert_eq!(
        led.values().copied().collect::<Vec<_>>(),
        vec![2, 2, 2],
        "leaders balanced: {led:?}"
    );

    // A subscribe for a shard n2 leads, sent to n1: the not_leader message names n2.
    let shard = owners
        .iter()
        .find(|o| o.node_id.as_deref() == Some("n2"))
        .unwrap()
        .shard;
    let answer = c
        .ask(0, Offer::reference_client(), &subscribe(&c.stream, shard))
        .await;
    let n2 = c.nodes[1].client.to_string();
    assert_eq!(
        answer,
        Message::NotLeader(message::NotLeader {
            node_id: "n2".into(),
            addr: Some(n2),
            generation: 1
        })
    );
    // A client that did not offer FEATURE_REDIRECT gets the coded error instead.
    let mut plain = Offer::reference_client();
    plain.features = plain.features.without(felix_proto::Features::REDIRECT);
    match c.ask(0, plain, &subscribe(&c.stream, shard)).await {
        Message::Error(e) => assert_eq!(e.code, Some(ErrorCode::NotLeader), "{e:?}"),
        other => panic!("expected a coded error, got {other:?}"),
    }
    // At the owner itself the subscription is served.
    let sub = c.client(1, Offer::reference_client()).await;
    let shard32 = u32::try_from(shard).unwrap();
    let mut events = within(
        10,
        sub.subscribe_shard("default", &c.stream, Start::Latest, Some(shard32)),
    )
    .await
    .expect("the owner serves its shard");
    // A key that routes to that shard, published at its owner, reaches the subscriber.
    let key = (0..1000)
        .map(|i| format!("key-{i}"))
        .find(|k| {
            let mapping = felix_proto::routing::RoutingMapping::Modulo;
            felix_proto::routing::shard_for_key(Some(k.as_bytes()), 6, mapping) == shard32
        })
        .expect("some key lands on the shard");
    let publisher = c.client(1, Offer::reference_client()).await;
    publisher
        .publish(
            "default",
            &c.stream,
            vec![bytes::Bytes::from_static(b"hello")],
            Some(bytes::Bytes::from(key)),
            felix_client::Ack::PerBatch,
        )
        .await
        .expect("the owner takes a publish for its shard");
    let event = felix_integration::next_event(&mut events).await;
    assert_eq!(&event.payload[..], b"hello");
    c.shutdown().await;
}

#[tokio::test]
async fn a_stopped_node_leaves_the_topology_and_rejoins() {
    let mut c = Cluster::start(3).await;
    let b = c.brokers[2].take().unwrap();
    within(15, b.shutdown()).await.unwrap();
    // Down within two leases (the control plane's leader marks it after one half): each look
    // at n1's topology follows a metadata change n1 applied, never a timer.
    let mut looks = 0;
    loop {
        let changed = c.brokers[0].as_ref().unwrap().metadata_changed();
        if c.topology(0).await == c.expected_topology(Some(2)) {
            break;
        }
        looks += 1;
        assert!(looks < 50, "n3 still listed: {:?}", c.topology(0).await);
        within(8, changed).await.expect("n1 still running");
    }
    c.brokers[2] = Some(c.boot(2, 3).await);
    c.wait_ready(2).await;
    let mut looks = 0;
    loop {
        let changed = c.brokers[0].as_ref().unwrap().metadata_changed();
        if c.topology(0).await == c.expected_topology(None) {
            break;
        }
        looks += 1;
        assert!(looks < 50, "n3 did not come back");
        within(10, changed).await.expect("n1 still running");
    }
    assert_eq!(c.topology(2).await, c.expected_topology(None));
    c.shutdown().await;
}

/// A publish and cache calls sent to a node that does not lead their shard are forwarded to
/// the leader, answered once it has answered, and land there once.
#[tokio::test]
async fn writes_through_a_non_owner_are_forwarded_to_the_leader() {
    let c = Cluster::start(3).await;
    let owners = c.owners(0).await;
    // A shard n1 does not lead, and a key that routes to it.
    let shard = owners
        .iter()
        .find(|o| o.node_id.as_deref() != Some("n1"))
        .expect("n1 does not lead all three");
    let (shard, leader) = (shard.shard as u32, shard.node_id.clone().unwrap());
    let leader_at = NODES.iter().position(|n| *n == leader).unwrap();
    let key = (0..1000)
        .map(|i| format!("key-{i}"))
        .find(|k| {
            let mapping = felix_proto::routing::RoutingMapping::Modulo;
            felix_proto::routing::shard_for_key(Some(k.as_bytes()), 3, mapping) == shard
        })
        .unwrap();
    let reader = c.client(leader_at, Offer::reference_client()).await;
    let mut events = within(
        10,
        reader.subscribe_shard("default", &c.stream, Start::Latest, Some(shard)),
    )
    .await
    .unwrap();
    let entry = c.client(0, Offer::reference_client()).await;
    for i in 0..20u8 {
        entry
            .publish(
                "default",
                &c.stream,
                vec![bytes::Bytes::from(vec![i])],
                Some(bytes::Bytes::from(key.clone())),
                felix_client::Ack::PerBatch,
            )
            .await
            .expect("a publish through a non-owner is forwarded and acked");
    }
    for i in 0..20u8 {
        let e = felix_integration::next_event(&mut events).await;
        assert_eq!(&e.payload[..], &[i], "in order, once each");
    }
    felix_integration::assert_quiet(&mut events, 200).await;
    let scrape = |i: usize| {
        let ops = c.nodes[i].ops;
        tokio::task::spawn_blocking(move || felix_integration::ops_support::scrape(ops))
    };
    let (entry_m, leader_m) = (scrape(0).await.unwrap(), scrape(leader_at).await.unwrap());
    let v = felix_integration::ops_support::value;
    assert!(
        v(&entry_m, "felix_broker_forwards_sent_total") >= 20.0,
        "{entry_m:?}"
    );
    assert!(v(&leader_m, "felix_broker_forwards_served_total") >= 20.0);
    // The entry node's client session is still open: its channel is open on the leader.
    assert_eq!(
        v(&leader_m, "felix_broker_forwarded_sessions"),
        1.0,
        "{leader_m:?}"
    );
    for m in [&entry_m, &leader_m] {
        // Each node dials each peer and accepts each peer's dial: two links per peer.
        assert_eq!(v(m, "felix_broker_peer_links"), 4.0, "{m:?}");
        assert_eq!(v(m, "felix_broker_peer_messages_dropped_total"), 0.0);
        assert_eq!(v(m, "felix_broker_forwards_waiting"), 0.0);
    }

    // The cache lives on one node; a put through each node is read back through every other.
    for (i, writer) in (0..3).enumerate() {
        let w = c.client(writer, Offer::reference_client()).await;
        let value = bytes::Bytes::from(format!("v{i}"));
        w.cache_put("default", "sessions", "k", value.clone(), None)
            .await
            .expect("a cache put through any node");
        for reader in 0..3 {
            let r = c.client(reader, Offer::reference_client()).await;
            let got = r.cache_get("default", "sessions", "k").await.unwrap();
            assert_eq!(
                got,
                Some(value.clone()),
                "written via n{} read via n{}",
                writer + 1,
                reader + 1
            );
        }
    }
    c.shutdown().await;
}
