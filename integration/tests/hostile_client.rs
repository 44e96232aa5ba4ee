//! A hostile client sends every kind of malformed input on one connection, each on its own
//! stream, and gets each one's specific answer; meanwhile a well-behaved client publishes
//! and subscribes on the same broker and sees no error and no gap.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use felix_client::{Ack, Client, ClientError, RawStream, Start, SubscriptionItem};
use felix_integration::{broker_with, unique, within};
use felix_proto::binary::{AckResult, PublishAck};
use felix_proto::message::Message;
use felix_proto::{ErrorCode, Flags, Frame};

const MAX_FRAME: u32 = 256 * 1024;

fn json(text: &str) -> Bytes {
    Frame::new(Flags::NONE, Bytes::copy_from_slice(text.as_bytes())).to_bytes()
}

fn header(magic: &[u8; 4], version: u16, flags: u16, len: u32) -> BytesMut {
    let mut b = BytesMut::new();
    b.put_slice(magic);
    b.put_u16(version);
    b.put_u16(flags);
    b.put_u32(len);
    b
}

fn with_payload(mut head: BytesMut, payload: &[u8]) -> Bytes {
    head.put_slice(payload);
    head.freeze()
}

/// The body of an acked binary publish (request `id`) to t1/default/`stream`, up to the
/// record count.
fn publish_head(id: u64, stream: &str) -> BytesMut {
    let mut p = BytesMut::new();
    p.put_u64(id);
    p.put_u8(1);
    for s in ["t1", "default", stream] {
        p.put_u16(s.len() as u16);
        p.put_slice(s.as_bytes());
    }
    p
}

#[derive(Debug, PartialEq)]
enum Seen {
    /// An `error` (or failed ack) with this code, `None` when uncoded.
    Error(Option<ErrorCode>),
    Answer(String),
}

async fn next(raw: &mut RawStream, what: &str) -> Option<Seen> {
    match within(10, raw.recv_frame()).await {
        Ok(None) | Err(ClientError::Connection(_)) => None,
        Ok(Some(frame)) if frame.flags.contains(Flags::BINARY_PUBLISH_ACK) => {
            match PublishAck::decode(frame.flags, &frame.payload)
                .unwrap()
                .result
            {
                AckResult::Err { code, .. } => Some(Seen::Error(code.map(|c| c.0))),
                AckResult::Ok { .. } => Some(Seen::Answer("ack".into())),
            }
        }
        Ok(Some(frame)) => match Message::decode(&frame.payload).unwrap() {
            Message::Error(e) => Some(Seen::Error(e.code)),
            other => Some(Seen::Answer(other.type_name().into())),
        },
        Err(e) => panic!("{what}: {e:?}"),
    }
}

/// `input` is answered with an error of `code`, and the stream then ends.
async fn refused_and_closed(
    client: &Client,
    authenticate: bool,
    input: Bytes,
    code: Option<ErrorCode>,
    what: &str,
) {
    let mut raw = client.open_raw_stream(authenticate).await.unwrap();
    raw.send(input).await.unwrap();
    assert_eq!(
        next(&mut raw, what).await,
        Some(Seen::Error(code)),
        "{what}"
    );
    assert_eq!(next(&mut raw, what).await, None, "{what}: the stream ends");
}

/// `input` is answered with an error of `code`, and the stream goes on serving.
async fn refused_and_kept(raw: &mut RawStream, input: Bytes, code: ErrorCode, what: &str) {
    raw.send(input).await.unwrap();
    assert_eq!(
        next(raw, what).await,
        Some(Seen::Error(Some(code))),
        "{what}"
    );
    raw.send(json(
        r#"{"type":"cache_get","tenant_id":"t1","namespace":"default","cache":"c","key":"k","request_id":1}"#,
    ))
    .await
    .unwrap();
    assert_eq!(
        next(raw, what).await,
        Some(Seen::Answer("cache_value".into())),
        "{what}: the stream goes on"
    );
}

async fn hostile(client: Client) {
    let coded = Some(ErrorCode::InvalidRequest);
    // Frames whose boundaries cannot be trusted end their stream.
    refused_and_closed(
        &client,
        true,
        with_payload(header(b"FLY1", 1, 0, 2), b"{}"),
        coded.clone(),
        "bad magic",
    )
    .await;
    refused_and_closed(
        &client,
        true,
        with_payload(header(b"FLX1", 2, 0, 2), b"{}"),
        coded.clone(),
        "bad version",
    )
    .await;
    refused_and_closed(
        &client,
        true,
        with_payload(header(b"FLX1", 1, 0x8000, 0), b""),
        coded.clone(),
        "unknown flag bit",
    )
    .await;
    refused_and_closed(
        &client,
        true,
        with_payload(header(b"FLX1", 1, 0x0008, 9), &[0; 9]),
        coded.clone(),
        "ack modifier without the publish base",
    )
    .await;
    refused_and_closed(
        &client,
        true,
        header(b"FLX1", 1, 0, MAX_FRAME + 1).freeze(),
        Some(ErrorCode::LimitExceeded),
        "a frame over the limit",
    )
    .await;
    // Before auth nothing was negotiated: the refusal carries no code.
    refused_and_closed(
        &client,
        false,
        json(
            r#"{"type":"cache_get","tenant_id":"t1","namespace":"default","cache":"c","key":"k"}"#,
        ),
        None,
        "a request before auth",
    )
    .await;
    refused_and_closed(
        &client,
        false,
        Bytes::from_static(b"GET / HTTP/1.1\r\nHost: felix\r\n\r\n"),
        None,
        "garbage before auth",
    )
    .await;

    // Whole frames with a bad inside are refused one by one; the stream goes on.
    let mut raw = client.open_raw_stream(true).await.unwrap();
    let mut truncated = publish_head(11, "hostile");
    truncated.put_u32(2); // two records announced...
    truncated.put_u32(3);
    truncated.put_slice(b"abc"); // ...one sent
    let frame = with_payload(
        header(b"FLX1", 1, 0x0009, truncated.len() as u32),
        &truncated,
    );
    refused_and_kept(&mut raw, frame, ErrorCode::InvalidRequest, "truncated body").await;
    let mut overrun = publish_head(12, "hostile");
    overrun.put_u32(u32::MAX); // a count no payload can hold
    overrun.put_u32(1);
    overrun.put_slice(b"x");
    let frame = with_payload(header(b"FLX1", 1, 0x0009, overrun.len() as u32), &overrun);
    refused_and_kept(&mut raw, frame, ErrorCode::InvalidRequest, "count overrun").await;
    let mut long_record = publish_head(13, "hostile");
    long_record.put_u32(1);
    long_record.put_u32(1 << 30); // a record longer than the frame
    long_record.put_slice(b"x");
    let frame = with_payload(
        header(b"FLX1", 1, 0x0009, long_record.len() as u32),
        &long_record,
    );
    refused_and_kept(&mut raw, frame, ErrorCode::InvalidRequest, "record overrun").await;
    refused_and_kept(
        &mut raw,
        json(r#"{"type":"cache_get","tenant_id":"t1","#),
        ErrorCode::InvalidRequest,
        "invalid JSON",
    )
    .await;
    refused_and_kept(
        &mut raw,
        json(
            r#"{"type":"cache_put","tenant_id":"t1","namespace":"default","cache":"c","key":"k","value":"!!not base64!!"}"#,
        ),
        ErrorCode::InvalidRequest,
        "invalid base64",
    )
    .await;
    refused_and_kept(
        &mut raw,
        json(r#"{"type":"auth","tenant_id":"t1","token":"x","client_features":1}"#),
        ErrorCode::InvalidRequest,
        "a second auth",
    )
    .await;
    refused_and_kept(
        &mut raw,
        json(r#"{"type":"event_stream_hello","subscription_id":1}"#),
        ErrorCode::InvalidRequest,
        "an event-stream frame on a request stream",
    )
    .await;
    refused_and_kept(
        &mut raw,
        with_payload(header(b"FLX1", 1, 0x0002, 4), &[0, 0, 0, 0]),
        ErrorCode::InvalidRequest,
        "an event batch on a request stream",
    )
    .await;
    refused_and_kept(
        &mut raw,
        json(r#"{"type":"publish_ok","request_id":5}"#),
        ErrorCode::InvalidRequest,
        "an answer sent as a request",
    )
    .await;
    refused_and_kept(
        &mut raw,
        json(r#"{"type":"subscribe","tenant_id":"t2","namespace":"default","stream":"x"}"#),
        ErrorCode::Forbidden,
        "another tenant's stream",
    )
    .await;
    refused_and_kept(
        &mut raw,
        json(r#"{"type":"subscribe","tenant_id":"t1","namespace":"default","stream":"../x"}"#),
        ErrorCode::InvalidRequest,
        "a name outside the charset",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_gets_its_own_answer_and_others_see_nothing() {
    let broker = broker_with(|c| c.max_frame_bytes = MAX_FRAME).await;
    let bystander = broker.client().await;
    let stream = unique("bystander");
    let mut sub = bystander
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    const RECORDS: u32 = 400;
    let publisher = {
        let client = bystander.clone();
        let stream = stream.clone();
        tokio::spawn(async move {
            for i in 0..RECORDS {
                client
                    .publish(
                        "default",
                        &stream,
                        vec![Bytes::from(i.to_be_bytes().to_vec())],
                        None,
                        Ack::PerMessage,
                    )
                    .await
                    .unwrap_or_else(|e| panic!("publish {i}: {e}"));
                if i % 20 == 0 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        })
    };

    // The hostile client runs its whole repertoire, twice over, while that goes on.
    let attacker = broker.client().await;
    within(60, hostile(attacker.clone())).await;
    within(60, hostile(attacker)).await;

    within(60, publisher).await.unwrap();
    for i in 0..RECORDS {
        match within(10, sub.next()).await {
            Ok(SubscriptionItem::Event(e)) => {
                assert_eq!(
                    &e.payload[..],
                    &i.to_be_bytes(),
                    "record {i} in order, no gap"
                )
            }
            other => panic!("record {i}: {other:?}"),
        }
    }
    felix_integration::assert_quiet(&mut sub, 100).await;
    broker.shutdown().await;
}
