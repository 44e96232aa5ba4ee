//! A stream's own retention on a single durable broker (no cluster): `trimmed` declares
//! `retention_max_bytes` and loses its oldest segments; `kept` declares none and, with no
//! broker-wide bound, keeps everything. Real QUIC, real files.

use std::time::Duration;

use bytes::Bytes;
use felix_client::{Ack, Start};
use felix_integration::durable_support::*;
use felix_integration::{start_broker, unique, within};
use felix_runtime_tokio::felix_engine::DeclaredStream;
use felix_runtime_tokio::BrokerOptions;

const NS: &str = "default";

#[tokio::test]
async fn a_declared_streams_own_bound_trims_it_and_no_other() {
    let dir = TempDir::new("stream-retention");
    let (trimmed, kept) = (unique("trimmed"), unique("kept"));
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().unwrap());
    opts.storage_dir = Some(dir.path().to_path_buf());
    opts.durable = {
        let mut d = periodic();
        d.segment_max_bytes = 4096;
        d.retention_check_interval = Duration::from_millis(50);
        d
    };
    let declared = trimmed.clone();
    let opts = opts.configure_engine(move |e| {
        let mut d = DeclaredStream::new("t1", NS, &declared, 1);
        d.retention_max_bytes = Some(16 * 1024);
        e.declared_streams.push(d);
    });
    let broker = within(20, start_broker(opts))
        .await
        .expect("the broker starts");
    let c = client(&broker).await;
    for s in [&trimmed, &kept] {
        for chunk in 0..20 {
            let payloads = (0..100)
                .map(|i| Bytes::from(format!("record-{:06}-xxxxxx", chunk * 100 + i)))
                .collect();
            c.publish(NS, s, payloads, None, Ack::PerMessage)
                .await
                .unwrap();
        }
    }
    let earliest = |s: String| {
        let c = &c;
        async move {
            c.group(NS, &s, 0, "probe")
                .seek(Start::Earliest, false)
                .await
                .unwrap()
                .0
        }
    };
    // Bounded: until retention has cut `trimmed`, each look after the broker's next change
    // (a retention cut moves its change counter).
    let mut cut = 0;
    let mut seen = 0;
    for _ in 0..100 {
        cut = earliest(trimmed.clone()).await;
        if cut > 0 {
            break;
        }
        seen = within(20, broker.changed_after(seen))
            .await
            .expect("the broker runs");
    }
    assert!(cut > 0, "the stream's own bound removed old segments");
    // `kept` has no bound of its own and none broker-wide: its log is never checked.
    assert_eq!(earliest(kept.clone()).await, 0);
    c.close().await;
    stop(broker).await;
}
