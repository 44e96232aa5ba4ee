//! The shard a message is about, with the generation it was sent under, and the caller's view
//! of current generations that decoding checks it against.
//!
//! A shard's generation goes up every time its leadership or replica set changes. A message
//! sent under an older generation was decided with facts that no longer hold (a forward to a
//! node that has since lost the shard, an answer from before a move), so it is refused while
//! decoding, before anything acts on it. A newer generation than the receiver's passes: the
//! receiver is the one behind, and catches up from the metadata log.

use std::fmt;

use crate::error::{PeerDecodeError, PeerEncodeError};
use crate::wire::{put_string, Reader};

/// What a shard belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum ShardKind {
    /// A stream's shard (wire 1).
    Stream,
    /// A cache's shard (wire 2).
    Cache,
    /// A stream shard's consumer-group log, a log of its own that rides the shard: it has
    /// the shard's replica set, leader and generation, and is replicated beside the shard's
    /// records (wire 3; replication messages only).
    StreamGroups,
    /// A cache shard's counter log, riding the cache's shard as a group log rides a stream's
    /// (wire 4; replication messages only).
    CacheCounters,
}

impl ShardKind {
    fn number(self) -> u8 {
        match self {
            ShardKind::Stream => 1,
            ShardKind::Cache => 2,
            ShardKind::StreamGroups => 3,
            ShardKind::CacheCounters => 4,
        }
    }

    fn from_number(n: u8) -> Option<ShardKind> {
        match n {
            1 => Some(ShardKind::Stream),
            2 => Some(ShardKind::Cache),
            3 => Some(ShardKind::StreamGroups),
            4 => Some(ShardKind::CacheCounters),
            _ => None,
        }
    }
}

/// One shard of one stream or cache of one cluster: a scope without its generation, the key
/// a [`GenerationView`] is asked about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ShardId {
    /// The cluster's id, as in [`crate::Hello::cluster_id`].
    pub cluster_id: String,
    /// Stream or cache.
    pub kind: ShardKind,
    /// Tenant.
    pub tenant: String,
    /// Namespace.
    pub namespace: String,
    /// Stream or cache name.
    pub name: String,
    /// Shard number within the stream or cache.
    pub shard: u32,
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            ShardKind::Stream => "stream",
            ShardKind::Cache => "cache",
            ShardKind::StreamGroups => "stream-groups",
            ShardKind::CacheCounters => "cache-counters",
        };
        write!(
            f,
            "{}:{kind}:{}/{}/{}#{}",
            self.cluster_id, self.tenant, self.namespace, self.name, self.shard
        )
    }
}

/// A shard and the generation the sender believes current. Every shard-scoped message
/// carries one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ShardScope {
    /// Which shard.
    pub shard: ShardId,
    /// The sender's generation for it.
    pub generation: u64,
}

impl ShardScope {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        let s = &self.shard;
        put_string(out, &s.cluster_id, "scope.cluster_id")?;
        out.push(s.kind.number());
        put_string(out, &s.tenant, "scope.tenant")?;
        put_string(out, &s.namespace, "scope.namespace")?;
        put_string(out, &s.name, "scope.name")?;
        out.extend_from_slice(&s.shard.to_be_bytes());
        out.extend_from_slice(&self.generation.to_be_bytes());
        Ok(())
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<ShardScope, PeerDecodeError> {
        let cluster_id = r.string("scope.cluster_id")?;
        let raw_kind = r.u8("scope.kind")?;
        let kind = ShardKind::from_number(raw_kind).ok_or(PeerDecodeError::InvalidValue {
            field: "scope.kind",
            value: raw_kind.into(),
        })?;
        let tenant = r.string("scope.tenant")?;
        let namespace = r.string("scope.namespace")?;
        let name = r.string("scope.name")?;
        let shard = r.u32("scope.shard")?;
        let generation = r.u64("scope.generation")?;
        Ok(ShardScope {
            shard: ShardId {
                cluster_id,
                kind,
                tenant,
                namespace,
                name,
                shard,
            },
            generation,
        })
    }

    /// Holds the scope against the receiver's view: unknown shard, or a generation older
    /// than the current one, is refused.
    pub(crate) fn check<V: GenerationView + ?Sized>(
        &self,
        view: &V,
    ) -> Result<(), PeerDecodeError> {
        match view.current(&self.shard) {
            None => Err(PeerDecodeError::UnknownShard {
                shard: Box::new(self.shard.clone()),
            }),
            Some(current) if self.generation < current => Err(PeerDecodeError::StaleGeneration {
                got: self.generation,
                current,
            }),
            Some(_) => Ok(()),
        }
    }
}

/// The receiver's current generation of each shard it knows, consulted while decoding a
/// shard-scoped message. The engine implements it over its applied cluster metadata; a
/// closure `Fn(&ShardId) -> Option<u64>` is one too.
pub trait GenerationView {
    /// The current generation of `shard`, or `None` when this node does not know the shard.
    fn current(&self, shard: &ShardId) -> Option<u64>;
}

impl<F: Fn(&ShardId) -> Option<u64>> GenerationView for F {
    fn current(&self, shard: &ShardId) -> Option<u64> {
        self(shard)
    }
}

/// A view that knows no shard: shard-scoped messages are refused
/// [`PeerDecodeError::UnknownShard`], the others decode. For a link that has not finished its
/// hello, where only hellos are expected.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoShards;

impl GenerationView for NoShards {
    fn current(&self, _shard: &ShardId) -> Option<u64> {
        None
    }
}
