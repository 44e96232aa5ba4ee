//! Node names and the raft ids they map to.
//!
//! Operators name nodes (`n1`, `broker-b`); raft-rs numbers them. Every node is configured with
//! the same peer list, so numbering the sorted names from 1 gives every node the same map with
//! nothing to agree on at run time.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// An operator-given node name, as `FELIX_NODE_ID` spells it.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub String);

impl NodeId {
    pub fn new(name: impl Into<String>) -> NodeId {
        NodeId(name.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a peer list cannot form a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VotersError {
    /// Raft needs a majority that survives a failure: 3 or 5 voters.
    Size(usize),
    Duplicate(NodeId),
    /// The node's own name is not in the list.
    NotListed(NodeId),
    /// A name that is empty or longer than [`MAX_NODE_ID_LEN`] bytes.
    BadName(String),
}

impl fmt::Display for VotersError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VotersError::Size(n) => {
                write!(f, "a cluster has 3 or 5 voters; the peer list names {n}")
            }
            VotersError::Duplicate(n) => write!(f, "node {n} is listed twice"),
            VotersError::NotListed(n) => write!(f, "this node ({n}) is not in the peer list"),
            VotersError::BadName(n) => write!(
                f,
                "node id {n:?} must be 1..={MAX_NODE_ID_LEN} bytes of [A-Za-z0-9._-]"
            ),
        }
    }
}

/// The longest node id, so it fits every length-prefixed field that carries one.
pub const MAX_NODE_ID_LEN: usize = 64;

/// The voter set: every configured node, in name order, numbered from 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Voters {
    names: Vec<NodeId>,
    by_name: BTreeMap<NodeId, u64>,
}

impl Voters {
    pub fn new(mut names: Vec<NodeId>) -> Result<Voters, VotersError> {
        for n in &names {
            let ok = !n.0.is_empty()
                && n.0.len() <= MAX_NODE_ID_LEN
                && n.0
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !ok {
                return Err(VotersError::BadName(n.0.clone()));
            }
        }
        names.sort();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(VotersError::Duplicate(w[0].clone()));
        }
        if names.len() != 3 && names.len() != 5 {
            return Err(VotersError::Size(names.len()));
        }
        let by_name = names
            .iter()
            .zip(1u64..)
            .map(|(n, i)| (n.clone(), i))
            .collect();
        Ok(Voters { names, by_name })
    }

    pub fn names(&self) -> &[NodeId] {
        &self.names
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn raft_id(&self, name: &NodeId) -> Option<u64> {
        self.by_name.get(name).copied()
    }

    pub fn name(&self, raft_id: u64) -> Option<&NodeId> {
        let i = usize::try_from(raft_id.checked_sub(1)?).ok()?;
        self.names.get(i)
    }

    pub fn raft_ids(&self) -> Vec<u64> {
        (1..=self.names.len() as u64).collect()
    }

    /// The cluster's id: a stable hash of the sorted names, the same on every node.
    pub fn cluster_id(&self) -> String {
        let joined: String = self.names.iter().map(|n| format!("{n},")).collect();
        format!("felix-{:016x}", crate::placement::name_hash(&joined))
    }

    /// A majority of the voters.
    pub fn quorum(&self) -> usize {
        self.names.len() / 2 + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<NodeId> {
        names.iter().map(|n| NodeId::new(*n)).collect()
    }

    #[test]
    fn numbering_follows_sorted_names_whatever_the_listed_order() {
        let a = Voters::new(ids(&["n3", "n1", "n2"])).unwrap();
        let b = Voters::new(ids(&["n2", "n3", "n1"])).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.raft_id(&NodeId::new("n1")), Some(1));
        assert_eq!(a.raft_id(&NodeId::new("n3")), Some(3));
        assert_eq!(a.name(2), Some(&NodeId::new("n2")));
        assert_eq!(a.name(0), None);
        assert_eq!(a.name(4), None);
        assert_eq!(a.quorum(), 2);
    }

    #[test]
    fn only_three_or_five_distinct_well_formed_names() {
        assert_eq!(Voters::new(ids(&["a", "b"])), Err(VotersError::Size(2)));
        assert_eq!(
            Voters::new(ids(&["a", "b", "c", "d"])),
            Err(VotersError::Size(4))
        );
        assert!(Voters::new(ids(&["a", "b", "c", "d", "e"])).is_ok());
        assert_eq!(
            Voters::new(ids(&["a", "b", "a"])),
            Err(VotersError::Duplicate(NodeId::new("a")))
        );
        assert!(matches!(
            Voters::new(ids(&["a", "b", ""])),
            Err(VotersError::BadName(_))
        ));
        assert!(matches!(
            Voters::new(ids(&["a", "b", "c d"])),
            Err(VotersError::BadName(_))
        ));
        let long = "x".repeat(MAX_NODE_ID_LEN + 1);
        assert!(matches!(
            Voters::new(vec![NodeId::new("a"), NodeId::new("b"), NodeId::new(long)]),
            Err(VotersError::BadName(_))
        ));
        let edge = "x".repeat(MAX_NODE_ID_LEN);
        assert!(Voters::new(vec![NodeId::new("a"), NodeId::new("b"), NodeId::new(edge)]).is_ok());
    }
}
