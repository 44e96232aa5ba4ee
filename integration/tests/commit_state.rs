//! Atomic commits: the event and the state changes as one record on the entity key's
//! shard; `state_get` reads the state back with the commit's offset as its version, also
//! after a restart; a conditional commit against a stale tail writes nothing.

use bytes::Bytes;
use felix_client::{Guarded, PublishRefusalReason, Start, StateChange};
use felix_integration::durable_support::*;
use felix_integration::{next_event, unique};

fn put(key: &str, value: &str) -> StateChange {
    StateChange::Put {
        key: key.into(),
        value: Bytes::from(value.to_owned()),
    }
}

#[tokio::test]
async fn commit_then_state_get_and_the_event_is_delivered() {
    let dir = TempDir::new("commit");
    let broker = start(dir.path(), periodic()).await;
    let stream = unique("matches");
    let entity = Bytes::from_static(b"match-7");
    let c = client(&broker).await;
    let mut sub = c
        .subscribe("default", &stream, Start::Earliest)
        .await
        .unwrap();

    let first = c
        .commit(
            "default",
            &stream,
            entity.clone(),
            Bytes::from_static(b"goal"),
            vec![put("score", "1-0"), put("last", "goal")],
            None,
        )
        .await
        .unwrap();
    assert_eq!(first, Guarded::Written(Some(0)));
    let second = c
        .commit(
            "default",
            &stream,
            entity.clone(),
            Bytes::from_static(b"var"),
            vec![
                put("score", "0-0"),
                StateChange::Delete { key: "last".into() },
            ],
            Some(1),
        )
        .await
        .unwrap();
    assert_eq!(second, Guarded::Written(Some(1)));
    let stale = c
        .commit(
            "default",
            &stream,
            entity.clone(),
            Bytes::from_static(b"late"),
            vec![put("score", "9-9")],
            Some(1),
        )
        .await
        .unwrap();
    assert_eq!(
        stale,
        Guarded::Refused(PublishRefusalReason::OffsetMismatch { tail: 2 })
    );

    let score = c
        .state_get("default", &stream, entity.clone(), "score")
        .await
        .unwrap();
    assert_eq!(score.value, Some(Bytes::from_static(b"0-0")));
    assert_eq!((score.version, score.as_of), (Some(1), Some(1)));
    let last = c
        .state_get("default", &stream, entity.clone(), "last")
        .await
        .unwrap();
    assert_eq!(last.value, None, "deleted by the second commit");

    // Subscribers see each commit's event once, at the commit's offset; nothing of the refused one.
    for (offset, event) in [(0, "goal"), (1, "var")] {
        let e = next_event(&mut sub).await;
        assert_eq!((e.offset, e.payload), (Some(offset), Bytes::from(event)));
    }
    c.close().await;
    stop(broker).await;

    let broker = start(dir.path(), periodic()).await;
    let c = client(&broker).await;
    let score = c
        .state_get("default", &stream, entity.clone(), "score")
        .await
        .unwrap();
    assert_eq!(score.value, Some(Bytes::from_static(b"0-0")));
    assert_eq!(score.version, Some(1), "state rebuilt from the log");
    c.close().await;
    stop(broker).await;
}
