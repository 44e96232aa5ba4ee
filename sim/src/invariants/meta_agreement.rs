//! Metadata agreement: no two nodes apply different entries at one raft index. Every time a
//! node's applied index moves, the simulator takes a digest of its whole metadata (the state
//! machine after applying everything up to that index, `Engine::cluster_view`); two digests
//! recorded at one index must be equal. A state machine is a function of its entries, so a
//! node that applied a different entry (or a different order) at or below the index shows a
//! different digest there.
//!
//! Digests meet only where two nodes happen to be seen at one index, so the invariant also
//! keeps what committed metadata can never forget: a member that joined, a shard that was
//! placed. Once seen applied at index `i`, every node's metadata at any index `>= i` must
//! still hold it; a node group that restarted blank and re-founded the cluster from an
//! empty log fails this even when no index is shared.
//!
//! A delete is the one thing that legitimately removes placed shards. A shard fact names the
//! incarnation of its object (`shard stream:t/n/s@0 1`), and it may be missing from a node's
//! metadata only where that very metadata shows the incarnation deleted (the object placed
//! again at a later incarnation, or its tombstone at that incarnation or later): a node
//! that forgot metadata shows no such tombstone and still fails.

use std::collections::BTreeMap;

use crate::oracle::Violation;

pub(crate) const NAME: &str = "meta_agreement";

#[derive(Default)]
pub(crate) struct MetaAgreement {
    /// Per applied index, the digest the first node seen there held, and that node.
    by_index: BTreeMap<u64, ([u8; 16], String)>,
    /// Facts committed metadata keeps, with the lowest index and the node they were seen at.
    kept: BTreeMap<String, (u64, String)>,
    pub(crate) checked: u64,
}

pub(crate) fn digest(bytes: &[u8]) -> [u8; 16] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    d.as_ref()[..16].try_into().expect("16 bytes")
}

impl MetaAgreement {
    /// `node`'s metadata at `index` holds `facts` (members, placed shards): each must stay,
    /// unless `deleted` (per object, the highest incarnation that metadata shows deleted)
    /// says the shard's incarnation is gone.
    pub(crate) fn observe_facts(
        &mut self,
        node: &str,
        index: u64,
        facts: &[String],
        deleted: &BTreeMap<String, u64>,
    ) -> Result<(), Violation> {
        for (fact, (at, first)) in &self.kept {
            if *at <= index && !facts.contains(fact) && !deleted_in(fact, deleted) {
                return Err(Violation {
                    invariant: NAME,
                    detail: format!(
                        "{node}'s metadata at raft index {index} has lost {fact}, applied by index {at} (seen on {first}): committed metadata was forgotten"
                    ),
                });
            }
        }
        for f in facts {
            let e = self
                .kept
                .entry(f.clone())
                .or_insert((index, node.to_owned()));
            if index < e.0 {
                *e = (index, node.to_owned());
            }
        }
        Ok(())
    }

    /// `node` has applied everything up to `index`, and its metadata digests to `digest`.
    pub(crate) fn observe(
        &mut self,
        node: &str,
        index: u64,
        digest: [u8; 16],
    ) -> Result<(), Violation> {
        match self.by_index.get(&index) {
            None => {
                self.by_index.insert(index, (digest, node.to_owned()));
            }
            Some((d, _)) if *d == digest => self.checked += 1,
            Some((_, first)) => {
                return Err(Violation {
                    invariant: NAME,
                    detail: format!(
                        "at raft index {index} {node}'s metadata differs from {first}'s: they applied different entries"
                    ),
                })
            }
        }
        Ok(())
    }
}

/// What one running node holds at the end of a run.
pub(crate) struct EndState {
    pub(crate) node: String,
    pub(crate) applied: u64,
    pub(crate) digest: [u8; 16],
    pub(crate) facts: Vec<String>,
    /// Per object, the highest incarnation its metadata shows deleted.
    pub(crate) deleted: BTreeMap<String, u64>,
}

/// Whether `fact` is a shard of an object incarnation that `deleted` shows deleted.
fn deleted_in(fact: &str, deleted: &BTreeMap<String, u64>) -> bool {
    let Some(shard) = fact.strip_prefix("shard ") else {
        return false;
    };
    let Some((object, _)) = shard.rsplit_once(' ') else {
        return false;
    };
    let Some((object, incarnation)) = object.rsplit_once('@') else {
        return false;
    };
    let Ok(incarnation) = incarnation.parse::<u64>() else {
        return false;
    };
    deleted.get(object).is_some_and(|d| *d >= incarnation)
}

impl MetaAgreement {
    /// After the quiet phase: every running node holds every fact ever seen committed, and
    /// all of them the same metadata at the same index (they converged).
    pub(crate) fn check_end(&self, nodes: &[EndState]) -> Result<(), Violation> {
        for n in nodes {
            if let Some((fact, (at, first))) = self
                .kept
                .iter()
                .find(|(f, _)| !n.facts.contains(f) && !deleted_in(f, &n.deleted))
            {
                return Err(Violation {
                    invariant: NAME,
                    detail: format!(
                        "at the end {} (applied {}) lacks {fact}, applied by index {at} on {first}: committed metadata was forgotten",
                        n.node, n.applied
                    ),
                });
            }
        }
        if let Some((a, b)) = nodes
            .iter()
            .zip(nodes.iter().skip(1))
            .find(|(a, b)| a.applied != b.applied || a.digest != b.digest)
        {
            return Err(Violation {
                invariant: NAME,
                detail: format!(
                    "after the quiet phase {} is at raft index {} and {} at {} with {} metadata: the nodes never converged",
                    a.node,
                    a.applied,
                    b.node,
                    b.applied,
                    if a.digest == b.digest { "the same" } else { "different" }
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_digests_at_one_index_must_match() {
        let mut m = MetaAgreement::default();
        m.observe("n1", 3, digest(b"a")).unwrap();
        m.observe("n2", 3, digest(b"a")).unwrap();
        m.observe("n2", 4, digest(b"b")).unwrap();
        let v = m.observe("n3", 4, digest(b"c")).unwrap_err();
        assert_eq!(v.invariant, NAME);
        assert!(v.detail.contains("raft index 4 n3"), "{v}");
    }

    #[test]
    fn a_fact_seen_committed_must_stay() {
        let mut m = MetaAgreement::default();
        let both = ["member n1".to_owned(), "member n3".to_owned()];
        let none = BTreeMap::new();
        m.observe_facts("n3", 4, &both, &none).unwrap();
        // Below the index it was seen at, it may be missing (not applied yet).
        m.observe_facts("n1", 3, &both[..1], &none).unwrap();
        let v = m.observe_facts("n1", 5, &both[..1], &none).unwrap_err();
        assert!(v.detail.contains("lost member n3"), "{v}");
    }

    #[test]
    fn a_shard_goes_only_where_its_incarnation_is_deleted() {
        let mut m = MetaAgreement::default();
        let s = "stream:t/n/s";
        let placed = ["member n1".to_owned(), format!("shard {s}@0 0")];
        let none = BTreeMap::new();
        m.observe_facts("n1", 4, &placed, &none).unwrap();
        // Gone without the delete in that metadata: forgotten.
        let v = m.observe_facts("n2", 6, &placed[..1], &none).unwrap_err();
        assert!(v.detail.contains("lost shard stream:t/n/s@0 0"), "{v}");
        // Gone with incarnation 0 deleted there: the delete removed it.
        let deleted = BTreeMap::from([(s.to_owned(), 0)]);
        m.observe_facts("n2", 6, &placed[..1], &deleted).unwrap();
        // Re-created at incarnation 1: its shard is kept in turn, and a delete of 0 does not
        // excuse losing it.
        let again = ["member n1".to_owned(), format!("shard {s}@1 0")];
        m.observe_facts("n1", 8, &again, &deleted).unwrap();
        let v = m
            .observe_facts("n2", 9, &placed[..1], &deleted)
            .unwrap_err();
        assert!(v.detail.contains("lost shard stream:t/n/s@1 0"), "{v}");
        let end = EndState {
            node: "n2".into(),
            applied: 9,
            digest: digest(b"x"),
            facts: placed[..1].to_vec(),
            deleted: BTreeMap::from([(s.to_owned(), 1)]),
        };
        m.check_end(&[end]).unwrap();
    }
}
