//! Replicated shards on three durable nodes in this process: a quorum publish is acknowledged
//! once two of three copies hold it, the shard survives its leader (a new one fences the
//! others and serves the same log), a follower back on an empty disk is rebuilt and counts
//! again, and everything acknowledged is read back at its offset.

use std::collections::BTreeMap;

use bytes::Bytes;
use felix_client::{Ack, Offer, Start};
use felix_integration::cluster_support::{Cluster, NODES};
use felix_integration::durable_support::TempDir;
use felix_integration::within;
use felix_proto::message::Message;
use felix_proto::routing::{shard_for_key, RoutingMapping};
use felix_proto::ErrorCode;
use felix_runtime_tokio::felix_engine::Consistency;

const SHARDS: u32 = 3;

fn key_for(shard: u32) -> Bytes {
    (0..10_000)
        .map(|i| format!("key-{i}"))
        .find(|k| shard_for_key(Some(k.as_bytes()), SHARDS, RoutingMapping::Modulo) == shard)
        .map(Bytes::from)
        .expect("some key lands on the shard")
}

/// The node leading `shard`, as node `at` sees it.
async fn leader_of(c: &Cluster, at: usize, shard: u32) -> Option<String> {
    c.owners(at).await[shard as usize].node_id.clone()
}

/// Waits until node `at` names a leader of `shard` other than `not`, and returns its index.
async fn new_leader(c: &Cluster, at: usize, shard: u32, not: &str) -> usize {
    within(30, async {
        loop {
            let changed = c.brokers[at].as_ref().expect("running").metadata_changed();
            if let Some(l) = leader_of(c, at, shard).await {
                if l != not {
                    return NODES.iter().position(|n| *n == l).expect("a node");
                }
            }
            let _ = changed.await;
        }
    })
    .await
}

/// Publishes one acked record keyed to `shard` through node `at`, retrying a refusal that
/// says to retry (the shard is between leaders), at most `tries` times.
async fn publish(c: &Cluster, at: usize, shard: u32, payload: Bytes) -> u64 {
    let client = c.client(at, Offer::reference_client()).await;
    for _ in 0..200 {
        let sent = client
            .publish(
                "default",
                &c.stream,
                vec![payload.clone()],
                Some(key_for(shard)),
                Ack::PerBatch,
            )
            .await;
        match sent {
            Ok(Some(offset)) => {
                client.close().await;
                return offset;
            }
            Ok(None) => panic!("an acked publish on a durable shard has an offset"),
            Err(e) if e.to_string().contains("shard_unavailable") => {
                // Between leaders: wait for the metadata to move, not for a time.
                let changed = c.brokers[at].as_ref().expect("running").metadata_changed();
                let _ = within(10, changed).await;
            }
            Err(e) => panic!("publish refused: {e}"),
        }
    }
    panic!("the shard never took the publish");
}

/// Every record of `shard` from the start, read from the node that leads it as node `at`
/// sees it. Our client does not follow redirects, so a reader that meets a leader change
/// (a `not_leader` answer) asks again.
async fn read_all(c: &Cluster, at: usize, shard: u32, expect: usize) -> Vec<(u64, Bytes)> {
    for _ in 0..20 {
        let changed = c.brokers[at].as_ref().expect("running").metadata_changed();
        let leader = leader_of(c, at, shard).await.expect("the shard is led");
        let leader = NODES.iter().position(|n| *n == leader).expect("a node");
        let client = c.client(leader, Offer::reference_client()).await;
        let sub = within(
            10,
            client.subscribe_shard("default", &c.stream, Start::Earliest, Some(shard)),
        )
        .await;
        let mut sub = match sub {
            Ok(sub) => sub,
            Err(e) if e.to_string().contains("not_leader") => {
                // The metadata here trails the leader's own: wait for it to move, bounded.
                let _ = tokio::time::timeout(std::time::Duration::from_secs(10), changed).await;
                continue;
            }
            Err(e) => panic!("the shard serves a reader: {e}"),
        };
        let mut out = Vec::new();
        while out.len() < expect {
            let e = felix_integration::next_event(&mut sub).await;
            out.push((e.offset.expect("durable records have offsets"), e.payload));
        }
        return out;
    }
    panic!("the shard's leader never served a reader");
}

/// Three durable nodes, each in a directory of its own named after `name`, with the stream
/// replicated on all three at quorum consistency.
async fn start_quorum(name: &str) -> (Cluster, Vec<TempDir>) {
    let dirs: Vec<TempDir> = NODES
        .iter()
        .map(|n| TempDir::new(&format!("{name}-{n}")))
        .collect();
    let paths = dirs.iter().map(|d| d.path().to_path_buf()).collect();
    let c = Cluster::start_replicated(SHARDS, paths, Consistency::Quorum).await;
    (c, dirs)
}

#[tokio::test]
async fn quorum_acks_survive_the_leader_and_are_read_back_at_their_offsets() {
    felix_integration::test_logs();
    // The directories live as long as the test.
    let (mut c, _dirs) = start_quorum("repl").await;
    let shard = 0;
    let old = leader_of(&c, 0, shard).await.expect("placed with a leader");
    let old_at = NODES.iter().position(|n| *n == old).unwrap();
    let entry = (old_at + 1) % NODES.len();

    let mut acked = BTreeMap::new();
    for i in 0..20 {
        let p = Bytes::from(format!("before-{i}"));
        acked.insert(publish(&c, entry, shard, p.clone()).await, p);
    }
    // The leader goes away; one of the two followers takes over at the next generation.
    let b = c.brokers[old_at].take().unwrap();
    within(15, b.shutdown()).await.unwrap();
    let next_at = new_leader(&c, entry, shard, &old).await;
    assert_ne!(next_at, old_at);
    for i in 0..20 {
        let p = Bytes::from(format!("after-{i}"));
        acked.insert(publish(&c, entry, shard, p.clone()).await, p);
    }
    let read = read_all(&c, entry, shard, acked.len()).await;
    let read: BTreeMap<u64, Bytes> = read.into_iter().collect();
    assert_eq!(
        read, acked,
        "every acknowledged record, at its offset, once"
    );
    let offsets: Vec<u64> = acked.keys().copied().collect();
    assert_eq!(offsets, (0..40).collect::<Vec<u64>>(), "contiguous from 0");

    // The old leader comes back as a follower of the new generation and catches up: with
    // the new leader stopped too, it and the third node still hold every record.
    c.brokers[old_at] = Some(c.boot(old_at, SHARDS).await);
    c.wait_ready(old_at).await;
    let p = Bytes::from_static(b"rejoined");
    acked.insert(publish(&c, entry, shard, p.clone()).await, p);
    let b = c.brokers[next_at].take().unwrap();
    within(15, b.shutdown()).await.unwrap();
    // Asked through the rejoined node, which is running whoever else stopped.
    let third = new_leader(&c, old_at, shard, NODES[next_at]).await;
    assert!(third != next_at);
    let read: BTreeMap<u64, Bytes> = read_all(&c, old_at, shard, acked.len())
        .await
        .into_iter()
        .collect();
    assert_eq!(
        read, acked,
        "nothing acknowledged was lost across two failovers"
    );
    c.shutdown().await;
}

#[tokio::test]
async fn a_follower_back_on_an_empty_disk_is_rebuilt_and_counts_for_the_quorum() {
    felix_integration::test_logs();
    let (mut c, dirs) = start_quorum("rebuild").await;
    let shard = 0;
    let leader = leader_of(&c, 0, shard).await.expect("placed with a leader");
    let lead_at = NODES.iter().position(|n| *n == leader).unwrap();
    let (wiped, other) = ((lead_at + 1) % NODES.len(), (lead_at + 2) % NODES.len());

    let mut acked = BTreeMap::new();
    for i in 0..20 {
        let p = Bytes::from(format!("before-{i}"));
        acked.insert(publish(&c, lead_at, shard, p.clone()).await, p);
    }
    // A follower loses its drive: stopped, its directory emptied, started again. It comes
    // back under a new storage identity with nothing of the shard.
    let b = c.brokers[wiped].take().unwrap();
    within(15, b.shutdown()).await.unwrap();
    let dir = dirs[wiped].path();
    std::fs::remove_dir_all(dir).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    c.brokers[wiped] = Some(c.boot(wiped, SHARDS).await);
    c.wait_ready(wiped).await;
    for i in 0..10 {
        let p = Bytes::from(format!("while-rebuilt-{i}"));
        acked.insert(publish(&c, lead_at, shard, p.clone()).await, p);
    }
    // With the other follower stopped, the only majority is the leader and the rebuilt copy:
    // these are acknowledged (not `quorum_timeout`) only if that copy holds the whole log and
    // counts for the quorum.
    let b = c.brokers[other].take().unwrap();
    within(15, b.shutdown()).await.unwrap();
    for i in 0..10 {
        let p = Bytes::from(format!("after-{i}"));
        acked.insert(publish(&c, lead_at, shard, p.clone()).await, p);
    }
    let read: BTreeMap<u64, Bytes> = read_all(&c, lead_at, shard, acked.len())
        .await
        .into_iter()
        .collect();
    assert_eq!(
        read, acked,
        "every acknowledged record, at its offset, once"
    );
    assert_eq!(
        acked.keys().copied().collect::<Vec<u64>>(),
        (0..40).collect::<Vec<u64>>(),
        "contiguous from 0"
    );
    c.shutdown().await;
}

/// Sends one consumer-group request for group `g` on `shard` to node `at`, asking again
/// while the shard is between leaders (`not_leader` from a node whose metadata trails, or
/// `shard_unavailable` while the new leader fences).
async fn group_request(c: &Cluster, at: usize, shard: u32, body: &str) -> Message {
    let json = format!(
        r#"{{"tenant_id":"t1","namespace":"default","stream":"{}","shard":{shard},"group":"g",{body}}}"#,
        c.stream
    );
    let ask = Message::decode(json.as_bytes()).expect("a group request");
    for _ in 0..50 {
        let changed = c.brokers[at].as_ref().expect("running").metadata_changed();
        match c.ask(at, Offer::reference_client(), &ask).await {
            Message::Error(e)
                if matches!(
                    e.code,
                    Some(ErrorCode::NotLeader | ErrorCode::ShardUnavailable)
                ) =>
            {
                let _ = within(10, changed).await;
            }
            answer => return answer,
        }
    }
    panic!("the shard's group never answered");
}

#[tokio::test]
async fn a_groups_acknowledged_cursor_survives_its_shards_leader() {
    felix_integration::test_logs();
    let (mut c, _dirs) = start_quorum("groups").await;
    let shard = 0;
    let old = leader_of(&c, 0, shard).await.expect("placed with a leader");
    let old_at = NODES.iter().position(|n| *n == old).unwrap();
    let entry = (old_at + 1) % NODES.len();
    for i in 0..6 {
        let offset = publish(&c, entry, shard, Bytes::from(format!("job-{i}"))).await;
        assert_eq!(offset, i);
    }
    let poll = r#""type":"group_poll","max_records":16,"request_id":1"#;
    let Message::GroupRecords(got) = group_request(&c, old_at, shard, poll).await else {
        panic!("group records");
    };
    let offsets: Vec<u64> = got.records.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (0..6).collect::<Vec<u64>>());
    // On a quorum stream a group's ack is answered once a majority holds it, like a publish.
    for offset in 0..4 {
        let ack = format!(r#""type":"group_ack","offset":{offset},"request_id":2"#);
        let answer = group_request(&c, old_at, shard, &ack).await;
        assert!(
            matches!(answer, Message::CacheOk(_)),
            "ack {offset}: {answer:?}"
        );
    }
    let b = c.brokers[old_at].take().unwrap();
    within(15, b.shutdown()).await.unwrap();
    let next_at = new_leader(&c, entry, shard, &old).await;
    // A record at the new generation commits everything below it.
    assert_eq!(
        publish(&c, entry, shard, Bytes::from_static(b"job-6")).await,
        6
    );
    let Message::GroupRecords(got) = group_request(&c, next_at, shard, poll).await else {
        panic!("group records");
    };
    let offsets: Vec<u64> = got.records.iter().map(|r| r.offset).collect();
    assert_eq!(
        offsets,
        vec![4, 5, 6],
        "the acknowledged four stay acknowledged on the next leader"
    );
    c.shutdown().await;
}
