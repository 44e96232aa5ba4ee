//! `publish_if`: of writers racing for one offset exactly one is written; the others are
//! refused with the tail, and a writer that resumes from the tail wins the next slot.

use bytes::Bytes;
use felix_client::{Guarded, PublishRefusalReason};
use felix_integration::durable_support::*;
use felix_integration::unique;

#[tokio::test]
async fn of_racing_writers_expecting_one_offset_exactly_one_wins() {
    let dir = TempDir::new("publish-if");
    let broker = start(dir.path(), on_commit()).await;
    let stream = unique("ledger");
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&broker).await);
    }
    for round in 0..3u64 {
        let mut tasks = Vec::new();
        for (i, c) in clients.iter().enumerate() {
            let c = c.clone();
            let stream = stream.clone();
            tasks.push(tokio::spawn(async move {
                let payload = Bytes::from(format!("round {round} writer {i}"));
                c.publish_if("default", &stream, None, round, vec![payload])
                    .await
                    .unwrap()
            }));
        }
        let mut wins = 0;
        for t in tasks {
            match t.await.unwrap() {
                Guarded::Written(offset) => {
                    assert_eq!(offset, Some(round));
                    wins += 1;
                }
                Guarded::Refused(PublishRefusalReason::OffsetMismatch { tail }) => {
                    assert_eq!(tail, round + 1, "the loser learns the tail");
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(wins, 1, "round {round}: exactly one writer wins");
    }
    let page = clients[0]
        .stream_read("default", &stream, 0, 0, None, None)
        .await
        .unwrap();
    assert_eq!(page.records.len(), 3, "one record per round, nothing else");
    for c in clients {
        c.close().await;
    }
    stop(broker).await;
}
