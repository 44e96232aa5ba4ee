//! Deleting a stream from the ops endpoint (`DELETE /v1/streams/{tenant}/{ns}/{stream}`) and
//! from the embedder's handle: a durable stream's subscriber sees `stream_deleted`, the
//! stream starts again at offset 0, a restart keeps it deleted, and the endpoint answers
//! 204 / 401 / 403 / 404.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use felix_client::{Ack, Start, SubscriptionEnd, SubscriptionItem};
use felix_integration::durable_support::*;
use felix_integration::{
    client_config, next_event, start_broker, unique, within, Claims, TokenMinter,
};
use felix_runtime_tokio::felix_engine::DeleteStreamError;
use felix_runtime_tokio::{BrokerOptions, RunningBroker};

/// `DELETE path` with an optional bearer token; the status code.
async fn delete(addr: SocketAddr, path: &str, token: Option<&str>) -> u16 {
    let (path, token) = (path.to_owned(), token.map(str::to_owned));
    // Blocking I/O off the runtime: the broker's drive loop shares it.
    tokio::task::spawn_blocking(move || {
        let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
        write!(conn, "DELETE {path} HTTP/1.1\r\nhost: felix\r\n{auth}\r\n").unwrap();
        let mut text = String::new();
        conn.read_to_string(&mut text).unwrap();
        text.split_whitespace().nth(1).unwrap().parse().unwrap()
    })
    .await
    .unwrap()
}

async fn start_durable(dir: &std::path::Path) -> RunningBroker {
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().unwrap());
    opts.storage_dir = Some(dir.to_path_buf());
    opts.durable = on_commit();
    opts.metrics_bind = Some("127.0.0.1:0".parse().unwrap());
    within(20, start_broker(opts)).await.expect("broker starts")
}

fn payloads(prefix: &str, n: usize) -> Vec<Bytes> {
    (0..n)
        .map(|i| Bytes::from(format!("{prefix}{i}")))
        .collect()
}

#[tokio::test]
async fn a_deleted_durable_stream_ends_its_subscription_and_starts_again_at_zero() {
    let dir = TempDir::new("stream-delete");
    let broker = start_durable(dir.path()).await;
    let ops = broker.metrics_addr().unwrap();
    let token = broker.dev_token().unwrap().to_owned();
    let c = client(&broker).await;
    let stream = unique("orders");
    let path = format!("/v1/streams/t1/default/{stream}");
    let mut sub = c
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    let first = c
        .publish("default", &stream, payloads("old", 3), None, Ack::PerBatch)
        .await
        .unwrap();
    assert_eq!(first, Some(0));
    for i in 0..3u64 {
        assert_eq!(next_event(&mut sub).await.offset, Some(i));
    }

    assert_eq!(delete(ops, &path, None).await, 401, "no token");
    assert_eq!(delete(ops, &path, Some("not.a.jwt")).await, 401);
    assert_eq!(
        delete(ops, "/v1/streams/t1/default/never-used", Some(&token)).await,
        404
    );
    assert_eq!(delete(ops, &path, Some(&token)).await, 204);
    // The client offered FEATURE_STREAM_DELETED: the end says why.
    assert_eq!(
        within(10, sub.next()).await.unwrap(),
        SubscriptionItem::End(SubscriptionEnd::StreamDeleted)
    );
    assert_eq!(delete(ops, &path, Some(&token)).await, 404, "already gone");

    // Recreated afresh: offsets from 0, and an earliest reader sees only the new record.
    let again = c
        .publish("default", &stream, payloads("new", 1), None, Ack::PerBatch)
        .await
        .unwrap();
    assert_eq!(again, Some(0));
    c.close().await;
    stop(broker).await;

    // A restart keeps it deleted: nothing of the old records comes back.
    let broker = start_durable(dir.path()).await;
    let c = client(&broker).await;
    let mut sub = c
        .subscribe("default", &stream, Start::Earliest)
        .await
        .unwrap();
    let event = next_event(&mut sub).await;
    assert_eq!((event.offset, &event.payload[..]), (Some(0), &b"new0"[..]));
    let next = c
        .publish(
            "default",
            &stream,
            payloads("later", 1),
            None,
            Ack::PerBatch,
        )
        .await
        .unwrap();
    assert_eq!(next, Some(1));
    // No tombstone is left holding files.
    let leftovers: Vec<_> = walk(&dir.path().join("streams"))
        .into_iter()
        .filter(|p| p.contains(".deleted."))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    c.close().await;
    stop(broker).await;
}

/// Every file below `dir`.
fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path.display().to_string());
        }
    }
    out
}

#[tokio::test]
async fn the_endpoint_wants_stream_manage_on_the_stream() {
    let minter = TokenMinter::new("test-key", [7u8; 32]);
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().unwrap()).jwks(minter.jwks());
    opts.metrics_bind = Some("127.0.0.1:0".parse().unwrap());
    let broker = within(20, start_broker(opts)).await.unwrap();
    let ops = broker.metrics_addr().unwrap();
    let stream = unique("audit");
    let writer = minter.mint(&Claims::new("t1", &["stream.publish:stream:t1/*"]));
    let c = within(
        15,
        felix_client::Client::connect(client_config(
            broker.local_addr(),
            broker.ca_cert_pem().as_bytes().to_vec(),
            &writer,
        )),
    )
    .await
    .unwrap();
    c.publish("default", &stream, payloads("x", 1), None, Ack::PerBatch)
        .await
        .unwrap();
    let path = format!("/v1/streams/t1/default/{stream}");

    assert_eq!(delete(ops, &path, Some(&writer)).await, 403);
    let other_stream = minter.mint(&Claims::new(
        "t1",
        &["stream.manage:stream:t1/default/other"],
    ));
    assert_eq!(delete(ops, &path, Some(&other_stream)).await, 403);
    let other_tenant = minter.mint(&Claims::new("t2", &["stream.manage:stream:t2/*"]));
    assert_eq!(delete(ops, &path, Some(&other_tenant)).await, 401);
    let manager = minter.mint(&Claims::new(
        "t1",
        &[&format!("stream.manage:stream:t1/default/{stream}")],
    ));
    assert_eq!(delete(ops, &path, Some(&manager)).await, 204);
    assert_eq!(
        delete(ops, "/v1/streams/t1/default", Some(&manager)).await,
        404
    );
    c.close().await;
    within(20, broker.shutdown()).await.unwrap();
}

#[tokio::test]
async fn the_embedders_handle_deletes_without_a_token() {
    let opts = BrokerOptions::new("127.0.0.1:0".parse().unwrap());
    let handle = within(20, start_broker(opts)).await.unwrap();
    let c = within(
        15,
        felix_client::Client::connect(client_config(
            handle.local_addr(),
            handle.ca_cert_pem().as_bytes().to_vec(),
            handle.dev_token().unwrap(),
        )),
    )
    .await
    .unwrap();
    let stream = unique("handle");
    let mut sub = c
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    c.publish("default", &stream, payloads("a", 1), None, Ack::PerBatch)
        .await
        .unwrap();
    next_event(&mut sub).await;
    within(10, handle.delete_stream("t1", "default", &stream))
        .await
        .unwrap();
    assert_eq!(
        within(10, sub.next()).await.unwrap(),
        SubscriptionItem::End(SubscriptionEnd::StreamDeleted)
    );
    assert_eq!(
        within(10, handle.delete_stream("t1", "default", &stream)).await,
        Err(DeleteStreamError::NotFound)
    );
    c.close().await;
    within(20, handle.shutdown()).await.unwrap();
}
