//! Metadata agreement: no two nodes apply different entries at one raft index. Every time a
//! node's applied index moves, the simulator takes a digest of its whole metadata (the state
//! machine after applying everything up to that index, `Engine::cluster_view`); two digests
//! recorded at one index must be equal. A state machine is a function of its entries, so a
//! node that applied a different entry (or a different order) at or below the index shows a
//! different digest there.

use std::collections::BTreeMap;

use crate::oracle::Violation;

pub(crate) const NAME: &str = "meta_agreement";

#[derive(Default)]
pub(crate) struct MetaAgreement {
    /// Per applied index, the digest the first node seen there held, and that node.
    by_index: BTreeMap<u64, ([u8; 16], String)>,
    pub(crate) checked: u64,
}

pub(crate) fn digest(bytes: &[u8]) -> [u8; 16] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    d.as_ref()[..16].try_into().expect("16 bytes")
}

impl MetaAgreement {
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
}
