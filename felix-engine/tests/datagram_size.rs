//! Large datagrams: the engine discovers them when the client accepts them, and a GSO batch
//! of them never exceeds what one send carries (Linux refuses a larger one whole).

use felix_engine::MAX_GSO_BATCH_BYTES;
use felix_testkit::*;

#[test]
fn gso_batches_of_large_datagrams_stay_within_one_send() {
    let mut net = Net::new(|c| {
        // Three of these fit one send; the default 44 would not.
        c.mtu_upper_bound = 16384;
        c.max_udp_payload_size = 16384;
    });
    net.set_client_max_udp_payload(16384);
    let (subscriber, publisher) = (net.connect(&[]), net.connect(&[]));
    let (control, _) = net.auth_stream(subscriber);
    net.send(
        subscriber,
        control,
        &json_frame(
            r#"{"type":"subscribe","tenant_id":"t1","namespace":"default","stream":"big"}"#,
        ),
    );
    net.finish(subscriber, control);
    net.run();
    let events = net.take_uni(subscriber);
    let (pid, _) = net.auth_stream(publisher);
    let record = [7u8; 1000];
    let records: Vec<&[u8]> = vec![&record; 64];
    let mut received = 0;
    // Eight publishes at a time, so a flush has far more than one batch's worth to send.
    let mut acked = 0;
    for round in 0..16u64 {
        for i in 0..8 {
            let frame = binary_publish(Some(round * 8 + i + 1), None, "big", &records);
            net.send(publisher, pid, &frame);
        }
        net.run();
        acked += net.read_frames(publisher, pid).len();
        received += net.read_frames(subscriber, events).len();
    }
    assert!(acked > 1, "publishes answered");
    assert!(received > 1, "events reached the subscriber");
    let segment = net
        .engine_transmits
        .iter()
        .map(|t| t.segment_size.unwrap_or(t.size))
        .max()
        .unwrap_or(0);
    assert!(segment > 8952, "discovery reached {segment} bytes");
    let batched = net
        .engine_transmits
        .iter()
        .filter(|t| t.segment_size.is_some())
        .count();
    assert!(batched > 0, "some transmits were GSO batches");
    for t in &net.engine_transmits {
        assert!(
            t.size <= MAX_GSO_BATCH_BYTES,
            "a transmit of {} bytes ({:?} per datagram)",
            t.size,
            t.segment_size
        );
    }
}
