//! The cluster state under a virtual clock and a seed: discovery, routing, redirects, retry
//! classes and the backoff's bounds, each answer exact.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use felix_proto::message::{BrokerEndpoint, NotLeader, ShardOwner, ShardOwnersView, TopologyView};
use felix_proto::{ErrorCode, RetryClass};

use super::*;
use crate::core::Start;

fn a(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn topo(addrs: &[&str]) -> TopologyView {
    TopologyView {
        brokers: addrs
            .iter()
            .enumerate()
            .map(|(i, addr)| BrokerEndpoint {
                node_id: format!("n{}", i + 1),
                addr: (*addr).to_owned(),
            })
            .collect(),
    }
}

fn owners(addrs: &[Option<&str>]) -> ShardOwnersView {
    ShardOwnersView {
        request_id: 1,
        owners: addrs
            .iter()
            .enumerate()
            .map(|(i, addr)| ShardOwner {
                shard: i as u64,
                node_id: addr.map(|_| format!("n{i}")),
                addr: addr.map(str::to_owned),
                generation: Some(1),
                unavailable: addr.is_none().then(|| "not_assigned".to_owned()),
            })
            .collect(),
    }
}

fn server(code: ErrorCode) -> ClientError {
    ClientError::Server {
        retry: Some(code.default_retry()),
        code: Some(code),
        message: "probe".into(),
    }
}

fn connected(seeds: &[u16], now: Instant) -> Cluster {
    let mut c = Cluster::new(ClusterConfig::new(seeds.iter().map(|p| a(*p)).collect()));
    c.handle_connected(a(seeds[0]), now);
    c
}

#[test]
fn endpoints_are_the_topology_then_every_seed_not_in_it() {
    let now = Instant::now();
    let mut c = connected(&[5003, 5001], now);
    assert_eq!(c.endpoints(), vec![a(5003), a(5001)], "seeds as given");
    assert!(c.topology_due(now), "asked at connect");
    c.handle_topology(
        Some(&topo(&[
            "127.0.0.1:5001",
            "127.0.0.1:5002",
            "127.0.0.1:5003",
        ])),
        now,
    );
    assert_eq!(c.endpoints(), vec![a(5001), a(5002), a(5003)]);
    assert!(!c.topology_due(now));
    c.begin_topology(now);
    assert!(
        !c.topology_due(now),
        "asked: not due again while it is answered"
    );
    assert!(!c.topology_due(now + DEFAULT_TOPOLOGY_INTERVAL - Duration::from_nanos(1)));
    assert!(c.topology_due(now + DEFAULT_TOPOLOGY_INTERVAL));
    assert_eq!(c.poll_timeout(), Some(now + DEFAULT_TOPOLOGY_INTERVAL));
    // A later answer naming only n3 keeps the seeds: n3, then the seeds in their order.
    c.handle_topology(Some(&topo(&["127.0.0.1:5003"])), now);
    assert_eq!(c.endpoints(), vec![a(5003), a(5001)]);
    // An empty answer is valid: the seeds only.
    c.handle_topology(Some(&topo(&[])), now);
    assert_eq!(c.endpoints(), vec![a(5003), a(5001)]);
}

#[test]
fn a_failed_topology_keeps_what_was_known_and_bad_entries_are_skipped() {
    let now = Instant::now();
    let mut c = connected(&[5001], now);
    c.handle_topology(
        Some(&topo(&[
            "127.0.0.1:5002",
            "not an address",
            "127.0.0.1:99999",
            "localhost:5004",
            "[::1]:5005",
            "127.0.0.1:5002",
        ])),
        now,
    );
    let v6: SocketAddr = "[::1]:5005".parse().unwrap();
    assert_eq!(c.endpoints(), vec![a(5002), a(5004), v6, a(5001)]);
    c.handle_topology(None, now + Duration::from_secs(1));
    assert_eq!(c.endpoints(), vec![a(5002), a(5004), v6, a(5001)]);
    assert_eq!(
        c.poll_timeout(),
        Some(now + Duration::from_secs(1) + DEFAULT_TOPOLOGY_INTERVAL),
        "a failure waits for the next refresh too"
    );
}

#[test]
fn a_topology_answer_is_cut_at_its_limit() {
    let now = Instant::now();
    let mut c = connected(&[1], now);
    let many: Vec<String> = (0..MAX_TOPOLOGY_BROKERS + 10)
        .map(|i| format!("127.0.0.1:{}", 10_000 + i))
        .collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    c.handle_topology(Some(&topo(&refs)), now);
    // The limit's worth of discovered brokers, then the seed.
    assert_eq!(c.endpoints().len(), MAX_TOPOLOGY_BROKERS + 1);
    assert_eq!(c.endpoints()[MAX_TOPOLOGY_BROKERS - 1], a(10_255));
}

#[test]
fn a_lost_broker_is_dialled_last_until_its_suspicion_ends() {
    let now = Instant::now();
    let mut c = connected(&[5001, 5002, 5003], now);
    assert_eq!(c.entry(), Some(a(5001)));
    c.handle_connection_lost(a(5001), now);
    assert_eq!(c.entry(), None);
    assert!(!c.topology_due(now), "no entry to ask");
    assert_eq!(c.poll_timeout(), None);
    assert_eq!(c.dial_order(now), vec![a(5002), a(5003), a(5001)]);
    let later = now + Duration::from_secs(1);
    c.handle_connection_lost(a(5002), later);
    // Both suspected: the one cleared soonest comes first among the suspects.
    assert_eq!(c.dial_order(later), vec![a(5003), a(5001), a(5002)]);
    assert_eq!(
        c.dial_order(now + DEFAULT_SUSPECT_FOR),
        vec![a(5001), a(5003), a(5002)]
    );
    c.handle_connected(a(5003), later);
    assert_eq!(c.entry(), Some(a(5003)));
    assert!(c.topology_due(later), "asked again after every reconnect");
    // Every seed is still there after losing all of them.
    c.handle_connection_lost(a(5003), later);
    assert_eq!(c.endpoints(), vec![a(5001), a(5002), a(5003)]);
}

#[test]
fn keyed_calls_route_to_the_keys_owner_and_unknown_owners_go_through_the_entry() {
    let now = Instant::now();
    let mut c = connected(&[5001], now);
    let orders = Object::stream("default", "orders");
    assert_eq!(
        c.route(&orders, None, now),
        Route::AskOwners { entry: a(5001) }
    );
    c.handle_shard_owners(
        &orders,
        &owners(&[Some("127.0.0.1:5001"), Some("127.0.0.1:5002"), None]),
        now,
    );
    // Unkeyed: shard 0.
    assert_eq!(
        c.route(&orders, None, now),
        Route::Owner {
            addr: a(5001),
            shard: 0
        }
    );
    for key in [&b"a"[..], b"b", b"c", b"key-7", b""] {
        let shard = shard_for_key(Some(key), 3, RoutingMapping::Modulo);
        let want = match shard {
            0 => Route::Owner {
                addr: a(5001),
                shard,
            },
            1 => Route::Owner {
                addr: a(5002),
                shard,
            },
            // Placed without a leader: waits here (see the leaderless test).
            _ => Route::Unavailable { shard, lost: None },
        };
        assert_eq!(c.route(&orders, Some(key), now), want, "key {key:?}");
    }
    // A shard nobody owned yet is asked about again soon, the others not.
    let soon = now + DEFAULT_LOST_OWNER_REASK;
    let unowned = (0..100)
        .map(|i| format!("k{i}"))
        .find(|k| shard_for_key(Some(k.as_bytes()), 3, RoutingMapping::Modulo) == 2)
        .unwrap();
    assert_eq!(
        c.route(&orders, Some(unowned.as_bytes()), soon),
        Route::AskOwners { entry: a(5001) }
    );
    assert_eq!(
        c.route(&orders, None, soon),
        Route::Owner {
            addr: a(5001),
            shard: 0
        }
    );
    // The answer is used for the refresh interval, then asked again.
    let stale = now + DEFAULT_OWNERS_REFRESH;
    assert_eq!(
        c.route(&orders, None, stale),
        Route::AskOwners { entry: a(5001) }
    );
    // Another object is separate.
    let sessions = Object::cache("default", "orders");
    assert_eq!(
        c.route(&sessions, None, now),
        Route::AskOwners { entry: a(5001) }
    );
    // No entry: dial first.
    c.handle_connection_lost(a(5001), now);
    assert_eq!(c.route(&orders, None, now), Route::NoEntry);
}

#[test]
fn entry_only_routing_sends_every_call_to_the_entry_and_never_asks_owners() {
    let now = Instant::now();
    let mut config = ClusterConfig::new(vec![a(5001), a(5002)]);
    config.routing = Routing::EntryOnly;
    let mut c = Cluster::new(config);
    let orders = Object::stream("default", "orders");
    let sessions = Object::cache("default", "sessions");
    assert_eq!(c.route(&orders, Some(b"k"), now), Route::NoEntry);
    c.handle_connected(a(5001), now);
    for at in [now, now + DEFAULT_OWNERS_REFRESH * 3] {
        assert_eq!(
            c.route(&orders, Some(b"k"), at),
            Route::Entry { addr: a(5001) }
        );
        assert_eq!(c.route(&orders, None, at), Route::Entry { addr: a(5001) });
        assert_eq!(
            c.route_shard(&orders, 2, at),
            Route::Entry { addr: a(5001) }
        );
        assert_eq!(
            c.route(&sessions, Some(b"c1.k0"), at),
            Route::Entry { addr: a(5001) }
        );
    }
    // An owners answer someone fed in anyway does not change where calls go.
    c.handle_shard_owners(
        &orders,
        &owners(&[Some("127.0.0.1:5002"), Some("127.0.0.1:5002")]),
        now,
    );
    assert_eq!(c.route(&orders, None, now), Route::Entry { addr: a(5001) });
    // The entry lost: dial first, then the new entry takes every call.
    c.handle_connection_lost(a(5001), now);
    assert_eq!(c.route(&orders, None, now), Route::NoEntry);
    assert_eq!(c.dial_order(now), vec![a(5002), a(5001)]);
    c.handle_connected(a(5002), now);
    assert_eq!(c.route(&orders, None, now), Route::Entry { addr: a(5002) });
    // The default routes by owners.
    assert_eq!(ClusterConfig::new(vec![a(5001)]).routing, Routing::ByOwners);
}

#[test]
fn a_lost_owner_is_asked_about_again_and_not_routed_to_while_suspected() {
    let now = Instant::now();
    let mut c = connected(&[5001], now);
    let s = Object::stream("ns", "s");
    let view = owners(&[Some("127.0.0.1:5002"), Some("127.0.0.1:5003")]);
    c.handle_shard_owners(&s, &view, now);
    let later = now + Duration::from_secs(1);
    c.handle_connection_lost(a(5002), later);
    assert_eq!(c.owners(&s), Some(vec![None, Some(a(5003))]));
    // Not forwarded by the entry into the dead owner: the owners are asked again at once...
    assert_eq!(
        c.route(&s, None, later),
        Route::AskOwners { entry: a(5001) }
    );
    assert_eq!(
        c.route_shard(&s, 1, later),
        Route::Owner {
            addr: a(5003),
            shard: 1
        },
        "the other shard is untouched"
    );
    // ...and an answer still naming it makes the shard unavailable here for the re-ask
    // interval, then asked again.
    c.handle_shard_owners(&s, &view, later);
    assert_eq!(
        c.route(&s, None, later),
        Route::Unavailable {
            shard: 0,
            lost: Some(a(5002))
        }
    );
    let err = Route::unavailable_error(0, Some(a(5002)));
    assert_eq!(classify(&err, false), Failure::NotApplied);
    assert_eq!(
        c.route(
            &s,
            None,
            later + DEFAULT_LOST_OWNER_REASK - Duration::from_nanos(1)
        ),
        Route::Unavailable {
            shard: 0,
            lost: Some(a(5002))
        }
    );
    assert_eq!(
        c.route(&s, None, later + DEFAULT_LOST_OWNER_REASK),
        Route::AskOwners { entry: a(5001) }
    );
    // The cluster names a new owner: routed there.
    let moved = owners(&[Some("127.0.0.1:5003"), Some("127.0.0.1:5003")]);
    c.handle_shard_owners(&s, &moved, later);
    assert_eq!(
        c.route(&s, None, later),
        Route::Owner {
            addr: a(5003),
            shard: 0
        }
    );
    // Once its suspicion ends, an answer naming the old owner is believed again.
    let cleared = later + DEFAULT_SUSPECT_FOR;
    c.handle_shard_owners(&s, &view, cleared);
    assert_eq!(c.owners(&s), Some(vec![Some(a(5002)), Some(a(5003))]));
    // A refusal by an owner forgets the object's owners.
    c.handle_stale_owner(&s);
    assert_eq!(
        c.route(&s, None, cleared),
        Route::AskOwners { entry: a(5001) }
    );
    // A failed ask routes through the entry until the refresh.
    c.handle_owners_failed(&s, cleared);
    assert_eq!(c.route(&s, None, cleared), Route::Entry { addr: a(5001) });
    assert_eq!(
        c.route(&s, None, cleared + DEFAULT_OWNERS_REFRESH),
        Route::AskOwners { entry: a(5001) }
    );
}

#[test]
fn a_placed_shard_without_a_leader_waits_here_instead_of_being_forwarded() {
    let now = Instant::now();
    let mut c = connected(&[5001], now);
    let s = Object::stream("ns", "s");
    // `owners()` gives `unavailable` to a shard with no address.
    c.handle_shard_owners(&s, &owners(&[None, Some("127.0.0.1:5002")]), now);
    assert_eq!(
        c.route_shard(&s, 0, now),
        Route::Unavailable {
            shard: 0,
            lost: None
        }
    );
    assert_eq!(
        c.route_shard(&s, 0, now + DEFAULT_LOST_OWNER_REASK),
        Route::AskOwners { entry: a(5001) }
    );
    // A shard with neither owner nor reason (an answer outside a cluster) is forwarded.
    let mut bare = owners(&[None]);
    bare.owners[0].unavailable = None;
    c.handle_shard_owners(&s, &bare, now);
    assert_eq!(c.route_shard(&s, 0, now), Route::Entry { addr: a(5001) });
    assert!(Route::unavailable_error(0, None)
        .to_string()
        .contains("no owner yet"));
}

#[test]
fn an_owner_hint_replaces_the_shards_owner() {
    let now = Instant::now();
    let mut c = connected(&[5001], now);
    let s = Object::stream("ns", "s");
    c.handle_shard_owners(&s, &owners(&[None, None]), now);
    let key_of = |shard: u32| {
        (0..100)
            .map(|i| format!("k{i}"))
            .find(|k| shard_for_key(Some(k.as_bytes()), 2, RoutingMapping::Modulo) == shard)
            .unwrap()
    };
    c.handle_owner_hint(&s, Some(key_of(1).as_bytes()), "127.0.0.1:5003", now);
    c.handle_owner_hint(&s, Some(key_of(0).as_bytes()), "garbage", now); // unparseable: ignored
    c.handle_owner_hint(&Object::stream("ns", "other"), None, "127.0.0.1:5004", now); // unknown object
                                                                                      // A broker this client lost is not believed from another's hint.
    c.handle_connection_lost(a(5009), now);
    c.handle_owner_hint(&s, Some(key_of(0).as_bytes()), "127.0.0.1:5009", now);
    assert_eq!(c.owners(&s), Some(vec![None, Some(a(5003))]));
    assert_eq!(
        c.route(&s, Some(key_of(1).as_bytes()), now),
        Route::Owner {
            addr: a(5003),
            shard: 1
        }
    );
}

#[test]
fn an_oversized_owners_answer_routes_through_the_entry() {
    let now = Instant::now();
    let mut c = connected(&[5001], now);
    let s = Object::stream("ns", "s");
    let many = vec![Some("127.0.0.1:5002"); MAX_OWNED_SHARDS + 1];
    c.handle_shard_owners(&s, &owners(&many), now);
    assert_eq!(c.route(&s, Some(b"k"), now), Route::Entry { addr: a(5001) });
    let most = vec![Some("127.0.0.1:5002"); MAX_OWNED_SHARDS];
    c.handle_shard_owners(&s, &owners(&most), now);
    assert!(matches!(c.route(&s, Some(b"k"), now), Route::Owner { addr, .. } if addr == a(5002)));
}

#[test]
fn owner_tables_are_bounded_and_the_oldest_goes_first() {
    let now = Instant::now();
    let mut c = connected(&[5001], now);
    for i in 0..MAX_OWNER_TABLES + 1 {
        let at = now + Duration::from_millis(i as u64);
        c.handle_owners_failed(&Object::stream("ns", &format!("s{i}")), at);
    }
    assert_eq!(c.owners.len(), MAX_OWNER_TABLES);
    assert!(c.owners(&Object::stream("ns", "s0")).is_none());
    assert!(c.owners(&Object::stream("ns", "s1")).is_some());
}

#[test]
fn redirects_are_followed_up_to_the_bound_and_never_back() {
    let mut r = Redirects::new(a(1), 3);
    assert_eq!(r.follow("n2", Some("127.0.0.1:2"), 1), Ok(a(2)));
    assert_eq!(r.follow("n3", Some("127.0.0.1:3"), 1), Ok(a(3)));
    assert_eq!(
        r.follow_message(&NotLeader {
            node_id: "n4".into(),
            addr: Some("127.0.0.1:4".into()),
            generation: 1
        }),
        Ok(a(4))
    );
    assert_eq!(r.asked(), &[a(1), a(2), a(3), a(4)], "four brokers asked");
    let past = r.follow("n5", Some("127.0.0.1:5"), 1).unwrap_err();
    assert!(past.to_string().contains("after 3 hops"), "{past}");
    assert_eq!(past.code(), Some(&ErrorCode::NotLeader));

    let mut r = Redirects::new(a(1), 3);
    assert_eq!(r.follow("n2", Some("127.0.0.1:2"), 1), Ok(a(2)));
    let back = r.follow("n1", Some("127.0.0.1:1"), 1).unwrap_err();
    assert!(back.to_string().contains("already asked"), "{back}");

    let mut r = Redirects::new(a(1), 3);
    let nowhere = r.follow("n2", None, 1).unwrap_err();
    assert!(nowhere.to_string().contains("not published"), "{nowhere}");
    let bad = r.follow("n2", Some("bad"), 1).unwrap_err();
    assert!(bad.to_string().contains("does not parse"), "{bad}");

    // Zero hops: the first redirect is already one too many.
    let mut r = Redirects::new(a(1), 0);
    assert!(r.follow("n2", Some("127.0.0.1:2"), 1).is_err());
}

#[test]
fn the_retry_classes() {
    use Failure::*;
    for (code, want) in [
        (ErrorCode::Unauthenticated, Terminal),
        (ErrorCode::Forbidden, Terminal),
        (ErrorCode::InvalidRequest, Terminal),
        (ErrorCode::LimitExceeded, Terminal),
        (ErrorCode::Revoked, Terminal),
        (ErrorCode::NotFound, NotApplied),
        (ErrorCode::ShardUnavailable, NotApplied),
        (ErrorCode::NotLeader, NotApplied),
        (ErrorCode::Overloaded, NotApplied),
        (ErrorCode::Draining, NotApplied),
        (ErrorCode::StaleClaim, NotApplied),
        (ErrorCode::StaleWidth, NotApplied),
        (ErrorCode::QuorumTimeout, Unknown),
        (ErrorCode::LeadershipLost, Unknown),
        (ErrorCode::Unacknowledged, Unknown),
        (ErrorCode::Internal, Unknown),
        (ErrorCode::Storage, Unknown),
    ] {
        assert_eq!(classify(&server(code.clone()), true), want, "{code}");
    }
    // The class the broker sent wins over the code's usual one.
    let retry_quorum = ClientError::Server {
        code: Some(ErrorCode::QuorumTimeout),
        retry: Some(RetryClass::Retry),
        message: String::new(),
    };
    assert_eq!(classify(&retry_quorum, true), NotApplied);
    // A code alone carries its usual class.
    let bare = ClientError::Server {
        code: Some(ErrorCode::Forbidden),
        retry: None,
        message: String::new(),
    };
    assert_eq!(classify(&bare, true), Terminal);
    let uncoded = ClientError::Server {
        code: None,
        retry: None,
        message: "no".into(),
    };
    assert_eq!(classify(&uncoded, true), Unknown);
    assert_eq!(classify(&uncoded, false), NotApplied);
    for e in [
        ClientError::Connection("lost".into()),
        ClientError::Timeout("an answer"),
        ClientError::Protocol("bad".into()),
    ] {
        assert_eq!(classify(&e, true), Unknown, "{e}");
        assert_eq!(classify(&e, false), NotApplied, "{e}");
    }
    assert_eq!(classify(&ClientError::Usage("x".into()), false), Terminal);
    let unsupported = ClientError::Unsupported {
        request_type: "x".into(),
    };
    assert_eq!(classify(&unsupported, true), Terminal);
    let nl = ClientError::NotLeader {
        node_id: "n2".into(),
        addr: None,
        generation: 1,
    };
    assert_eq!(classify(&nl, true), NotApplied);
}

#[test]
fn terminal_errors_are_never_retried() {
    let now = Instant::now();
    let mut c = connected(&[1], now);
    let mut at = c.attempts(Resend::Always, now);
    let e = server(ErrorCode::Forbidden);
    assert_eq!(
        c.next_attempt(&mut at, e.clone(), true, now),
        Next::GiveUp(e)
    );
    assert_eq!(at.made(), 1);
}

#[test]
fn publish_never_resends_an_unknown_outcome_and_at_least_once_does() {
    let now = Instant::now();
    let mut c = connected(&[1], now);
    let lost = ClientError::Connection("lost".into());
    // Plain publish: written then lost is final; refused (nothing applied) is retried, and a
    // request that never left is retried.
    let mut at = c.attempts(Resend::Never, now);
    assert_eq!(
        c.next_attempt(&mut at, lost.clone(), true, now),
        Next::GiveUp(lost.clone())
    );
    let quorum = server(ErrorCode::QuorumTimeout);
    assert_eq!(
        c.next_attempt(&mut at, quorum.clone(), true, now),
        Next::GiveUp(quorum.clone())
    );
    assert!(matches!(
        c.next_attempt(&mut at, lost.clone(), false, now),
        Next::RetryAfter { attempt: 2, .. }
    ));
    assert!(matches!(
        c.next_attempt(&mut at, server(ErrorCode::ShardUnavailable), true, now),
        Next::RetryAfter { attempt: 3, .. }
    ));
    // At least once: both unknowns retried.
    let mut at = c.attempts(Resend::Always, now);
    assert!(matches!(
        c.next_attempt(&mut at, lost, true, now),
        Next::RetryAfter { attempt: 2, .. }
    ));
    assert!(matches!(
        c.next_attempt(&mut at, quorum, true, now),
        Next::RetryAfter { attempt: 3, .. }
    ));
}

#[test]
fn the_backoff_is_full_jitter_under_a_doubling_ceiling() {
    let policy = RetryPolicy {
        max_attempts: 8,
        base: Duration::from_millis(100),
        cap: Duration::from_millis(700),
        deadline: None,
    };
    assert_eq!(policy.ceiling(2), Duration::from_millis(100));
    assert_eq!(policy.ceiling(3), Duration::from_millis(200));
    assert_eq!(policy.ceiling(4), Duration::from_millis(400));
    assert_eq!(policy.ceiling(5), Duration::from_millis(700), "capped");
    assert_eq!(
        policy.ceiling(60),
        Duration::from_millis(700),
        "no overflow"
    );
    let now = Instant::now();
    let mut config = ClusterConfig::new(vec![a(1)]);
    config.retry = policy;
    config.seed = 42;
    let run = |config: &ClusterConfig| {
        let mut c = Cluster::new(config.clone());
        let mut at = c.attempts(Resend::Always, now);
        let mut delays = Vec::new();
        loop {
            match c.next_attempt(&mut at, server(ErrorCode::ShardUnavailable), true, now) {
                Next::RetryAfter { delay, attempt } => {
                    assert!(delay <= policy.ceiling(attempt), "{delay:?} at {attempt}");
                    delays.push(delay);
                }
                Next::GiveUp(e) => {
                    assert_eq!(e.code(), Some(&ErrorCode::ShardUnavailable));
                    break;
                }
            }
        }
        delays
    };
    let first = run(&config);
    assert_eq!(first.len(), 7, "8 attempts: 7 sleeps");
    assert_eq!(first, run(&config), "a seed replays its delays");
    config.seed = 43;
    assert_ne!(first, run(&config), "another seed, other delays");
    // Jitter spreads over the whole range, not the ceiling: over many draws both halves of
    // [0, ceiling] are hit, and nothing exceeds it.
    let mut c = Cluster::new(config.clone());
    let (mut low, mut high) = (0, 0);
    for _ in 0..1000 {
        let d = c.jitter(Duration::from_millis(100));
        assert!(d <= Duration::from_millis(100));
        if d < Duration::from_millis(50) {
            low += 1;
        } else {
            high += 1;
        }
    }
    assert!(low > 400 && high > 400, "{low} below half, {high} above");
    assert_eq!(c.jitter(Duration::ZERO), Duration::ZERO);
}

#[test]
fn the_attempt_bound_counts_the_first_attempt() {
    let now = Instant::now();
    let mut c = connected(&[1], now);
    let policy = RetryPolicy {
        max_attempts: 2,
        ..RetryPolicy::default()
    };
    let mut at = c.attempts_with(policy, Resend::Always, now);
    let e = server(ErrorCode::Overloaded);
    assert!(matches!(
        c.next_attempt(&mut at, e.clone(), true, now),
        Next::RetryAfter { attempt: 2, .. }
    ));
    assert_eq!(
        c.next_attempt(&mut at, e.clone(), true, now),
        Next::GiveUp(e)
    );
    // One attempt: never retried; zero is taken as one.
    for max_attempts in [0, 1] {
        let policy = RetryPolicy {
            max_attempts,
            ..RetryPolicy::default()
        };
        let mut at = c.attempts_with(policy, Resend::Always, now);
        let e = server(ErrorCode::Overloaded);
        assert_eq!(
            c.next_attempt(&mut at, e.clone(), true, now),
            Next::GiveUp(e)
        );
    }
}

#[test]
fn the_deadline_bounds_every_attempt_and_sleep() {
    let now = Instant::now();
    let mut c = connected(&[1], now);
    let policy = RetryPolicy {
        max_attempts: 100,
        base: Duration::from_secs(10),
        cap: Duration::from_secs(10),
        deadline: Some(Duration::from_millis(300)),
    };
    let mut at = c.attempts_with(policy, Resend::Always, now);
    let e = server(ErrorCode::ShardUnavailable);
    // A sleep never runs past the deadline...
    let t = now + Duration::from_millis(250);
    match c.next_attempt(&mut at, e.clone(), true, t) {
        Next::RetryAfter { delay, .. } => assert!(delay <= Duration::from_millis(50), "{delay:?}"),
        other => panic!("{other:?}"),
    }
    // ...and at the deadline the call ends.
    let end = now + Duration::from_millis(300);
    assert_eq!(
        c.next_attempt(&mut at, e.clone(), true, end),
        Next::GiveUp(e)
    );
}

#[test]
fn a_cursor_resumes_after_the_last_delivered_record_or_the_move() {
    let mut c = Cursor::new(Start::Earliest);
    assert_eq!(c.resume_start(), Start::Earliest, "nothing delivered yet");
    c.handle_subscribed(Some(0));
    assert_eq!(c.resume_start(), Start::Earliest);
    c.handle_delivered(3);
    c.handle_delivered(2); // out of order never moves it back
    assert_eq!(c.last(), Some(3));
    assert_eq!(c.resume_start(), Start::Offset(4));
    c.handle_moved(Some(9));
    assert_eq!(
        c.resume_start(),
        Start::Offset(9),
        "the move's point is later"
    );
    c.handle_delivered(11);
    assert_eq!(c.resume_start(), Start::Offset(12));

    // `Latest` is pinned to the confirmed start, so a failover before the first event does
    // not skip what was published in between.
    let mut latest = Cursor::new(Start::Latest);
    latest.handle_subscribed(Some(17));
    assert_eq!(latest.resume_start(), Start::Offset(17));
    let mut moved = Cursor::new(Start::Latest);
    moved.handle_moved(Some(5));
    assert_eq!(moved.resume_start(), Start::Offset(5));
    let mut at = Cursor::new(Start::Offset(4));
    at.handle_subscribed(Some(4));
    assert_eq!(at.resume_start(), Start::Offset(4), "the start is carried");
}

#[test]
fn a_not_leader_answer_to_subscribe_is_followed_with_the_same_start() {
    use crate::core::{read_subscribe_reply, subscribe_frame, SubscribeRequest};
    use felix_proto::FrameDecoder;
    let frame = felix_proto::message::Message::NotLeader(NotLeader {
        node_id: "n2".into(),
        addr: Some("127.0.0.1:7002".into()),
        generation: 3,
    })
    .to_frame();
    let err = read_subscribe_reply(&frame).unwrap_err();
    let ClientError::NotLeader {
        node_id,
        addr,
        generation,
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!((node_id.as_str(), generation), ("n2", &3));
    let mut r = Redirects::new(a(7001), DEFAULT_MAX_REDIRECT_HOPS);
    assert_eq!(r.follow(node_id, addr.as_deref(), *generation), Ok(a(7002)));
    // The request sent to the owner is the same bytes: start and shard carried through.
    let req = SubscribeRequest {
        namespace: "default",
        stream: "orders",
        start: Start::Offset(4),
        shard: Some(2),
    };
    let bytes = subscribe_frame("t1", &req).unwrap();
    let mut d = FrameDecoder::new(1 << 20);
    d.feed(&bytes);
    let sent = d.next_frame().unwrap().unwrap();
    let text = std::str::from_utf8(&sent.payload).unwrap();
    assert!(text.contains(r#""start":{"offset":4}"#), "{text}");
    assert!(text.contains(r#""shard":2"#), "{text}");
    assert_eq!(err.code(), Some(&ErrorCode::NotLeader));
    assert_eq!(classify(&err, true), Failure::NotApplied);
}

#[test]
fn a_shard_routes_to_its_own_owner() {
    let now = Instant::now();
    let mut c = connected(&[5001], now);
    let s = Object::stream("ns", "s");
    assert_eq!(
        c.route_shard(&s, 1, now),
        Route::AskOwners { entry: a(5001) }
    );
    assert_eq!(c.shard_count(&s), None);
    c.handle_shard_owners(&s, &owners(&[Some("127.0.0.1:5002"), None]), now);
    assert_eq!(c.shard_count(&s), Some(2));
    assert_eq!(
        c.route_shard(&s, 0, now),
        Route::Owner {
            addr: a(5002),
            shard: 0
        }
    );
    assert_eq!(
        c.route_shard(&s, 1, now),
        Route::Unavailable {
            shard: 1,
            lost: None
        }
    );
    assert_eq!(c.route_shard(&s, 9, now), Route::Entry { addr: a(5001) });
    c.handle_owners_failed(&s, now);
    assert_eq!(
        c.shard_count(&s),
        None,
        "an empty answer says nothing of the count"
    );
}

#[test]
fn a_cursor_past_retention_is_final_and_one_ahead_of_the_tail_is_retried() {
    use crate::core::read_subscribe_reply;
    use felix_proto::message::{CursorErrorReason, Message, SubscribeCursorError};
    for (reason, want) in [
        (CursorErrorReason::TooOld, Failure::Terminal),
        (CursorErrorReason::InFuture, Failure::NotApplied),
    ] {
        let frame = Message::SubscribeCursorError(SubscribeCursorError {
            requested: 33,
            available: 0,
            reason,
        })
        .to_frame();
        let err = read_subscribe_reply(&frame).unwrap_err();
        assert_eq!(classify(&err, true), want, "{err}");
    }
}

#[test]
fn the_routing_questions_exact_frames() {
    use crate::core::stream_ops::{
        read_shard_owners, read_topology, shard_owners_frame, topology_frame,
    };
    use felix_proto::message::{Message, ShardKind};
    use felix_proto::FrameDecoder;
    let payload = |bytes: bytes::Bytes| {
        let mut d = FrameDecoder::new(1 << 20);
        d.feed(&bytes);
        let f = d.next_frame().unwrap().unwrap();
        assert!(f.flags.is_empty(), "a JSON frame");
        String::from_utf8(f.payload.to_vec()).unwrap()
    };
    assert_eq!(payload(topology_frame()), r#"{"type":"topology"}"#);
    let asked = payload(shard_owners_frame(
        "t1",
        "default",
        "orders",
        ShardKind::Stream,
    ));
    // Decoded back as the broker decodes it: every field as asked.
    match Message::decode(asked.as_bytes()).unwrap() {
        Message::ShardOwners(o) => {
            assert_eq!(
                (
                    o.tenant_id.as_str(),
                    o.namespace.as_str(),
                    o.name.as_str(),
                    o.kind
                ),
                ("t1", "default", "orders", ShardKind::Stream)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(asked.starts_with(r#"{"type":"shard_owners","#), "{asked}");
    let cache = payload(shard_owners_frame("t1", "default", "s", ShardKind::Cache));
    assert!(cache.contains(r#""kind":"cache""#), "{cache}");
    // The answers, as a cluster broker sends them, decode into what the core takes.
    let owners = Message::decode(
        br#"{"type":"shard_owners_view","request_id":1,"owners":[
            {"shard":0,"node_id":"n2","addr":"127.0.0.1:7002","generation":3},
            {"shard":1,"unavailable":"not_assigned","generation":3}]}"#,
    )
    .unwrap()
    .to_frame();
    let view = read_shard_owners(&owners).unwrap();
    let now = Instant::now();
    let mut c = connected(&[7001], now);
    let s = Object::stream("default", "orders");
    c.handle_shard_owners(&s, &view, now);
    assert_eq!(c.owners(&s), Some(vec![Some(a(7002)), None]));
    assert_eq!(
        c.route_shard(&s, 1, now),
        Route::Unavailable {
            shard: 1,
            lost: None
        }
    );
    let topology = Message::decode(
        br#"{"type":"topology_view","brokers":[{"node_id":"n1","addr":"127.0.0.1:7001"},
            {"node_id":"n2","addr":"localhost:7002","region":"x"}]}"#,
    )
    .unwrap()
    .to_frame();
    c.handle_topology(Some(&read_topology(&topology).unwrap()), now);
    assert_eq!(c.endpoints(), vec![a(7001), a(7002)]);
    // One entry without an address: the whole answer fails to decode, and is ignored.
    let bad = Message::decode(br#"{"type":"topology_view","brokers":[{"node_id":"n3"}]}"#);
    assert!(bad.is_err());
    // A refusal instead of an answer is an error, which keeps what was known.
    let refused = Message::decode(br#"{"type":"error","message":"no"}"#)
        .unwrap()
        .to_frame();
    assert!(read_topology(&refused).is_err());
    c.handle_topology(None, now);
    assert_eq!(c.endpoints(), vec![a(7001), a(7002)]);
}

/// The payload of the one frame in `bytes`.
fn one_payload(bytes: &bytes::Bytes) -> String {
    let mut d = felix_proto::FrameDecoder::new(1 << 20);
    d.feed(bytes);
    let f = d.next_frame().unwrap().unwrap();
    assert!(d.next_frame().unwrap().is_none(), "one frame");
    String::from_utf8(f.payload.to_vec()).unwrap()
}

fn answer(json: &str) -> felix_proto::Frame {
    felix_proto::message::Message::decode(json.as_bytes())
        .unwrap()
        .to_frame()
}

/// Drives `request` from the entry 7001 through a `not_leader` naming 7002 and then a
/// second naming 7003, and returns what 7003 answered: the same bytes went to each.
fn followed_twice(request: bytes::Bytes, owner_answer: &str) -> felix_proto::Frame {
    let mut call = OneShot::new(request.clone(), a(7001), DEFAULT_MAX_REDIRECT_HOPS);
    assert_eq!(call.target(), a(7001));
    let hop = |to: u16| {
        answer(&format!(
            r#"{{"type":"not_leader","node_id":"n{}","addr":"127.0.0.1:{to}","generation":4}}"#,
            to - 7000
        ))
    };
    assert_eq!(
        call.handle_answer(hop(7002)),
        Ok(OneShotStep::SendTo(a(7002)))
    );
    assert_eq!(call.target(), a(7002));
    assert_eq!(call.request(), &request, "the same request goes on");
    assert_eq!(
        call.handle_answer(hop(7003)),
        Ok(OneShotStep::SendTo(a(7003)))
    );
    assert_eq!(call.request(), &request, "and on again");
    match call.handle_answer(answer(owner_answer)) {
        Ok(OneShotStep::Answered(frame)) => frame,
        other => panic!("{other:?}"),
    }
}

#[test]
fn producer_init_follows_not_leader_to_the_owner() {
    use crate::core::stream_ops::{producer_init_frame, read_producer_init};
    let request = producer_init_frame();
    assert_eq!(
        one_payload(&request),
        r#"{"type":"producer_init","request_id":1}"#
    );
    let frame = followed_twice(
        request,
        r#"{"type":"producer_init_ok","request_id":1,"producer_id":77}"#,
    );
    assert_eq!(read_producer_init(&frame), Ok(77));
}

#[test]
fn topology_follows_not_leader_to_the_named_broker() {
    use crate::core::stream_ops::{read_topology, topology_frame};
    let request = topology_frame();
    assert_eq!(one_payload(&request), r#"{"type":"topology"}"#);
    let frame = followed_twice(
        request,
        r#"{"type":"topology_view","brokers":[{"node_id":"n3","addr":"127.0.0.1:7003"}]}"#,
    );
    let view = read_topology(&frame).unwrap();
    let got: Vec<_> = view
        .brokers
        .iter()
        .map(|b| (b.node_id.as_str(), b.addr.as_str()))
        .collect();
    assert_eq!(got, [("n3", "127.0.0.1:7003")], "the named broker's answer");
}

#[test]
fn stream_shards_follows_not_leader_to_the_owner() {
    use crate::core::stream_ops::{read_stream_shards, stream_shards_frame};
    let request = stream_shards_frame("t1", "default", "orders");
    assert_eq!(
        one_payload(&request),
        r#"{"type":"stream_shards","tenant_id":"t1","namespace":"default","stream":"orders","request_id":1}"#
    );
    let frame = followed_twice(
        request,
        r#"{"type":"stream_shards_view","shards":6,"request_id":1}"#,
    );
    assert_eq!(read_stream_shards(&frame), Ok(6));
}

#[test]
fn a_one_shot_redirect_stops_at_a_loop_the_bound_or_no_address() {
    use crate::core::stream_ops::{producer_init_frame, read_producer_init};
    let nl = |addr: Option<u16>| {
        answer(&match addr {
            Some(p) => format!(
                r#"{{"type":"not_leader","node_id":"n","addr":"127.0.0.1:{p}","generation":1}}"#
            ),
            None => r#"{"type":"not_leader","node_id":"n","generation":1}"#.to_owned(),
        })
    };
    let not_applied = |r: Result<OneShotStep, ClientError>| {
        let e = r.unwrap_err();
        assert_eq!(e.code(), Some(&ErrorCode::NotLeader), "{e}");
        assert_eq!(classify(&e, true), Failure::NotApplied, "retried whole");
    };
    // Back to the entry: a loop.
    let mut call = OneShot::new(producer_init_frame(), a(7001), 3);
    assert_eq!(
        call.handle_answer(nl(Some(7002))),
        Ok(OneShotStep::SendTo(a(7002)))
    );
    not_applied(call.handle_answer(nl(Some(7001))));
    // Nowhere to follow to.
    let mut call = OneShot::new(producer_init_frame(), a(7001), 3);
    not_applied(call.handle_answer(nl(None)));
    // The bound: 3 hops followed, so 4 brokers asked; the 4th hop is refused.
    let mut call = OneShot::new(producer_init_frame(), a(7001), 3);
    for p in 7002..=7004 {
        assert_eq!(
            call.handle_answer(nl(Some(p))),
            Ok(OneShotStep::SendTo(a(p)))
        );
    }
    not_applied(call.handle_answer(nl(Some(7005))));
    // A coded `not_leader` error is a refusal, not a redirect: answered, and read as one.
    let mut call = OneShot::new(producer_init_frame(), a(7001), 3);
    let coded = answer(r#"{"type":"error","code":"not_leader","message":"no"}"#);
    let Ok(OneShotStep::Answered(frame)) = call.handle_answer(coded) else {
        panic!("a coded error is not followed")
    };
    assert_eq!(
        read_producer_init(&frame).unwrap_err().code(),
        Some(&ErrorCode::NotLeader)
    );
}

#[test]
fn the_topology_refresh_asks_each_live_known_broker_in_turn_and_keeps_the_seeds() {
    use crate::core::stream_ops::{read_topology, topology_frame};
    // The request is the same bytes whoever is asked.
    assert_eq!(one_payload(&topology_frame()), r#"{"type":"topology"}"#);
    let view = |json: &str| read_topology(&answer(json)).unwrap();
    let t0 = Instant::now();
    let mut c = connected(&[7001], t0);
    // At connect: due at once, and asked of the entry.
    assert!(c.topology_due_after_connect(t0));
    c.begin_topology(t0);
    assert!(!c.topology_due(t0));
    assert_eq!(c.topology_target(t0), Some(a(7001)));
    c.handle_topology(
        Some(&view(
            r#"{"type":"topology_view","brokers":[{"node_id":"n1","addr":"127.0.0.1:7001"},
            {"node_id":"n2","addr":"127.0.0.1:7002"},{"node_id":"n3","addr":"127.0.0.1:7003"}]}"#,
        )),
        t0,
    );
    assert_eq!(c.endpoints(), vec![a(7001), a(7002), a(7003)]);
    // Not due before the interval; then each refresh asks the next known broker.
    let t1 = t0 + DEFAULT_TOPOLOGY_INTERVAL;
    assert!(!c.topology_due(t1 - Duration::from_nanos(1)));
    assert_eq!(c.poll_timeout(), Some(t1));
    assert!(c.topology_due(t1));
    assert!(
        !c.topology_due_after_connect(t1),
        "a periodic refresh: the background's turn"
    );
    c.begin_topology(t1);
    assert!(!c.topology_due(t1), "not asked twice at once");
    assert_eq!(c.topology_target(t1), Some(a(7002)), "not the entry again");
    // n2's view is stale and names only itself: the known set shrinks to it and the seed,
    // never below the seed.
    c.handle_topology(
        Some(&view(
            r#"{"type":"topology_view","brokers":[{"node_id":"n2","addr":"127.0.0.1:7002"}]}"#,
        )),
        t1,
    );
    assert_eq!(c.endpoints(), vec![a(7002), a(7001)]);
    // Next in turn after n2 is the seed, which restores n3.
    let t2 = t1 + DEFAULT_TOPOLOGY_INTERVAL;
    assert!(c.topology_due(t2));
    c.begin_topology(t2);
    assert_eq!(c.topology_target(t2), Some(a(7001)));
    c.handle_topology(
        Some(&view(
            r#"{"type":"topology_view","brokers":[{"node_id":"n1","addr":"127.0.0.1:7001"},
            {"node_id":"n2","addr":"127.0.0.1:7002"},{"node_id":"n3","addr":"127.0.0.1:7003"}]}"#,
        )),
        t2,
    );
    // n2 fails: the turn after n1 skips it while it is suspected, and goes to n3.
    let t3 = t2 + DEFAULT_TOPOLOGY_INTERVAL;
    c.handle_connection_lost(a(7002), t3);
    c.begin_topology(t3);
    assert_eq!(c.topology_target(t3), Some(a(7003)));
    // A failed ask (n3 unreachable, then the entry refused) keeps everything known.
    c.handle_connection_lost(a(7003), t3);
    c.handle_topology(None, t3);
    assert_eq!(c.endpoints(), vec![a(7001), a(7002), a(7003)]);
    // Every broker but the entry suspected: the entry is asked.
    let t4 = t3 + DEFAULT_TOPOLOGY_INTERVAL;
    c.handle_connection_lost(a(7002), t4);
    c.handle_connection_lost(a(7003), t4);
    assert!(c.topology_due(t4));
    c.begin_topology(t4);
    assert_eq!(c.topology_target(t4), Some(a(7001)));
    // The entry lost and another reached: the first ask after that goes to the new entry.
    let t5 = t4 + Duration::from_secs(1);
    c.handle_connection_lost(a(7001), t5);
    assert_eq!(c.topology_target(t5), None, "no entry: dial first");
    assert!(!c.topology_due(t5));
    c.handle_connected(a(7003), t5);
    assert!(c.topology_due(t5), "asked at once after a reconnect");
    assert!(
        c.topology_due_after_connect(t5),
        "by the call that reached it"
    );
    c.begin_topology(t5);
    assert_eq!(c.topology_target(t5), Some(a(7003)));
}

#[test]
fn the_topology_interval_has_a_floor() {
    let t0 = Instant::now();
    let mut config = ClusterConfig::new(vec![a(7001)]);
    config.topology_interval = Duration::ZERO;
    let mut c = Cluster::new(config);
    c.handle_connected(a(7001), t0);
    c.begin_topology(t0);
    assert_eq!(c.topology_interval(), MIN_TOPOLOGY_INTERVAL);
    assert_eq!(c.poll_timeout(), Some(t0 + MIN_TOPOLOGY_INTERVAL));
    assert!(!c.topology_due(t0));
    c.handle_topology(None, t0);
    assert!(c.topology_due(t0 + MIN_TOPOLOGY_INTERVAL));
}

/// What the core decided after one failed attempt of a one-request call.
#[derive(Debug, PartialEq, Eq)]
enum Decided {
    Retried,
    GaveUp,
}

/// One attempt of `request` entering at 7001, answered `refusal`, read by `read`; when the
/// core says to retry, the next attempt enters at 7002 (the entry after a failover) with the
/// same bytes and is answered `ok`, which `read` accepts.
fn one_request_retry<T: std::fmt::Debug>(
    request: bytes::Bytes,
    resend: Resend,
    refusal: &str,
    ok: &str,
    read: impl Fn(&felix_proto::Frame) -> Result<T, ClientError>,
) -> Decided {
    let t0 = Instant::now();
    let mut c = connected(&[7001, 7002], t0);
    let mut at = c.attempts(resend, t0);
    let mut call = OneShot::new(request.clone(), a(7001), DEFAULT_MAX_REDIRECT_HOPS);
    let Ok(OneShotStep::Answered(frame)) = call.handle_answer(answer(refusal)) else {
        panic!("{refusal}: a refusal is an answer")
    };
    let err = read(&frame).expect_err(refusal);
    match c.next_attempt(&mut at, err, true, t0) {
        Next::GiveUp(_) => Decided::GaveUp,
        Next::RetryAfter { delay, attempt } => {
            assert_eq!(attempt, 2, "{refusal}");
            assert!(delay <= DEFAULT_BACKOFF_BASE, "{refusal}: {delay:?}");
            call.retry_at(a(7002));
            assert_eq!(
                call.target(),
                a(7002),
                "the attempt enters at the new entry"
            );
            assert_eq!(call.request(), &request, "{refusal}: the same bytes again");
            let Ok(OneShotStep::Answered(frame)) = call.handle_answer(answer(ok)) else {
                panic!("{ok}")
            };
            read(&frame).expect(ok);
            Decided::Retried
        }
    }
}

#[test]
fn a_one_request_call_is_retried_by_its_class() {
    use crate::core::stream_ops::{
        publish_if_frame, read_guarded, read_stream_records, stream_read_frame,
    };
    use Decided::*;
    let read_req = stream_read_frame("t1", "default", "orders", 0, 5, None, Some(10));
    assert_eq!(
        one_payload(&read_req),
        r#"{"type":"stream_read","tenant_id":"t1","namespace":"default","stream":"orders","shard":0,"from":5,"max_records":10,"request_id":1}"#
    );
    let read_ok = r#"{"type":"stream_records","records":[],"next_offset":5,"request_id":1}"#;
    let cond_req = publish_if_frame(
        "t1",
        "default",
        "orders",
        None,
        5,
        vec![bytes::Bytes::from_static(b"x")],
    );
    let cond_ok = r#"{"type":"publish_ok","request_id":1,"offset":5}"#;
    let err = |code: &str, retry: &str| {
        format!(r#"{{"type":"error","message":"probe","code":"{code}","retry":"{retry}"}}"#)
    };
    // (refusal, a read (re-sent when unknown), a conditional publish (never re-sent))
    let cases: Vec<(String, Decided, Decided)> = vec![
        // retry: nothing applied, both retried
        (err("shard_unavailable", "retry"), Retried, Retried),
        (err("not_found", "retry"), Retried, Retried),
        // retry_after
        (err("overloaded", "retry_after"), Retried, Retried),
        // redirect, as a coded error (not followed: refused, then retried whole)
        (err("not_leader", "redirect"), Retried, Retried),
        // outcome_unknown: only the read is sent again
        (err("quorum_timeout", "outcome_unknown"), Retried, GaveUp),
        (err("leadership_lost", "outcome_unknown"), Retried, GaveUp),
        // an uncoded refusal to a sent request cannot be told from a failed write
        (
            r#"{"type":"error","message":"boom"}"#.to_owned(),
            Retried,
            GaveUp,
        ),
        // fatal: never
        (err("forbidden", "fatal"), GaveUp, GaveUp),
        (err("unauthenticated", "fatal"), GaveUp, GaveUp),
        (err("invalid_request", "fatal"), GaveUp, GaveUp),
    ];
    for (refusal, read_decided, cond_decided) in cases {
        assert_eq!(
            one_request_retry(
                read_req.clone(),
                Resend::Always,
                &refusal,
                read_ok,
                read_stream_records
            ),
            read_decided,
            "stream_read answered {refusal}"
        );
        assert_eq!(
            one_request_retry(
                cond_req.clone(),
                Resend::Never,
                &refusal,
                cond_ok,
                read_guarded
            ),
            cond_decided,
            "publish_if answered {refusal}"
        );
    }
    // A read from an offset retention has passed is final; one past the tail is retried (a
    // broker promoted a moment ago may not hold it yet).
    let cursor = |reason: &str| {
        format!(
            r#"{{"type":"subscribe_cursor_error","requested":5,"available":9,"reason":"{reason}"}}"#
        )
    };
    assert_eq!(
        one_request_retry(
            read_req.clone(),
            Resend::Always,
            &cursor("too_old"),
            read_ok,
            read_stream_records
        ),
        GaveUp
    );
    assert_eq!(
        one_request_retry(
            read_req.clone(),
            Resend::Always,
            &cursor("in_future"),
            read_ok,
            read_stream_records
        ),
        Retried
    );
}

#[test]
fn a_one_request_calls_lost_connection_and_redirect_bound_are_retried_by_class() {
    let t0 = Instant::now();
    let mut c = connected(&[7001, 7002], t0);
    let lost = ClientError::Connection("the broker ended the stream".into());
    // Lost before the request left (the stream could not be opened): retried for every kind.
    for resend in [Resend::Always, Resend::Never] {
        let mut at = c.attempts(resend, t0);
        assert!(matches!(
            c.next_attempt(&mut at, lost.clone(), false, t0),
            Next::RetryAfter { attempt: 2, .. }
        ));
    }
    // Lost after it left: a read is sent again, a conditional publish or commit is not.
    let mut at = c.attempts(Resend::Always, t0);
    assert!(matches!(
        c.next_attempt(&mut at, lost.clone(), true, t0),
        Next::RetryAfter { attempt: 2, .. }
    ));
    let mut at = c.attempts(Resend::Never, t0);
    assert_eq!(
        c.next_attempt(&mut at, lost.clone(), true, t0),
        Next::GiveUp(lost)
    );
    // Redirected past the hop bound: the attempt ends not applied, and the next attempt gets
    // a fresh bound from the entry.
    let nl = |p: u16| {
        answer(&format!(
            r#"{{"type":"not_leader","node_id":"n","addr":"127.0.0.1:{p}","generation":1}}"#
        ))
    };
    let request = crate::core::stream_ops::producer_init_frame();
    let mut call = OneShot::new(request.clone(), a(7001), 1);
    assert_eq!(
        call.handle_answer(nl(7002)),
        Ok(OneShotStep::SendTo(a(7002)))
    );
    let e = call.handle_answer(nl(7003)).unwrap_err();
    let mut at = c.attempts(Resend::Never, t0);
    assert!(matches!(
        c.next_attempt(&mut at, e, true, t0),
        Next::RetryAfter { attempt: 2, .. }
    ));
    call.retry_at(a(7001));
    assert_eq!(call.target(), a(7001));
    assert_eq!(
        call.handle_answer(nl(7002)),
        Ok(OneShotStep::SendTo(a(7002))),
        "the bound starts again"
    );
    assert_eq!(call.request(), &request);
}

#[test]
fn group_calls_resend_by_what_a_second_copy_would_do() {
    use crate::core::groups::GroupCall as G;
    for call in [
        G::Describe,
        G::DeadLetters,
        G::Poll,
        G::Ack,
        G::Seek,
        G::Extend,
    ] {
        assert_eq!(group_resend(call), Resend::Always, "{}", call.name());
    }
    for call in [G::Nack, G::DeadLetter, G::Discard, G::Redrive, G::Delete] {
        assert_eq!(group_resend(call), Resend::Never, "{}", call.name());
    }
}

#[test]
fn a_redirect_to_a_broker_lost_moments_ago_is_not_dialled() {
    let t0 = Instant::now();
    let mut c = connected(&[7001, 7002, 7003], t0);
    let nl =
        answer(r#"{"type":"not_leader","node_id":"n2","addr":"127.0.0.1:7002","generation":4}"#);
    // Not lost: followed.
    let mut call = OneShot::new(
        crate::core::stream_ops::producer_init_frame(),
        a(7001),
        DEFAULT_MAX_REDIRECT_HOPS,
    );
    assert_eq!(
        call.handle_answer(nl.clone()),
        Ok(OneShotStep::SendTo(a(7002)))
    );
    assert_eq!(c.check_redirect(a(7002), t0), Ok(a(7002)));
    // Lost: the attempt ends not applied, retried with backoff.
    c.handle_connection_lost(a(7002), t0);
    let e = c.check_redirect(a(7002), t0).unwrap_err();
    assert_eq!(e.code(), Some(&ErrorCode::ShardUnavailable), "{e}");
    assert_eq!(classify(&e, true), Failure::NotApplied);
    let mut at = c.attempts(Resend::Never, t0);
    assert!(matches!(
        c.next_attempt(&mut at, e, true, t0),
        Next::RetryAfter { attempt: 2, .. }
    ));
    // Until its suspicion ends.
    let later = t0 + DEFAULT_SUSPECT_FOR;
    assert!(c
        .check_redirect(a(7002), later - Duration::from_nanos(1))
        .is_err());
    assert_eq!(c.check_redirect(a(7002), later), Ok(a(7002)));
}

#[test]
fn a_redirects_refusal_is_typed_and_a_stale_generation_is_not_a_loop() {
    use RedirectRefused::*;
    let mut r = Redirects::new(a(7001), 3);
    assert_eq!(r.follow_checked(None, 5), Err(NoAddress));
    assert_eq!(r.follow_checked(Some("nowhere:1"), 5), Err(Unparseable));
    assert_eq!(r.follow_checked(Some("127.0.0.1:7002"), 5), Ok(a(7002)));
    // 7002's view is behind: it names generation 4 after 5 was followed. Stale, whether it
    // names a broker already asked or a new one; nothing is recorded.
    assert_eq!(
        r.follow_checked(Some("127.0.0.1:7001"), 4),
        Err(Stale { newest: 5 })
    );
    assert_eq!(
        r.follow_checked(Some("127.0.0.1:7003"), 4),
        Err(Stale { newest: 5 })
    );
    assert_eq!(r.asked(), &[a(7001), a(7002)]);
    // The same generation or a newer one is followed; back to an asked broker is a loop.
    assert_eq!(
        r.follow_checked(Some("127.0.0.1:7001"), 5),
        Err(Loop(a(7001)))
    );
    assert_eq!(r.follow_checked(Some("127.0.0.1:7003"), 6), Ok(a(7003)));
    assert_eq!(r.follow_checked(Some("127.0.0.1:7004"), 6), Ok(a(7004)));
    assert_eq!(r.follow_checked(Some("127.0.0.1:7005"), 7), Err(Bound));
    // As the error an attempt ends with: not applied, retried whole.
    let mut r = Redirects::new(a(7001), 3);
    r.follow("n2", Some("127.0.0.1:7002"), 5).unwrap();
    let e = r.follow("n3", Some("127.0.0.1:7003"), 4).unwrap_err();
    assert_eq!(e.code(), Some(&ErrorCode::NotLeader));
    assert!(e.to_string().contains("stale view"), "{e}");
    assert_eq!(classify(&e, true), Failure::NotApplied);
    // The conformance kit's broken client (no hop allowed) still reads as it did.
    let mut r = Redirects::new(a(7001), 0);
    let e = r.follow("n2", Some("127.0.0.1:7002"), 1).unwrap_err();
    assert!(
        e.to_string().contains("still redirected after 0 hops"),
        "{e}"
    );
}
