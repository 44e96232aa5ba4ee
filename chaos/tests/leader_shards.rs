//! Real `felix-broker` processes (docs/replication.md, "Who may lead a `leader` shard"):
//! - the leader of a `leader` stream cut off from its followers acknowledges alone, is
//!   SIGKILLed, is not replaced by a follower missing its records, and after its restart
//!   every record it acknowledged is read back;
//! - `felix admin abandon` places a one-copy shard whose node is gone on a live node.
//!
//! The broker and CLI are the workspace's builds (`felix_chaos::harness`).

use std::time::Duration;

use bytes::Bytes;
use felix_chaos::cluster::{Cluster, Layout, StreamDecl, NAMESPACE, NODES, READY_LIMIT, TENANT};
use felix_chaos::harness::{cli, client_config, index, started, until_async};
use felix_client::{Ack, Client, ClientError, RetryClass};
use felix_proto::message::{self, Message, ShardKind};
use felix_testkit::{Direction, Rule};

const LEASE: Duration = Duration::from_millis(1000);

fn layout(streams: Vec<StreamDecl>) -> Layout {
    Layout {
        cluster: true,
        streams,
        fsync_mode: "on_commit".into(),
        lease: LEASE,
        relays: true,
        prefix: "felix-leader-shards",
    }
}

/// One cluster at a time: a layout's ports come from a window fixed by the process id.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Shard 0's leader and generation as node `at` names them.
async fn owner(c: &Cluster, at: usize, stream: &str) -> Result<(Option<String>, u64), String> {
    let client = Client::connect(client_config(c, at))
        .await
        .map_err(|e| e.to_string())?;
    let ask = Message::ShardOwners(message::ShardOwners {
        tenant_id: TENANT.into(),
        namespace: NAMESPACE.into(),
        name: stream.into(),
        kind: ShardKind::Stream,
        request_id: 1,
    });
    let mut raw = client
        .open_raw_stream(true)
        .await
        .map_err(|e| e.to_string())?;
    raw.send(ask.to_frame().to_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let frame = tokio::time::timeout(Duration::from_secs(5), raw.recv_frame())
        .await
        .map_err(|_| "no answer".to_owned())?
        .map_err(|e| e.to_string())?
        .ok_or("no answer")?;
    client.close().await;
    match Message::decode(&frame.payload).map_err(|e| e.to_string())? {
        Message::ShardOwnersView(v) => {
            let o = v
                .owners
                .into_iter()
                .find(|o| o.shard == 0)
                .ok_or("no shard 0")?;
            Ok((o.node_id, o.generation.unwrap_or(0)))
        }
        other => Err(format!("{other:?}")),
    }
}

async fn publish(client: &Client, stream: &str, payload: &str) -> Result<Option<u64>, ClientError> {
    client
        .publish(
            NAMESPACE,
            stream,
            vec![Bytes::from(payload.to_owned())],
            None,
            Ack::PerMessage,
        )
        .await
}

/// Node `i`'s `felix_broker_cluster_shards_awaiting_leader` (0 when unreadable).
fn awaiting_leader(c: &Cluster, i: usize) -> u64 {
    felix_chaos::cluster::http_get(c.nodes[i].ops, "/metrics", true)
        .and_then(|(_, text)| {
            text.lines()
                .find_map(|l| l.strip_prefix("felix_broker_cluster_shards_awaiting_leader "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

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

#[test]
fn a_crashed_leader_keeps_its_leader_shard_and_every_record_it_acknowledged_alone() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let streams = vec![StreamDecl {
        name: "ls",
        shards: 1,
        replication_factor: 3,
        consistency: "leader",
    }];
    let mut c = started(&layout(streams));
    let (leader, generation) = rt.block_on(until_async(&c, "a leader for ls", || async {
        match owner(&c, 0, "ls").await {
            Ok((Some(l), g)) => Some((index(&l), g)),
            _ => None,
        }
    }));
    let follower = (leader + 1) % NODES.len();
    let mut acked = Vec::new();
    rt.block_on(async {
        let client = Client::connect(client_config(&c, leader)).await.unwrap();
        for i in 0..5 {
            let p = format!("before-{i}");
            acked.push((publish(&client, "ls", &p).await.unwrap().unwrap(), p));
        }
        // Cut off from both followers: what it acknowledges now only its own disk holds.
        cut(&c, leader, true);
        for i in 0..20 {
            let p = format!("alone-{i}");
            match publish(&client, "ls", &p).await {
                Ok(Some(offset)) => acked.push((offset, p)),
                _ => break,
            }
        }
        client.close().await;
    });
    assert!(
        acked.len() > 5,
        "the cut-off leader acknowledged nothing alone"
    );
    c.kill(leader).unwrap();
    cut(&c, leader, false);
    // The followers see it gone and, with no follower recorded level with it, wait for it:
    // a publish through a follower is refused `shard_unavailable` (awaiting_leader).
    rt.block_on(until_async(
        &c,
        "awaiting_leader from a follower",
        || async {
            let client = Client::connect(client_config(&c, follower)).await.ok()?;
            let answer = publish(&client, "ls", "through-a-follower").await;
            client.close().await;
            match answer {
                Err(e) if e.to_string().contains("awaiting_leader") => Some(()),
                _ => None,
            }
        },
    ));
    // The control plane's leader decides, after the lease lapsed, that nobody may take the
    // shard: the moment the old rule handed it on. Wait for that decision, then check it held.
    rt.block_on(until_async(
        &c,
        "the control plane keeps ls for its leader",
        || async {
            (0..NODES.len())
                .filter(|&i| i != leader)
                .any(|i| awaiting_leader(&c, i) >= 1)
                .then_some(())
        },
    ));
    let (l, g) = rt.block_on(owner(&c, follower, "ls")).unwrap();
    assert_eq!(
        (l.as_deref(), g),
        (Some(NODES[leader]), generation),
        "handed on"
    );
    c.start(leader).unwrap();
    c.wait_ready(leader, READY_LIMIT).unwrap();
    let records = rt.block_on(until_async(&c, "a full read of ls", || async {
        let (l, _) = owner(&c, follower, "ls").await.ok()?;
        let client = Client::connect(client_config(&c, index(&l?))).await.ok()?;
        let page = client
            .stream_read(NAMESPACE, "ls", 0, 0, None, Some(1000))
            .await
            .ok()?;
        client.close().await;
        Some(page.records)
    }));
    for (offset, payload) in &acked {
        let found = records.iter().find(|r| r.offset == *offset);
        assert_eq!(
            found.map(|r| r.payload.as_ref()),
            Some(payload.as_bytes()),
            "acknowledged record at {offset} lost"
        );
    }
    c.stop_all();
}

#[test]
fn abandon_places_a_one_copy_shard_whose_node_is_gone_on_a_live_node() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let streams = vec![StreamDecl {
        name: "solo",
        shards: 1,
        replication_factor: 1,
        consistency: "leader",
    }];
    let mut c = started(&layout(streams));
    let gone = rt.block_on(until_async(&c, "a leader for solo", || async {
        owner(&c, 0, "solo").await.ok()?.0.map(|l| index(&l))
    }));
    let other = (gone + 1) % NODES.len();
    c.kill(gone).unwrap();
    rt.block_on(until_async(&c, "shard_unavailable for solo", || async {
        let client = Client::connect(client_config(&c, other)).await.ok()?;
        let answer = publish(&client, "solo", "while-gone").await;
        client.close().await;
        match answer {
            Err(e) if e.retry() == Some(RetryClass::Retry) => Some(()),
            _ => None,
        }
    }));
    let out = std::process::Command::new(cli())
        .args(["admin", "abandon", "--broker"])
        .arg(c.nodes[other].ops.to_string())
        .arg("--ca")
        .arg(c.dir.join("ca.pem"))
        .args(["--token", &c.token, TENANT, NAMESPACE, "solo", "0"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("given up"), "{stdout}");
    let offset = rt.block_on(until_async(
        &c,
        "a publish to solo acknowledged",
        || async {
            let client = Client::connect(client_config(&c, other)).await.ok()?;
            let answer = publish(&client, "solo", "after-abandon").await;
            client.close().await;
            answer.ok().flatten()
        },
    ));
    assert_eq!(offset, 0, "the fresh copy starts empty");
    c.stop_all();
}
