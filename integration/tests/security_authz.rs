//! The authorization matrix through the real QUIC path: every operation the broker serves ×
//! {allowed, forbidden, other tenant, bad token}, each answered with its exact code.
//!
//! One connection carries every case: each case is a fresh stream that authenticates with its
//! own token, which is the point — identity is per stream, not per connection. Tokens are
//! minted here with full control over every claim; the broker trusts a JWKS of two keys
//! (`k-old`, `k-new`), as during a key rotation.

use bytes::Bytes;
use felix_client::{Client, ClientError, RawStream};
use felix_integration::{broker_with_jwks, within, TestBroker};
use felix_proto::binary::{
    encode_publish_batch_frame, AckMode, AckResult, AckedPrefix, PublishAck, PublishBatchHeader,
};
use felix_proto::message::Message;
use felix_proto::{ErrorCode, Flags, Frame, RetryClass};
use serde_json::{json, Value};

const TENANT: &str = "t1";
const OTHER_TENANT: &str = "t2";
/// The offer felix-client 0.6.2 sends: error codes (features) and coded acks (0x0200) on.
const OFFER: &str = r#""client_flags":8191,"client_features":4218945535,"client_features_hi":15"#;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
}

struct Key {
    kid: &'static str,
    key: felix_auth::SigningKey,
}

impl Key {
    fn new(kid: &'static str, seed: u8) -> Key {
        Key {
            kid,
            key: felix_auth::SigningKey::from_bytes(&[seed; 32]),
        }
    }

    fn jwk(&self) -> Value {
        let doc: Value =
            serde_json::from_str(&felix_auth::jwks_document(&[(self.kid, &self.key)])).unwrap();
        doc["keys"][0].clone()
    }

    /// A compact JWS of `claims` signed by this key, its header naming `kid`.
    fn sign_as(&self, kid: &str, claims: &Value) -> String {
        felix_auth::sign_compact(&self.key, kid, claims.to_string().as_bytes())
    }

    fn sign(&self, claims: &Value) -> String {
        self.sign_as(self.kid, claims)
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Valid claims for `tenant` with `perms`; tests make one field wrong at a time.
fn claims(tenant: &str, perms: &[&str]) -> Value {
    let now = now();
    json!({"iss": "felix-auth", "aud": "felix-broker", "sub": "authz-test", "tid": tenant,
           "iat": now - 10, "exp": now + 3600, "perms": perms})
}

/// Every operation a stream can ask of this broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    PublishBinary,
    PublishJson,
    Subscribe,
    CachePut,
    CacheGet,
    CacheDelete,
    StreamShards,
    CacheShards,
    ShardOwnersStream,
    ShardOwnersCache,
}

const OPS: [Op; 10] = [
    Op::PublishBinary,
    Op::PublishJson,
    Op::Subscribe,
    Op::CachePut,
    Op::CacheGet,
    Op::CacheDelete,
    Op::StreamShards,
    Op::CacheShards,
    Op::ShardOwnersStream,
    Op::ShardOwnersCache,
];

/// Every action a token can carry.
const ACTIONS: [&str; 8] = [
    "stream.publish",
    "stream.subscribe",
    "stream.manage",
    "cache.read",
    "cache.write",
    "cache.manage",
    "group.consume",
    "group.manage",
];

impl Op {
    /// The one permission this operation needs.
    fn action(self) -> &'static str {
        match self {
            Op::PublishBinary | Op::PublishJson => "stream.publish",
            Op::Subscribe | Op::StreamShards | Op::ShardOwnersStream => "stream.subscribe",
            Op::CachePut | Op::CacheDelete => "cache.write",
            Op::CacheGet | Op::CacheShards | Op::ShardOwnersCache => "cache.read",
        }
    }

    fn kind(self) -> &'static str {
        if self.action().starts_with("cache") {
            "cache"
        } else {
            "stream"
        }
    }

    /// `action:kind:tenant/*`.
    fn grant(self, tenant: &str) -> String {
        format!("{}:{}:{tenant}/*", self.action(), self.kind())
    }

    /// The answer type an allowed request gets.
    fn success(self) -> &'static str {
        match self {
            Op::PublishBinary => "binary_ack",
            Op::PublishJson => "publish_ok",
            Op::Subscribe => "subscribed",
            Op::CachePut => "cache_ok",
            Op::CacheGet | Op::CacheDelete => "cache_value",
            Op::StreamShards => "stream_shards_view",
            Op::CacheShards => "cache_shards_view",
            Op::ShardOwnersStream | Op::ShardOwnersCache => "shard_owners_view",
        }
    }

    /// The request naming `tenant/default/authz`.
    fn request(self, tenant: &str, request_id: u64) -> Bytes {
        let name = "authz";
        let msg = match self {
            Op::PublishBinary => {
                let header = PublishBatchHeader {
                    acked: Some(AckedPrefix {
                        request_id,
                        ack_mode: AckMode::PerMessage,
                    }),
                    idempotent: None,
                    key: None,
                    tenant_id: tenant,
                    namespace: "default",
                    stream: name,
                };
                return encode_publish_batch_frame(&header, &[b"payload"]);
            }
            Op::PublishJson => json!({"type": "publish", "tenant_id": tenant,
                "namespace": "default", "stream": name, "payload": "cGF5bG9hZA==",
                "request_id": request_id, "ack": "per_message"}),
            Op::Subscribe => json!({"type": "subscribe", "tenant_id": tenant,
                "namespace": "default", "stream": name}),
            Op::CachePut => json!({"type": "cache_put", "tenant_id": tenant,
                "namespace": "default", "cache": name, "key": "k", "value": "dg==",
                "request_id": request_id}),
            Op::CacheGet => json!({"type": "cache_get", "tenant_id": tenant,
                "namespace": "default", "cache": name, "key": "k", "request_id": request_id}),
            Op::CacheDelete => json!({"type": "cache_delete", "tenant_id": tenant,
                "namespace": "default", "cache": name, "key": "k", "request_id": request_id}),
            Op::StreamShards => json!({"type": "stream_shards", "tenant_id": tenant,
                "namespace": "default", "stream": name, "request_id": request_id}),
            Op::CacheShards => json!({"type": "cache_shards", "tenant_id": tenant,
                "namespace": "default", "cache": name, "request_id": request_id}),
            Op::ShardOwnersStream => json!({"type": "shard_owners", "tenant_id": tenant,
                "namespace": "default", "name": name, "kind": "stream",
                "request_id": request_id}),
            Op::ShardOwnersCache => json!({"type": "shard_owners", "tenant_id": tenant,
                "namespace": "default", "name": name, "kind": "cache",
                "request_id": request_id}),
        };
        json_frame(&msg.to_string())
    }
}

fn json_frame(text: &str) -> Bytes {
    Frame::new(Flags::NONE, Bytes::copy_from_slice(text.as_bytes())).to_bytes()
}

fn auth_frame(tenant: &str, token: &str) -> Bytes {
    json_frame(&format!(
        r#"{{"type":"auth","tenant_id":"{tenant}","token":"{token}",{OFFER}}}"#
    ))
}

/// What one answer frame says.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// A success, by type name (`binary_ack` for an ok binary ack).
    Ok(String),
    /// A refusal with its code and retry class.
    Refused(ErrorCode, Option<RetryClass>),
    /// A refusal without a code (never expected here: every stream offered error codes).
    Uncoded(String),
}

fn answer(frame: &Frame) -> Answer {
    if frame.flags.contains(Flags::BINARY_PUBLISH_ACK) {
        let ack = PublishAck::decode(frame.flags, &frame.payload).expect("ack decodes");
        return match ack.result {
            AckResult::Ok { .. } => Answer::Ok("binary_ack".into()),
            AckResult::Err {
                code: Some((code, retry)),
                ..
            } => Answer::Refused(code, Some(retry)),
            AckResult::Err { message, .. } => Answer::Uncoded(message),
        };
    }
    match Message::decode(&frame.payload).expect("answer decodes") {
        Message::Error(e) => match e.code {
            Some(code) => Answer::Refused(code, e.retry),
            None => Answer::Uncoded(e.message),
        },
        Message::PublishError(e) => match e.code {
            Some(code) => Answer::Refused(code, e.retry),
            None => Answer::Uncoded(e.message),
        },
        other => Answer::Ok(other.type_name().to_owned()),
    }
}

async fn next_answer(raw: &mut RawStream, what: &str) -> Answer {
    match within(10, raw.recv_frame()).await {
        Ok(Some(frame)) => answer(&frame),
        other => panic!("{what}: expected an answer, got {other:?}"),
    }
}

/// The stream ends (FIN or reset) without another frame.
async fn ends(raw: &mut RawStream, what: &str) {
    match within(10, raw.recv_frame()).await {
        Ok(None) | Err(ClientError::Connection(_)) => {}
        other => panic!("{what}: expected the stream to end, got {other:?}"),
    }
}

/// Opens a stream, authenticates it with `token` for `tenant` and expects `auth_ok`.
async fn authed(client: &Client, tenant: &str, token: &str, what: &str) -> RawStream {
    let mut raw = client.open_raw_stream(false).await.unwrap();
    raw.send(auth_frame(tenant, token)).await.unwrap();
    assert_eq!(
        next_answer(&mut raw, what).await,
        Answer::Ok("auth_ok".into()),
        "{what}: auth"
    );
    raw
}

struct Fixture {
    broker: TestBroker,
    client: Client,
    old: Key,
    new: Key,
}

async fn fixture() -> Fixture {
    let old = Key::new("k-old", 11);
    let new = Key::new("k-new", 12);
    // A key the broker cannot use (RSA) sits beside them and is skipped.
    let jwks = json!({"keys": [old.jwk(), new.jwk(),
        {"kty": "RSA", "kid": "rsa", "n": "AQAB", "e": "AQAB"}]});
    let broker = broker_with_jwks(jwks.to_string().into_bytes()).await;
    // The connection itself authenticates its first stream with a token for t1 that can do
    // nothing; every case below brings its own stream and token.
    let token = old.sign(&claims(TENANT, &[]));
    let client = broker
        .client_with(|c| {
            c.tenant = TENANT.into();
            c.token = token;
        })
        .await
        .expect("connects");
    Fixture {
        broker,
        client,
        old,
        new,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_is_authorized_per_stream() {
    let f = fixture().await;
    let mut request_id = 0;
    for op in OPS {
        // Allowed: exactly the one permission it needs, on the right tenant.
        let grant = op.grant(TENANT);
        let token = f.new.sign(&claims(TENANT, &[&grant]));
        let what = format!("{op:?} allowed");
        let mut raw = authed(&f.client, TENANT, &token, &what).await;
        request_id += 1;
        raw.send(op.request(TENANT, request_id)).await.unwrap();
        assert_eq!(
            next_answer(&mut raw, &what).await,
            Answer::Ok(op.success().into()),
            "{what}"
        );

        // Forbidden: every other action, on every object of the tenant.
        let others: Vec<String> = ACTIONS
            .iter()
            .filter(|a| **a != op.action())
            .flat_map(|a| {
                [
                    format!("{a}:stream:{TENANT}/*"),
                    format!("{a}:cache:{TENANT}/*"),
                ]
            })
            .collect();
        let others: Vec<&str> = others.iter().map(String::as_str).collect();
        let token = f.old.sign(&claims(TENANT, &others));
        let what = format!("{op:?} forbidden");
        let mut raw = authed(&f.client, TENANT, &token, &what).await;
        request_id += 1;
        raw.send(op.request(TENANT, request_id)).await.unwrap();
        assert_eq!(
            next_answer(&mut raw, &what).await,
            Answer::Refused(ErrorCode::Forbidden, Some(RetryClass::Fatal)),
            "{what}"
        );
        // A refusal leaves the stream usable: the same stream may still do what it may.
        let next = if op.action() == "stream.subscribe" {
            Op::CacheGet
        } else {
            Op::StreamShards
        };
        raw.send(next.request(TENANT, 999)).await.unwrap();
        assert_eq!(
            next_answer(&mut raw, &what).await,
            Answer::Ok(next.success().into()),
            "{what}: the stream goes on"
        );

        // Another tenant: a t1 token whose patterns would match anything, t2 named.
        let wildcard = [
            format!("{}:{}:*", op.action(), op.kind()),
            format!("{}:{}:{OTHER_TENANT}/*", op.action(), op.kind()),
            grant.clone(),
        ];
        let wildcard: Vec<&str> = wildcard.iter().map(String::as_str).collect();
        let token = f.new.sign(&claims(TENANT, &wildcard));
        let what = format!("{op:?} other tenant");
        let mut raw = authed(&f.client, TENANT, &token, &what).await;
        request_id += 1;
        raw.send(op.request(OTHER_TENANT, request_id))
            .await
            .unwrap();
        assert_eq!(
            next_answer(&mut raw, &what).await,
            Answer::Refused(ErrorCode::Forbidden, Some(RetryClass::Fatal)),
            "{what}"
        );
    }
    f.broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_are_unauthenticated_and_nothing_after_them_is_served() {
    let f = fixture().await;
    let now = now();
    let every: Vec<String> = OPS.iter().map(|op| op.grant(TENANT)).collect();
    let every: Vec<&str> = every.iter().map(String::as_str).collect();
    let with = |change: &dyn Fn(&mut Value)| {
        let mut c = claims(TENANT, &every);
        change(&mut c);
        c
    };
    let stranger = Key::new("k-old", 99);
    let bad_tokens: Vec<(&str, String, &str)> = vec![
        (
            "expired (past the 60 s leeway)",
            f.old.sign(&with(&|c| c["exp"] = json!(now - 120))),
            TENANT,
        ),
        (
            "not valid yet (nbf)",
            f.old.sign(&with(&|c| c["nbf"] = json!(now + 600))),
            TENANT,
        ),
        (
            "issued in the future (iat)",
            f.old.sign(&with(&|c| c["iat"] = json!(now + 600))),
            TENANT,
        ),
        (
            "wrongly signed (kid k-old, another key)",
            stranger.sign(&with(&|_| {})),
            TENANT,
        ),
        (
            "signed by k-new, header says k-old",
            f.new.sign_as("k-old", &with(&|_| {})),
            TENANT,
        ),
        (
            "unknown kid",
            f.old.sign_as("k-retired", &with(&|_| {})),
            TENANT,
        ),
        (
            "wrong audience",
            f.old
                .sign(&with(&|c| c["aud"] = json!(["felix-controlplane"]))),
            TENANT,
        ),
        (
            "wrong issuer",
            f.old.sign(&with(&|c| c["iss"] = json!("someone"))),
            TENANT,
        ),
        (
            "token for t1, stream authenticates as t2",
            f.old.sign(&with(&|_| {})),
            OTHER_TENANT,
        ),
        ("not a JWS", "garbage".to_owned(), TENANT),
        (
            "alg none",
            {
                use base64::Engine as _;
                let header = b64().encode(r#"{"alg":"none","kid":"k-old"}"#);
                let body = b64().encode(with(&|_| {}).to_string());
                format!("{header}.{body}.")
            },
            TENANT,
        ),
    ];
    for (why, token, tenant) in &bad_tokens {
        for op in OPS {
            let what = format!("{op:?} with {why}");
            let mut raw = f.client.open_raw_stream(false).await.unwrap();
            // The request rides right behind the auth, in one write.
            let mut both = auth_frame(tenant, token).to_vec();
            both.extend_from_slice(&op.request(tenant, 1));
            raw.send(Bytes::from(both)).await.unwrap();
            assert_eq!(
                next_answer(&mut raw, &what).await,
                Answer::Refused(ErrorCode::Unauthenticated, Some(RetryClass::Fatal)),
                "{what}"
            );
            ends(&mut raw, &what).await;
        }
    }
    // The connection survived all of it.
    let token = f.old.sign(&claims(TENANT, &every));
    let mut raw = authed(&f.client, TENANT, &token, "after bad tokens").await;
    raw.send(Op::CacheGet.request(TENANT, 5)).await.unwrap();
    assert_eq!(
        next_answer(&mut raw, "after bad tokens").await,
        Answer::Ok("cache_value".into())
    );
    f.broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_keys_of_a_rotation_verify_and_each_stream_keeps_its_own_identity() {
    let f = fixture().await;
    let publisher = f
        .old
        .sign(&claims(TENANT, &["stream.publish:stream:t1/default/*"]));
    let reader = f
        .new
        .sign(&claims(TENANT, &["stream.subscribe:stream:t1/default/*"]));
    let mut p = authed(&f.client, TENANT, &publisher, "k-old publisher").await;
    let mut r = authed(&f.client, TENANT, &reader, "k-new reader").await;
    // Interleaved on one connection, each stream answers by its own token.
    for round in 0..3u64 {
        p.send(Op::PublishBinary.request(TENANT, round))
            .await
            .unwrap();
        r.send(Op::PublishBinary.request(TENANT, round))
            .await
            .unwrap();
        assert_eq!(
            next_answer(&mut p, "publisher").await,
            Answer::Ok("binary_ack".into())
        );
        assert_eq!(
            next_answer(&mut r, "reader").await,
            Answer::Refused(ErrorCode::Forbidden, Some(RetryClass::Fatal))
        );
        p.send(Op::StreamShards.request(TENANT, 10 + round))
            .await
            .unwrap();
        r.send(Op::StreamShards.request(TENANT, 10 + round))
            .await
            .unwrap();
        assert_eq!(
            next_answer(&mut p, "publisher").await,
            Answer::Refused(ErrorCode::Forbidden, Some(RetryClass::Fatal))
        );
        assert_eq!(
            next_answer(&mut r, "reader").await,
            Answer::Ok("stream_shards_view".into())
        );
    }
    // A second auth on an authenticated stream changes nothing: it is refused.
    let everything = f
        .new
        .sign(&claims(TENANT, &["stream.subscribe:stream:t1/*"]));
    r.send(auth_frame(TENANT, &everything)).await.unwrap();
    assert_eq!(
        next_answer(&mut r, "second auth").await,
        Answer::Refused(ErrorCode::InvalidRequest, Some(RetryClass::Fatal))
    );
    f.broker.shutdown().await;
}
