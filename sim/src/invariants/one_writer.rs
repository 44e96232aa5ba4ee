//! One writer per generation: across every node and the whole run, the publishes served for
//! a replicated shard at one generation are all served by one node. A generation names one
//! leadership (docs/replication.md, invariant 3); two nodes writing at one generation would
//! build two different logs that both claim it.

use std::collections::BTreeMap;

use felix_engine::WritesServed;

use crate::oracle::Violation;

pub(crate) const NAME: &str = "one_writer_per_generation";

#[derive(Default)]
pub(crate) struct OneWriter {
    /// (object, shard, generation) -> the node that served writes at it.
    writer: BTreeMap<(String, u32, u64), String>,
    /// (node, object, shard) -> the count seen last, to notice new writes.
    last: BTreeMap<(String, String, u32), u64>,
    pub(crate) checked: u64,
}

impl OneWriter {
    /// Feeds one node's write counters; returns the shards that node served a write on since
    /// the last look (for the lease check).
    pub(crate) fn observe(
        &mut self,
        node: &str,
        served: &[((String, u32), WritesServed)],
    ) -> Result<Vec<(String, u32)>, Violation> {
        let mut wrote = Vec::new();
        for ((object, shard), w) in served {
            let last = self
                .last
                .entry((node.to_owned(), object.clone(), *shard))
                .or_insert(0);
            if w.count <= *last {
                continue;
            }
            *last = w.count;
            wrote.push((object.clone(), *shard));
            let key = (object.clone(), *shard, w.generation);
            match self.writer.get(&key) {
                None => {
                    self.writer.insert(key, node.to_owned());
                }
                Some(first) if first == node => self.checked += 1,
                Some(first) => {
                    return Err(Violation {
                        invariant: NAME,
                        detail: format!(
                            "{object} shard {shard} generation {}: {first} served writes at it, and now {node} does too",
                            w.generation
                        ),
                    })
                }
            }
        }
        Ok(wrote)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(generation: u64, count: u64) -> Vec<((String, u32), WritesServed)> {
        vec![(
            ("stream:t/n/s".into(), 0),
            WritesServed { generation, count },
        )]
    }

    #[test]
    fn a_second_node_writing_at_a_generation_is_refused() {
        let mut w = OneWriter::default();
        assert_eq!(w.observe("n1", &served(2, 1)).unwrap().len(), 1);
        assert!(w.observe("n1", &served(2, 1)).unwrap().is_empty());
        w.observe("n2", &served(3, 4)).unwrap();
        let v = w.observe("n1", &served(3, 2)).unwrap_err();
        assert_eq!(v.invariant, NAME);
    }
}
