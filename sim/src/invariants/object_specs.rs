//! Object specs: what the operator was told about a stream it created or changed through the
//! admin API (`Engine::create_stream_as`, `alter_stream_as`, on whichever node was up) is
//! what every node holds at the end.
//! - A create answered with a view (`Ok(Some)`) names exactly the spec asked for, and that
//!   stream is on every node at the end with that shard count, replication factor,
//!   consistency and durability.
//! - A create of a spec identical to every earlier one for that name (and to every retention
//!   an alter asked for it) is never refused as a conflict (creates are idempotent); a refusal is only ever "not now" (`Unavailable`).
//! - Whatever a node holds for a name is one of the specs asked for it (never a mix of two
//!   creates), with a retention some create or alter asked for; and every node holds the
//!   same (a name is on all of them or on none).

use std::collections::BTreeMap;

use felix_engine::stream_admin::{AdminError, Consistency, Retention, StreamSpec, StreamView};

use crate::oracle::Violation;

pub(crate) const NAME: &str = "object_specs";

#[derive(Default)]
pub(crate) struct ObjectSpecs {
    /// Per stream: every spec a create asked for, in order.
    asked: BTreeMap<String, Vec<StreamSpec>>,
    /// Per stream: the spec a create was answered with.
    answered: BTreeMap<String, StreamSpec>,
    /// Per stream: every retention an alter asked for.
    retentions: BTreeMap<String, Vec<Retention>>,
    pub(crate) calls: u64,
    /// Calls refused as "not now" (no control-plane leader, recovery not done).
    pub(crate) unavailable: u64,
}

fn violation(detail: String) -> Violation {
    Violation {
        invariant: NAME,
        detail,
    }
}

/// The fields a stream keeps for life (retention is what an alter changes).
fn fixed(s: &StreamSpec) -> (u32, u8, Consistency, bool) {
    (s.shards, s.replication_factor, s.consistency, s.durable)
}

impl ObjectSpecs {
    /// The specs asked for `name` so far (the workload picks repeats and conflicts from them).
    pub(crate) fn asked(&self) -> impl Iterator<Item = (&String, &StreamSpec)> {
        self.asked
            .iter()
            .filter_map(|(n, s)| s.first().map(|s| (n, s)))
    }

    pub(crate) fn create(
        &mut self,
        node: &str,
        name: &str,
        spec: StreamSpec,
        answer: &Result<Option<StreamView>, AdminError>,
    ) -> Result<(), Violation> {
        self.calls += 1;
        let altered = self.retentions.get(name).into_iter().flatten();
        let identical = altered.into_iter().all(|r| *r == spec.retention);
        let earlier = self.asked.entry(name.to_owned()).or_default();
        // A stream whose retention an alter changed differs from its first create: 409.
        let identical = identical && earlier.iter().all(|s| *s == spec);
        earlier.push(spec);
        match answer {
            Ok(Some(view)) if view.spec == spec => {
                self.answered.insert(name.to_owned(), spec);
                Ok(())
            }
            Ok(Some(view)) => Err(violation(format!(
                "{node} answered the create of {name} ({spec:?}) with another spec: {:?}",
                view.spec
            ))),
            Ok(None) => Ok(()),
            Err(AdminError::Conflict { field, .. }) if identical => Err(violation(format!(
                "{node} refused a create of {name} as a conflict on {field}, but every create of it asked the same spec"
            ))),
            Err(AdminError::Conflict { .. }) => Ok(()),
            Err(AdminError::Unavailable(_)) => {
                self.unavailable += 1;
                Ok(())
            }
            Err(e) => Err(violation(format!(
                "{node} refused a valid create of {name} ({spec:?}): {e}"
            ))),
        }
    }

    pub(crate) fn alter(
        &mut self,
        node: &str,
        name: &str,
        retention: Retention,
        answer: &Result<bool, AdminError>,
    ) -> Result<(), Violation> {
        self.calls += 1;
        self.retentions
            .entry(name.to_owned())
            .or_default()
            .push(retention);
        match answer {
            Ok(_) => Ok(()),
            // This node has not applied the create yet (or it was never applied).
            Err(AdminError::NotFound(_)) => Ok(()),
            Err(AdminError::Unavailable(_)) => {
                self.unavailable += 1;
                Ok(())
            }
            Err(e) => Err(violation(format!(
                "{node} refused a valid retention change of {name} ({retention:?}): {e}"
            ))),
        }
    }

    /// `held`: per node (caught up to the last applied index), what it holds for every name
    /// asked for (`None`: no such stream there).
    pub(crate) fn check_end(
        &self,
        held: &[(String, BTreeMap<String, Option<StreamSpec>>)],
    ) -> Result<(), Violation> {
        for (name, asked) in &self.asked {
            let mut first: Option<(&str, Option<StreamSpec>)> = None;
            for (node, specs) in held {
                let spec = specs.get(name).copied().flatten();
                match (&first, spec) {
                    (None, _) => first = Some((node, spec)),
                    (Some((other, theirs)), mine) if *theirs != mine => {
                        return Err(violation(format!(
                            "at the end {node} holds {name} as {mine:?} and {other} as {theirs:?}"
                        )))
                    }
                    _ => {}
                }
                let Some(spec) = spec else {
                    if let Some(answered) = self.answered.get(name) {
                        return Err(violation(format!(
                            "{name} was created ({answered:?}, answered with its view) but {node} does not hold it at the end"
                        )));
                    }
                    continue;
                };
                if !asked.iter().any(|a| fixed(a) == fixed(&spec)) {
                    return Err(violation(format!(
                        "{node} holds {name} as {spec:?}, which no create asked for: {asked:?}"
                    )));
                }
                if let Some(answered) = self.answered.get(name) {
                    if fixed(answered) != fixed(&spec) {
                        return Err(violation(format!(
                            "{name} was created as {answered:?} but {node} holds {spec:?}"
                        )));
                    }
                }
                let alters = self.retentions.get(name).into_iter().flatten();
                if !asked
                    .iter()
                    .map(|a| &a.retention)
                    .chain(alters)
                    .any(|r| *r == spec.retention)
                {
                    return Err(violation(format!(
                        "{node} holds {name} with retention {:?}, which nobody asked for",
                        spec.retention
                    )));
                }
            }
        }
        Ok(())
    }
}
