//! Which shards the control plane's leader hands to a new generation, and to whom.
//!
//! The control plane only *names* the next leader; the named node still has to fence a
//! majority of the replica set at the new generation and adopt the most advanced log among
//! them before it serves ([`super::fence`]). So the choice here needs no knowledge of who is
//! caught up: any replica that still holds its copy (the storage identity the metadata names
//! for it) and renewed its lease recently may be named. What it must get right is *when*:
//! never while the current leader may still hold its lease, which [`super::lease::may_regrant`]
//! decides from when this node last heard the leader renew.

use crate::meta::{may_hand_over, Command, Metadata, ShardRef};
use crate::NodeId;

/// What the control plane knows of one node's lease renewals, by its own clock.
pub trait Renewals {
    /// The holder may still be writing under a lease this node granted: no regrant yet.
    fn may_hold_lease(&self, node: &NodeId) -> bool;
    /// Renewed recently enough to be worth naming as a leader.
    fn is_live(&self, node: &NodeId) -> bool;
}

/// The promotions due now, in the metadata's shard order:
/// - a shard whose leader's lease may be regranted (it went quiet), or whose leader lost its
///   copy (it came back on another disk), goes to the next generation with the first replica,
///   in placement order, that is live and holds its copy — or to nobody when none does, so
///   clients are told `shard_unavailable` instead of being sent to a dead node;
/// - a shard led by nobody goes to the first such replica as soon as one is live.
///
/// A leader placed before it first joined is waited for as long as a lease it might hold,
/// so a cluster starting up does not hand its shards to nobody and back while its nodes
/// join. A durable shard with one replica therefore waits for its node, and a node with an
/// empty disk is never named.
pub fn promotions(meta: &Metadata, renewals: &impl Renewals) -> Vec<Command> {
    promotions_by(meta, renewals, LeaderShards::Proven).due
}

/// What one pass of the promotion rule decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Promotions {
    /// The commands to propose, in the metadata's shard order.
    pub due: Vec<Command>,
    /// Shards whose leader lapsed (or lost its copy) and that nobody may take without
    /// giving up records only that leader is known to hold: they wait for it (or an
    /// operator's abandon). Counted so an operator, and a test, sees the decision made.
    pub awaiting_leader: Vec<ShardRef>,
}

/// Which replicas of a `leader`-consistency shard may be named when its leader lapses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LeaderShards {
    /// Only one its leader's standing quiescence named level ([`crate::meta::may_hand_over`]).
    #[default]
    Proven,
    /// Any live replica holding a copy, as before the spec's rule was kept: acknowledged
    /// records only the crashed leader held are lost. The simulator's canary.
    AbandonOnSilence,
}

/// [`promotions`] under `rule` (the simulator's canary names the old one).
pub fn promotions_by(meta: &Metadata, renewals: &impl Renewals, rule: LeaderShards) -> Promotions {
    let mut due = Vec::new();
    let mut awaiting_leader = Vec::new();
    for (shard, m) in meta.shards() {
        let consistency = meta.consistency_of(&shard);
        let holds = |n: &NodeId| m.holds_copy(n, &meta.members);
        let allowed = |next: Option<&NodeId>| {
            rule == LeaderShards::AbandonOnSilence
                || may_hand_over(m, consistency, next, &meta.members).is_ok()
        };
        let candidate = |skip: Option<&NodeId>| {
            let found = m
                .replicas
                .iter()
                .filter(|r| Some(*r) != skip)
                .find(|r| renewals.is_live(r) && holds(r) && allowed(Some(r)))
                .cloned();
            // No one may take it: nobody leads, unless that too would give up records
            // only the current leader holds (it is then waited for).
            match found {
                Some(n) => Some(Some(n)),
                None if allowed(None) => Some(None),
                None => None,
            }
        };
        // A leader that may no longer write here: quiet past its lease, or its copy gone.
        let lapsed =
            |l: &NodeId| meta.members.contains_key(l) && (!holds(l) || !renewals.may_hold_lease(l));
        let next = match &m.leader {
            // Placed before it first joined (its disk not yet recorded): its join records
            // the copy, so it is waited for like a leader that may hold its lease.
            Some(l) if !meta.members.contains_key(l) && renewals.may_hold_lease(l) => None,
            Some(l) if !holds(l) => candidate(Some(l)),
            Some(l) if !renewals.may_hold_lease(l) => candidate(Some(l)),
            Some(_) => None,
            None => candidate(None).flatten().map(Some),
        };
        let proven = |n: Option<&NodeId>| may_hand_over(m, consistency, n, &meta.members).is_ok();
        match next {
            // The canary's move: what the old rule did, which only an operator's abandon
            // may do now.
            Some(Some(leader)) if !proven(Some(&leader)) => due.push(Command::Abandon {
                shard,
                generation: m.generation,
                leader,
            }),
            Some(None) if !proven(None) => awaiting_leader.push(shard),
            Some(leader) => due.push(Command::Promote {
                shard,
                generation: m.generation + 1,
                leader,
            }),
            None if m.leader.as_ref().is_some_and(|l| lapsed(l)) => awaiting_leader.push(shard),
            None => {}
        }
    }
    Promotions {
        due,
        awaiting_leader,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::meta::{Consistency, Declarations, ObjectKey, StreamSpec};

    struct Seen {
        holding: BTreeSet<&'static str>,
        live: BTreeSet<&'static str>,
    }

    impl Renewals for Seen {
        fn may_hold_lease(&self, n: &NodeId) -> bool {
            self.holding.contains(n.as_str())
        }
        fn is_live(&self, n: &NodeId) -> bool {
            self.live.contains(n.as_str())
        }
    }

    fn seen(holding: &[&'static str], live: &[&'static str]) -> Seen {
        Seen {
            holding: holding.iter().copied().collect(),
            live: live.iter().copied().collect(),
        }
    }

    fn cluster(rf: u8) -> Metadata {
        declared_after(rf, &["n1", "n2", "n3"])
    }

    fn join(n: &str) -> Command {
        Command::Join {
            node: NodeId::new(n),
            client_addr: None,
            storage_id: format!("disk-{n}"),
            durable: true,
        }
    }

    /// Three voters; `joined` join (in order, disk `disk-<id>`), then n1 declares one stream
    /// of two shards at `rf` copies. Entries are numbered from 1.
    fn declared_after(rf: u8, joined: &[&str]) -> Metadata {
        let mut m = Metadata::new(vec![
            NodeId::new("n1"),
            NodeId::new("n2"),
            NodeId::new("n3"),
        ]);
        let mut d = Declarations::default();
        d.streams.insert(
            ObjectKey::new("t", "ns", "s"),
            StreamSpec {
                shards: 2,
                replication_factor: rf,
                consistency: Consistency::Quorum,
                retention: Default::default(),
                durable: true,
            },
        );
        let declare = Command::Declare {
            node: NodeId::new("n1"),
            declarations: d,
        };
        let entries = joined.iter().map(|n| join(n)).chain([declare]);
        for (i, c) in entries.enumerate() {
            m.apply_entry(i as u64 + 1, &c.encode());
        }
        m
    }

    /// Each due promotion as `shard -> generation leader`.
    fn show(due: &[Command]) -> Vec<String> {
        due.iter()
            .map(|c| match c {
                Command::Promote {
                    shard,
                    generation,
                    leader,
                } => format!(
                    "{shard} -> g{generation} {}",
                    leader.as_ref().map_or("nobody", |l| l.as_str())
                ),
                other => format!("{other:?}"),
            })
            .collect()
    }

    fn leaders(m: &Metadata) -> Vec<String> {
        m.shards()
            .map(|(s, m)| {
                format!(
                    "{s}: {:?} g{} led by {}",
                    m.replicas.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
                    m.generation,
                    m.leader.as_ref().map_or("nobody", |l| l.as_str())
                )
            })
            .collect()
    }

    #[test]
    fn nothing_moves_while_every_leader_may_hold_its_lease() {
        let m = cluster(3);
        assert_eq!(
            leaders(&m),
            [
                "stream t/ns/s#0: [\"n3\", \"n1\", \"n2\"] g1 led by n3",
                "stream t/ns/s#1: [\"n1\", \"n2\", \"n3\"] g1 led by n1",
            ]
        );
        let all = ["n1", "n2", "n3"];
        assert!(promotions(&m, &seen(&all, &all)).is_empty());
        // Nobody is waited for either: no leader lapsed.
        let plan = promotions_by(&m, &seen(&all, &all), LeaderShards::Proven);
        assert!(plan.awaiting_leader.is_empty());
        // Quiet but maybe still leased: still nothing (the lease decides, not liveness).
        assert!(promotions(&m, &seen(&all, &["n3"])).is_empty());
    }

    #[test]
    fn a_lapsed_leader_hands_over_to_the_first_live_replica_holding_its_copy() {
        let m = cluster(3);
        let due = promotions(&m, &seen(&["n1", "n2"], &["n1", "n2"]));
        assert_eq!(show(&due), ["stream t/ns/s#0 -> g2 n1"]);
        // n1 is first after the leader but quiet: the next one is named.
        let due = promotions(&m, &seen(&["n1", "n2"], &["n2"]));
        assert_eq!(show(&due), ["stream t/ns/s#0 -> g2 n2"]);
    }

    #[test]
    fn no_live_replica_means_nobody_leads_and_the_next_live_one_takes_it() {
        let mut m = cluster(3);
        let due = promotions(&m, &seen(&["n1"], &[]));
        assert_eq!(show(&due), ["stream t/ns/s#0 -> g2 nobody"]);
        m.apply_entry(100, &due[0].encode());
        // Applied once: the same proposal again is a stale generation and changes nothing.
        assert_eq!(
            m.apply_entry(101, &due[0].encode()),
            crate::meta::Applied::Unchanged
        );
        let due = promotions(&m, &seen(&["n1"], &["n2"]));
        assert_eq!(show(&due), ["stream t/ns/s#0 -> g3 n2"]);
    }

    #[test]
    fn a_node_back_on_an_empty_disk_is_never_named_and_loses_what_it_led() {
        let mut m = cluster(3);
        let wiped = Command::Join {
            node: NodeId::new("n1"),
            client_addr: None,
            storage_id: "disk-n1-new".into(),
            durable: true,
        };
        m.apply_entry(50, &wiped.encode());
        let all = ["n1", "n2", "n3"];
        let due = promotions(&m, &seen(&all, &all));
        assert_eq!(show(&due), ["stream t/ns/s#1 -> g2 n2"]);
        // Naming it anyway is refused by the state machine itself.
        let bad = Command::Promote {
            shard: m.shards().next().unwrap().0,
            generation: 2,
            leader: Some(NodeId::new("n1")),
        };
        assert!(matches!(
            m.apply_entry(51, &bad.encode()),
            crate::meta::Applied::Invalid(_)
        ));
    }

    #[test]
    fn a_leader_placed_before_it_joined_is_waited_for_then_handed_on_if_it_never_comes() {
        // Declared while n3 had not joined: its copies have no disk recorded yet.
        let mut m = declared_after(1, &["n1", "n2"]);
        assert_eq!(
            leaders(&m),
            [
                "stream t/ns/s#0: [\"n3\"] g1 led by n3",
                "stream t/ns/s#1: [\"n1\"] g1 led by n1",
            ]
        );
        // n3 may still come (and no lease of its can be ruled out): nothing moves.
        let live = ["n1", "n2"];
        assert!(promotions(&m, &seen(&["n1", "n2", "n3"], &live)).is_empty());
        // Past the time a lease could run, a node that never came is handed on.
        let due = promotions(&m, &seen(&live, &live));
        assert_eq!(show(&due), ["stream t/ns/s#0 -> g2 nobody"]);
        // Once it joins, its join records the copy's disk and it leads at generation 1.
        m.apply_entry(10, &join("n3").encode());
        let all = ["n1", "n2", "n3"];
        assert!(promotions(&m, &seen(&all, &all)).is_empty());
    }

    #[test]
    fn a_single_replica_shard_waits_for_its_node() {
        let mut m = cluster(1);
        assert_eq!(
            leaders(&m),
            [
                "stream t/ns/s#0: [\"n3\"] g1 led by n3",
                "stream t/ns/s#1: [\"n1\"] g1 led by n1",
            ]
        );
        let due = promotions(&m, &seen(&["n1", "n2"], &["n1", "n2"]));
        assert_eq!(show(&due), ["stream t/ns/s#0 -> g2 nobody"]);
        m.apply_entry(100, &due[0].encode());
        assert!(promotions(&m, &seen(&["n1", "n2"], &["n1", "n2"])).is_empty());
        let due = promotions(&m, &seen(&["n1", "n2", "n3"], &["n1", "n2", "n3"]));
        assert_eq!(show(&due), ["stream t/ns/s#0 -> g3 n3"]);
    }

    /// Runs `testdata/replication/promotion.txt`: a script over one shard of one stream on
    /// n1..n3, each `promote` line printing what the control plane's leader would do.
    #[test]
    fn golden_promotion() {
        crate::replication::golden::check("promotion.txt", |b| {
            let mut m = Metadata::new(vec![
                NodeId::new("n1"),
                NodeId::new("n2"),
                NodeId::new("n3"),
            ]);
            let mut index = 0;
            let mut out = Vec::new();
            let mut apply = |m: &mut Metadata, c: Command| {
                index += 1;
                m.apply_entry(index, &c.encode())
            };
            let the_shard = |m: &Metadata| m.shards().next().map(|(s, x)| (s, x.clone()));
            for line in &b.lines {
                let words: Vec<&str> = line.split_whitespace().collect();
                let arg = |k: &str| {
                    words
                        .iter()
                        .find_map(|w| w.strip_prefix(&format!("{k}=")))
                        .unwrap_or_else(|| panic!("{line}: no {k}="))
                };
                let nodes = |k: &str| -> Vec<NodeId> {
                    arg(k)
                        .split(',')
                        .filter(|n| !n.is_empty())
                        .map(NodeId::new)
                        .collect()
                };
                match words[0] {
                    "stream" => {
                        for n in ["n1", "n2", "n3"] {
                            apply(&mut m, join(n));
                        }
                        let mut d = Declarations::default();
                        let consistency = match arg("consistency") {
                            "leader" => Consistency::Leader,
                            _ => Consistency::Quorum,
                        };
                        d.streams.insert(
                            ObjectKey::new("t", "ns", "s"),
                            StreamSpec {
                                shards: 1,
                                replication_factor: arg("rf").parse().unwrap(),
                                consistency,
                                retention: Default::default(),
                                durable: true,
                            },
                        );
                        apply(
                            &mut m,
                            Command::Declare {
                                node: NodeId::new("n1"),
                                declarations: d,
                            },
                        );
                        let (_, x) = the_shard(&m).unwrap();
                        out.push(format!(
                            "placed on {} led by {}",
                            x.replicas
                                .iter()
                                .map(|r| r.as_str())
                                .collect::<Vec<_>>()
                                .join(","),
                            x.leader.as_ref().unwrap()
                        ));
                    }
                    "quiesce" | "resume" => {
                        let (shard, x) = the_shard(&m).unwrap();
                        let end = arg("end").parse().unwrap();
                        let c = if words[0] == "quiesce" {
                            Command::Quiesce {
                                shard,
                                generation: x.generation,
                                end,
                                level: nodes("level"),
                            }
                        } else {
                            Command::Resume {
                                shard,
                                generation: x.generation,
                                end,
                            }
                        };
                        let applied = apply(&mut m, c);
                        let (_, x) = the_shard(&m).unwrap();
                        out.push(format!(
                            "{} quiet={}",
                            if applied == crate::meta::Applied::Unchanged {
                                "unchanged"
                            } else {
                                "recorded"
                            },
                            x.quiet.map_or("none".into(), |q| format!(
                                "{}:{}",
                                q.end,
                                q.level
                                    .iter()
                                    .map(|n| n.as_str())
                                    .collect::<Vec<_>>()
                                    .join(",")
                            ))
                        ));
                    }
                    "wipe" => {
                        let n = arg("node");
                        apply(
                            &mut m,
                            Command::Join {
                                node: NodeId::new(n),
                                client_addr: None,
                                storage_id: format!("disk-{n}-new"),
                                durable: true,
                            },
                        );
                    }
                    "promote" | "canary" => {
                        let live: Vec<&'static str> = arg("live")
                            .split(',')
                            .filter(|n| !n.is_empty())
                            .map(|n| -> &'static str { Box::leak(n.to_owned().into_boxed_str()) })
                            .collect();
                        let rule = if words[0] == "canary" {
                            LeaderShards::AbandonOnSilence
                        } else {
                            LeaderShards::Proven
                        };
                        let plan = promotions_by(&m, &seen(&live, &live), rule);
                        if plan.due.is_empty() {
                            out.push(if plan.awaiting_leader.is_empty() {
                                "wait".into()
                            } else {
                                "wait (awaiting its leader)".into()
                            });
                        }
                        for c in plan.due {
                            let what = match &c {
                                Command::Promote {
                                    generation, leader, ..
                                } => format!(
                                    "promote g{generation} {}",
                                    leader.as_ref().map_or("nobody", |l| l.as_str())
                                ),
                                Command::Abandon { leader, .. } => format!("abandon to {leader}"),
                                other => format!("{other:?}"),
                            };
                            let applied = apply(&mut m, c);
                            let verdict = match applied {
                                crate::meta::Applied::Invalid(why) => format!(" (refused: {why})"),
                                _ => String::new(),
                            };
                            out.push(format!("{what}{verdict}"));
                        }
                    }
                    other => panic!("unknown line {other}"),
                }
            }
            out.join("\n")
        });
    }
}
