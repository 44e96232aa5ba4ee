use super::*;

fn n(s: &str) -> NodeId {
    NodeId::new(s)
}

fn meta() -> Metadata {
    Metadata::new(vec![n("n3"), n("n1"), n("n2")])
}

fn join(node: &str, addr: Option<&str>, storage: &str) -> Command {
    Command::Join {
        node: n(node),
        client_addr: addr.map(String::from),
        storage_id: storage.into(),
        durable: true,
    }
}

fn decls(shards: u32, rf: u8) -> Declarations {
    let mut d = Declarations::default();
    d.streams.insert(
        ObjectKey::new("t1", "default", "orders"),
        StreamSpec {
            shards,
            replication_factor: rf,
            consistency: Consistency::Quorum,
            retention: Default::default(),
            durable: true,
        },
    );
    d.caches.insert(
        ObjectKey::new("t1", "default", "sessions"),
        CacheSpec {
            shards: 3,
            replication_factor: 1,
        },
    );
    d
}

fn apply(m: &mut Metadata, cmds: &[Command]) -> Vec<Applied> {
    cmds.iter()
        .map(|c| {
            let next = m.applied + 1;
            m.apply_entry(next, &c.encode())
        })
        .collect()
}

#[test]
fn join_then_the_same_join_changes_nothing_and_a_new_disk_is_a_rejoin() {
    let mut m = meta();
    let got = apply(
        &mut m,
        &[
            join("n1", Some("127.0.0.1:5001"), "disk-a"),
            join("n1", Some("127.0.0.1:5001"), "disk-a"),
            join("n1", Some("127.0.0.1:5009"), "disk-a"),
            join("n1", Some("127.0.0.1:5009"), "disk-b"),
            join("n9", None, "x"),
        ],
    );
    assert_eq!(
        got,
        vec![
            Applied::Joined(n("n1")),
            Applied::Unchanged,
            Applied::Joined(n("n1")),
            Applied::Rejoined {
                node: n("n1"),
                previous_storage: "disk-a".into()
            },
            Applied::Invalid("n9 is not a voter".into()),
        ]
    );
    assert_eq!(m.applied, 5);
    assert_eq!(m.members[&n("n1")].storage_id, "disk-b");
}

#[test]
fn the_first_declaration_is_the_clusters_and_a_disagreeing_node_is_refused_by_name() {
    let mut m = meta();
    let got = apply(
        &mut m,
        &[
            Command::Declare {
                node: n("n2"),
                declarations: decls(6, 3),
            },
            Command::Declare {
                node: n("n1"),
                declarations: decls(6, 3),
            },
            Command::Declare {
                node: n("n1"),
                declarations: decls(6, 3),
            },
            Command::Declare {
                node: n("n3"),
                declarations: decls(4, 3),
            },
        ],
    );
    assert_eq!(got[0], Applied::Declared(n("n2")));
    assert_eq!(got[1], Applied::Declared(n("n1")));
    assert_eq!(got[2], Applied::Unchanged);
    assert_eq!(
        got[3],
        Applied::Refused {
            node: n("n3"),
            reason: "stream t1/default/orders is declared here as StreamSpec { shards: 4, \
                     replication_factor: 3, consistency: Quorum, retention: Retention { \
                     max_age_seconds: None, max_bytes: None }, durable: true } but the \
                     cluster has StreamSpec { shards: 6, replication_factor: 3, consistency: \
                     Quorum, retention: Retention { max_age_seconds: None, max_bytes: None }, \
                     durable: true }"
                .into()
        }
    );
    assert!(m.refused.contains_key(&n("n3")));
    let orders = &m.streams[&ObjectKey::new("t1", "default", "orders")];
    assert_eq!(orders.shards.len(), 6);
    assert!(orders
        .shards
        .iter()
        .all(|s| s.replicas.len() == 3 && s.generation == 1));
    assert_eq!(
        m.caches[&ObjectKey::new("t1", "default", "sessions")]
            .shards
            .len(),
        3
    );
}

#[test]
fn a_declaration_that_cannot_be_placed_is_refused_whole() {
    let mut m = meta();
    let got = apply(
        &mut m,
        &[Command::Declare {
            node: n("n1"),
            declarations: decls(2, 4),
        }],
    );
    assert_eq!(
        got,
        vec![Applied::Refused {
            node: n("n1"),
            reason: "stream t1/default/orders: replication_factor 4 needs that many nodes; \
                     the cluster has 3"
                .into()
        }]
    );
    assert!(m.declarations.is_none());
    assert!(m.streams.is_empty() && m.caches.is_empty());
}

#[test]
fn missing_objects_are_named_from_either_side() {
    let mine = decls(6, 3);
    let mut theirs = decls(6, 3);
    theirs.streams.insert(
        ObjectKey::new("t1", "default", "extra"),
        StreamSpec {
            shards: 1,
            replication_factor: 1,
            consistency: Consistency::Leader,
            retention: Default::default(),
            durable: true,
        },
    );
    assert_eq!(
        mine.disagreement(&theirs).as_deref(),
        Some("stream t1/default/extra is declared by the cluster but not here")
    );
    assert_eq!(
        theirs.disagreement(&mine).as_deref(),
        Some("stream t1/default/extra is declared here but not by the cluster")
    );
    assert_eq!(mine.disagreement(&mine.clone()), None);
}

#[test]
fn created_streams_are_placed_once_and_liveness_changes_topology() {
    let mut m = meta();
    let key = ObjectKey::new("t1", "ns", "auto");
    let spec = StreamSpec {
        shards: 1,
        replication_factor: 1,
        consistency: Consistency::Leader,
        retention: Default::default(),
        durable: true,
    };
    let got = apply(
        &mut m,
        &[
            join("n1", Some("a:1"), "d1"),
            join("n2", Some("a:2"), "d2"),
            join("n3", None, "d3"),
            Command::CreateStream {
                key: key.clone(),
                spec,
            },
            Command::CreateStream {
                key: key.clone(),
                spec,
            },
            Command::Liveness {
                node: n("n2"),
                up: false,
            },
            Command::Liveness {
                node: n("n2"),
                up: false,
            },
        ],
    );
    assert_eq!(got[3], Applied::Placed(key.clone()));
    assert_eq!(got[4], Applied::Unchanged);
    assert_eq!(
        got[5],
        Applied::Liveness {
            node: n("n2"),
            up: false
        }
    );
    assert_eq!(got[6], Applied::Unchanged);
    let serving: Vec<_> = m
        .serving_members()
        .map(|(n, a)| (n.0.clone(), a.to_string()))
        .collect();
    assert_eq!(serving, vec![("n1".to_string(), "a:1".to_string())]);
}

#[test]
fn garbage_entries_apply_as_nothing_and_empty_entries_are_rafts_own() {
    let mut m = meta();
    assert_eq!(m.apply_entry(1, b""), Applied::Unchanged);
    assert!(matches!(
        m.apply_entry(2, b"{not json"),
        Applied::Invalid(_)
    ));
    assert!(matches!(
        m.apply_entry(3, br#"{"op":"nope"}"#),
        Applied::Invalid(_)
    ));
    assert_eq!(m.applied, 3);
    assert!(m.members.is_empty());
}

#[test]
fn same_commands_same_bytes_and_a_snapshot_restores_exactly() {
    let cmds = [
        join("n2", Some("a:2"), "d2"),
        Command::Declare {
            node: n("n2"),
            declarations: decls(6, 3),
        },
        join("n1", Some("a:1"), "d1"),
        Command::CreateStream {
            key: ObjectKey::new("t9", "x", "y"),
            spec: StreamSpec {
                shards: 2,
                replication_factor: 2,
                consistency: Consistency::Leader,
                retention: Default::default(),
                durable: true,
            },
        },
    ];
    let (mut a, mut b) = (meta(), meta());
    apply(&mut a, &cmds);
    apply(&mut b, &cmds);
    assert_eq!(a.snapshot(), b.snapshot());
    assert_eq!(Metadata::restore(&a.snapshot()).unwrap(), a);
}

/// Three nodes joined on their disks and one stream of one shard with three copies placed:
/// the metadata and that shard.
fn three_joined_one_shard() -> (Metadata, ShardRef) {
    let mut m = meta();
    apply(
        &mut m,
        &[
            join("n1", None, "disk-1"),
            join("n2", None, "disk-2"),
            join("n3", None, "disk-3"),
            Command::Declare {
                node: n("n1"),
                declarations: decls(1, 3),
            },
        ],
    );
    let shard = ShardRef {
        kind: ObjectKind::Stream,
        key: ObjectKey::new("t1", "default", "orders"),
        shard: 0,
    };
    (m, shard)
}

#[test]
fn a_rebuilt_copy_is_recorded_on_its_new_disk_only_at_the_generation_that_fed_it() {
    let (mut m, shard) = three_joined_one_shard();
    let generation = m.shard(&shard).unwrap().generation;
    let record = |generation: u64, storage: &str| Command::RecordCopy {
        shard: shard.clone(),
        generation,
        node: n("n3"),
        storage_id: storage.into(),
    };
    let got = apply(
        &mut m,
        &[
            // Not n3's disk (yet): nothing.
            record(generation, "disk-3-new"),
            join("n3", None, "disk-3-new"),
            // Fed by an older leadership: nothing.
            record(generation.saturating_sub(1), "disk-3-new"),
            record(generation + 1, "disk-3-new"),
            record(generation, "disk-3-new"),
            record(generation, "disk-3-new"),
        ],
    );
    let copy = Applied::CopyRecorded {
        shard: shard.clone(),
        node: n("n3"),
        storage_id: "disk-3-new".into(),
    };
    let rejoin = Applied::Rejoined {
        node: n("n3"),
        previous_storage: "disk-3".into(),
    };
    let u = || Applied::Unchanged;
    assert_eq!(got, vec![u(), rejoin, u(), u(), copy, u()]);
    let meta = m.shard(&shard).unwrap();
    assert_eq!(meta.storage_of(&n("n3")), Some("disk-3-new"));
    assert!(meta.holds_copy(&n("n3"), &m.members));
    assert_eq!(meta.storage_of(&n("n2")), Some("disk-2"));
}

#[test]
fn a_reopen_moves_only_its_leaders_own_generation_on_by_one() {
    let (mut m, shard) = three_joined_one_shard();
    let placed = m.shard(&shard).unwrap().clone();
    let (g, leader) = (placed.generation, placed.leader.clone().unwrap());
    let other = placed
        .replicas
        .iter()
        .find(|r| **r != leader)
        .unwrap()
        .clone();
    let reopen = |generation: u64, leader: &NodeId| Command::Reopen {
        shard: shard.clone(),
        generation,
        leader: leader.clone(),
    };
    let got = apply(
        &mut m,
        &[
            // Not the leader at g, an older generation, a later one: nothing.
            reopen(g, &other),
            reopen(g.saturating_sub(1), &leader),
            reopen(g + 1, &leader),
            reopen(g, &leader),
            // Asked twice: the second finds g + 1.
            reopen(g, &leader),
        ],
    );
    let u = || Applied::Unchanged;
    let moved = Applied::Promoted {
        shard: shard.clone(),
        generation: g + 1,
        leader: Some(leader.clone()),
    };
    assert_eq!(got, vec![u(), u(), u(), moved, u()]);
    let now = m.shard(&shard).unwrap();
    assert_eq!(
        (now.generation, now.leader.as_ref()),
        (g + 1, Some(&leader))
    );
    assert_eq!(now.replicas, placed.replicas);
}

fn operator_spec() -> StreamSpec {
    StreamSpec {
        shards: 6,
        replication_factor: 3,
        consistency: Consistency::Quorum,
        retention: Retention {
            max_age_seconds: Some(86_400),
            max_bytes: Some(1 << 30),
        },
        durable: true,
    }
}

/// An operator's create (`POST /v1/streams`) as one command on three joined nodes: the
/// whole stream placed at once with its retention recorded; the same command again, and one
/// with another spec, change nothing (the first applied wins: the API answers 409 from
/// `first_difference`); one with a retention of 0 applies as nothing on every node. The
/// state after each entry is pinned in `testdata/meta/create_stream.txt` (`FELIX_BLESS=1`
/// rewrites it; review the diff like code: every node must reach exactly this).
#[test]
fn an_operator_create_applied_to_states_golden() {
    let key = ObjectKey::new("t1", "ops", "orders");
    let mut other = operator_spec();
    other.shards = 4;
    let mut zero = operator_spec();
    zero.retention.max_bytes = Some(0);
    let cmds = [
        join("n1", Some("a:1"), "d1"),
        join("n2", Some("a:2"), "d2"),
        join("n3", Some("a:3"), "d3"),
        Command::CreateStream {
            key: key.clone(),
            spec: operator_spec(),
        },
        Command::CreateStream {
            key: key.clone(),
            spec: operator_spec(),
        },
        Command::CreateStream {
            key: key.clone(),
            spec: other,
        },
        Command::CreateStream {
            key: ObjectKey::new("t1", "ops", "empty"),
            spec: zero,
        },
    ];
    let mut m = meta();
    let mut out = String::new();
    for c in &cmds {
        let next = m.applied + 1;
        let got = m.apply_entry(next, &c.encode());
        out.push_str(&format!(
            "{}\n  -> {got:?}\n",
            String::from_utf8(c.encode()).unwrap()
        ));
    }
    out.push_str("\nstreams:\n");
    for (k, s) in &m.streams {
        out.push_str(&format!("{k} {:?}\n", s.spec));
        for (i, sh) in s.shards.iter().enumerate() {
            let replicas: Vec<&str> = sh.replicas.iter().map(|r| r.0.as_str()).collect();
            out.push_str(&format!(
                "  #{i} leader {} generation {} replicas {} storage {}\n",
                sh.leader.as_ref().map_or("-", |l| l.0.as_str()),
                sh.generation,
                replicas.join(","),
                sh.replica_storage.join(",")
            ));
        }
    }
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/meta/create_stream.txt");
    if std::env::var_os("FELIX_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &out).unwrap();
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with FELIX_BLESS=1)", path.display()));
    assert_eq!(out, want);
    assert_eq!(
        m.streams[&key].spec.first_difference(&other),
        Some("shards")
    );
    assert_eq!(
        m.streams[&key].spec.first_difference(&operator_spec()),
        None
    );
}

/// What the admin API refuses `400` before proposing anything, each naming its field.
#[test]
fn an_operator_spec_is_checked_naming_the_bad_field() {
    let m = meta();
    let field = |f: &dyn Fn(&mut StreamSpec)| {
        let mut s = operator_spec();
        f(&mut s);
        m.check_stream_spec(&s).err().map(|e| e.field)
    };
    assert_eq!(field(&|_| {}), None);
    assert_eq!(field(&|s| s.shards = 0), Some("shards"));
    assert_eq!(field(&|s| s.shards = MAX_STREAM_SHARDS), None);
    assert_eq!(field(&|s| s.shards = MAX_STREAM_SHARDS + 1), Some("shards"));
    // Three voters: RF 3 fits, 4 does not.
    assert_eq!(
        field(&|s| s.replication_factor = 4),
        Some("replication_factor")
    );
    assert_eq!(
        field(&|s| s.replication_factor = 0),
        Some("replication_factor")
    );
    assert_eq!(
        field(&|s| s.retention.max_age_seconds = Some(0)),
        Some("retention.max_age_seconds")
    );
    assert_eq!(
        field(&|s| s.retention.max_bytes = Some(0)),
        Some("retention.max_bytes")
    );
    assert_eq!(field(&|s| s.retention = Retention::default()), None);
    let e = m
        .check_stream_spec(&StreamSpec {
            replication_factor: 4,
            ..operator_spec()
        })
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "replication_factor: replication_factor 4 needs that many nodes; the cluster has 3"
    );
}

/// An operator's retention change (`PATCH /v1/streams/…`): applied to a placed stream, the
/// same change again is nothing, a retention of 0 and an unknown stream apply as nothing on
/// every node; shards, placement and generations are untouched.
#[test]
fn an_operator_alter_changes_retention_only() {
    let key = ObjectKey::new("t1", "ops", "orders");
    let mut m = meta();
    apply(
        &mut m,
        &[
            join("n1", Some("a:1"), "d1"),
            join("n2", Some("a:2"), "d2"),
            join("n3", Some("a:3"), "d3"),
            Command::CreateStream {
                key: key.clone(),
                spec: operator_spec(),
            },
        ],
    );
    let placed = m.streams[&key].shards.clone();
    let week = Retention {
        max_age_seconds: Some(7 * 86_400),
        max_bytes: None,
    };
    let got = apply(
        &mut m,
        &[
            Command::AlterStream {
                key: key.clone(),
                retention: week,
            },
            Command::AlterStream {
                key: key.clone(),
                retention: week,
            },
            Command::AlterStream {
                key: key.clone(),
                retention: Retention {
                    max_age_seconds: Some(0),
                    max_bytes: None,
                },
            },
            Command::AlterStream {
                key: ObjectKey::new("t1", "ops", "nope"),
                retention: week,
            },
        ],
    );
    assert_eq!(got[0], Applied::Altered(key.clone()));
    assert_eq!(got[1], Applied::Unchanged);
    assert_eq!(
        got[2],
        Applied::Invalid(
            "stream t1/ops/orders: retention.max_age_seconds: 0 would keep nothing: leave it \
             out for the broker-wide setting"
                .into()
        )
    );
    assert_eq!(
        got[3],
        Applied::Invalid("stream t1/ops/nope is not placed".into())
    );
    let s = &m.streams[&key];
    assert_eq!(s.spec.retention, week);
    assert_eq!(
        StreamSpec {
            retention: operator_spec().retention,
            ..s.spec
        },
        operator_spec()
    );
    assert_eq!(s.shards, placed);
}

/// An operator's cache create: placed whole on the joined nodes, once (a second create of the
/// key, whatever its spec, changes nothing); one that cannot be placed applies as nothing.
#[test]
fn an_operator_cache_create_is_placed_once() {
    let key = ObjectKey::new("t1", "ops", "sessions");
    let spec = CacheSpec {
        shards: 1,
        replication_factor: 3,
    };
    let mut m = meta();
    let got = apply(
        &mut m,
        &[
            join("n1", Some("a:1"), "d1"),
            join("n2", Some("a:2"), "d2"),
            join("n3", Some("a:3"), "d3"),
            Command::CreateCache {
                key: key.clone(),
                spec,
            },
            Command::CreateCache {
                key: key.clone(),
                spec: CacheSpec {
                    shards: 1,
                    replication_factor: 1,
                },
            },
            Command::CreateCache {
                key: ObjectKey::new("t1", "ops", "wide"),
                spec: CacheSpec {
                    shards: 1,
                    replication_factor: 4,
                },
            },
        ],
    );
    assert_eq!(got[3], Applied::Placed(key.clone()));
    assert_eq!(got[4], Applied::Unchanged);
    assert!(matches!(&got[5], Applied::Invalid(why) if why.contains("replication_factor 4")));
    let c = &m.caches[&key];
    assert_eq!(c.spec, spec);
    assert_eq!(c.shards.len(), 1);
    let mut replicas = c.shards[0].replicas.clone();
    replicas.sort();
    assert_eq!(replicas, vec![n("n1"), n("n2"), n("n3")]);
    assert_eq!(c.shards[0].replica_storage.len(), 3);
    assert!(!m.caches.contains_key(&ObjectKey::new("t1", "ops", "wide")));
}

/// A cache of four shards with three copies, created beside a stream already placed: every
/// shard placed whole (three replicas, a leader, generation 1), leaders balanced with the
/// stream's over the three nodes; each shard then fails over on its own (a `Promote` names
/// its shard and moves no other), and the keys a client sends hash onto the shards as the
/// protocol's function says. Exact output.
#[test]
fn a_multi_shard_cache_is_placed_and_fails_over_shard_by_shard() {
    let key = ObjectKey::new("t1", "ops", "sessions");
    let spec = CacheSpec {
        shards: 4,
        replication_factor: 3,
    };
    let mut m = meta();
    let got = apply(
        &mut m,
        &[
            join("n1", Some("a:1"), "d1"),
            join("n2", Some("a:2"), "d2"),
            join("n3", Some("a:3"), "d3"),
            Command::CreateStream {
                key: ObjectKey::new("t1", "ops", "orders"),
                spec: StreamSpec::new(2, 3, Consistency::Quorum),
            },
            Command::CreateCache {
                key: key.clone(),
                spec,
            },
        ],
    );
    assert_eq!(got[4], Applied::Placed(key.clone()));
    let show = |m: &Metadata| {
        m.shards()
            .map(|(r, s)| {
                let replicas: Vec<&str> = s.replicas.iter().map(|n| n.0.as_str()).collect();
                format!(
                    "{r} leader {} generation {} replicas {} storage {}\n",
                    s.leader.as_ref().map_or("-", |l| l.0.as_str()),
                    s.generation,
                    replicas.join(","),
                    s.replica_storage.join(",")
                )
            })
            .collect::<String>()
    };
    assert_eq!(
        show(&m),
        "stream t1/ops/orders#0 leader n1 generation 1 replicas n1,n2,n3 storage d1,d2,d3\n\
         stream t1/ops/orders#1 leader n2 generation 1 replicas n2,n3,n1 storage d2,d3,d1\n\
         cache t1/ops/sessions#0 leader n3 generation 1 replicas n3,n1,n2 storage d3,d1,d2\n\
         cache t1/ops/sessions#1 leader n2 generation 1 replicas n2,n3,n1 storage d2,d3,d1\n\
         cache t1/ops/sessions#2 leader n3 generation 1 replicas n3,n1,n2 storage d3,d1,d2\n\
         cache t1/ops/sessions#3 leader n1 generation 1 replicas n1,n2,n3 storage d1,d2,d3\n"
    );
    // Shard 2's leader, having recorded its followers level (a cache's writes are `leader`
    // consistency), stops: shard 2 fails over to n1; the other shards keep their leaders,
    // shard 0 too, though n3 led it as well (each shard is promoted on its own).
    let shard2 = ShardRef {
        kind: ObjectKind::Cache,
        key: key.clone(),
        shard: 2,
    };
    let got = apply(
        &mut m,
        &[
            Command::Quiesce {
                shard: shard2.clone(),
                generation: 1,
                end: 0,
                level: vec![n("n1"), n("n2")],
            },
            Command::Liveness {
                node: n("n3"),
                up: false,
            },
            Command::Promote {
                shard: shard2.clone(),
                generation: 2,
                leader: Some(n("n1")),
            },
        ],
    );
    assert_eq!(
        got[2],
        Applied::Promoted {
            shard: shard2,
            generation: 2,
            leader: Some(n("n1")),
        }
    );
    let leaders: Vec<(Option<&str>, u64)> = m.caches[&key]
        .shards
        .iter()
        .map(|s| (s.leader.as_ref().map(|l| l.0.as_str()), s.generation))
        .collect();
    assert_eq!(
        leaders,
        [
            (Some("n3"), 1),
            (Some("n2"), 1),
            (Some("n1"), 2),
            (Some("n1"), 1)
        ]
    );
    // The keys a client sends, over the cache's four shards (routing.md's function).
    let shards: Vec<u32> = ["user-42", "k1", "orders/123", "a", ""]
        .iter()
        .map(|k| crate::routing::cache_shard(k.as_bytes(), spec.shards))
        .collect();
    assert_eq!(shards, [3, 2, 1, 0, 3]);
}

/// An operator's delete (`DELETE /v1/streams/…`) as one command: only the named incarnation
/// goes (a stale or repeated delete changes nothing, and never touches the stream re-created
/// since); the name's next life is incarnation 1 with every shard's generation above the
/// highest the deleted one reached; a deleted stream cannot be altered. Pinned in
/// `testdata/meta/delete_stream.txt` (`FELIX_BLESS=1` rewrites it).
#[test]
fn an_operator_delete_applied_to_states_golden() {
    let key = ObjectKey::new("t1", "ops", "orders");
    let mut spec = operator_spec();
    spec.shards = 2;
    let shard0 = ShardRef {
        kind: ObjectKind::Stream,
        key: key.clone(),
        shard: 0,
    };
    let delete = |incarnation| Command::DeleteStream {
        key: key.clone(),
        incarnation,
    };
    let cache = ObjectKey::new("t1", "ops", "sessions");
    let cache_spec = CacheSpec {
        shards: 1,
        replication_factor: 3,
    };
    let cmds = [
        join("n1", Some("a:1"), "d1"),
        join("n2", Some("a:2"), "d2"),
        join("n3", Some("a:3"), "d3"),
        Command::CreateStream {
            key: key.clone(),
            spec,
        },
        Command::Promote {
            shard: shard0.clone(),
            generation: 2,
            leader: Some(n("n2")),
        },
        Command::Promote {
            shard: shard0.clone(),
            generation: 3,
            leader: Some(n("n3")),
        },
        // No such incarnation yet: nothing.
        delete(1),
        delete(0),
        delete(0),
        Command::AlterStream {
            key: key.clone(),
            retention: Retention::default(),
        },
        Command::Promote {
            shard: shard0.clone(),
            generation: 4,
            leader: Some(n("n1")),
        },
        Command::CreateStream {
            key: key.clone(),
            spec,
        },
        // The first life's delete, proposed again late: the new life stays.
        delete(0),
        Command::CreateStream {
            key: ObjectKey::new("t1", "ops", "other"),
            spec,
        },
        delete(1),
        Command::CreateStream {
            key: key.clone(),
            spec,
        },
        Command::DeleteStream {
            key: ObjectKey::new("t1", "ops", "other"),
            incarnation: 0,
        },
        // A cache's delete is the same, by its own incarnation.
        Command::CreateCache {
            key: cache.clone(),
            spec: cache_spec,
        },
        Command::DeleteCache {
            key: cache.clone(),
            incarnation: 1,
        },
        Command::DeleteCache {
            key: cache.clone(),
            incarnation: 0,
        },
        Command::CreateCache {
            key: cache.clone(),
            spec: cache_spec,
        },
        Command::CreateCache {
            key: ObjectKey::new("t1", "ops", "gone"),
            spec: cache_spec,
        },
        Command::DeleteCache {
            key: ObjectKey::new("t1", "ops", "gone"),
            incarnation: 0,
        },
    ];
    let mut m = meta();
    let mut out = String::new();
    for c in &cmds {
        let next = m.applied + 1;
        let got = m.apply_entry(next, &c.encode());
        out.push_str(&format!(
            "{}\n  -> {got:?}\n",
            String::from_utf8(c.encode()).unwrap()
        ));
    }
    out.push_str("\nstreams:\n");
    for (k, s) in &m.streams {
        out.push_str(&format!("{k} incarnation {}\n", s.incarnation));
        for (i, sh) in s.shards.iter().enumerate() {
            let replicas: Vec<&str> = sh.replicas.iter().map(|r| r.0.as_str()).collect();
            out.push_str(&format!(
                "  #{i} leader {} generation {} replicas {}\n",
                sh.leader.as_ref().map_or("-", |l| l.0.as_str()),
                sh.generation,
                replicas.join(","),
            ));
        }
    }
    out.push_str("deleted:\n");
    for (k, d) in &m.deleted_streams {
        out.push_str(&format!("{k} {d:?}\n"));
    }
    out.push_str("caches:\n");
    for (k, c) in &m.caches {
        let g: Vec<u64> = c.shards.iter().map(|s| s.generation).collect();
        out.push_str(&format!(
            "{k} incarnation {} generations {g:?}\n",
            c.incarnation
        ));
    }
    out.push_str("deleted caches:\n");
    for (k, d) in &m.deleted_caches {
        out.push_str(&format!("{k} {d:?}\n"));
    }
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/meta/delete_stream.txt");
    if std::env::var_os("FELIX_BLESS").is_some() {
        std::fs::write(&path, &out).unwrap();
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with FELIX_BLESS=1)", path.display()));
    assert_eq!(out, want);
    // A snapshot round trip keeps incarnations and tombstones.
    assert_eq!(Metadata::restore(&m.snapshot()).unwrap(), m);
}

/// A node that installs a snapshot instead of the entries it missed (it was down during a
/// delete) is told of every stream incarnation the snapshot no longer has: deleted, or
/// deleted and re-created. Streams unchanged, or new, are not reported.
#[test]
fn a_snapshot_reports_the_stream_incarnations_it_no_longer_has() {
    let spec = StreamSpec::new(1, 3, Consistency::Leader);
    let (a, b, c) = (
        ObjectKey::new("t", "n", "a"),
        ObjectKey::new("t", "n", "b"),
        ObjectKey::new("t", "n", "c"),
    );
    let create = |k: &ObjectKey| Command::CreateStream {
        key: k.clone(),
        spec,
    };
    let mut before = meta();
    let joins = [
        join("n1", None, "d1"),
        join("n2", None, "d2"),
        join("n3", None, "d3"),
    ];
    apply(&mut before, &joins);
    apply(&mut before, &[create(&a), create(&b), create(&c)]);
    let mut after = before.clone();
    let delete = |k: &ObjectKey| Command::DeleteStream {
        key: k.clone(),
        incarnation: 0,
    };
    let d = ObjectKey::new("t", "n", "d");
    apply(
        &mut after,
        &[delete(&a), delete(&b), create(&b), create(&d)],
    );
    assert_eq!(
        before.streams_gone_in(&after),
        vec![
            Applied::StreamDeleted {
                key: a,
                incarnation: 0
            },
            Applied::StreamDeleted {
                key: b.clone(),
                incarnation: 0
            },
        ]
    );
    assert_eq!(after.streams[&b].incarnation, 1);
    assert!(after.streams_gone_in(&after).is_empty());
}
