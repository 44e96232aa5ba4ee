//! The engine's side of a `leader` shard's quiescence (`felix_cluster::replication::quiesce`):
//! on every pass, each `leader`-consistency shard whose logs are all led here is looked at as
//! one, its wish handed to the control plane, and its acknowledgements held or released.

use std::time::Instant;

use felix_cluster::meta::{Command, Consistency, ShardRef};
use felix_cluster::replication::quiesce::{QuietLeader, QuietView, QuietWish};
use felix_cluster::NodeId;

use super::CopyRef;
use crate::cluster::ClusterNode;

/// One led shard's quiescence, for the generation it began at, and the end of each of its
/// logs when acknowledgements began to be held.
pub(super) struct ShardQuiet {
    generation: u64,
    machine: QuietLeader,
    held: Option<Vec<(CopyRef, u64)>>,
}

impl ClusterNode {
    /// Looks at every `leader` shard led here: see the module.
    pub(super) fn drive_quiet(&mut self, now: Instant) {
        let mut shards: Vec<ShardRef> = self
            .replicas
            .slots
            .keys()
            .map(|r| r.shard.clone())
            .collect();
        shards.dedup();
        let quiet_after = self.replicas.quiet_after;
        let mut keep = Vec::new();
        for shard in shards {
            let meta = self.meta();
            let Some(m) = meta.shard(&shard).cloned() else {
                continue;
            };
            if meta.consistency_of(&shard) != Consistency::Leader {
                continue;
            }
            let copies: Vec<CopyRef> = self
                .replicas
                .slots
                .keys()
                .filter(|r| r.shard == shard)
                .cloned()
                .collect();
            // Every log of the shard must be led here at the metadata's generation.
            let mut end = 0;
            let mut durable_here = true;
            let mut level: Option<Vec<NodeId>> = None;
            let mut leading = true;
            for c in &copies {
                match self.replicas.slots[c].copy.leader() {
                    Some(l) if l.generation() == m.generation => {
                        end += l.end();
                        durable_here &= l.durable_end() >= l.end();
                        let here = l.level_with(l.end());
                        level = Some(match level {
                            None => here,
                            Some(before) => {
                                before.into_iter().filter(|n| here.contains(n)).collect()
                            }
                        });
                    }
                    _ => leading = false,
                }
            }
            if !leading || copies.is_empty() {
                continue;
            }
            keep.push(shard.clone());
            let view = QuietView {
                end,
                durable_here,
                level: level.unwrap_or_default(),
                recorded_quiet: m.quiet.as_ref().map(|q| q.end),
                recorded_resume: m.resumed_at,
            };
            let entry = self
                .replicas
                .quiet
                .entry(shard.clone())
                .or_insert_with(|| ShardQuiet {
                    generation: m.generation,
                    machine: QuietLeader::new(now, end, quiet_after),
                    held: None,
                });
            if entry.generation != m.generation {
                *entry = ShardQuiet {
                    generation: m.generation,
                    machine: QuietLeader::new(now, end, quiet_after),
                    held: None,
                };
            }
            let wish = entry.machine.look(now, &view);
            let holding = entry.machine.held_past().is_some();
            let slots = &mut self.replicas.slots;
            match (holding, &entry.held) {
                (true, None) => {
                    // Each log is held at its own end as of the ask.
                    let held: Vec<(CopyRef, u64)> = copies
                        .iter()
                        .filter_map(|c| {
                            let l = slots.get_mut(c)?.copy.leader_mut()?;
                            l.hold(Some(l.end()));
                            Some((c.clone(), l.end()))
                        })
                        .collect();
                    entry.held = Some(held);
                }
                (false, Some(_)) => {
                    for (c, _) in entry.held.take().unwrap_or_default() {
                        if let Some(l) = slots.get_mut(&c).and_then(|s| s.copy.leader_mut()) {
                            l.hold(None);
                        }
                    }
                }
                _ => {}
            }
            let generation = m.generation;
            let command = wish.map(|w| match w {
                QuietWish::Quiesce { end, level } => Command::Quiesce {
                    shard: shard.clone(),
                    generation,
                    end,
                    level,
                },
                QuietWish::Resume { end } => Command::Resume {
                    shard: shard.clone(),
                    generation,
                    end,
                },
            });
            if let (Some(c), Some(control)) = (command, self.control.as_mut()) {
                control.want(c, now);
            }
        }
        self.replicas.quiet.retain(|s, _| keep.contains(s));
    }

    /// `leader` shards led here whose quiescence the metadata records: a follower may take
    /// each over without loss. For `/metrics`.
    pub(super) fn leader_shards_quiet(&self) -> usize {
        let meta = self.meta();
        self.replicas
            .quiet
            .iter()
            .filter(|(s, q)| {
                let recorded = meta.shard(s).and_then(|m| m.quiet.as_ref()).map(|x| x.end);
                q.machine.held_past().is_some() && recorded == q.machine.held_past()
            })
            .count()
    }
}
