//! Conditional cache writes end to end over real QUIC with our client, on a durable and an
//! in-memory broker: versions on gets, put-if-absent and compare-and-set, delete-if, and
//! racing writers of which exactly one wins each round.

use bytes::Bytes;
use felix_client::{Client, Condition, ConditionResult};
use felix_integration::durable_support::*;
use felix_integration::unique;

async fn basic_rules(c: &Client, cache: &str) {
    let put_if = |value: &'static str, cond: Condition| async move {
        c.cache_put_if("default", cache, "lease", Bytes::from(value), None, cond)
            .await
            .unwrap()
    };
    let first = put_if("alice", Condition::Absent).await;
    assert!(first.applied);
    let v1 = first.version.expect("the version written");
    // Taken: refused, with the holder's version.
    assert_eq!(
        put_if("bob", Condition::Absent).await,
        ConditionResult {
            applied: false,
            version: Some(v1)
        }
    );
    assert_eq!(
        c.cache_get_versioned("default", cache, "lease")
            .await
            .unwrap(),
        Some((Bytes::from("alice"), v1))
    );
    let second = put_if("alice-renewed", Condition::Version(v1)).await;
    assert!(second.applied);
    let v2 = second.version.unwrap();
    assert!(v2 > v1, "versions only grow");
    // A stale version is refused, naming the current one.
    let stale = put_if("bob", Condition::Version(v1)).await;
    assert_eq!((stale.applied, stale.version), (false, Some(v2)));
    let del = c
        .cache_delete_if("default", cache, "lease", v1)
        .await
        .unwrap();
    assert_eq!((del.applied, del.version), (false, Some(v2)));
    let del = c
        .cache_delete_if("default", cache, "lease", v2)
        .await
        .unwrap();
    assert_eq!((del.applied, del.version), (true, None));
    assert_eq!(c.cache_get("default", cache, "lease").await.unwrap(), None);
    assert_eq!(
        c.cache_get_versioned("default", cache, "lease")
            .await
            .unwrap(),
        None
    );
    // Deleting what is absent is refused with no version.
    let none = c
        .cache_delete_if("default", cache, "lease", v2)
        .await
        .unwrap();
    assert_eq!((none.applied, none.version), (false, None));
    assert!(
        put_if("carol", Condition::Absent).await.applied,
        "absent again"
    );
}

/// `tasks` writers each increment a number stored under one key `rounds` times by
/// compare-and-set, retrying on refusal: no increment is lost.
async fn racing_increments(c: &Client, cache: &str, tasks: usize, rounds: usize) {
    c.cache_put("default", cache, "n", Bytes::from("0"), None)
        .await
        .unwrap();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let c = c.clone();
            let cache = cache.to_owned();
            tokio::spawn(async move {
                let mut refusals = 0;
                for _ in 0..rounds {
                    for attempt in 0.. {
                        assert!(attempt < 10_000, "no progress");
                        let (value, version) = c
                            .cache_get_versioned("default", &cache, "n")
                            .await
                            .unwrap()
                            .unwrap();
                        let n: u64 = std::str::from_utf8(&value).unwrap().parse().unwrap();
                        let r = c
                            .cache_put_if(
                                "default",
                                &cache,
                                "n",
                                Bytes::from((n + 1).to_string()),
                                None,
                                Condition::Version(version),
                            )
                            .await
                            .unwrap();
                        if r.applied {
                            break;
                        }
                        refusals += 1;
                    }
                }
                refusals
            })
        })
        .collect();
    let mut refusals = 0;
    for h in handles {
        refusals += h.await.unwrap();
    }
    let total = c.cache_get("default", cache, "n").await.unwrap().unwrap();
    assert_eq!(total, Bytes::from((tasks * rounds).to_string()));
    // With several writers some attempts must have lost a race (else this proves little).
    assert!(refusals > 0, "no race happened");
}

#[tokio::test]
async fn conditional_writes_on_a_durable_cache() {
    let dir = TempDir::new("conditional");
    let broker = start(dir.path(), periodic()).await;
    let c = client(&broker).await;
    let cache = unique("leases");
    basic_rules(&c, &cache).await;
    racing_increments(&c, &cache, 6, 15).await;

    // Ten clients race to take one lease: exactly one wins, the rest see its version.
    let mut clients = Vec::new();
    for _ in 0..10 {
        clients.push(client(&broker).await);
    }
    let attempts: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let c = c.clone();
            let cache = cache.clone();
            tokio::spawn(async move {
                c.cache_put_if(
                    "default",
                    &cache,
                    "one",
                    Bytes::from(i.to_string()),
                    None,
                    Condition::Absent,
                )
                .await
                .unwrap()
            })
        })
        .collect();
    let mut results = Vec::new();
    for a in attempts {
        results.push(a.await.unwrap());
    }
    let winners: Vec<_> = results.iter().filter(|r| r.applied).collect();
    assert_eq!(winners.len(), 1);
    let v = winners[0].version;
    assert!(results.iter().all(|r| r.version == v));
    c.close().await;
    stop(broker).await;
}

#[tokio::test]
async fn conditional_writes_in_memory() {
    let broker = felix_integration::broker().await;
    let c = broker.client().await;
    let cache = unique("mem");
    let start_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    basic_rules(&c, &cache).await;
    let r = c
        .cache_put_if(
            "default",
            &cache,
            "fresh",
            Bytes::from("x"),
            None,
            Condition::Absent,
        )
        .await
        .unwrap();
    // Versions start at the run's wall-clock microseconds, not at 0.
    assert!(r.version.unwrap() + 60_000_000 > start_us);
    racing_increments(&c, &cache, 6, 15).await;
    broker.shutdown().await;
}
