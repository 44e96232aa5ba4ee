//! Object specs: what the operator was told about a stream it created, changed or deleted
//! through the admin API (`Engine::create_stream_as`, `alter_stream_as`, `delete_stream_as`,
//! on whichever node was up) is what every node holds at the end.
//! - A create answered with a view (`Ok(Some)`) names exactly the spec asked for, and that
//!   incarnation of the stream is on every node at the end with that shard count,
//!   replication factor, consistency and durability, unless a delete of that incarnation
//!   was asked (answered `Ok`).
//! - A delete answered `Ok` and seen applied (some node's metadata shows its incarnation
//!   deleted) is final: no node holds that incarnation at the end, and unless the name was
//!   created again after the delete, no node holds the name at all. A delete is only ever
//!   refused as `NotFound` (not placed on that node) or "not now".
//! - A create of a spec identical to every earlier one for that name (and to every retention
//!   an alter asked for it) is never refused as a conflict (creates are idempotent); a refusal is only ever "not now" (`Unavailable`).
//! - Whatever a node holds for a name is one of the specs asked for it (never a mix of two
//!   creates), with a retention some create or alter asked for; and every node holds the
//!   same (a name is on all of them or on none).

use std::collections::BTreeMap;

use felix_engine::stream_admin::{AdminError, Consistency, Retention, StreamSpec, StreamView};
use felix_engine::DeleteStreamError;

use crate::oracle::Violation;

pub(crate) const NAME: &str = "object_specs";

/// Per node caught up at the end: per name, its spec and incarnation there (`None`: absent).
pub(crate) type Held = [HeldOn];
/// One node's part of [`Held`].
pub(crate) type HeldOn = (String, BTreeMap<String, Option<(StreamSpec, u64)>>);

#[derive(Default)]
pub(crate) struct ObjectSpecs {
    /// Per stream: every spec a create asked for, in order.
    asked: BTreeMap<String, Vec<StreamSpec>>,
    /// Per stream and incarnation: the spec a create was answered with.
    answered: BTreeMap<(String, u64), StreamSpec>,
    /// Per stream: the call number of its last create.
    last_create: BTreeMap<String, u64>,
    /// Per stream: every delete answered `Ok`, as (incarnation, call number, seen applied).
    deletes: BTreeMap<String, Vec<(u64, u64, bool)>>,
    /// Deletes answered `Ok`, and how many of them were seen applied.
    pub(crate) deleted: u64,
    pub(crate) deletes_applied: u64,
    /// Names the caught-up nodes hold at a later incarnation at the end (re-created).
    pub(crate) recreated: u64,
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
        self.last_create.insert(name.to_owned(), self.calls);
        let altered = self.retentions.get(name).into_iter().flatten();
        let identical = altered.into_iter().all(|r| *r == spec.retention);
        let earlier = self.asked.entry(name.to_owned()).or_default();
        // A stream whose retention an alter changed differs from its first create: 409.
        let identical = identical && earlier.iter().all(|s| *s == spec);
        earlier.push(spec);
        match answer {
            Ok(Some(view)) if view.spec == spec => {
                self.answered
                    .insert((name.to_owned(), view.incarnation), spec);
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

    /// A delete of `name` answered `Ok` on `node`, for the `incarnation` placed there when it
    /// was asked.
    pub(crate) fn delete(
        &mut self,
        node: &str,
        name: &str,
        incarnation: Option<u64>,
        answer: &Result<(), DeleteStreamError>,
    ) -> Result<(), Violation> {
        self.calls += 1;
        match (answer, incarnation) {
            (Ok(()), Some(incarnation)) => {
                self.deleted += 1;
                let calls = self.calls;
                let deletes = self.deletes.entry(name.to_owned()).or_default();
                deletes.push((incarnation, calls, false));
                Ok(())
            }
            (Ok(()), None) => Err(violation(format!(
                "{node} answered a delete of {name} with Ok, but holds no incarnation of it"
            ))),
            // Not placed on this node (not applied yet, or deleted already).
            (Err(DeleteStreamError::NotFound), _) => Ok(()),
            (Err(DeleteStreamError::Unavailable(_)), _) => {
                self.unavailable += 1;
                Ok(())
            }
            (Err(e), _) => Err(violation(format!(
                "{node} refused a valid delete of {name}: {e}"
            ))),
        }
    }

    /// The names a delete was answered `Ok` for.
    pub(crate) fn deleted_names(&self) -> Vec<String> {
        self.deletes.keys().cloned().collect()
    }

    /// Deletes answered `Ok` and not seen applied yet: (name, incarnation).
    pub(crate) fn pending_deletes(&self) -> Vec<(String, u64)> {
        let pending = self
            .deletes
            .iter()
            .flat_map(|(name, ds)| ds.iter().filter(|d| !d.2).map(move |d| (name.clone(), d.0)));
        pending.collect()
    }

    /// Some node's metadata shows `incarnation` of `name` deleted.
    pub(crate) fn delete_applied(&mut self, name: &str, incarnation: u64) {
        for d in self.deletes.get_mut(name).into_iter().flatten() {
            if d.0 == incarnation && !d.2 {
                d.2 = true;
                self.deletes_applied += 1;
            }
        }
    }

    /// `held`: per node (caught up to the last applied index), what it holds for every name
    /// asked for, with its incarnation (`None`: no such stream there).
    pub(crate) fn check_end(&self, held: &Held) -> Result<(), Violation> {
        for (name, asked) in &self.asked {
            let mut first: Option<(&str, Option<(StreamSpec, u64)>)> = None;
            let deletes = self.deletes.get(name).map_or(&[][..], |d| &d[..]);
            let last_create = self.last_create.get(name).copied().unwrap_or(0);
            for (node, specs) in held {
                let here = specs.get(name).copied().flatten();
                match (&first, here) {
                    (None, _) => first = Some((node, here)),
                    (Some((other, theirs)), mine) if *theirs != mine => {
                        return Err(violation(format!(
                            "at the end {node} holds {name} as {mine:?} and {other} as {theirs:?}"
                        )))
                    }
                    _ => {}
                }
                for (deleted, at, _) in deletes.iter().filter(|d| d.2) {
                    match here {
                        Some((_, incarnation)) if incarnation <= *deleted => {
                            return Err(violation(format!(
                                "{name} incarnation {deleted} was deleted (answered Ok, applied) but at the end {node} holds incarnation {incarnation}"
                            )))
                        }
                        Some((spec, incarnation)) if last_create < *at => {
                            return Err(violation(format!(
                                "{name} was deleted (answered Ok, applied) and never created again, but at the end {node} holds it ({spec:?}, incarnation {incarnation})"
                            )))
                        }
                        _ => {}
                    }
                }
                for ((_, incarnation), answered) in self
                    .answered
                    .range((name.clone(), 0)..=(name.clone(), u64::MAX))
                {
                    let deleted = deletes.iter().any(|d| d.0 == *incarnation);
                    match here {
                        Some((spec, i)) if i == *incarnation => {
                            if fixed(answered) != fixed(&spec) {
                                return Err(violation(format!(
                                    "{name} was created as {answered:?} (incarnation {i}) but {node} holds {spec:?}"
                                )));
                            }
                        }
                        _ if deleted => {}
                        _ => {
                            return Err(violation(format!(
                                "{name} was created ({answered:?}, incarnation {incarnation}, answered with its view) and never deleted, but at the end {node} holds {here:?}"
                            )))
                        }
                    }
                }
                let Some((spec, _)) = here else {
                    continue;
                };
                if !asked.iter().any(|a| fixed(a) == fixed(&spec)) {
                    return Err(violation(format!(
                        "{node} holds {name} as {spec:?}, which no create asked for: {asked:?}"
                    )));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(shards: u32) -> StreamSpec {
        StreamSpec {
            shards,
            replication_factor: 1,
            consistency: Consistency::Leader,
            retention: Retention::default(),
            durable: true,
        }
    }

    fn view(spec: StreamSpec, incarnation: u64) -> StreamView {
        StreamView {
            tenant: "t".into(),
            namespace: "n".into(),
            stream: "s".into(),
            spec,
            shards: Vec::new(),
            incarnation,
        }
    }

    fn held(at_end: Option<(StreamSpec, u64)>) -> Vec<HeldOn> {
        vec![("n1".into(), BTreeMap::from([("s".to_owned(), at_end)]))]
    }

    #[test]
    fn an_applied_delete_is_final_unless_the_name_is_created_again() {
        let mut o = ObjectSpecs::default();
        o.create("n1", "s", spec(1), &Ok(Some(view(spec(1), 0))))
            .unwrap();
        // Asked, not seen applied: the stream may still be there.
        o.delete("n1", "s", Some(0), &Ok(())).unwrap();
        o.check_end(&held(Some((spec(1), 0)))).unwrap();
        // Seen applied: that incarnation, and the name, must be gone.
        o.delete_applied("s", 0);
        let v = o.check_end(&held(Some((spec(1), 0)))).unwrap_err();
        assert!(v.detail.contains("incarnation 0 was deleted"), "{v}");
        let v = o.check_end(&held(Some((spec(1), 1)))).unwrap_err();
        assert!(v.detail.contains("never created again"), "{v}");
        o.check_end(&held(None)).unwrap();
        // Created again (another spec) and answered: that is what is held.
        o.create("n2", "s", spec(2), &Ok(Some(view(spec(2), 1))))
            .unwrap();
        o.check_end(&held(Some((spec(2), 1)))).unwrap();
        let v = o.check_end(&held(None)).unwrap_err();
        assert!(v.detail.contains("never deleted"), "{v}");
        // A delete refused as not found, or not now, is no violation; any other refusal is.
        o.delete("n3", "s", None, &Err(DeleteStreamError::NotFound))
            .unwrap();
        let v = o
            .delete("n3", "s", Some(1), &Err(DeleteStreamError::Forbidden))
            .unwrap_err();
        assert!(v.detail.contains("refused a valid delete"), "{v}");
    }
}
