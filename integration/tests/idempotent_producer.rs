//! Idempotent producers end to end: a re-sent batch lands once and is answered with the
//! first copy's offset (JSON and the binary 0x0100 frame), also after a broker restart; a
//! gap is refused with the expected sequence; a reused sequence is refused.

use bytes::Bytes;
use felix_client::{
    Client, Guarded, IdempotentBatch, IdempotentEncoding, PublishRefusalReason, Start,
};
use felix_integration::durable_support::*;
use felix_integration::{broker, next_event, unique};
use felix_proto::Features;

fn batch<'a>(stream: &'a str, producer: u64, sequence: u64, tag: &str) -> IdempotentBatch<'a> {
    IdempotentBatch {
        namespace: "default",
        stream,
        key: None,
        producer_id: producer,
        sequence,
        payloads: vec![
            Bytes::from(format!("{tag}-a")),
            Bytes::from(format!("{tag}-b")),
        ],
    }
}

async fn send(c: &Client, b: IdempotentBatch<'_>, enc: IdempotentEncoding) -> Guarded {
    c.publish_idempotent(b, enc).await.expect("answered")
}

#[tokio::test]
async fn a_resent_batch_lands_once_in_either_encoding_and_across_a_restart() {
    let dir = TempDir::new("idempotent");
    let stream = unique("orders");
    let broker = start(dir.path(), on_commit()).await;
    // Our client offers FEATURE_SEQUENCE_REUSED.
    let c = client(&broker).await;
    let producer = c.producer_init().await.unwrap();
    let other = c.producer_init().await.unwrap();
    assert_ne!(producer, other, "every producer gets its own id");

    for enc in [IdempotentEncoding::Json, IdempotentEncoding::Binary] {
        let seq = match enc {
            IdempotentEncoding::Json => 0,
            IdempotentEncoding::Binary => 1,
        };
        let first = send(&c, batch(&stream, producer, seq, "x"), enc).await;
        let again = send(&c, batch(&stream, producer, seq, "x"), enc).await;
        assert_eq!(first, Guarded::Written(Some(2 * seq)));
        assert_eq!(
            again, first,
            "the re-send is answered with the first copy's offset"
        );
    }
    let gap = send(
        &c,
        batch(&stream, producer, 5, "g"),
        IdempotentEncoding::Binary,
    )
    .await;
    assert_eq!(
        gap,
        Guarded::Refused(PublishRefusalReason::SequenceGap { expected: 2 })
    );
    let reused = send(
        &c,
        batch(&stream, producer, 0, "changed"),
        IdempotentEncoding::Json,
    )
    .await;
    assert_eq!(
        reused,
        Guarded::Refused(PublishRefusalReason::SequenceReused)
    );
    // A client that cannot read `sequence_reused` is answered as for a re-send, unwritten.
    let plain = client_with(&broker, |c| {
        c.offer.features = Features(c.offer.features.0 & !Features::SEQUENCE_REUSED.0)
    })
    .await;
    let reused = send(
        &plain,
        batch(&stream, producer, 0, "changed"),
        IdempotentEncoding::Json,
    )
    .await;
    assert_eq!(reused, Guarded::Written(Some(0)));
    plain.close().await;
    c.close().await;
    stop(broker).await;

    // The restarted broker knows the producer from its log.
    let broker = start(dir.path(), on_commit()).await;
    let c = client(&broker).await;
    let again = send(
        &c,
        batch(&stream, producer, 1, "x"),
        IdempotentEncoding::Binary,
    )
    .await;
    assert_eq!(
        again,
        Guarded::Written(Some(2)),
        "answered from the log, not appended"
    );
    let next = send(
        &c,
        batch(&stream, producer, 2, "y"),
        IdempotentEncoding::Json,
    )
    .await;
    assert_eq!(next, Guarded::Written(Some(4)));
    let mut sub = c
        .subscribe("default", &stream, Start::Earliest)
        .await
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..6 {
        let e = next_event(&mut sub).await;
        seen.push((e.offset.unwrap(), e.payload));
    }
    let expect: Vec<(u64, Bytes)> = ["x-a", "x-b", "x-a", "x-b", "y-a", "y-b"]
        .iter()
        .enumerate()
        .map(|(i, p)| (i as u64, Bytes::from(*p)))
        .collect();
    assert_eq!(seen, expect, "each batch once, in order");
    c.close().await;
    stop(broker).await;
}

#[tokio::test]
async fn an_in_memory_broker_dedups_in_memory_and_a_stranger_is_refused() {
    let broker = broker().await;
    let c = broker.client().await;
    let stream = unique("mem");
    let producer = c.producer_init().await.unwrap();
    let first = send(
        &c,
        batch(&stream, producer, 0, "m"),
        IdempotentEncoding::Binary,
    )
    .await;
    assert_eq!(first, Guarded::Written(None), "no log, no offset");
    let again = send(
        &c,
        batch(&stream, producer, 0, "m"),
        IdempotentEncoding::Binary,
    )
    .await;
    assert_eq!(again, Guarded::Written(None));
    let stranger = send(&c, batch(&stream, 42, 3, "s"), IdempotentEncoding::Json).await;
    assert_eq!(
        stranger,
        Guarded::Refused(PublishRefusalReason::UnknownProducer)
    );
    c.close().await;
    broker.shutdown().await;
}
