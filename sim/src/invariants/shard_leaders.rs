//! One leader per shard and generation: every node's metadata names, for each shard, a leader
//! at a generation; across all nodes and the whole run, one (shard, generation) is only ever
//! given one leader. A generation names one leadership, so two nodes believing in different
//! leaders at one generation could both accept writes for it.

use std::collections::BTreeMap;

use felix_engine::ShardLeader;

use crate::oracle::Violation;

pub(crate) const NAME: &str = "one_leader_per_generation";

#[derive(Default)]
pub(crate) struct ShardLeaders {
    /// (object, shard, generation) -> (leader, the node that first reported it).
    seen: BTreeMap<(String, u32, u64), (Option<String>, String)>,
    pub(crate) checked: u64,
}

impl ShardLeaders {
    pub(crate) fn observe(&mut self, node: &str, view: &[ShardLeader]) -> Result<(), Violation> {
        for s in view {
            let key = (s.object.clone(), s.shard, s.generation);
            match self.seen.get(&key) {
                None => {
                    self.seen.insert(key, (s.leader.clone(), node.to_owned()));
                }
                Some((leader, _)) if *leader == s.leader => self.checked += 1,
                Some((leader, first)) => {
                    return Err(Violation {
                        invariant: NAME,
                        detail: format!(
                            "{} shard {} generation {}: {first} says the leader is {leader:?}, {node} says {:?}",
                            s.object, s.shard, s.generation, s.leader
                        ),
                    })
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lead(generation: u64, leader: &str) -> ShardLeader {
        ShardLeader {
            object: "stream:t1/default/orders".into(),
            shard: 0,
            generation,
            leader: Some(leader.into()),
            quiet_level: Vec::new(),
        }
    }

    #[test]
    fn a_second_leader_at_one_generation_is_refused() {
        let mut s = ShardLeaders::default();
        s.observe("n1", &[lead(1, "n2")]).unwrap();
        s.observe("n3", &[lead(1, "n2"), lead(2, "n3")]).unwrap();
        let v = s.observe("n2", &[lead(2, "n1")]).unwrap_err();
        assert_eq!(v.invariant, NAME);
    }
}
