//! An operator gives up a shard's acknowledged records (`felix admin abandon`): the one way a
//! durable shard comes to be led by a node that may lack records its leader acknowledged
//! (docs/replication.md, "Giving records up").

use std::time::Instant;

use felix_cluster::meta::{Command, ObjectKey, ObjectKind, ShardRef};
use felix_cluster::NodeId;

use super::ClusterNode;

/// Why an abandon was not asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AbandonError {
    /// The token does not verify for the tenant (401).
    Unauthorized(String),
    /// The token lacks `node.manage` on `cluster:*` (403).
    Forbidden,
    /// Not a cluster node, a bad name, or no such shard (404).
    NotFound(String),
    /// The shard's leader is live, or no node can take it (409).
    Refused(String),
}

impl std::fmt::Display for AbandonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AbandonError::Unauthorized(why) => write!(f, "unauthorized: {why}"),
            AbandonError::Forbidden => {
                f.write_str("forbidden: node.manage on cluster:* is required")
            }
            AbandonError::NotFound(why) | AbandonError::Refused(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for AbandonError {}

/// What an abandon asked for, in words for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbandonPlan {
    pub shard: String,
    pub from: Option<String>,
    pub to: String,
    pub generation: u64,
    /// What is given up, in words.
    pub given_up: String,
}

impl ClusterNode {
    /// Asks the control plane to hand `shard` to `to` (or the first live replica holding a
    /// copy; for a single-copy shard, the first live member) at its next generation, giving
    /// up what its leader acknowledged and that node lacks. Refused while the leader is live.
    pub(crate) fn abandon(
        &mut self,
        now: Instant,
        kind: ObjectKind,
        (tenant, namespace, name): (&str, &str, &str),
        shard: u32,
        to: Option<&str>,
    ) -> Result<AbandonPlan, AbandonError> {
        let r = ShardRef {
            kind,
            key: ObjectKey::new(tenant, namespace, name),
            shard,
        };
        let meta = self.meta();
        let m = meta
            .shard(&r)
            .ok_or_else(|| AbandonError::NotFound(format!("{r} is not placed")))?;
        let live = |n: &NodeId| meta.members.get(n).is_some_and(|x| x.up);
        if let Some(l) = m.leader.as_ref().filter(|l| live(l)) {
            return Err(AbandonError::Refused(format!(
                "{r} is led by {l}, which is live: nothing needs giving up"
            )));
        }
        let holds = |n: &NodeId| m.holds_copy(n, &meta.members);
        let target = match to {
            Some(t) => NodeId::new(t),
            None => m
                .replicas
                .iter()
                .find(|n| Some(*n) != m.leader.as_ref() && live(n) && holds(n))
                .or_else(|| {
                    (m.replicas.len() == 1)
                        .then(|| meta.members.keys().find(|n| live(n)))
                        .flatten()
                })
                .cloned()
                .ok_or_else(|| AbandonError::Refused(format!("no live node can take {r}")))?,
        };
        if !live(&target) {
            return Err(AbandonError::Refused(format!(
                "{target} is not a live member"
            )));
        }
        if !holds(&target) && m.replicas.len() > 1 {
            return Err(AbandonError::Refused(format!(
                "{target} holds no copy of {r}: name a replica that does"
            )));
        }
        let from = m.leader.as_ref().map(|l| l.0.clone());
        let given_up = match (&from, holds(&target)) {
            (Some(l), true) => format!(
                "every record {l} acknowledged that {target}'s copy lacks (records past the \
                 end of {target}'s copy are cut from {l}'s when it rejoins)"
            ),
            (Some(l), false) => format!(
                "every record of the shard: {target} starts it empty, and {l}'s copy is \
                 dropped if it rejoins"
            ),
            (None, _) => {
                format!("whatever the shard's last leader acknowledged that {target} lacks")
            }
        };
        let plan = AbandonPlan {
            shard: r.to_string(),
            from,
            to: target.0.clone(),
            generation: m.generation + 1,
            given_up,
        };
        let command = Command::Abandon {
            shard: r,
            generation: m.generation,
            leader: target,
        };
        match self.control.as_mut() {
            Some(c) => c.want(command, now),
            None => {
                return Err(AbandonError::Refused(
                    "the control plane is not running yet".into(),
                ))
            }
        }
        Ok(plan)
    }
}
