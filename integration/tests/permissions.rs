//! Tokens from a JWKS: what a token's claims and permissions let a client do, and tenant
//! isolation between two tenants using the same stream names.

use bytes::Bytes;
use felix_client::{Ack, Client, ClientError, ErrorCode, Start};
use felix_integration::{
    broker_with_jwks, next_event, unique, within, Claims, TestBroker, TokenMinter,
};

fn minter() -> TokenMinter {
    TokenMinter::new("test-key", [7u8; 32])
}

async fn connect(broker: &TestBroker, tenant: &str, token: String) -> Result<Client, ClientError> {
    broker
        .client_with(|c| {
            c.tenant = tenant.into();
            c.token = token;
        })
        .await
}

fn assert_code(result: Result<impl std::fmt::Debug, ClientError>, code: ErrorCode, what: &str) {
    match result {
        Err(e) if e.code() == Some(&code) => {}
        other => panic!("{what}: expected {code}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_are_unauthenticated() {
    let minter = minter();
    let broker = broker_with_jwks(minter.jwks()).await;
    let all = ["stream.publish:stream:t1/*"];
    let cases = [
        (
            "expired",
            minter.mint(&Claims {
                expires_in: -60,
                ..Claims::new("t1", &all)
            }),
        ),
        (
            "wrong issuer",
            minter.mint(&Claims {
                iss: "someone-else".into(),
                ..Claims::new("t1", &all)
            }),
        ),
        (
            "wrong audience",
            minter.mint(&Claims {
                aud: "felix-gateway".into(),
                ..Claims::new("t1", &all)
            }),
        ),
        (
            "unknown kid",
            minter.mint_as("other-key", &Claims::new("t1", &all)),
        ),
        (
            "signed by another key",
            TokenMinter::new("test-key", [8u8; 32]).mint(&Claims::new("t1", &all)),
        ),
        ("tenant mismatch", minter.mint(&Claims::new("t2", &all))),
    ];
    for (what, token) in cases {
        assert_code(
            connect(&broker, "t1", token).await.map(|_| ()),
            ErrorCode::Unauthenticated,
            what,
        );
    }
    // And a good one connects.
    connect(&broker, "t1", minter.mint(&Claims::new("t1", &all)))
        .await
        .expect("a valid token connects");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_limit_what_a_token_can_do() {
    let minter = minter();
    let broker = broker_with_jwks(minter.jwks()).await;
    let stream = unique("orders");
    let reader_token = minter.mint(&Claims::new(
        "t1",
        &[
            "stream.subscribe:stream:t1/default/*",
            "cache.read:cache:t1/default/*",
        ],
    ));
    let writer_token = minter.mint(&Claims::new(
        "t1",
        &[
            &format!("stream.publish:stream:t1/default/{stream}"),
            "cache.write:cache:t1/default/*",
        ],
    ));
    let reader = connect(&broker, "t1", reader_token).await.unwrap();
    let writer = connect(&broker, "t1", writer_token).await.unwrap();

    let mut sub = reader
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    assert_code(
        writer
            .subscribe("default", &stream, Start::Latest)
            .await
            .map(|_| ()),
        ErrorCode::Forbidden,
        "writer subscribes",
    );

    writer
        .publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"allowed")],
            None,
            Ack::PerMessage,
        )
        .await
        .unwrap();
    assert_eq!(&next_event(&mut sub).await.payload[..], b"allowed");
    assert_code(
        writer
            .publish(
                "default",
                &unique("elsewhere"),
                vec![Bytes::from_static(b"x")],
                None,
                Ack::PerMessage,
            )
            .await,
        ErrorCode::Forbidden,
        "publish outside the granted stream",
    );
    assert_code(
        reader
            .publish(
                "default",
                &stream,
                vec![Bytes::from_static(b"x")],
                None,
                Ack::PerMessage,
            )
            .await,
        ErrorCode::Forbidden,
        "reader publishes",
    );

    writer
        .cache_put("default", "c", "k", Bytes::from_static(b"v"), None)
        .await
        .unwrap();
    assert_code(
        writer.cache_get("default", "c", "k").await,
        ErrorCode::Forbidden,
        "writer reads the cache",
    );
    assert_eq!(
        reader
            .cache_get("default", "c", "k")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"v"[..])
    );
    assert_code(
        reader
            .cache_put("default", "c", "k", Bytes::from_static(b"w"), None)
            .await,
        ErrorCode::Forbidden,
        "reader writes the cache",
    );
    // Refusals leave the streams usable.
    writer
        .publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"again")],
            None,
            Ack::PerMessage,
        )
        .await
        .unwrap();
    assert_eq!(&next_event(&mut sub).await.payload[..], b"again");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_with_the_same_names_are_isolated() {
    let minter = minter();
    let broker = broker_with_jwks(minter.jwks()).await;
    let full = |t: &str| {
        minter.mint(&Claims::new(
            t,
            &[
                &format!("stream.publish:stream:{t}/*"),
                &format!("stream.subscribe:stream:{t}/*"),
                &format!("cache.read:cache:{t}/*"),
                &format!("cache.write:cache:{t}/*"),
            ],
        ))
    };
    let one = connect(&broker, "t1", full("t1")).await.unwrap();
    let two = connect(&broker, "t2", full("t2")).await.unwrap();
    let stream = unique("shared-name");
    let mut sub_one = one
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    let mut sub_two = two
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    one.publish(
        "default",
        &stream,
        vec![Bytes::from_static(b"from t1")],
        None,
        Ack::PerMessage,
    )
    .await
    .unwrap();
    two.publish(
        "default",
        &stream,
        vec![Bytes::from_static(b"from t2")],
        None,
        Ack::PerMessage,
    )
    .await
    .unwrap();
    assert_eq!(&next_event(&mut sub_one).await.payload[..], b"from t1");
    assert_eq!(&next_event(&mut sub_two).await.payload[..], b"from t2");
    felix_integration::assert_quiet(&mut sub_one, 100).await;
    felix_integration::assert_quiet(&mut sub_two, 100).await;

    one.cache_put("default", "c", "k", Bytes::from_static(b"t1 value"), None)
        .await
        .unwrap();
    assert_eq!(
        within(10, two.cache_get("default", "c", "k"))
            .await
            .unwrap(),
        None,
        "t2 cannot see t1's cache"
    );
    broker.shutdown().await;
}
