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

/// Declarations are "ensure" (docs/operations.md, "Declarations are ensured"): the first
/// node's create what is absent; a node declaring the same changes nothing; one declaring a
/// stream otherwise keeps the cluster's record and is told every differing field, while what
/// it declares that is absent is created; one that cannot be placed creates nothing. The
/// state after each entry is pinned in `testdata/meta/declare_ensure.txt` (`FELIX_BLESS=1`
/// rewrites it).
#[test]
fn declarations_are_ensured_golden() {
    let mut otherwise = decls(4, 2);
    otherwise.streams.values_mut().for_each(|s| {
        s.consistency = Consistency::Leader;
        s.retention.max_bytes = Some(4096);
    });
    otherwise
        .caches
        .values_mut()
        .for_each(|c| c.replication_factor = 3);
    otherwise.streams.insert(
        ObjectKey::new("t1", "default", "extra"),
        StreamSpec::new(2, 1, Consistency::Leader),
    );
    let mut impossible = decls(6, 3);
    impossible.streams.insert(
        ObjectKey::new("t1", "default", "wide"),
        StreamSpec::new(1, 4, Consistency::Leader),
    );
    impossible.streams.insert(
        ObjectKey::new("t1", "default", "never"),
        StreamSpec::new(1, 1, Consistency::Leader),
    );
    let declare = |node: &str, declarations: &Declarations| Command::Declare {
        node: n(node),
        declarations: declarations.clone(),
    };
    let cmds = [
        declare("n2", &decls(6, 3)),
        declare("n1", &decls(6, 3)),
        declare("n1", &decls(6, 3)),
        declare("n3", &otherwise),
        declare("n3", &otherwise),
        declare("n1", &impossible),
        declare("n1", &Declarations::default()),
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
        out.push_str(&format!("{k} {:?} shards {}\n", s.spec, s.shards.len()));
    }
    out.push_str("caches:\n");
    for (k, c) in &m.caches {
        out.push_str(&format!("{k} {:?} shards {}\n", c.spec, c.shards.len()));
    }
    out.push_str(&format!("refused: {:?}\n", m.refused));
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/meta/declare_ensure.txt");
    if std::env::var_os("FELIX_BLESS").is_some() {
        std::fs::write(&path, &out).unwrap();
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with FELIX_BLESS=1)", path.display()));
    assert_eq!(out, want);
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
