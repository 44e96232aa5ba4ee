//! The `auth` exchange over real QUIC: dev token, refused tokens, legacy offers, ALPN.

use bytes::Bytes;
use felix_client::{Ack, ClientError, ErrorCode, Offer, Start, CLIENT_ALPN};
use felix_integration::{broker, next_event, unique, within};
use felix_proto::{Features, Flags};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_token_is_accepted_with_an_advertisement() {
    let broker = broker().await;
    let client = broker.client().await;
    let caps = client.capabilities();
    assert!(!caps.legacy_ok, "a negotiating client gets auth_ok");
    // What the real client needs from a broker (peer-client-wire.md §9).
    for bits in [0x0001, 0x0008, 0x0010, 0x0040, 0x0200] {
        assert!(
            caps.flags().contains(Flags(bits)),
            "flag {bits:#06x} not negotiated: {caps:?}"
        );
    }
    assert!(caps.features().contains(Features::ERROR_CODES), "{caps:?}");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_token_is_refused_unauthenticated() {
    let broker = broker().await;
    let err = broker
        .client_with(|c| c.token = "not-a-token".into())
        .await
        .err()
        .expect("a garbage token must not connect");
    match &err {
        ClientError::Server {
            code: Some(ErrorCode::Unauthenticated),
            ..
        } => {}
        other => panic!("expected a coded unauthenticated refusal, got {other:?}"),
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_for_another_tenant_is_refused() {
    let broker = broker().await;
    let err = broker
        .client_with(|c| c.tenant = "t2".into())
        .await
        .err()
        .expect("the dev token is for t1 only");
    assert!(
        matches!(
            err.code(),
            Some(ErrorCode::Unauthenticated | ErrorCode::Forbidden)
        ),
        "{err:?}"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_offering_nothing_gets_plain_ok_and_still_works() {
    let broker = broker().await;
    let legacy = broker
        .client_with(|c| c.offer = Offer::none())
        .await
        .expect("legacy connects");
    assert!(
        legacy.capabilities().legacy_ok,
        "no client_flags must be answered with plain ok"
    );
    assert_eq!(legacy.capabilities().flags(), Flags::ORIGINAL_V1);

    // It publishes acked batches with the JSON fallback, and a modern subscriber sees them.
    let stream = unique("legacy");
    let modern = broker.client().await;
    let mut sub = modern
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    let payloads = vec![Bytes::from_static(b"one"), Bytes::from_static(b"two")];
    within(
        10,
        legacy.publish("default", &stream, payloads, None, Ack::PerBatch),
    )
    .await
    .unwrap();
    assert_eq!(&next_event(&mut sub).await.payload[..], b"one");
    assert_eq!(&next_event(&mut sub).await.payload[..], b"two");

    // And its cache writes are answered with cache_ok (request ids are always sent).
    within(
        10,
        legacy.cache_put("default", "c", "k", Bytes::from_static(b"v"), None),
    )
    .await
    .unwrap();
    let got = within(10, legacy.cache_get("default", "c", "k"))
        .await
        .unwrap();
    assert_eq!(got.as_deref(), Some(&b"v"[..]));
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alpn_offered_and_not_offered_both_connect() {
    let broker = broker().await;
    for offer_alpn in [false, true] {
        let client = broker
            .client_with(|c| c.offer_alpn = offer_alpn)
            .await
            .expect("connects");
        let selected = client.negotiated_alpn();
        if offer_alpn {
            assert_eq!(
                selected.as_deref(),
                Some(CLIENT_ALPN),
                "felix/1 must be selected when offered"
            );
        } else {
            assert_eq!(selected, None, "no ALPN offered, none selected");
        }
        within(
            10,
            client.cache_put("default", "c", "alpn", Bytes::from_static(b"x"), None),
        )
        .await
        .expect("the connection serves requests");
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_offer_is_accepted() {
    // The exact words felix-client 0.6.2 sends, including a low word above 2^31.
    let broker = broker().await;
    let client = broker
        .client_with(|c| c.offer = Offer::reference_client())
        .await
        .expect("connects");
    assert!(!client.capabilities().legacy_ok);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_auth_on_a_stream_is_refused() {
    let broker = broker().await;
    let client = broker.client().await;
    let mut raw = client.open_raw_stream(true).await.unwrap();
    raw.send(felix_client::core::auth_frame(
        "t1",
        &broker.token(),
        &Offer::full(),
    ))
    .await
    .unwrap();
    let frame = within(10, raw.recv_frame())
        .await
        .unwrap()
        .expect("an answer");
    match felix_proto::message::Message::decode(&frame.payload).unwrap() {
        felix_proto::message::Message::Error(e) => {
            assert_eq!(e.code, Some(ErrorCode::InvalidRequest), "{e:?}")
        }
        other => panic!("a second auth must be refused, got {other:?}"),
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_is_per_stream() {
    // One connection, one good stream; a stream on it with a bad token is refused, and the
    // good one keeps working.
    let broker = broker().await;
    let client = broker.client().await;
    let mut raw = client.open_raw_stream(false).await.unwrap();
    raw.send(felix_client::core::auth_frame(
        "t1",
        "forged",
        &Offer::full(),
    ))
    .await
    .unwrap();
    let frame = within(10, raw.recv_frame())
        .await
        .unwrap()
        .expect("an answer");
    match felix_proto::message::Message::decode(&frame.payload).unwrap() {
        felix_proto::message::Message::Error(e) => {
            assert_eq!(e.code, Some(ErrorCode::Unauthenticated), "{e:?}")
        }
        other => panic!("a forged token must be refused, got {other:?}"),
    }
    within(
        10,
        client.cache_put("default", "c", "k", Bytes::from_static(b"v"), None),
    )
    .await
    .unwrap();
    broker.shutdown().await;
}
