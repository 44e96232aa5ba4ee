//! Peer links take the broker's datagram settings: MTU discovery up to
//! `limits.mtu_upper_bound` and GSO batches, as client links do. Replication ships up to a
//! megabyte at a time, which at QUIC's default 1452-byte ceiling, one datagram per
//! transmit, was some 750 packets and sends per shipment.

use std::time::Duration;

use felix_engine::{DurableConfig, EngineConfig};
use felix_testkit::*;

fn ship_a_large_batch(upper: Option<u16>) -> ClusterNet {
    let mut c = ClusterNet::started(
        &ClusterSpec::quorum_orders(1),
        |_, cfg: &mut EngineConfig| {
            cfg.durable = Some(DurableConfig::default());
            if let Some(u) = upper {
                cfg.mtu_upper_bound = u;
                cfg.initial_mtu = cfg.initial_mtu.min(u);
            }
        },
    );
    // MTU probes run on their own timer once the links are up.
    c.advance(Duration::from_secs(5));
    let l = c.orders_leader(0, 0).0.expect("led");
    let p = c.connect(l);
    let (id, _) = c.auth_stream(l, p);
    let payload = vec![7u8; 1024];
    let batch: Vec<&[u8]> = (0..64).map(|_| &payload[..]).collect();
    c.nodes[l].send(p, id, &binary_publish(Some(1), None, "orders", &batch));
    let mut acked = false;
    for _ in 0..2000 {
        c.advance(Duration::from_millis(1));
        if !c.nodes[l].read_frames(p, id).is_empty() {
            acked = true;
            break;
        }
    }
    assert!(acked, "the quorum publish was answered");
    c
}

#[test]
fn peer_links_probe_up_to_the_mtu_upper_bound_and_send_gso_batches() {
    let c = ship_a_large_batch(None);
    assert!(
        c.peer_largest_datagram > 1452,
        "largest peer datagram {} B: discovery stopped at QUIC's default ceiling",
        c.peer_largest_datagram
    );
    assert!(
        c.peer_most_segments > 1,
        "a 64 KiB shipment went out one datagram per transmit"
    );
    // The knob bounds them: at 1400 no peer datagram is larger.
    let c = ship_a_large_batch(Some(1400));
    assert!(
        c.peer_largest_datagram <= 1400,
        "largest peer datagram {} B over the 1400-byte bound",
        c.peer_largest_datagram
    );
    assert!(c.peer_most_segments > 1);
}
