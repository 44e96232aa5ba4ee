//! Datagram size: path-MTU discovery up to `mtu_upper_bound` finds what the path carries. A
//! path that drops datagrams over 1400 bytes still carries publish and subscribe (the
//! probes above it are lost, the connection stays below it), and on loopback, which carries
//! 64 KiB, both sides reach large datagrams and send them without refused batches.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use felix_client::{Ack, Client, Start};
use felix_integration::{broker_with, next_event, unique, within};
use tokio::net::UdpSocket;

/// The largest datagram the relay passes.
const PATH_MTU: usize = 1400;

/// Datagrams the relay dropped for being over [`PATH_MTU`], each way.
#[derive(Default)]
struct Dropped {
    to_broker: AtomicU64,
    to_client: AtomicU64,
}

/// A UDP relay for one client: what arrives on its address goes to `broker`, answers go back
/// to the client's address; datagrams over [`PATH_MTU`] bytes are dropped. Runs until aborted.
async fn relay(broker: SocketAddr) -> (SocketAddr, Arc<Dropped>, tokio::task::JoinHandle<()>) {
    let front = UdpSocket::bind("127.0.0.1:0").await.expect("bind front");
    let back = UdpSocket::bind("127.0.0.1:0").await.expect("bind back");
    back.connect(broker).await.expect("connect back");
    let addr = front.local_addr().expect("front addr");
    let dropped = Arc::new(Dropped::default());
    let counts = dropped.clone();
    let task = tokio::spawn(async move {
        let mut client: Option<SocketAddr> = None;
        let (mut up, mut down) = (vec![0u8; 65536], vec![0u8; 65536]);
        loop {
            tokio::select! {
                got = front.recv_from(&mut up) => {
                    let Ok((n, from)) = got else { continue };
                    client = Some(from);
                    if n > PATH_MTU {
                        counts.to_broker.fetch_add(1, Ordering::Relaxed);
                    } else {
                        let _ = back.send(&up[..n]).await;
                    }
                }
                got = back.recv(&mut down) => {
                    let (Ok(n), Some(to)) = (got, client) else { continue };
                    if n > PATH_MTU {
                        counts.to_client.fetch_add(1, Ordering::Relaxed);
                    } else {
                        let _ = front.send_to(&down[..n], to).await;
                    }
                }
            }
        }
    });
    (addr, dropped, task)
}

/// Publishes `n` messages of `size` bytes in one acked batch and waits for all of them on
/// `sub`.
async fn round_trip(
    client: &Client,
    sub: &mut felix_client::Subscription,
    stream: &str,
    n: usize,
    size: usize,
) {
    let payloads: Vec<Bytes> = (0..n).map(|i| Bytes::from(vec![i as u8; size])).collect();
    within(
        20,
        client.publish("default", stream, payloads, None, Ack::PerBatch),
    )
    .await
    .expect("publish acked");
    for i in 0..n {
        let event = next_event(sub).await;
        assert_eq!(event.payload.len(), size);
        assert_eq!(event.payload[0], i as u8, "message {i} in order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_that_drops_datagrams_over_1400_bytes_still_carries_publish_and_subscribe() {
    let broker = broker_with(|c| {
        c.mtu_upper_bound = 8952;
        c.max_udp_payload_size = 8952;
    })
    .await;
    let (relay_addr, dropped, relay_task) = relay(broker.addr()).await;
    let client = broker
        .client_with(|c| {
            c.addr = relay_addr;
            c.mtu_upper_bound = 8952;
        })
        .await
        .expect("connects through the relay");
    let stream = unique("mtu-relay");
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .expect("subscribe");
    round_trip(&client, &mut sub, &stream, 32, 1000).await;

    // Discovery probes both ways; wait (bounded) until the relay has dropped some each way,
    // so the traffic after this runs on a path that discovery has already measured.
    let mut waited = 0;
    while dropped.to_broker.load(Ordering::Relaxed) == 0
        || dropped.to_client.load(Ordering::Relaxed) == 0
    {
        assert!(
            waited < 1000,
            "no probe over {PATH_MTU} bytes reached the relay: {} to the broker, {} to the client",
            dropped.to_broker.load(Ordering::Relaxed),
            dropped.to_client.load(Ordering::Relaxed)
        );
        // Each round trip waits for its messages to arrive: the wait is the traffic itself.
        round_trip(&client, &mut sub, &stream, 4, 1000).await;
        waited += 1;
    }
    // Large messages and batches still arrive whole, in datagrams the path carries.
    round_trip(&client, &mut sub, &stream, 64, 1000).await;
    round_trip(&client, &mut sub, &stream, 2, 20_000).await;
    let stats = client.connection().stats();
    assert!(
        usize::from(stats.path.current_mtu) <= PATH_MTU,
        "the client settled at {} bytes, above what the path carries",
        stats.path.current_mtu
    );
    relay_task.abort();
    drop((sub, client));
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_reaches_large_datagrams_both_ways_and_sends_them_whole() {
    let broker = broker_with(|c| {
        c.mtu_upper_bound = 65527;
        c.max_udp_payload_size = 65527;
    })
    .await;
    let big = |c: &mut felix_client::ClientConfig| c.mtu_upper_bound = 65527;
    let publisher = broker.client_with(big).await.expect("publisher");
    let subscriber = broker.client_with(big).await.expect("subscriber");
    let stream = unique("mtu-big");
    let mut sub = subscriber
        .subscribe("default", &stream, Start::Latest)
        .await
        .expect("subscribe");
    // Enough traffic for discovery to finish and for full GSO batches of large datagrams: a
    // batch over 64 KiB would be refused by the kernel and lost whole.
    for _ in 0..48 {
        round_trip(&publisher, &mut sub, &stream, 64, 1024).await;
    }
    let sent = publisher.connection().stats();
    assert!(
        sent.path.current_mtu > 8952,
        "the publisher's path MTU is {}",
        sent.path.current_mtu
    );
    // A refused batch loses up to ten packets at once, and the retransmissions go the same
    // way (about a hundred here without the bound); loopback itself loses none.
    assert!(
        sent.path.lost_packets < 16,
        "the publisher lost {} packets: whole batches of large datagrams refused",
        sent.path.lost_packets
    );
    let received = subscriber.connection().stats().udp_rx;
    let mean = received.bytes / received.datagrams.max(1);
    assert!(
        mean > 1500,
        "the broker's datagrams to the subscriber average {mean} bytes"
    );
    drop((sub, subscriber, publisher));
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_frequency_is_asked_for_only_when_a_threshold_is_set() {
    // Defaults: neither side sends an ACK_FREQUENCY frame.
    let broker = broker_with(|_| {}).await;
    let client = broker.client().await;
    let stream = unique("ack-default");
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .expect("subscribe");
    for _ in 0..8 {
        round_trip(&client, &mut sub, &stream, 16, 1000).await;
    }
    let stats = client.connection().stats();
    assert_eq!(stats.frame_rx.ack_frequency, 0, "the broker asked unasked");
    assert_eq!(stats.frame_tx.ack_frequency, 0, "the client asked unasked");
    drop((sub, client));
    broker.shutdown().await;

    // A threshold on each side: the broker asks the client, the client asks the broker.
    let broker = broker_with(|c| {
        c.ack_eliciting_threshold = 8;
        c.max_ack_delay = Duration::from_millis(5);
    })
    .await;
    let client = broker
        .client_with(|c| c.ack_eliciting_threshold = 8)
        .await
        .expect("connects");
    let stream = unique("ack-asked");
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .expect("subscribe");
    let mut rounds = 0;
    loop {
        let stats = client.connection().stats();
        if stats.frame_rx.ack_frequency > 0 && stats.frame_tx.ack_frequency > 0 {
            break;
        }
        assert!(
            rounds < 500,
            "no ACK_FREQUENCY frame: {} received, {} sent",
            stats.frame_rx.ack_frequency,
            stats.frame_tx.ack_frequency
        );
        round_trip(&client, &mut sub, &stream, 4, 1000).await;
        rounds += 1;
    }
    drop((sub, client));
    broker.shutdown().await;
}
