//! Where a stream's or cache's shards live: a replica set per shard, its first member the leader.
//!
//! A pure function of the candidate nodes, the load already placed and the object's name, so
//! every node that applies the same metadata entry computes the same answer. It spreads
//! replicas (each holds a copy of the log), then leaders within them, and breaks ties by a
//! rotation derived from the name, so that many one-shard streams do not all land on the first
//! node.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::NodeId;

/// The largest replica set: a majority of five survives two failures.
pub const MAX_REPLICATION_FACTOR: u8 = 5;

/// One shard's replica set. `replicas[0]` leads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardAssignment {
    pub replicas: Vec<NodeId>,
}

impl ShardAssignment {
    pub fn leader(&self) -> &NodeId {
        &self.replicas[0]
    }
}

/// How many leaders and replicas each node already holds, across everything placed so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Load {
    pub leaders: BTreeMap<NodeId, u32>,
    pub replicas: BTreeMap<NodeId, u32>,
}

impl Load {
    /// Counts an existing placement.
    pub fn add(&mut self, shards: &[ShardAssignment]) {
        for s in shards {
            *self.leaders.entry(s.leader().clone()).or_default() += 1;
            for r in &s.replicas {
                *self.replicas.entry(r.clone()).or_default() += 1;
            }
        }
    }

    fn leaders_of(&self, n: &NodeId) -> u32 {
        self.leaders.get(n).copied().unwrap_or(0)
    }

    fn replicas_of(&self, n: &NodeId) -> u32 {
        self.replicas.get(n).copied().unwrap_or(0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlacementError {
    /// `replication_factor` outside 1..=5.
    ReplicationFactor(u8),
    /// More replicas asked for than there are nodes to hold them.
    TooFewNodes {
        replication_factor: u8,
        nodes: usize,
    },
    /// Zero shards.
    NoShards,
}

impl fmt::Display for PlacementError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlacementError::ReplicationFactor(rf) => write!(
                f,
                "replication_factor {rf} is outside 1..={MAX_REPLICATION_FACTOR}"
            ),
            PlacementError::TooFewNodes { replication_factor, nodes } => write!(
                f,
                "replication_factor {replication_factor} needs that many nodes; the cluster has {nodes}"
            ),
            PlacementError::NoShards => f.write_str("a stream has at least one shard"),
        }
    }
}

/// 64-bit FNV-1a: a stable rotation for a name, the same on every node and every build.
pub(crate) fn name_hash(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Places `shards` shards of the object named `name` on `candidates` (sorted, distinct), with
/// `replication_factor` replicas each, counting them into `load`.
///
/// Each shard's replica set is the candidates holding the fewest replicas, and its leader the
/// member of that set leading the fewest shards. Ties go to the first candidate at or after a
/// start position that is the name's hash plus the shard number.
pub fn place(
    candidates: &[NodeId],
    load: &mut Load,
    name: &str,
    shards: u32,
    replication_factor: u8,
) -> Result<Vec<ShardAssignment>, PlacementError> {
    if replication_factor == 0 || replication_factor > MAX_REPLICATION_FACTOR {
        return Err(PlacementError::ReplicationFactor(replication_factor));
    }
    if usize::from(replication_factor) > candidates.len() {
        return Err(PlacementError::TooFewNodes {
            replication_factor,
            nodes: candidates.len(),
        });
    }
    if shards == 0 {
        return Err(PlacementError::NoShards);
    }
    let n = candidates.len();
    let base = name_hash(name);
    let mut out = Vec::with_capacity(shards as usize);
    for shard in 0..shards {
        let start = ((base.wrapping_add(u64::from(shard))) % n as u64) as usize;
        // The rotated order: position 0 is `start`.
        let rotated = |i: usize| (i + n - start) % n;
        // The replica set: the candidates holding the fewest replicas. Then its leader: the
        // member leading the fewest shards. Choosing the set first keeps replicas within one of
        // each other; leaders follow as closely as the sets allow.
        let mut ranked: Vec<usize> = (0..n).collect();
        ranked.sort_by_key(|&i| {
            let c = &candidates[i];
            (load.replicas_of(c), load.leaders_of(c), rotated(i))
        });
        ranked.truncate(usize::from(replication_factor));
        let leader_at = (0..ranked.len())
            .min_by_key(|&j| (load.leaders_of(&candidates[ranked[j]]), rotated(ranked[j])))
            .expect("at least one replica");
        let leader = ranked.remove(leader_at);
        let mut replicas = vec![candidates[leader].clone()];
        replicas.extend(ranked.into_iter().map(|i| candidates[i].clone()));
        let assignment = ShardAssignment { replicas };
        load.add(std::slice::from_ref(&assignment));
        out.push(assignment);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(names: &[&str]) -> Vec<NodeId> {
        names.iter().map(|n| NodeId::new(*n)).collect()
    }

    /// One golden case: objects placed in order on one cluster.
    struct Case {
        file: &'static str,
        nodes: &'static [&'static str],
        /// (name, shards, replication factor), placed in this order into one load.
        objects: &'static [(&'static str, u32, u8)],
    }

    const CASES: &[Case] = &[
        Case {
            file: "three_nodes_six_shards_rf3",
            nodes: &["n1", "n2", "n3"],
            objects: &[("t1/default/orders", 6, 3)],
        },
        Case {
            file: "three_nodes_rf1_many_single_shard_streams",
            nodes: &["n1", "n2", "n3"],
            objects: &[
                ("t1/default/a", 1, 1),
                ("t1/default/b", 1, 1),
                ("t1/default/c", 1, 1),
                ("t1/default/d", 1, 1),
                ("t1/default/e", 1, 1),
                ("t1/default/f", 1, 1),
            ],
        },
        Case {
            file: "five_nodes_mixed",
            nodes: &["a", "b", "c", "d", "e"],
            objects: &[
                ("t1/ns/orders", 8, 3),
                ("t1/ns/cache:sessions", 4, 5),
                ("t2/ns/clicks", 3, 1),
            ],
        },
        Case {
            file: "three_nodes_rf2_odd_shards",
            nodes: &["n1", "n2", "n3"],
            objects: &[("t1/default/x", 5, 2), ("t1/default/y", 2, 2)],
        },
    ];

    fn render(case: &Case) -> String {
        let candidates = nodes(case.nodes);
        let mut load = Load::default();
        let mut out = String::new();
        out.push_str(&format!("# nodes: {}\n", case.nodes.join(" ")));
        for &(name, shards, rf) in case.objects {
            out.push_str(&format!("{name} shards={shards} rf={rf}\n"));
            let placed = place(&candidates, &mut load, name, shards, rf).unwrap();
            for (i, s) in placed.iter().enumerate() {
                let names: Vec<&str> = s.replicas.iter().map(|r| r.as_str()).collect();
                out.push_str(&format!("  {i}: {}\n", names.join(" ")));
            }
        }
        out.push_str("load:\n");
        for c in &candidates {
            out.push_str(&format!(
                "  {c}: leaders={} replicas={}\n",
                load.leaders_of(c),
                load.replicas_of(c)
            ));
        }
        out
    }

    /// Exact outputs pinned in `testdata/placement/`. `FELIX_BLESS=1` rewrites them; review the
    /// diff like code, because every node of a cluster must compute the same placement.
    #[test]
    fn placement_golden_files() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/placement");
        let bless = std::env::var_os("FELIX_BLESS").is_some();
        for case in CASES {
            let got = render(case);
            let path = dir.join(format!("{}.txt", case.file));
            if bless {
                std::fs::write(&path, &got).unwrap();
                continue;
            }
            let want = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e} (run with FELIX_BLESS=1)", path.display()));
            assert_eq!(got, want, "placement changed for {}", case.file);
        }
    }

    #[test]
    fn leaders_balanced_and_replicas_distinct() {
        let candidates = nodes(&["n1", "n2", "n3"]);
        for shards in 1..=12u32 {
            for rf in 1..=3u8 {
                let mut load = Load::default();
                let placed = place(&candidates, &mut load, "t/ns/s", shards, rf).unwrap();
                assert_eq!(placed.len(), shards as usize);
                for s in &placed {
                    assert_eq!(s.replicas.len(), usize::from(rf));
                    let mut r = s.replicas.clone();
                    r.sort();
                    r.dedup();
                    assert_eq!(r.len(), usize::from(rf), "a node twice in {s:?}");
                }
                let counts: Vec<u32> = candidates.iter().map(|c| load.leaders_of(c)).collect();
                let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                assert!(
                    hi - lo <= 1,
                    "leaders {counts:?} for {shards} shards rf {rf}"
                );
                let reps: Vec<u32> = candidates.iter().map(|c| load.replicas_of(c)).collect();
                let (lo, hi) = (reps.iter().min().unwrap(), reps.iter().max().unwrap());
                assert!(
                    hi - lo <= 1,
                    "replicas {reps:?} for {shards} shards rf {rf}"
                );
            }
        }
    }

    #[test]
    fn refusals_name_the_problem() {
        let c = nodes(&["n1", "n2", "n3"]);
        let mut load = Load::default();
        assert_eq!(
            place(&c, &mut load, "s", 1, 0),
            Err(PlacementError::ReplicationFactor(0))
        );
        assert_eq!(
            place(&c, &mut load, "s", 1, 6),
            Err(PlacementError::ReplicationFactor(6))
        );
        assert_eq!(
            place(&c, &mut load, "s", 1, 4),
            Err(PlacementError::TooFewNodes {
                replication_factor: 4,
                nodes: 3
            })
        );
        assert_eq!(
            place(&c, &mut load, "s", 0, 1),
            Err(PlacementError::NoShards)
        );
        assert_eq!(load, Load::default(), "a refusal places nothing");
    }
}
