//! Refusals: unknown requests, replay on an in-memory stream, oversize and unauthenticated
//! frames.

use bytes::{BufMut, Bytes, BytesMut};
use felix_client::{ClientError, ErrorCode, Start};
use felix_integration::{broker, unique, within, TENANT};
use felix_proto::frame::{FrameHeader, DEFAULT_PREAUTH_MAX_FRAME_BYTES};
use felix_proto::message::{self, Message};
use felix_proto::{Flags, Frame};

fn json(text: &str) -> Bytes {
    Frame::new(Flags::NONE, Bytes::copy_from_slice(text.as_bytes())).to_bytes()
}

/// The stream must end (FIN or reset) within 10 s, possibly after an `error` frame, which
/// is returned.
async fn ends_with_optional_error(
    raw: &mut felix_client::RawStream,
) -> Option<message::ErrorMessage> {
    let mut error = None;
    for _ in 0..4 {
        match within(10, raw.recv_frame()).await {
            Ok(None) | Err(ClientError::Connection(_)) => return error,
            Ok(Some(frame)) => match Message::decode(&frame.payload) {
                Ok(Message::Error(e)) => error = Some(e),
                other => panic!("expected an error or the end of the stream, got {other:?}"),
            },
            Err(other) => panic!("{other:?}"),
        }
    }
    panic!("the stream did not end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_request_is_answered_unsupported_and_the_stream_kept() {
    let broker = broker().await;
    let client = broker.client().await;
    let mut raw = client.open_raw_stream(true).await.unwrap();
    raw.send(json(r#"{"type":"brand_new_request","request_id":7}"#))
        .await
        .unwrap();
    let frame = within(10, raw.recv_frame())
        .await
        .unwrap()
        .expect("an answer");
    match Message::decode(&frame.payload).unwrap() {
        Message::Unsupported(u) => {
            assert_eq!(u.request_type, "brand_new_request");
            assert_eq!(u.request_id, Some(7));
        }
        other => panic!("expected unsupported, got {other:?}"),
    }
    // The stream still serves requests.
    let get = Message::CacheGet(message::CacheGet {
        tenant_id: TENANT.into(),
        namespace: "default".into(),
        cache: "c".into(),
        key: "k".into(),
        request_id: Some(8),
    });
    raw.send(get.to_frame().to_bytes()).await.unwrap();
    let frame = within(10, raw.recv_frame())
        .await
        .unwrap()
        .expect("an answer");
    match Message::decode(&frame.payload).unwrap() {
        Message::CacheValue(v) => assert_eq!(v.request_id, Some(8)),
        other => panic!("expected cache_value, got {other:?}"),
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_on_an_in_memory_stream_is_refused_with_a_code() {
    let broker = broker().await;
    let client = broker.client().await;
    for start in [Start::Earliest, Start::Offset(0)] {
        let err = within(10, client.subscribe("default", &unique("replay"), start))
            .await
            .err()
            .unwrap_or_else(|| panic!("{start:?} on an in-memory stream must be refused"));
        assert_eq!(
            err.code(),
            Some(&ErrorCode::InvalidRequest),
            "{start:?}: {err:?}"
        );
    }
    // The connection is unaffected.
    client
        .subscribe("default", &unique("replay"), Start::Latest)
        .await
        .unwrap();
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_preauth_frame_is_refused() {
    let broker = broker().await;
    let client = broker.client().await;
    let mut raw = client.open_raw_stream(false).await.unwrap();
    // Only the header: the broker must refuse on it alone, without waiting for 64 KiB.
    let header = FrameHeader {
        flags: Flags::NONE,
        length: DEFAULT_PREAUTH_MAX_FRAME_BYTES + 1,
    };
    raw.send(Bytes::copy_from_slice(&header.to_bytes()))
        .await
        .unwrap();
    if let Some(e) = ends_with_optional_error(&mut raw).await {
        // Nothing was offered on this stream, so the refusal carries no code.
        assert_eq!(e.code, None, "{e:?}");
    }
    // Other streams on the connection are unaffected.
    client.cache_get("default", "c", "k").await.unwrap();
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_before_auth_is_refused_unauthenticated() {
    let broker = broker().await;
    let client = broker.client().await;
    let mut raw = client.open_raw_stream(false).await.unwrap();
    raw.send(json(r#"{"type":"cache_get","tenant_id":"t1","namespace":"default","cache":"c","key":"k","request_id":1}"#))
        .await
        .unwrap();
    let error = ends_with_optional_error(&mut raw).await;
    // The broker cannot know we read codes (no auth, no offer); if it answers, it refuses.
    if let Some(e) = error {
        assert!(
            e.code.is_none() || e.code == Some(ErrorCode::Unauthenticated),
            "{e:?}"
        );
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_with_an_unknown_flag_is_refused() {
    let broker = broker().await;
    let client = broker.client().await;
    let mut raw = client.open_raw_stream(true).await.unwrap();
    let mut wire = BytesMut::new();
    wire.put_u32(felix_proto::frame::MAGIC);
    wire.put_u16(1);
    wire.put_u16(0x8000);
    wire.put_u32(0);
    raw.send(wire.freeze()).await.unwrap();
    if let Some(e) = ends_with_optional_error(&mut raw).await {
        assert_eq!(e.code, Some(ErrorCode::InvalidRequest), "{e:?}");
    }
    broker.shutdown().await;
}
