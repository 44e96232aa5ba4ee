//! `--admin-ops`: the operator works on the cluster while it runs. At seeded moments of the
//! fault phase (and just after it) the admin API is called on whichever node is up: a stream
//! created (a fresh name, or again with the same spec, or with another one), its retention
//! changed, or it is deleted (and maybe created again by a later call). The answers and the
//! end state are checked by `object_specs`.

use std::collections::BTreeMap;
use std::time::Duration;

use felix_engine::stream_admin::{Consistency, Retention, StreamSpec};

use super::{ClusterWorld, Fault, FAULT_PHASE};
use crate::client::{NAMESPACE, TENANT};
use crate::oracle::Violation;
use crate::rng::SimRng;

/// How many calls a run makes, at most.
const MAX_CALLS: u64 = 8;

impl ClusterWorld {
    pub(super) fn schedule_admin(&mut self, plan: &mut SimRng) {
        for _ in 0..plan.range(2..MAX_CALLS + 1) {
            let at = plan.duration(
                Duration::from_millis(800),
                FAULT_PHASE + Duration::from_secs(4),
            );
            self.push_fault(at, Fault::Admin);
        }
    }

    /// One admin call on a node that is up, drawn from the run's admin stream.
    pub(super) fn admin_call(&mut self, now: std::time::Instant) -> Result<(), Violation> {
        let up: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| {
                let n = &self.nodes[i];
                n.frozen.is_none() && n.running.as_ref().is_some_and(|r| r.ready)
            })
            .collect();
        if up.is_empty() {
            return Ok(());
        }
        let i = *self.admin_rng.pick(&up);
        let existing: Vec<(String, StreamSpec)> =
            self.specs.asked().map(|(n, s)| (n.clone(), *s)).collect();
        let gone = self.specs.deleted_names();
        let retentions = [
            Retention::default(),
            Retention {
                max_age_seconds: Some(3600),
                max_bytes: None,
            },
            Retention {
                max_age_seconds: None,
                max_bytes: Some(1 << 20),
            },
        ];
        let local = self.local(i, now);
        let node = self.nodes[i].id.clone();
        let token = self.token.clone();
        let max_rf = self.nodes.len().min(3) as u64;
        let rng = &mut self.admin_rng;
        let what = rng.below(12);
        let engine = &mut self.nodes[i].running.as_mut().expect("up").engine;
        if existing.is_empty() || what < 5 {
            let name = format!("ops-{}", existing.len());
            let rf = rng.range(1..(max_rf + 1)) as u8;
            let spec = StreamSpec {
                shards: rng.range(1..4) as u32,
                replication_factor: rf,
                consistency: *rng.pick(&[Consistency::Leader, Consistency::Quorum]),
                retention: *rng.pick(&retentions),
                durable: true,
            };
            let answer = engine.create_stream_as(local, &token, (TENANT, NAMESPACE, &name), spec);
            self.log(format_args!(
                "ADMIN {node} create {name} {spec:?}: {answer:?}"
            ));
            self.specs.create(&node, &name, spec, &answer)?;
        } else {
            // Half the creates of a known name after a delete go to a deleted one: a re-create.
            let (name, first) = if (5..9).contains(&what) && !gone.is_empty() && rng.below(2) == 0 {
                let name = rng.pick(&gone);
                existing
                    .iter()
                    .find(|(n, _)| n == name)
                    .expect("a deleted name was asked for")
                    .clone()
            } else {
                rng.pick(&existing).clone()
            };
            if what >= 10 {
                let names = (TENANT, NAMESPACE, name.as_str());
                let incarnation = engine.stream_incarnation(names);
                let answer = engine.delete_stream_as(local, &token, TENANT, NAMESPACE, &name);
                self.log(format_args!(
                    "ADMIN {node} delete {name} (incarnation {incarnation:?}): {answer:?}"
                ));
                self.specs.delete(&node, &name, incarnation, &answer)?;
            } else if what < 9 {
                // Again with the spec first asked (idempotent), or with one more shard (409
                // once the first is applied).
                let mut spec = first;
                if what == 8 {
                    spec.shards += 1;
                }
                let answer =
                    engine.create_stream_as(local, &token, (TENANT, NAMESPACE, &name), spec);
                self.log(format_args!(
                    "ADMIN {node} create {name} {spec:?}: {answer:?}"
                ));
                self.specs.create(&node, &name, spec, &answer)?;
            } else {
                let retention = *rng.pick(&retentions);
                let answer =
                    engine.alter_stream_as(local, &token, (TENANT, NAMESPACE, &name), retention);
                self.log(format_args!(
                    "ADMIN {node} alter {name} {retention:?}: {answer:?}"
                ));
                self.specs.alter(&node, &name, retention, &answer)?;
            }
        }
        self.drain(i, now)
    }

    /// Marks the deletes asked for that `incarnations` (a node's metadata) shows applied.
    pub(super) fn see_deletes(&mut self, incarnations: &super::Incarnations) {
        for (name, incarnation) in self.specs.pending_deletes() {
            let object = format!("stream:{TENANT}/{NAMESPACE}/{name}");
            let deleted = incarnations.get(&object).and_then(|(_, d)| *d);
            if deleted.is_some_and(|d| d >= incarnation) {
                self.specs.delete_applied(&name, incarnation);
            }
        }
    }

    /// What every node caught up with the last applied index holds for each name asked for.
    pub(super) fn check_object_specs(&mut self) -> Result<(), Violation> {
        let now = self.clock.now();
        let seen: Vec<_> = self
            .nodes
            .iter()
            .filter_map(|n| n.running.as_ref()?.engine.cluster_view())
            .map(|v| v.incarnations())
            .collect();
        for incarnations in &seen {
            self.see_deletes(incarnations);
        }
        let applied = |n: &super::SimNode| {
            n.running
                .as_ref()
                .and_then(|r| r.engine.cluster_view())
                .map(|v| v.applied_index())
        };
        let last = self.nodes.iter().filter_map(applied).max();
        let names: Vec<String> = self.specs.asked().map(|(n, _)| n.clone()).collect();
        let mut held = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if last.is_none() || applied(n) != last {
                continue;
            }
            let engine = &n.running.as_ref().expect("it has a view").engine;
            let local = self.local(i, now);
            let mut specs = BTreeMap::new();
            for name in &names {
                let view = engine.stream_view(local, None, (TENANT, NAMESPACE, name));
                let mut spec = view.ok().map(|v| (v.spec, v.incarnation));
                // Canary: node 2 reports the first stream with a retention it never got.
                if self.canary == Some(crate::Canary::SpecDivergence) && i == 1 {
                    if let (Some((s, _)), true) = (spec.as_mut(), name == "ops-0") {
                        s.retention.max_bytes = Some(s.retention.max_bytes.unwrap_or(0) + 1);
                    }
                }
                specs.insert(name.clone(), spec);
            }
            held.push((n.id.clone(), specs));
        }
        self.specs.recreated = held.first().map_or(0, |(_, specs)| {
            let later = specs.values().flatten().filter(|(_, i)| *i > 0);
            later.count() as u64
        });
        self.specs.check_end(&held)
    }
}
