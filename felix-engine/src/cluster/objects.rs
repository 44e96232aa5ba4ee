//! Streams and caches created, altered, deleted and read by an operator through the admin
//! API (`/v1/streams`, `/v1/caches`, docs/operations.md): each change is one command wanted
//! from the control plane (`propose_admin`: proposed here, forwarded by raft to its leader),
//! so an object is placed, changed or deleted whole or not at all; what it looks like is read
//! from the metadata as applied here.

use std::time::Instant;

use felix_cluster::meta::{CacheSpec, Command, ObjectKey, Retention, ShardMeta, StreamSpec};

use super::ClusterNode;
use crate::stream_admin::{AdminError, CacheView, ShardView, StreamView};
use crate::stream_delete::DeleteStreamError;

impl ClusterNode {
    /// Proposes an operator's command (create, alter, delete) to the control plane, once
    /// it runs and has a leader; otherwise nothing is proposed, and the reason is returned
    /// (the admin API answers it as unavailable: a retry later does the change whole).
    fn propose_admin(&mut self, now: Instant, command: Command) -> Result<(), String> {
        let Some(control) = self.control.as_mut() else {
            return Err("the control plane is not running yet".into());
        };
        if control.leader().is_none() {
            return Err("the control plane has no leader (no majority of its voters)".into());
        }
        control.want(command, now);
        self.pump(now);
        Ok(())
    }

    /// A placed stream as the metadata applied here has it.
    pub(crate) fn stream_view(&self, key: &ObjectKey) -> Option<StreamView> {
        let meta = self.meta();
        let s = meta.streams.get(key)?;
        let shards = self.shard_views(&s.shards);
        Some(StreamView {
            tenant: key.tenant.clone(),
            namespace: key.namespace.clone(),
            stream: key.name.clone(),
            spec: s.spec,
            shards,
            incarnation: s.incarnation,
        })
    }

    fn shard_views(&self, shards: &[ShardMeta]) -> Vec<ShardView> {
        let meta = self.meta();
        shards
            .iter()
            .enumerate()
            .map(|(i, m)| ShardView {
                shard: i as u32,
                leader: m.leader.as_ref().map(|l| l.0.clone()),
                writable: m
                    .leader
                    .as_ref()
                    .is_some_and(|l| meta.members.get(l).is_some_and(|x| x.up)),
                replicas: m.replicas.iter().map(|r| r.0.clone()).collect(),
                generation: m.generation,
                here: None,
            })
            .collect()
    }

    /// A placed cache as the metadata applied here has it.
    pub(crate) fn cache_view(&self, key: &ObjectKey) -> Option<CacheView> {
        let c = self.meta().caches.get(key)?;
        Some(CacheView {
            tenant: key.tenant.clone(),
            namespace: key.namespace.clone(),
            cache: key.name.clone(),
            spec: c.spec,
            shards: self.shard_views(&c.shards),
            incarnation: c.incarnation,
        })
    }

    /// Every placed cache of `tenant`, in name order.
    pub(crate) fn cache_views(&self, tenant: &str) -> Vec<CacheView> {
        self.meta()
            .caches
            .keys()
            .filter(|k| k.tenant == tenant)
            .filter_map(|k| self.cache_view(k))
            .collect()
    }

    /// As [`ClusterNode::create_stream`], for a cache: its keys hash over its shards
    /// (`felix_cluster::routing::cache_shard`), each shard placed and led as a stream's.
    pub(crate) fn create_cache(
        &mut self,
        now: Instant,
        key: ObjectKey,
        spec: CacheSpec,
    ) -> Result<Option<CacheView>, AdminError> {
        if let Some(view) = self.cache_view(&key) {
            let field = if view.spec.shards != spec.shards {
                Some("shards")
            } else if view.spec.replication_factor != spec.replication_factor {
                Some("replication_factor")
            } else {
                None
            };
            return match field {
                None => Ok(Some(view)),
                Some(field) => Err(AdminError::Conflict {
                    field,
                    why: format!("{key} exists with another {field}"),
                }),
            };
        }
        // The same bounds as a stream's: shards 1..=MAX_STREAM_SHARDS, a placeable factor.
        self.meta()
            .check_stream_spec(&StreamSpec::new(
                spec.shards,
                spec.replication_factor,
                felix_cluster::meta::Consistency::Leader,
            ))
            .map_err(|e| AdminError::BadRequest {
                field: e.field,
                why: e.why,
            })?;
        self.propose_admin(now, Command::CreateCache { key, spec })
            .map_err(AdminError::Unavailable)?;
        Ok(None)
    }

    /// Every placed stream's width, for the broker to open each as wide as it was placed.
    pub(crate) fn stream_widths(&self) -> Vec<(crate::broker::StreamKey, u32)> {
        self.meta()
            .streams
            .iter()
            .map(|(k, s)| {
                let key = crate::broker::StreamKey::new(&k.tenant, &k.namespace, &k.name);
                (key, s.shards.len() as u32)
            })
            .collect()
    }

    /// Every placed stream's own retention, for the broker to run its logs with.
    pub(crate) fn stream_retentions(
        &self,
    ) -> Vec<(
        crate::broker::StreamKey,
        crate::broker::retention::StreamRetention,
    )> {
        self.meta()
            .streams
            .iter()
            .map(|(k, s)| {
                let key = crate::broker::StreamKey::new(&k.tenant, &k.namespace, &k.name);
                let r = s.spec.retention;
                let own = crate::broker::retention::StreamRetention {
                    max_bytes: r.max_bytes,
                    max_age: r.max_age_seconds.map(std::time::Duration::from_secs),
                };
                (key, own)
            })
            .collect()
    }

    /// Every placed stream of `tenant`, in name order.
    pub(crate) fn stream_views(&self, tenant: &str) -> Vec<StreamView> {
        self.meta()
            .streams
            .keys()
            .filter(|k| k.tenant == tenant)
            .filter_map(|k| self.stream_view(k))
            .collect()
    }

    /// Checks `spec` and asks the control plane for the stream: `Ok(Some)` when it exists
    /// with this very spec, `Ok(None)` when asked (the caller waits for it to be placed).
    pub(crate) fn create_stream(
        &mut self,
        now: Instant,
        key: ObjectKey,
        spec: StreamSpec,
    ) -> Result<Option<StreamView>, AdminError> {
        if let Some(view) = self.stream_view(&key) {
            return match view.spec.first_difference(&spec) {
                None => Ok(Some(view)),
                Some(field) => Err(AdminError::Conflict {
                    field,
                    why: format!("{key} exists with another {field}"),
                }),
            };
        }
        self.meta()
            .check_stream_spec(&spec)
            .map_err(|e| AdminError::BadRequest {
                field: e.field,
                why: e.why,
            })?;
        self.propose_admin(now, Command::CreateStream { key, spec })
            .map_err(AdminError::Unavailable)?;
        Ok(None)
    }

    /// Asks the control plane to change a stream's retention: `Ok(true)` when it already has
    /// `retention`, `Ok(false)` when asked (the caller waits to see it applied).
    pub(crate) fn alter_stream(
        &mut self,
        now: Instant,
        key: ObjectKey,
        retention: Retention,
    ) -> Result<bool, AdminError> {
        let Some(view) = self.stream_view(&key) else {
            return Err(AdminError::NotFound(format!("no stream {key}")));
        };
        if view.spec.retention == retention {
            return Ok(true);
        }
        let mut spec = view.spec;
        spec.retention = retention;
        self.meta()
            .check_stream_spec(&spec)
            .map_err(|e| AdminError::BadRequest {
                field: e.field,
                why: e.why,
            })?;
        self.propose_admin(now, Command::AlterStream { key, retention })
            .map_err(AdminError::Unavailable)?;
        Ok(false)
    }

    /// Asks the control plane to delete a stream (`DELETE /v1/streams/…` in a cluster): one
    /// `DeleteStream` command for the incarnation placed now. `Ok(incarnation)` when asked;
    /// the caller waits until this node's metadata no longer has it and its copies here are
    /// gone ([`ClusterNode::stream_deleted_here`]).
    pub(crate) fn delete_stream(
        &mut self,
        now: Instant,
        key: ObjectKey,
    ) -> Result<u64, DeleteStreamError> {
        let Some(incarnation) = self.meta().streams.get(&key).map(|s| s.incarnation) else {
            return Err(DeleteStreamError::NotFound);
        };
        self.propose_admin(now, Command::DeleteStream { key, incarnation })
            .map_err(DeleteStreamError::Unavailable)?;
        Ok(incarnation)
    }

    /// As [`ClusterNode::delete_stream`], for a cache (`DELETE /v1/caches/…`).
    pub(crate) fn delete_cache(&mut self, now: Instant, key: ObjectKey) -> Result<u64, AdminError> {
        let Some(incarnation) = self.meta().caches.get(&key).map(|c| c.incarnation) else {
            return Err(AdminError::NotFound(format!("no cache {key}")));
        };
        self.propose_admin(now, Command::DeleteCache { key, incarnation })
            .map_err(AdminError::Unavailable)?;
        Ok(incarnation)
    }
}
