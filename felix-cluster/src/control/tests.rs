//! Three control planes in one thread: a FIFO network that can cut nodes off, disks that
//! confirm every record at once, and a clock that moves only when told.

use super::*;
use crate::meta::{Consistency, Declarations, StreamSpec};

const START_NODES: [&str; 3] = ["n1", "n2", "n3"];

fn n(s: &str) -> NodeId {
    NodeId::new(s)
}

struct Cluster {
    now: Instant,
    seed: u64,
    planes: BTreeMap<NodeId, ControlPlane>,
    disks: BTreeMap<NodeId, Vec<u8>>,
    /// Each node's snapshot file, once it compacted.
    snapshots: BTreeMap<NodeId, Vec<u8>>,
    net: VecDeque<(NodeId, NodeId, Message)>,
    /// Nodes whose traffic is dropped both ways.
    cut: BTreeSet<NodeId>,
    /// Every node's applied changes, in order.
    applied: BTreeMap<NodeId, Vec<Applied>>,
    /// Lease grants the planes gave out, by the node they are for (the latest).
    grants: BTreeMap<NodeId, LeaseGrant>,
}

fn voters() -> Voters {
    Voters::new(START_NODES.iter().map(|s| n(s)).collect()).unwrap()
}

fn config(node: &NodeId, seed: u64) -> ControlConfig {
    ControlConfig::new(node.clone(), voters(), seed, Duration::from_secs(2))
}

impl Cluster {
    fn new(seed: u64) -> Cluster {
        let now = Instant::now();
        let mut c = Cluster {
            now,
            seed,
            planes: BTreeMap::new(),
            disks: BTreeMap::new(),
            snapshots: BTreeMap::new(),
            net: VecDeque::new(),
            cut: BTreeSet::new(),
            applied: BTreeMap::new(),
            grants: BTreeMap::new(),
        };
        for name in START_NODES {
            c.start(&n(name));
        }
        c
    }

    /// Starts (or restarts) a node from whatever its disk holds.
    fn start(&mut self, node: &NodeId) {
        let disk = self.disks.entry(node.clone()).or_default();
        let mut replay = record::Replayer::new(voters().raft_ids());
        if let Some(snap) = self.snapshots.get(node) {
            replay.snapshot_file(snap).unwrap();
        }
        assert_eq!(replay.log(disk), (disk.len(), None));
        let plane = ControlPlane::new(config(node, self.seed), replay.finish(), self.now);
        self.planes.insert(node.clone(), plane);
        self.net.retain(|(from, to, _)| from != node && to != node);
    }

    /// What the engine's metadata log does past its threshold: the snapshot file, then a
    /// fresh log holding what follows it.
    fn compact(&mut self, node: &NodeId) -> u64 {
        let p = self.planes.get_mut(node).unwrap();
        let c = p
            .compaction()
            .expect("something applied since the last snapshot");
        self.snapshots.insert(node.clone(), c.snapshot_file.clone());
        self.disks.insert(node.clone(), c.head.clone());
        p.compacted(&c);
        c.index
    }

    fn wipe(&mut self, node: &NodeId) {
        self.disks.insert(node.clone(), Vec::new());
        self.snapshots.remove(node);
        self.start(node);
        // What the peer handshake tells every other node when the restarted one dials it.
        for (name, p) in self.planes.iter_mut() {
            if name != node {
                p.peer_reconnected(node);
            }
        }
    }

    /// Delivers everything pending, then advances the clock one tick; `rounds` times.
    fn run(&mut self, rounds: usize) {
        for _ in 0..rounds {
            self.settle();
            self.now += Duration::from_millis(100);
            let names: Vec<NodeId> = self.planes.keys().cloned().collect();
            for name in names {
                self.planes.get_mut(&name).unwrap().handle_timeout(self.now);
            }
            self.settle();
        }
    }

    fn settle(&mut self) {
        for _ in 0..10_000 {
            let mut progress = false;
            let names: Vec<NodeId> = self.planes.keys().cloned().collect();
            for name in &names {
                while let Some(out) = self.planes.get_mut(name).unwrap().poll_output() {
                    progress = true;
                    match out {
                        ControlOutput::Send { to, message } => {
                            self.net.push_back((name.clone(), to, message))
                        }
                        ControlOutput::Persist { ready, record } => {
                            self.disks.get_mut(name).unwrap().extend_from_slice(&record);
                            self.planes.get_mut(name).unwrap().persisted(ready);
                        }
                        ControlOutput::Applied(a) => {
                            self.applied.entry(name.clone()).or_default().push(a)
                        }
                        ControlOutput::LeaseGranted { node, grant, .. } => {
                            self.grants.insert(node, grant);
                        }
                    }
                }
            }
            while let Some((from, to, m)) = self.net.pop_front() {
                progress = true;
                if self.cut.contains(&from) || self.cut.contains(&to) {
                    continue;
                }
                let now = self.now;
                if let Some(p) = self.planes.get_mut(&to) {
                    p.handle_message(now, &from, m);
                }
            }
            if !progress {
                return;
            }
        }
        panic!("the cluster never went quiet");
    }

    fn leaders(&self) -> Vec<NodeId> {
        self.planes
            .iter()
            .filter(|(name, p)| p.is_leader() && !self.cut.contains(*name))
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn run_until(&mut self, max_rounds: usize, mut done: impl FnMut(&Cluster) -> bool) -> usize {
        for round in 0..max_rounds {
            if done(self) {
                return round;
            }
            self.run(1);
        }
        panic!("not done after {max_rounds} rounds");
    }

    fn join_all(&mut self) {
        let now = self.now;
        for (name, p) in self.planes.iter_mut() {
            p.want(
                Command::Join {
                    node: name.clone(),
                    client_addr: Some(format!("127.0.0.1:{}", 5000 + name.0.len())),
                    storage_id: format!("disk-{name}"),
                    durable: true,
                },
                now,
            );
        }
    }
}

fn declarations() -> Declarations {
    let mut d = Declarations::default();
    d.streams.insert(
        ObjectKey::new("t1", "default", "orders"),
        StreamSpec {
            shards: 6,
            replication_factor: 3,
            consistency: Consistency::Quorum,
            retention: Default::default(),
            durable: true,
        },
    );
    d
}

#[test]
fn three_blank_nodes_elect_one_leader_and_agree_on_every_entry() {
    let mut c = Cluster::new(7);
    c.run_until(100, |c| c.leaders().len() == 1);
    c.join_all();
    let now = c.now;
    for (name, p) in c.planes.iter_mut() {
        p.want(
            Command::Declare {
                node: name.clone(),
                declarations: declarations(),
            },
            now,
        );
    }
    c.run_until(100, |c| {
        c.planes
            .values()
            .all(|p| p.metadata().members.len() == 3 && p.metadata().declared_by.len() == 3)
    });
    c.run(3);
    let snaps: Vec<Vec<u8>> = c.planes.values().map(|p| p.metadata().snapshot()).collect();
    assert!(
        snaps.windows(2).all(|w| w[0] == w[1]),
        "metadata differs between nodes"
    );
    assert_eq!(c.leaders().len(), 1);
    assert!(c.planes.values().all(|p| p.votes()));
    let orders = &c.planes[&n("n1")].metadata().streams[&ObjectKey::new("t1", "default", "orders")];
    assert_eq!(orders.shards.len(), 6);
}

/// Runs a scripted scenario and records, after every round, each node's term, role and next
/// election timer.
fn trace(seed: u64) -> Vec<(u64, bool, usize)> {
    let mut c = Cluster::new(seed);
    let mut out = Vec::new();
    for round in 0..200 {
        if round == 60 {
            // Cut the leader off, so the rest hold a second election.
            let l = c.leaders();
            c.cut.extend(l);
        }
        if round == 120 {
            c.cut.clear();
        }
        c.run(1);
        for p in c.planes.values() {
            out.push((p.term(), p.is_leader(), p.election_timeout_ticks()));
        }
    }
    out
}

/// The seed hook (`election.rs`): the same seed gives the same elections, timer by timer. If
/// raft-rs's own `thread_rng` draw ever decided a timer, two runs would differ.
#[test]
fn elections_follow_the_seed_and_nothing_else() {
    let a = trace(42);
    let b = trace(42);
    assert_eq!(a, b);
    let timers: BTreeSet<usize> = a.iter().map(|t| t.2).collect();
    assert!(
        timers.len() > 3,
        "the timers should vary within the range: {timers:?}"
    );
    assert!(timers.iter().all(|t| (10..20).contains(t)));
    assert_ne!(trace(43), a, "another seed should give another run");
}

#[test]
fn a_cut_off_leader_steps_down_and_the_rest_elect_another() {
    let mut c = Cluster::new(3);
    c.run_until(100, |c| c.leaders().len() == 1);
    let old = c.leaders()[0].clone();
    let old_term = c.planes[&old].term();
    c.cut.insert(old.clone());
    c.run_until(100, |c| c.leaders().len() == 1);
    let new = c.leaders()[0].clone();
    assert_ne!(new, old);
    assert!(c.planes[&new].term() > old_term);
    // check_quorum: the isolated leader gives up within an election timeout of silence.
    c.run_until(40, |c| !c.planes[&old].is_leader());
    c.cut.clear();
    c.run(30);
    assert_eq!(
        c.leaders(),
        vec![new.clone()],
        "pre_vote: the rejoined node did not disrupt"
    );
}

#[test]
fn the_leader_marks_a_silent_member_down_and_back_up() {
    let mut c = Cluster::new(11);
    c.run_until(100, |c| c.leaders().len() == 1);
    c.join_all();
    c.run_until(100, |c| {
        c.planes.values().all(|p| p.metadata().members.len() == 3)
    });
    let leader = c.leaders()[0].clone();
    let victim = c.planes.keys().find(|n| **n != leader).unwrap().clone();
    c.cut.insert(victim.clone());
    let rounds = c.run_until(100, |c| !c.planes[&leader].metadata().members[&victim].up);
    // Down after 1 s of silence (half the 2 s lease), plus a commit.
    assert!(rounds <= 14, "took {rounds} rounds");
    let serving: Vec<&NodeId> = c.planes[&leader]
        .metadata()
        .serving_members()
        .map(|(n, _)| n)
        .collect();
    assert!(!serving.contains(&&victim));
    c.cut.clear();
    c.run_until(100, |c| c.planes[&leader].metadata().members[&victim].up);
}

#[test]
fn a_member_marked_down_that_becomes_the_leader_marks_itself_up() {
    // Marked down while cut off; then the old leader is cut off and the marked node wins
    // the next election (the first seed where it does). Nobody else judges the leader, so
    // it must say it is up itself.
    for seed in 0..40 {
        let mut c = Cluster::new(seed);
        c.run_until(100, |c| c.leaders().len() == 1);
        c.join_all();
        c.run_until(100, |c| {
            c.planes.values().all(|p| p.metadata().members.len() == 3)
        });
        let leader = c.leaders()[0].clone();
        let victim = c.planes.keys().find(|n| **n != leader).unwrap().clone();
        c.cut.insert(victim.clone());
        c.run_until(100, |c| !c.planes[&leader].metadata().members[&victim].up);
        c.cut.clear();
        // Caught up (its log as long as the third's), so either may win next.
        let applied = c.planes[&leader].metadata().applied;
        c.run_until(100, |c| c.planes[&victim].metadata().applied >= applied);
        c.cut.insert(leader.clone());
        c.run_until(200, |c| c.leaders().iter().any(|l| *l != leader));
        if !c.leaders().contains(&victim) {
            continue;
        }
        c.run_until(100, |c| c.planes[&victim].metadata().members[&victim].up);
        return;
    }
    panic!("no seed elected the member marked down");
}

#[test]
fn a_restart_rebuilds_the_metadata_from_the_log() {
    let mut c = Cluster::new(5);
    c.run_until(100, |c| c.leaders().len() == 1);
    c.join_all();
    c.run_until(100, |c| {
        c.planes.values().all(|p| p.metadata().members.len() == 3)
    });
    let before = c.planes[&n("n2")].metadata().clone();
    c.start(&n("n2"));
    assert!(
        c.planes[&n("n2")].votes(),
        "a disk with state votes at once"
    );
    assert_eq!(c.planes[&n("n2")].metadata().members, before.members);
    c.run(20);
    assert_eq!(c.leaders().len(), 1);
}

/// The lost-disk trap: an entry committed on n1 and n2 only; n1 goes away and n2 comes back
/// blank. Were n2 to vote, n3 (which never got the entry) could win with n2's vote and the
/// committed entry would be gone. The guard keeps n2 silent until n1 is back.
#[test]
fn a_blank_voter_does_not_elect_a_leader_that_lacks_committed_entries() {
    let mut c = Cluster::new(9);
    c.run_until(100, |c| c.leaders().len() == 1);
    // Make n1 the leader, so the committed entry certainly lives on it.
    while c.leaders() != vec![n("n1")] {
        let l = c.leaders()[0].clone();
        c.cut.insert(l);
        c.run_until(100, |c| c.leaders().len() == 1);
        c.cut.clear();
        c.run(30);
    }
    c.cut.insert(n("n3"));
    let now = c.now;
    c.planes.get_mut(&n("n1")).unwrap().want(
        Command::Join {
            node: n("n1"),
            client_addr: None,
            storage_id: "d1".into(),
            durable: true,
        },
        now,
    );
    c.run_until(50, |c| {
        c.planes[&n("n2")].metadata().members.contains_key(&n("n1"))
    });
    assert!(!c.planes[&n("n3")].metadata().members.contains_key(&n("n1")));
    // n1 goes away, n2 loses its disk, n3 comes back.
    c.cut.clear();
    c.cut.insert(n("n1"));
    c.wipe(&n("n2"));
    assert!(!c.planes[&n("n2")].votes());
    c.run(100);
    assert!(
        !c.planes[&n("n3")].is_leader(),
        "n3 was elected with a blank voter's help"
    );
    assert!(!c.planes[&n("n2")].votes());
    // n1 returns: it leads, n2 catches up and may vote again, and the entry is everywhere.
    c.cut.clear();
    c.run_until(200, |c| {
        c.planes
            .values()
            .all(|p| p.metadata().members.contains_key(&n("n1")))
            && c.planes[&n("n2")].votes()
    });
}

/// A follower restarts blank while the leader carries on: the leader probes it from the
/// start, it catches up to every entry, and votes again. Without the probe reset raft-rs
/// would trust the old match and never resend what the follower lost.
#[test]
fn a_follower_that_comes_back_blank_catches_up_from_the_leader() {
    let mut c = Cluster::new(21);
    c.run_until(100, |c| c.leaders().len() == 1);
    c.join_all();
    c.run_until(100, |c| {
        c.planes.values().all(|p| p.metadata().members.len() == 3)
    });
    let leader = c.leaders()[0].clone();
    let follower = c.planes.keys().find(|n| **n != leader).unwrap().clone();
    let want = c.planes[&leader].metadata().clone();
    c.wipe(&follower);
    assert!(!c.planes[&follower].votes());
    c.run_until(50, |c| c.planes[&follower].votes());
    assert_eq!(c.planes[&follower].metadata().members, want.members);
    assert_eq!(c.leaders(), vec![leader], "no election was needed");
}

/// Every node compacts its log into a snapshot; a restart from snapshot and fresh log
/// rebuilds the same metadata and votes at once, and a follower that then loses its disk is
/// caught up by the leader's snapshot (the entries it needs are gone from every log).
#[test]
fn a_compacted_log_restarts_from_its_snapshot_and_a_blank_follower_gets_the_snapshot() {
    let mut c = Cluster::new(31);
    c.run_until(100, |c| c.leaders().len() == 1);
    c.join_all();
    let now = c.now;
    for (name, p) in c.planes.iter_mut() {
        p.want(
            Command::Declare {
                node: name.clone(),
                declarations: declarations(),
            },
            now,
        );
    }
    c.run_until(100, |c| {
        c.planes
            .values()
            .all(|p| p.metadata().declared_by.len() == 3)
    });
    c.run(3);
    let want = c.planes[&n("n1")].metadata().clone();
    let names: Vec<NodeId> = c.planes.keys().cloned().collect();
    for name in &names {
        let index = c.compact(name);
        assert_eq!(index, c.planes[name].metadata().applied);
        assert!(
            c.planes[name].compaction().is_none(),
            "nothing new to cover"
        );
    }
    let leader = c.leaders()[0].clone();
    let term = c.planes[&leader].term();
    // Every node restarts from its snapshot and the short log after it.
    for name in &names {
        c.start(name);
        assert!(c.planes[name].votes(), "{name} has state: it is not blank");
        assert_eq!(c.planes[name].metadata(), &want, "{name}");
        assert!(c.planes[name].term() >= term);
    }
    c.run_until(100, |c| c.leaders().len() == 1);
    let leader = c.leaders()[0].clone();
    let follower = names.iter().find(|n| **n != leader).unwrap().clone();
    c.wipe(&follower);
    assert!(!c.planes[&follower].votes());
    c.run_until(50, |c| c.planes[&follower].votes());
    assert!(
        c.planes[&follower].node.store().snapshot_point().0 > 0,
        "caught up by a snapshot"
    );
    let got = c.planes[&follower].metadata();
    assert_eq!(got.streams, want.streams);
    assert_eq!(got.declared_by, want.declared_by);
    // What it was sent is on its disk: a snapshot record in its log.
    c.start(&follower);
    assert_eq!(c.planes[&follower].metadata().streams, want.streams);
    assert!(c.planes[&follower].votes());
}

/// The simulator's cluster seed 8850: a node back with a blank disk, its guard already lifted
/// (here by blank peers: a fresh cluster), meets a leader whose view of it predates the loss.
/// The heartbeat's commit is beyond the empty log; raft-rs aborts the process on that unless
/// the commit is clamped.
#[test]
fn a_heartbeat_committing_past_an_open_blank_log_does_not_abort() {
    let now = Instant::now();
    let me = n(START_NODES[0]);
    let mut plane = ControlPlane::new(config(&me, 1), MetaStore::new(voters().raft_ids()), now);
    let id = |name: &str| voters().raft_id(&n(name)).unwrap();
    let mut prevote = Message::default();
    prevote.msg_type = MessageType::MsgRequestPreVote;
    prevote.from = id(START_NODES[1]);
    prevote.to = id(START_NODES[0]);
    prevote.term = 1;
    plane.handle_message(now, &n(START_NODES[1]), prevote);
    assert!(
        plane.votes(),
        "a majority blank: a fresh cluster, the guard is lifted"
    );
    let mut heartbeat = Message::default();
    heartbeat.msg_type = MessageType::MsgHeartbeat;
    heartbeat.from = id(START_NODES[2]);
    heartbeat.to = id(START_NODES[0]);
    heartbeat.term = 5;
    heartbeat.commit = 12;
    plane.handle_message(now, &n(START_NODES[2]), heartbeat);
    assert_eq!(
        plane.metadata().applied,
        0,
        "nothing committed without the entries"
    );
}

impl Cluster {
    /// A cluster of `seed` with a leader, every node joined, and the leader's declarations
    /// applied there; the leader.
    fn declared(seed: u64) -> (Cluster, NodeId) {
        let mut c = Cluster::new(seed);
        c.run_until(100, |c| c.leaders().len() == 1);
        c.join_all();
        let leader = c.leaders()[0].clone();
        let now = c.now;
        c.planes.get_mut(&leader).unwrap().want(
            Command::Declare {
                node: leader.clone(),
                declarations: declarations(),
            },
            now,
        );
        c.run_until(100, |c| c.planes[&leader].metadata().streams.len() == 1);
        (c, leader)
    }

    /// Every node not cut off renews its leases with the control plane's leader; the grants
    /// once the leadership is confirmed (no time passes).
    fn renew_all(&mut self) -> BTreeMap<NodeId, Option<LeaseGrant>> {
        let now = self.now;
        let Some(leader) = self.leaders().first().cloned() else {
            return BTreeMap::new();
        };
        let names: Vec<NodeId> = self.planes.keys().cloned().collect();
        let asking: Vec<NodeId> = names
            .into_iter()
            .filter(|n| !self.cut.contains(n))
            .collect();
        self.grants.clear();
        for name in &asking {
            self.planes
                .get_mut(&leader)
                .unwrap()
                .lease_renewed(now, name, 0);
        }
        self.settle();
        asking
            .into_iter()
            .map(|n| {
                let g = self.grants.get(&n).copied();
                (n, g)
            })
            .collect()
    }
}

#[test]
fn a_leader_that_stops_renewing_loses_its_shards_only_after_its_lease_and_margin() {
    let (mut c, control) = Cluster::declared(21);
    let key = ObjectKey::new("t1", "default", "orders");
    let led_by = |c: &Cluster, node: &NodeId| -> Vec<u32> {
        c.planes[&control].metadata().streams[&key]
            .shards
            .iter()
            .enumerate()
            .filter(|(_, s)| s.leader.as_ref() == Some(node))
            .map(|(i, _)| i as u32)
            .collect()
    };
    let victim = c.planes.keys().find(|n| **n != control).unwrap().clone();
    let victims_shards = led_by(&c, &victim);
    assert!(
        !victims_shards.is_empty(),
        "placement gives every node a shard to lead"
    );
    // Everyone renews for a while: nothing moves.
    let mut last_grant = c.now;
    for _ in 0..40 {
        assert!(c.renew_all().values().all(|g| g.is_some()));
        last_grant = c.now;
        c.run(1);
    }
    assert_eq!(led_by(&c, &victim), victims_shards);
    // The victim goes silent.
    c.cut.insert(victim.clone());
    let mut rounds = 0;
    while !led_by(&c, &victim).is_empty() {
        assert!(rounds < 100, "never moved");
        c.renew_all();
        c.run(1);
        rounds += 1;
    }
    let waited = c.now - last_grant;
    // Never before the lease (2 s) and its regrant margin (0.5 s); soon after it.
    assert!(
        waited >= Duration::from_millis(2500),
        "moved after {waited:?}"
    );
    assert!(rounds <= 30, "took {rounds} rounds");
    let meta = c.planes[&control].metadata();
    for i in victims_shards {
        let s = &meta.streams[&key].shards[i as usize];
        assert_eq!(s.generation, 2);
        assert!(s.leader.is_some() && s.leader.as_ref() != Some(&victim));
    }
    // Back: it renews again and leads nothing until a shard is handed to it.
    c.cut.clear();
    assert!(c.renew_all()[&victim].is_some());
}

#[test]
fn a_grant_is_refused_while_a_shard_is_being_moved_away_from_its_holder() {
    let mut c = Cluster::new(22);
    c.run_until(100, |c| c.leaders().len() == 1);
    c.join_all();
    let control = c.leaders()[0].clone();
    let now = c.now;
    let p = c.planes.get_mut(&control).unwrap();
    p.want(
        Command::Declare {
            node: control.clone(),
            declarations: declarations(),
        },
        now,
    );
    c.run_until(100, |c| c.planes[&control].metadata().streams.len() == 1);
    let victim = c.planes.keys().find(|n| **n != control).unwrap().clone();
    c.renew_all();
    c.cut.insert(victim.clone());
    // Stop at the first tick where the promotion is wanted and not yet applied.
    let mut refused = false;
    for _ in 0..60 {
        c.renew_all();
        c.now += Duration::from_millis(100);
        let now = c.now;
        let p = c.planes.get_mut(&control).unwrap();
        p.handle_timeout(now);
        if p.wanted
            .iter()
            .any(|w| matches!(w, Command::Promote { .. }))
        {
            assert!(!p.lease_renewed(now, &victim, 0));
            refused = true;
            break;
        }
        c.settle();
    }
    assert!(refused, "a promotion away from the victim was never wanted");
}

/// Promotions and liveness verdicts are the leader's, made from its own record of renewals: a
/// leader deposed before its promotion committed must not hand it to the next leader (raft
/// forwards a follower's proposals), which would move a shard whose holder renews with it.
/// Sim replicated seed 3328: two nodes held one shard's lease at once.
#[test]
fn a_deposed_leader_does_not_pass_on_the_promotions_it_wanted() {
    let mut c = Cluster::new(23);
    c.run_until(100, |c| c.leaders().len() == 1);
    c.join_all();
    let old = c.leaders()[0].clone();
    let now = c.now;
    c.planes.get_mut(&old).unwrap().want(
        Command::Declare {
            node: old.clone(),
            declarations: declarations(),
        },
        now,
    );
    c.run_until(100, |c| c.planes[&old].metadata().streams.len() == 1);
    let key = ObjectKey::new("t1", "default", "orders");
    let victim = c.planes.keys().find(|n| **n != old).unwrap().clone();
    let led_by_victim = |c: &Cluster, at: &NodeId| -> Vec<(usize, u64)> {
        c.planes[at].metadata().streams[&key]
            .shards
            .iter()
            .enumerate()
            .filter(|(_, s)| s.leader.as_ref() == Some(&victim))
            .map(|(i, s)| (i, s.generation))
            .collect()
    };
    let before = led_by_victim(&c, &old);
    assert!(!before.is_empty());
    c.renew_all();
    // The victim's renewals stop reaching the leader; at the first tick where the leader wants
    // the victim's shards moved, the leader is cut off before the proposal leaves it.
    let mut wanted = false;
    for _ in 0..60 {
        let now = c.now;
        let others: Vec<NodeId> = c.planes.keys().filter(|n| **n != victim).cloned().collect();
        for n in &others {
            c.planes.get_mut(&old).unwrap().lease_renewed(now, n, 0);
        }
        c.now += Duration::from_millis(100);
        let now = c.now;
        let p = c.planes.get_mut(&old).unwrap();
        p.handle_timeout(now);
        if p.wanted
            .iter()
            .any(|w| matches!(w, Command::Promote { .. }))
        {
            wanted = true;
            c.cut.insert(old.clone());
            break;
        }
        c.settle();
    }
    assert!(wanted, "the leader never wanted the victim's shards moved");
    // The others elect a leader, and the victim renews with it.
    c.run_until(100, |c| c.leaders().len() == 1);
    let new = c.leaders()[0].clone();
    assert_ne!(new, old);
    c.run_until(20, |c| {
        c.planes[&new].metadata().applied >= c.planes[&old].metadata().applied
    });
    for _ in 0..5 {
        c.run(1);
        assert!(c.renew_all()[&victim].is_some());
    }
    // The old leader comes back as a follower of the new one.
    c.cut.clear();
    for _ in 0..30 {
        c.renew_all();
        c.run(1);
    }
    assert!(!c.planes[&old].is_leader());
    assert!(!c.planes[&old]
        .wanted
        .iter()
        .any(|w| matches!(w, Command::Promote { .. } | Command::Liveness { .. })));
    assert_eq!(led_by_victim(&c, &new), before, "the victim's shards moved");
}

/// A renewal is granted only once a majority has answered this leader after the request
/// arrived: a leader cut off from every other node, still leader in its own eyes, accepts the
/// request and never grants it.
#[test]
fn a_renewal_is_granted_only_once_a_majority_confirms_the_leadership() {
    let mut c = Cluster::new(24);
    c.run_until(100, |c| c.leaders().len() == 1);
    c.join_all();
    c.run(5);
    let control = c.leaders()[0].clone();
    let other = c.planes.keys().find(|n| **n != control).unwrap().clone();
    assert!(c.renew_all()[&other].is_some(), "granted when connected");
    c.cut.insert(control.clone());
    c.grants.clear();
    let now = c.now;
    let p = c.planes.get_mut(&control).unwrap();
    assert!(p.is_leader());
    assert!(
        p.lease_renewed(now, &control, 7),
        "accepted: it still leads here"
    );
    c.settle();
    assert!(
        c.grants.is_empty(),
        "granted without a majority's confirmation: {:?}",
        c.grants
    );
}

/// At most `max_pending_grants` renewals wait for the leadership check: a further one drops
/// the oldest waiting, whose holder asks again later; at the default all are granted.
#[test]
fn renewals_past_the_pending_bound_drop_the_oldest_waiting() {
    for (bound, granted) in [
        (2, vec!["n2", "n3"]),
        (DEFAULT_MAX_PENDING_GRANTS, vec!["n1", "n2", "n3"]),
    ] {
        let mut c = Cluster::new(26);
        c.run_until(100, |c| c.leaders().len() == 1);
        c.join_all();
        c.run(5);
        let leader = c.leaders()[0].clone();
        c.grants.clear();
        let now = c.now;
        let p = c.planes.get_mut(&leader).unwrap();
        p.cfg.max_pending_grants = bound;
        for (seq, node) in ["n1", "n2", "n3"].into_iter().enumerate() {
            assert!(
                p.lease_renewed(now, &n(node), seq as u64),
                "{node} accepted"
            );
        }
        c.settle();
        let got: Vec<&str> = c.grants.keys().map(|k| k.0.as_str()).collect();
        assert_eq!(got, granted, "bound {bound}");
    }
}

/// The control plane's leader dies with the shards it led: the next leader, which never heard
/// it renew, moves them a lease and the regrant margin after it took over (every earlier
/// grant answered a request sent before that), not a further election timeout later.
#[test]
fn a_new_leader_moves_its_silent_predecessors_shards_a_lease_and_margin_after_taking_over() {
    let (mut c, old) = Cluster::declared(25);
    let key = ObjectKey::new("t1", "default", "orders");
    let led_by_old = |c: &Cluster, at: &NodeId| -> usize {
        c.planes[at].metadata().streams[&key]
            .shards
            .iter()
            .filter(|s| s.leader.as_ref() == Some(&old))
            .count()
    };
    assert!(
        led_by_old(&c, &old) > 0,
        "the control plane's node leads shards"
    );
    for _ in 0..10 {
        c.renew_all();
        c.run(1);
    }
    c.cut.insert(old.clone());
    let mut took_over = None;
    for _ in 0..200 {
        c.renew_all();
        c.run(1);
        let Some(new) = c.leaders().first().cloned() else {
            continue;
        };
        let since = *took_over.get_or_insert(c.now);
        if led_by_old(&c, &new) == 0 {
            let waited = c.now - since;
            // The lease (2 s) and its regrant margin (0.5 s), give or take a 100 ms round.
            assert!(
                waited >= Duration::from_millis(2400),
                "moved after {waited:?}"
            );
            assert!(
                waited <= Duration::from_millis(3000),
                "moved after {waited:?}"
            );
            return;
        }
    }
    panic!("the silent leader's shards never moved");
}

/// A delete reaches every node, also one cut off while it was applied: n3 misses the delete
/// and the re-create of `orders` (and the delete of `old`), the others compact past them, and
/// n3, sent a snapshot, is told both incarnations it held are gone. A restart replays the
/// delete of a name that still lives as nothing (its removal was done before the new life
/// opened), and the delete of a name still deleted as a delete again.
#[test]
fn a_delete_reaches_a_node_that_was_away_as_a_snapshot_and_replays_only_where_the_name_stays_deleted(
) {
    let mut c = Cluster::new(41);
    c.run_until(100, |c| c.leaders().len() == 1);
    c.join_all();
    c.run_until(100, |c| {
        c.planes.values().all(|p| p.metadata().members.len() == 3)
    });
    let spec = StreamSpec::new(1, 3, Consistency::Quorum);
    let (orders, old) = (
        ObjectKey::new("t1", "ops", "orders"),
        ObjectKey::new("t1", "ops", "old"),
    );
    let want = |c: &mut Cluster, cmd: Command| {
        let now = c.now;
        c.planes.get_mut(&n("n1")).unwrap().want(cmd, now);
    };
    for key in [&orders, &old] {
        want(
            &mut c,
            Command::CreateStream {
                key: key.clone(),
                spec,
            },
        );
    }
    c.run_until(100, |c| {
        c.planes.values().all(|p| p.metadata().streams.len() == 2)
    });
    c.cut.insert(n("n3"));
    c.run_until(100, |c| c.leaders().iter().all(|l| *l != n("n3")));
    c.applied.clear();
    let old_generation = c.planes[&n("n1")].metadata().streams[&orders]
        .shards
        .iter()
        .map(|m| m.generation)
        .max()
        .unwrap();
    for key in [&orders, &old] {
        want(
            &mut c,
            Command::DeleteStream {
                key: key.clone(),
                incarnation: 0,
            },
        );
    }
    c.run_until(100, |c| c.planes[&n("n1")].metadata().streams.is_empty());
    want(
        &mut c,
        Command::CreateStream {
            key: orders.clone(),
            spec,
        },
    );
    c.run_until(100, |c| {
        [n("n1"), n("n2")].iter().all(|x| {
            c.planes[x]
                .metadata()
                .streams
                .get(&orders)
                .is_some_and(|s| s.incarnation == 1)
        })
    });
    let deleted = |c: &Cluster, node: &str| -> Vec<Applied> {
        c.applied
            .get(&n(node))
            .into_iter()
            .flatten()
            .filter(|a| matches!(a, Applied::StreamDeleted { .. }))
            .cloned()
            .collect()
    };
    let both = vec![
        Applied::StreamDeleted {
            key: old.clone(),
            incarnation: 0,
        },
        Applied::StreamDeleted {
            key: orders.clone(),
            incarnation: 0,
        },
    ];
    let mut live = deleted(&c, "n2");
    live.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    assert_eq!(live, both, "applied live on n2");
    // n2 restarts from its log, which holds both deletes and the re-create: only the delete
    // of the name still deleted is replayed as a delete.
    c.applied.clear();
    c.start(&n("n2"));
    c.settle();
    assert_eq!(deleted(&c, "n2"), both[..1].to_vec(), "replayed on n2");
    // The other is told as a delete of the old life only, with the generations it reached:
    // the node removes copies of that life, if a crash left any, and keeps the new life's.
    let replayed: Vec<Applied> = c.applied[&n("n2")]
        .iter()
        .filter(|a| matches!(a, Applied::Recreated { .. }))
        .cloned()
        .collect();
    assert_eq!(
        replayed,
        vec![Applied::Recreated {
            kind: crate::meta::ObjectKind::Stream,
            key: orders.clone(),
            generation: old_generation,
        }],
        "replayed on n2 for the name that lives again"
    );
    c.run_until(100, |c| c.leaders().len() == 1);
    for x in ["n1", "n2"] {
        c.compact(&n(x));
    }
    assert!(deleted(&c, "n3").is_empty());
    c.cut.clear();
    c.run_until(100, |c| {
        c.planes[&n("n3")]
            .metadata()
            .streams
            .get(&orders)
            .is_some_and(|s| s.incarnation == 1)
    });
    assert!(
        c.planes[&n("n3")].node.store().snapshot_point().0 > 0,
        "caught up by a snapshot"
    );
    assert_eq!(deleted(&c, "n3"), both, "told by the snapshot");
}
