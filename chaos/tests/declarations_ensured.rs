//! Real `felix-broker` processes (docs/operations.md, "Declarations are ensured"): two nodes
//! start with `orders` declared as 3 shards and create it; the third starts with a config
//! that declares it as 5 shards at `leader` consistency and also declares a stream the
//! cluster lacks. It does not stop: it logs one warning naming the stream and each
//! differing field, becomes ready, serves the cluster's 3-shard `orders` (a publish through
//! it is acknowledged; its `GET` shows 3 shards), and the stream it alone declared is created.
//!
//! The broker and CLI are the workspace's builds (`felix_chaos::harness`).

use std::time::Duration;

use bytes::Bytes;
use felix_chaos::cluster::{Cluster, Layout, StreamDecl, NAMESPACE, NODES, READY_LIMIT, TENANT};
use felix_chaos::harness::{laid_out, until, until_async};
use felix_client::{Ack, Client, ClientConfig, Offer};

/// `GET /v1/streams/{t}/{ns}/{stream}` on node `at`: its shard count, once placed.
fn shards_seen(c: &Cluster, at: usize, stream: &str) -> Option<usize> {
    let path = format!("/v1/streams/{TENANT}/{NAMESPACE}/{stream}");
    let addr = c.nodes[at].ops;
    let (status, body) = get_with_token(addr, &path, &c.token)?;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["shards"].as_array().map(Vec::len)
}

fn get_with_token(addr: std::net::SocketAddr, path: &str, token: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).ok()?;
    let status = answer.split_whitespace().nth(1)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

#[test]
fn a_node_declaring_a_stream_otherwise_warns_and_serves() {
    let layout = Layout {
        cluster: true,
        streams: vec![StreamDecl {
            name: "orders",
            shards: 3,
            replication_factor: 3,
            consistency: "quorum",
        }],
        fsync_mode: "on_commit".into(),
        lease: Duration::from_millis(1000),
        relays: false,
        prefix: "felix-declarations",
    };
    let mut c = laid_out(&layout);
    // The third node's own view of `orders`, and a stream only it declares.
    let path = c.config_of(2).to_path_buf();
    let text = std::fs::read_to_string(&path).unwrap();
    let stanza =
        "stream = \"orders\"\nshards = 3\nreplication_factor = 3\nconsistency = \"quorum\"";
    assert!(text.contains(stanza), "{text}");
    let mut text = text.replace(
        stanza,
        "stream = \"orders\"\nshards = 5\nreplication_factor = 3\nconsistency = \"leader\"",
    );
    text.push_str(&format!(
        "\n[[streams]]\ntenant = \"{TENANT}\"\nnamespace = \"{NAMESPACE}\"\nstream = \"only-n3\"\n\
         shards = 2\nreplication_factor = 3\n"
    ));
    std::fs::write(&path, text).unwrap();

    // The first two create `orders` as they declare it.
    c.start(0).expect("n1 starts");
    c.start(1).expect("n2 starts");
    // Watched for changes once they listen (`until` asks their ops endpoints).
    for i in 0..2 {
        c.wait_ready(i, READY_LIMIT).expect("n1 and n2 are ready");
    }
    let placed = until(&c, "orders placed by the first two", || {
        shards_seen(&c, 0, "orders")
    });
    assert_eq!(placed, 3);
    c.start(2).expect("n3 starts");
    for i in 0..NODES.len() {
        c.wait_ready(i, READY_LIMIT).expect("every node is ready");
    }
    assert!(c.exited().is_empty(), "{:?}", c.exited());

    // One warning naming the stream and each differing field; no refusal.
    let log = std::fs::read_to_string(&c.nodes[2].log).unwrap();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("declares stream"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    let w = warnings[0];
    for needle in [
        &format!("stream {TENANT}/{NAMESPACE}/orders")[..],
        "shards: declared 5, the cluster has 3",
        "consistency: declared leader, the cluster has quorum",
        "the cluster's record is kept",
    ] {
        assert!(w.contains(needle), "{needle:?} not in {w}");
    }
    assert!(!w.contains("replication_factor"), "{w}");
    assert!(!log.contains("refused this node"), "{log}");

    // It serves the cluster's stream: shown with 3 shards, and a publish through it lands.
    assert_eq!(shards_seen(&c, 2, "orders"), Some(3));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut config = ClientConfig::new(
        c.nodes[2].client,
        c.ca_pem.as_bytes().to_vec(),
        TENANT,
        &c.token,
    );
    config.request_timeout = Duration::from_secs(5);
    config.offer = Offer::reference_client();
    rt.block_on(until_async(
        &c,
        "a publish acknowledged through n3",
        || async {
            let client = Client::connect(config.clone()).await.ok()?;
            let answer = client
                .publish(
                    NAMESPACE,
                    "orders",
                    vec![Bytes::from_static(b"through n3")],
                    Some(Bytes::from_static(b"k")),
                    Ack::PerMessage,
                )
                .await;
            client.close().await;
            if let Ok(Some(_)) = answer {
                return Some(());
            }
            eprintln!("publish through n3: {answer:?}");
            None
        },
    ));
    // What only it declared was created, as it declared it.
    let only = until(&c, "only-n3 placed", || shards_seen(&c, 0, "only-n3"));
    assert_eq!(only, 2);
    c.stop_all();
}
