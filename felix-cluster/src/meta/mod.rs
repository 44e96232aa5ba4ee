//! The cluster's metadata: a deterministic state machine over ordered maps.
//!
//! Every node applies the same committed [`Command`]s in the same order and must reach the
//! same state, so nothing here iterates a hash map, reads a clock or depends on which node
//! applies it. Commands are idempotent: a node re-proposes what it needs until it sees it
//! applied, because raft may drop a proposal (a leader change) without saying so.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::NodeId;
use crate::placement::{self, Load, ShardAssignment};

/// A stream or cache, by its scope.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectKey {
    pub tenant: String,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(tenant: &str, namespace: &str, name: &str) -> ObjectKey {
        ObjectKey {
            tenant: tenant.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.tenant, self.namespace, self.name)
    }
}

/// What an acknowledgement on a stream promises (docs/replication.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Consistency {
    Leader,
    Quorum,
}

impl fmt::Display for Consistency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Consistency::Leader => "leader",
            Consistency::Quorum => "quorum",
        })
    }
}

/// How long a stream keeps its records; `None` leaves it to the broker-wide setting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    #[serde(default)]
    pub max_age_seconds: Option<u64>,
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

/// A stream as declared, created through the admin API, or created on first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamSpec {
    pub shards: u32,
    pub replication_factor: u8,
    pub consistency: Consistency,
    /// Recorded with the stream (entries from before it existed read as the default).
    #[serde(default)]
    pub retention: Retention,
    /// Whether the stream is asked to outlive its nodes' processes: recorded; what a copy
    /// does is still each node's own storage setting (docs/operations.md).
    #[serde(default = "durable_by_default")]
    pub durable: bool,
}

impl StreamSpec {
    /// A spec with the broker-wide retention and `durable`: what first use and
    /// configuration declarations create.
    pub fn new(shards: u32, replication_factor: u8, consistency: Consistency) -> StreamSpec {
        StreamSpec {
            shards,
            replication_factor,
            consistency,
            retention: Retention::default(),
            durable: true,
        }
    }

    /// Every field in which `declared` differs from this record, as "field: declared X, the
    /// cluster has Y", joined by "; ".
    pub fn differences(&self, declared: &StreamSpec) -> String {
        let mut out = Vec::new();
        let mut field = |name: &str, mine: String, theirs: String| {
            if mine != theirs {
                out.push(format!("{name}: declared {theirs}, the cluster has {mine}"));
            }
        };
        let opt = |v: Option<u64>| v.map_or("unset".to_owned(), |v| v.to_string());
        field(
            "shards",
            self.shards.to_string(),
            declared.shards.to_string(),
        );
        let rf = (self.replication_factor, declared.replication_factor);
        field("replication_factor", rf.0.to_string(), rf.1.to_string());
        let c = (self.consistency, declared.consistency);
        field("consistency", c.0.to_string(), c.1.to_string());
        let (a, b) = (self.retention, declared.retention);
        field(
            "retention.max_age_seconds",
            opt(a.max_age_seconds),
            opt(b.max_age_seconds),
        );
        field("retention.max_bytes", opt(a.max_bytes), opt(b.max_bytes));
        field(
            "durable",
            self.durable.to_string(),
            declared.durable.to_string(),
        );
        out.join("; ")
    }

    /// The first field in which `other` differs from this spec, named as the admin API
    /// names it (`409` on a create that differs from the stream's record).
    pub fn first_difference(&self, other: &StreamSpec) -> Option<&'static str> {
        if self.shards != other.shards {
            Some("shards")
        } else if self.replication_factor != other.replication_factor {
            Some("replication_factor")
        } else if self.consistency != other.consistency {
            Some("consistency")
        } else if self.retention.max_age_seconds != other.retention.max_age_seconds {
            Some("retention.max_age_seconds")
        } else if self.retention.max_bytes != other.retention.max_bytes {
            Some("retention.max_bytes")
        } else if self.durable != other.durable {
            Some("durable")
        } else {
            None
        }
    }
}

/// The most shards a stream created through the admin API may have. Every shard is a log
/// on each of its replicas and a line in every node's metadata, so the bound keeps one
/// request from placing an unbounded number of them.
pub const MAX_STREAM_SHARDS: u32 = 1024;

/// Why a stream spec cannot be created: the field it names, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    pub field: &'static str,
    pub why: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.why)
    }
}

/// A cache as declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheSpec {
    pub shards: u32,
    pub replication_factor: u8,
}

impl CacheSpec {
    /// As [`StreamSpec::differences`].
    pub fn differences(&self, declared: &CacheSpec) -> String {
        let mut out = Vec::new();
        if self.shards != declared.shards {
            let (a, b) = (self.shards, declared.shards);
            out.push(format!("shards: declared {b}, the cluster has {a}"));
        }
        if self.replication_factor != declared.replication_factor {
            let (a, b) = (self.replication_factor, declared.replication_factor);
            out.push(format!(
                "replication_factor: declared {b}, the cluster has {a}"
            ));
        }
        out.join("; ")
    }
}

/// Everything one node's configuration declares. Every node of a cluster is given the same.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Declarations {
    #[serde(with = "pairs")]
    pub streams: BTreeMap<ObjectKey, StreamSpec>,
    #[serde(with = "pairs")]
    pub caches: BTreeMap<ObjectKey, CacheSpec>,
}

/// A cluster member as it announced itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Where clients reach it; `None` keeps it out of `topology`.
    pub client_addr: Option<String>,
    /// The identity of its disk: a node that comes back with another has lost its state.
    pub storage_id: String,
    /// As the control plane's leader last judged it.
    pub up: bool,
    /// Whether its copies outlive its process. A node without a disk comes back from every
    /// restart with a new identity and empty copies: nothing of its can be waited for.
    #[serde(default = "durable_by_default")]
    pub durable: bool,
}

fn durable_by_default() -> bool {
    true
}

/// A `leader`-consistency shard's leader said, at its generation, that it had acknowledged
/// nothing past `end` and that each of `level` held every record below `end` durably; it
/// then holds any later acknowledgement until the cluster has recorded a
/// [`Command::Resume`]. While this stands, one of `level` may lead in its place without
/// losing an acknowledged record (docs/replication.md, "Who may lead a `leader` shard").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quiet {
    pub end: u64,
    pub level: Vec<NodeId>,
}

/// One shard's current assignment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMeta {
    pub replicas: Vec<NodeId>,
    /// `None` while no qualifying replica can lead it.
    pub leader: Option<NodeId>,
    /// Bumped on every leadership change; never reused.
    pub generation: u64,
    /// Beside `replicas`: the storage identity each replica's copy lives on ("" until the
    /// node first joins). A node back with another identity lost its copy: it counts toward
    /// no fence, no quorum and no promotion until it is rebuilt from a leader.
    #[serde(default)]
    pub replica_storage: Vec<String>,
    /// The leader's last standing word that followers are level with it, at this generation.
    #[serde(default)]
    pub quiet: Option<Quiet>,
    /// The highest `end` a [`Command::Resume`] named at this generation: a quiescence at or
    /// below it is stale (sent before the leader acknowledged past it) and is not applied.
    #[serde(default)]
    pub resumed_at: Option<u64>,
}

impl ShardMeta {
    /// Starts `generation` led by `leader`: what the last leader said of its followers no
    /// longer stands.
    fn lead_at(&mut self, generation: u64, leader: Option<NodeId>) {
        self.generation = generation;
        self.leader = leader;
        self.quiet = None;
        self.resumed_at = None;
    }

    /// The storage identity `node`'s copy lives on, when `node` is a replica.
    pub fn storage_of(&self, node: &NodeId) -> Option<&str> {
        let i = self.replicas.iter().position(|r| r == node)?;
        Some(self.replica_storage.get(i).map_or("", |s| s.as_str()))
    }

    /// Whether `node` holds this shard's copy on the disk the metadata says it has now.
    pub fn holds_copy(&self, node: &NodeId, members: &BTreeMap<NodeId, Member>) -> bool {
        match (self.storage_of(node), members.get(node)) {
            (Some(s), Some(m)) => !s.is_empty() && s == m.storage_id,
            _ => false,
        }
    }
}

/// Which kind of object a shard belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ObjectKind {
    Stream,
    Cache,
}

/// One shard of a stream or cache.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ShardRef {
    pub kind: ObjectKind,
    pub key: ObjectKey,
    pub shard: u32,
}

impl fmt::Display for ShardRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            ObjectKind::Stream => "stream",
            ObjectKind::Cache => "cache",
        };
        write!(f, "{kind} {}#{}", self.key, self.shard)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacedStream {
    pub spec: StreamSpec,
    pub shards: Vec<ShardMeta>,
    /// Which life of this name it is: 0 for the first, one more after each
    /// [`Command::DeleteStream`]. A node whose copies are of another incarnation (it was down
    /// during the delete) removes them before it holds the new one.
    #[serde(default)]
    pub incarnation: u64,
    /// The highest generation the name's deleted lives reached (0 for a first life): every
    /// generation of this life lies above it, so a copy on disk whose replica state records
    /// a generation at or below it is an old life's ([`Applied::Recreated`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub born_above: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What a deleted stream (or cache) leaves in the metadata: the incarnation deleted and the
/// highest generation any of its shards reached. Re-created, the name gets the next incarnation and
/// its shards start above that generation, so no message or copy of the old life is taken
/// for the new one. Removed when the name is re-created (one small entry per name deleted and
/// not re-created).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletedStream {
    pub incarnation: u64,
    pub generation: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacedCache {
    pub spec: CacheSpec,
    pub shards: Vec<ShardMeta>,
    /// As [`PlacedStream::incarnation`].
    #[serde(default)]
    pub incarnation: u64,
    /// As [`PlacedStream::born_above`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub born_above: u64,
}

/// A change to the metadata: the data of one raft entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Command {
    /// A node announces itself (again after every restart; a no-op when nothing changed).
    Join {
        node: NodeId,
        client_addr: Option<String>,
        storage_id: String,
        /// False for a node without a disk (see [`Member::durable`]).
        #[serde(default = "durable_by_default")]
        durable: bool,
    },
    /// A node's declared streams and caches, "ensured": each the cluster does not hold is
    /// created; one it holds keeps the cluster's record (`Applied::DeclaredOtherwise` names
    /// what differs). Refused only when one to create cannot be placed.
    Declare {
        node: NodeId,
        declarations: Declarations,
    },
    /// A stream created by its first publish or subscribe, or by an operator
    /// (`POST /v1/streams`): one command, so a stream is placed whole or not at all. A key
    /// already placed is left as it is, whatever this spec says (the first applied wins;
    /// the admin API then answers `409` naming the field that differs).
    CreateStream { key: ObjectKey, spec: StreamSpec },
    /// A cache created by an operator (`POST /v1/caches`): one command, placed whole. A key
    /// already placed is left as it is (the admin API answers `409` naming what differs).
    CreateCache { key: ObjectKey, spec: CacheSpec },
    /// An operator changed a stream's retention (`PATCH /v1/streams/…`); the only part of a
    /// stream's spec that changes in place (docs/operations.md says why the rest does not).
    AlterStream {
        key: ObjectKey,
        retention: Retention,
    },
    /// The control plane's leader saw a member go quiet, or come back.
    Liveness { node: NodeId, up: bool },
    /// A shard's next generation, led by `leader` (a replica holding its copy), or by nobody
    /// while no replica qualifies. Applied only as the very next generation, so a stale or
    /// repeated proposal changes nothing.
    Promote {
        shard: ShardRef,
        generation: u64,
        leader: Option<NodeId>,
    },
    /// The leader of `shard` at `generation` came back (a restart) to lead it again: the
    /// shard moves to `generation + 1`, led by the same node, so that no node opens one
    /// generation twice. A leader ships records before its own disk holds them, so a copy
    /// may hold, at `generation`, records the restarted leader lost; at a new generation the
    /// epochs tell them apart and the copy is cut (docs/replication.md, "Shipping before the
    /// leader's sync"). Applied only while `leader` leads at exactly `generation`, so it can
    /// never move a shard: any node may ask.
    Reopen {
        shard: ShardRef,
        generation: u64,
        leader: NodeId,
    },
    /// The leader of `shard` at `generation` fed `node`'s copy onto the disk `storage_id` (a
    /// new one: the node came back without its old disk) until it held the leader's whole
    /// log as of its request: the copy lives there from now on, so later fences and
    /// promotions count it. Applied only at that generation (a later leader may not have fed
    /// it) and only while `storage_id` is still the node's disk.
    RecordCopy {
        shard: ShardRef,
        generation: u64,
        node: NodeId,
        storage_id: String,
    },
    /// The leader of a `leader`-consistency shard at `generation` has acknowledged nothing
    /// past `end`, which each of `level` holds durably, and holds later acknowledgements
    /// until a [`Command::Resume`] is applied. Applied only at that generation, while that
    /// node leads, and when `end` is past any `Resume` recorded there.
    Quiesce {
        shard: ShardRef,
        generation: u64,
        end: u64,
        level: Vec<NodeId>,
    },
    /// The leader at `generation` wants to acknowledge past `end`: a quiescence at or below
    /// it no longer stands, and one proposed earlier and applied later is ignored.
    Resume {
        shard: ShardRef,
        generation: u64,
        end: u64,
    },
    /// An operator gives up whatever `shard`'s current holders acknowledged that `leader`
    /// lacks: `leader` leads it at `generation + 1`. `leader` must be a live member; a
    /// replica that holds its copy, or, for a shard of one replica, any member, whose fresh
    /// copy becomes the shard's. The only way a durable shard is led by a node that may
    /// lack acknowledged records.
    Abandon {
        shard: ShardRef,
        generation: u64,
        leader: NodeId,
    },
    /// An operator deletes a stream (`DELETE /v1/streams/…`): one command, so every node
    /// removes its copies as it applies it (or as it catches up, when it was down). Applied
    /// only to that `incarnation`: a re-proposal never deletes the stream re-created since.
    DeleteStream { key: ObjectKey, incarnation: u64 },
    /// As [`Command::DeleteStream`], for a cache (`DELETE /v1/caches/…`).
    DeleteCache { key: ObjectKey, incarnation: u64 },
}

impl Command {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a command always serializes")
    }

    pub fn decode(data: &[u8]) -> Result<Command, String> {
        serde_json::from_slice(data).map_err(|e| e.to_string())
    }
}

/// What applying a command did, for the node to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    Joined(NodeId),
    /// The node's storage identity differs from the one recorded: it lost its disk.
    Rejoined {
        node: NodeId,
        previous_storage: String,
    },
    Declared(NodeId),
    /// A node's declarations were applied, but these objects it declares differ from the
    /// cluster's record, which is kept: each names the object and its differing fields.
    DeclaredOtherwise {
        node: NodeId,
        differences: Vec<String>,
    },
    /// A node's declaration names an object that cannot be created (it could never be
    /// placed): nothing of it was created.
    Refused {
        node: NodeId,
        reason: String,
    },
    Placed(ObjectKey),
    Liveness {
        node: NodeId,
        up: bool,
    },
    Promoted {
        shard: ShardRef,
        generation: u64,
        leader: Option<NodeId>,
    },
    CopyRecorded {
        shard: ShardRef,
        node: NodeId,
        storage_id: String,
    },
    /// An operator's change to a stream's spec was recorded.
    Altered(ObjectKey),
    /// A leader's quiescence or resumption was recorded.
    QuietChanged {
        shard: ShardRef,
    },
    /// An operator gave up what `shard`'s holders had and `leader` lacks.
    Abandoned {
        shard: ShardRef,
        generation: u64,
        leader: NodeId,
    },
    /// A stream's incarnation is gone: every copy of it here must go, its subscriptions end
    /// with `stream_deleted`. Also reported for a snapshot that no longer has it.
    StreamDeleted {
        key: ObjectKey,
        incarnation: u64,
    },
    /// As [`Applied::StreamDeleted`], for a cache.
    CacheDeleted {
        key: ObjectKey,
        incarnation: u64,
    },
    /// Only at start, for each placed stream or cache whose name was deleted before (a later
    /// life, [`PlacedStream::born_above`] above 0). Its old copies here were retired before
    /// the new life's were opened, unless a crash cut the retirement short; then the old
    /// files are still under the name. A copy here whose replica state records a generation
    /// at or below `generation` (the highest the deleted lives reached: every generation of
    /// this life lies above it) is an old life's and must go.
    Recreated {
        kind: ObjectKind,
        key: ObjectKey,
        generation: u64,
    },
    /// Already true: nothing changed.
    Unchanged,
    /// The entry did not decode or named something impossible; applied as nothing, on every
    /// node alike.
    Invalid(String),
}

/// The state machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    /// The voters, sorted: placement's candidates.
    pub voters: Vec<NodeId>,
    pub members: BTreeMap<NodeId, Member>,
    /// The cluster's declarations, once the first node's were applied.
    pub declarations: Option<Declarations>,
    pub declared_by: BTreeMap<NodeId, bool>,
    pub refused: BTreeMap<NodeId, String>,
    #[serde(with = "pairs")]
    pub streams: BTreeMap<ObjectKey, PlacedStream>,
    #[serde(with = "pairs")]
    pub caches: BTreeMap<ObjectKey, PlacedCache>,
    /// Streams deleted and not re-created since ([`DeletedStream`]).
    #[serde(default, with = "pairs")]
    pub deleted_streams: BTreeMap<ObjectKey, DeletedStream>,
    /// Caches deleted and not re-created since.
    #[serde(default, with = "pairs")]
    pub deleted_caches: BTreeMap<ObjectKey, DeletedStream>,
    /// The last raft index applied.
    pub applied: u64,
}

impl Metadata {
    pub fn new(voters: Vec<NodeId>) -> Metadata {
        let mut voters = voters;
        voters.sort();
        Metadata {
            voters,
            members: BTreeMap::new(),
            declarations: None,
            declared_by: BTreeMap::new(),
            refused: BTreeMap::new(),
            streams: BTreeMap::new(),
            caches: BTreeMap::new(),
            deleted_streams: BTreeMap::new(),
            deleted_caches: BTreeMap::new(),
            applied: 0,
        }
    }

    /// Applies the entry at `index` (its raw data; empty entries are raft's own).
    pub fn apply_entry(&mut self, index: u64, data: &[u8]) -> Applied {
        self.applied = index;
        if data.is_empty() {
            return Applied::Unchanged;
        }
        match Command::decode(data) {
            Ok(cmd) => self.apply(&cmd),
            Err(e) => Applied::Invalid(e),
        }
    }

    fn load(&self) -> Load {
        let mut load = Load::default();
        for s in self.streams.values() {
            load.add(&assignments(&s.shards));
        }
        for c in self.caches.values() {
            load.add(&assignments(&c.shards));
        }
        load
    }

    fn apply(&mut self, cmd: &Command) -> Applied {
        match cmd {
            Command::Join {
                node,
                client_addr,
                storage_id,
                durable,
            } => {
                if !self.voters.contains(node) {
                    return Applied::Invalid(format!("{node} is not a voter"));
                }
                let previous = self.members.insert(
                    node.clone(),
                    Member {
                        client_addr: client_addr.clone(),
                        storage_id: storage_id.clone(),
                        up: true,
                        durable: *durable,
                    },
                );
                if !*durable {
                    // A node without a disk never has anything to wait for: its copies are
                    // whatever this process holds, so they live on its new identity.
                    for shard in self.shards_mut() {
                        if let Some(i) = shard.replicas.iter().position(|r| r == node) {
                            if shard.replica_storage.len() < shard.replicas.len() {
                                shard
                                    .replica_storage
                                    .resize(shard.replicas.len(), String::new());
                            }
                            shard.replica_storage[i] = storage_id.clone();
                        }
                    }
                }
                if previous.is_none() {
                    // Copies placed before the node ever joined live on its first disk.
                    for shard in self.shards_mut() {
                        if let Some(i) = shard.replicas.iter().position(|r| r == node) {
                            if shard.replica_storage[i].is_empty() {
                                shard.replica_storage[i] = storage_id.clone();
                            }
                        }
                    }
                }
                match previous {
                    None => Applied::Joined(node.clone()),
                    Some(p) if p.storage_id != *storage_id => Applied::Rejoined {
                        node: node.clone(),
                        previous_storage: p.storage_id,
                    },
                    Some(p) if p.client_addr == *client_addr && p.up && p.durable == *durable => {
                        Applied::Unchanged
                    }
                    Some(_) => Applied::Joined(node.clone()),
                }
            }
            Command::Declare { node, declarations } => {
                if !self.voters.contains(node) {
                    return Applied::Invalid(format!("{node} is not a voter"));
                }
                self.ensure(node, declarations)
            }
            Command::CreateStream { key, spec } => {
                if self.streams.contains_key(key) {
                    return Applied::Unchanged;
                }
                if let Err(e) = self.check(spec.shards, spec.replication_factor) {
                    return Applied::Invalid(format!("stream {key}: {e}"));
                }
                if let Some(e) = retention_error(&spec.retention) {
                    return Applied::Invalid(format!("stream {key}: {e}"));
                }
                self.place_stream(key, *spec);
                Applied::Placed(key.clone())
            }
            Command::CreateCache { key, spec } => {
                if self.caches.contains_key(key) {
                    return Applied::Unchanged;
                }
                if let Err(e) = self.check(spec.shards, spec.replication_factor) {
                    return Applied::Invalid(format!("cache {key}: {e}"));
                }
                self.place_cache(key, *spec);
                Applied::Placed(key.clone())
            }
            Command::AlterStream { key, retention } => {
                if let Some(e) = retention_error(retention) {
                    return Applied::Invalid(format!("stream {key}: {e}"));
                }
                let Some(s) = self.streams.get_mut(key) else {
                    return Applied::Invalid(format!("stream {key} is not placed"));
                };
                if s.spec.retention == *retention {
                    return Applied::Unchanged;
                }
                s.spec.retention = *retention;
                Applied::Altered(key.clone())
            }
            Command::Liveness { node, up } => match self.members.get_mut(node) {
                Some(m) if m.up != *up => {
                    m.up = *up;
                    Applied::Liveness {
                        node: node.clone(),
                        up: *up,
                    }
                }
                Some(_) => Applied::Unchanged,
                None => Applied::Invalid(format!("{node} has not joined")),
            },
            Command::Promote {
                shard,
                generation,
                leader,
            } => {
                let members = self.members.clone();
                let consistency = self.consistency_of(shard);
                let Some(meta) = self.shard_mut(shard) else {
                    return Applied::Invalid(format!("{shard} is not placed"));
                };
                if *generation != meta.generation + 1 {
                    return Applied::Unchanged;
                }
                if let Some(l) = leader {
                    if !meta.holds_copy(l, &members) {
                        return Applied::Invalid(format!(
                            "{l} does not hold a copy of {shard} and cannot lead it"
                        ));
                    }
                }
                if let Err(why) = may_hand_over(meta, consistency, leader.as_ref(), &members) {
                    return Applied::Invalid(format!("{shard}: {why}"));
                }
                meta.lead_at(*generation, leader.clone());
                Applied::Promoted {
                    shard: shard.clone(),
                    generation: *generation,
                    leader: leader.clone(),
                }
            }
            Command::Reopen {
                shard,
                generation,
                leader,
            } => {
                let Some(meta) = self.shard_mut(shard) else {
                    return Applied::Invalid(format!("{shard} is not placed"));
                };
                if meta.generation != *generation || meta.leader.as_ref() != Some(leader) {
                    return Applied::Unchanged;
                }
                meta.lead_at(meta.generation + 1, Some(leader.clone()));
                Applied::Promoted {
                    shard: shard.clone(),
                    generation: meta.generation,
                    leader: Some(leader.clone()),
                }
            }
            Command::RecordCopy {
                shard,
                generation,
                node,
                storage_id,
            } => {
                let disk_now = self.members.get(node).map(|m| m.storage_id.clone());
                let Some(meta) = self.shard_mut(shard) else {
                    return Applied::Invalid(format!("{shard} is not placed"));
                };
                let Some(i) = meta.replicas.iter().position(|r| r == node) else {
                    return Applied::Invalid(format!("{node} holds no copy of {shard}"));
                };
                let current = meta.generation == *generation;
                if !current || disk_now.as_ref() != Some(storage_id) || storage_id.is_empty() {
                    return Applied::Unchanged;
                }
                if meta.replica_storage.len() < meta.replicas.len() {
                    meta.replica_storage
                        .resize(meta.replicas.len(), String::new());
                }
                if meta.replica_storage[i] == *storage_id {
                    return Applied::Unchanged;
                }
                meta.replica_storage[i] = storage_id.clone();
                Applied::CopyRecorded {
                    shard: shard.clone(),
                    node: node.clone(),
                    storage_id: storage_id.clone(),
                }
            }
            Command::Quiesce {
                shard,
                generation,
                end,
                level,
            } => {
                let members = self.members.clone();
                let Some(meta) = self.shard_mut(shard) else {
                    return Applied::Invalid(format!("{shard} is not placed"));
                };
                let stale = meta.resumed_at.is_some_and(|r| *end <= r);
                if meta.generation != *generation || meta.leader.is_none() || stale {
                    return Applied::Unchanged;
                }
                // Only copies the metadata counts (their disk as recorded) can stand in.
                let level: Vec<NodeId> = level
                    .iter()
                    .filter(|n| meta.leader.as_ref() != Some(*n) && meta.holds_copy(n, &members))
                    .cloned()
                    .collect();
                let quiet = Some(Quiet { end: *end, level });
                if meta.quiet == quiet {
                    return Applied::Unchanged;
                }
                meta.quiet = quiet;
                Applied::QuietChanged {
                    shard: shard.clone(),
                }
            }
            Command::Resume {
                shard,
                generation,
                end,
            } => {
                let Some(meta) = self.shard_mut(shard) else {
                    return Applied::Invalid(format!("{shard} is not placed"));
                };
                if meta.generation != *generation || meta.resumed_at.is_some_and(|r| r >= *end) {
                    return Applied::Unchanged;
                }
                meta.resumed_at = Some(*end);
                if meta.quiet.as_ref().is_some_and(|q| q.end <= *end) {
                    meta.quiet = None;
                }
                Applied::QuietChanged {
                    shard: shard.clone(),
                }
            }
            Command::Abandon {
                shard,
                generation,
                leader,
            } => {
                let member = self.members.get(leader).cloned();
                let members = self.members.clone();
                let Some(meta) = self.shard_mut(shard) else {
                    return Applied::Invalid(format!("{shard} is not placed"));
                };
                if meta.generation != *generation {
                    return Applied::Unchanged;
                }
                let Some(member) = member.filter(|m| m.up) else {
                    return Applied::Invalid(format!("{leader} is not a live member"));
                };
                if meta.holds_copy(leader, &members) {
                } else if meta.replicas.len() == 1 {
                    // The one copy is gone with its node: a fresh one on `leader` replaces it.
                    meta.replicas = vec![leader.clone()];
                    meta.replica_storage = vec![member.storage_id.clone()];
                } else {
                    return Applied::Invalid(format!(
                        "{leader} does not hold a copy of {shard}: name a replica that does"
                    ));
                }
                meta.lead_at(generation + 1, Some(leader.clone()));
                Applied::Abandoned {
                    shard: shard.clone(),
                    generation: generation + 1,
                    leader: leader.clone(),
                }
            }
            Command::DeleteStream { key, incarnation } => {
                match self.streams.get(key) {
                    Some(s) if s.incarnation == *incarnation => {}
                    _ => return Applied::Unchanged,
                }
                let s = self.streams.remove(key).expect("present");
                let generation = s.shards.iter().map(|m| m.generation).max().unwrap_or(0);
                let tomb = DeletedStream {
                    incarnation: *incarnation,
                    generation,
                };
                self.deleted_streams.insert(key.clone(), tomb);
                Applied::StreamDeleted {
                    key: key.clone(),
                    incarnation: *incarnation,
                }
            }
            Command::DeleteCache { key, incarnation } => {
                match self.caches.get(key) {
                    Some(c) if c.incarnation == *incarnation => {}
                    _ => return Applied::Unchanged,
                }
                let c = self.caches.remove(key).expect("present");
                let generation = c.shards.iter().map(|m| m.generation).max().unwrap_or(0);
                let tomb = DeletedStream {
                    incarnation: *incarnation,
                    generation,
                };
                self.deleted_caches.insert(key.clone(), tomb);
                Applied::CacheDeleted {
                    key: key.clone(),
                    incarnation: *incarnation,
                }
            }
        }
    }

    /// The stream incarnations this state has and `next` has not (deleted, or deleted and
    /// re-created): what a node installing `next` as a snapshot must remove, as if it had
    /// applied each [`Command::DeleteStream`].
    pub fn streams_gone_in(&self, next: &Metadata) -> Vec<Applied> {
        self.streams
            .iter()
            .filter(|(k, s)| {
                next.streams
                    .get(*k)
                    .is_none_or(|n| n.incarnation != s.incarnation)
            })
            .map(|(k, s)| Applied::StreamDeleted {
                key: k.clone(),
                incarnation: s.incarnation,
            })
            .chain(
                self.caches
                    .iter()
                    .filter(|(k, c)| {
                        next.caches
                            .get(*k)
                            .is_none_or(|n| n.incarnation != c.incarnation)
                    })
                    .map(|(k, c)| Applied::CacheDeleted {
                        key: k.clone(),
                        incarnation: c.incarnation,
                    }),
            )
            .collect()
    }

    /// What an acknowledgement on `shard` promises: a cache's writes are `leader`'s.
    pub fn consistency_of(&self, shard: &ShardRef) -> Consistency {
        match shard.kind {
            ObjectKind::Stream => self
                .streams
                .get(&shard.key)
                .map_or(Consistency::Leader, |s| s.spec.consistency),
            ObjectKind::Cache => Consistency::Leader,
        }
    }

    /// One shard's assignment.
    pub fn shard(&self, shard: &ShardRef) -> Option<&ShardMeta> {
        let shards = match shard.kind {
            ObjectKind::Stream => &self.streams.get(&shard.key)?.shards,
            ObjectKind::Cache => &self.caches.get(&shard.key)?.shards,
        };
        shards.get(shard.shard as usize)
    }

    fn shard_mut(&mut self, shard: &ShardRef) -> Option<&mut ShardMeta> {
        let shards = match shard.kind {
            ObjectKind::Stream => &mut self.streams.get_mut(&shard.key)?.shards,
            ObjectKind::Cache => &mut self.caches.get_mut(&shard.key)?.shards,
        };
        shards.get_mut(shard.shard as usize)
    }

    /// Every placed shard, streams first, each in key then index order.
    pub fn shards(&self) -> impl Iterator<Item = (ShardRef, &ShardMeta)> {
        let streams = self.streams.iter().flat_map(|(k, s)| {
            s.shards.iter().enumerate().map(move |(i, m)| {
                let r = ShardRef {
                    kind: ObjectKind::Stream,
                    key: k.clone(),
                    shard: i as u32,
                };
                (r, m)
            })
        });
        let caches = self.caches.iter().flat_map(|(k, c)| {
            c.shards.iter().enumerate().map(move |(i, m)| {
                let r = ShardRef {
                    kind: ObjectKind::Cache,
                    key: k.clone(),
                    shard: i as u32,
                };
                (r, m)
            })
        });
        streams.chain(caches)
    }

    fn shards_mut(&mut self) -> impl Iterator<Item = &mut ShardMeta> {
        self.streams
            .values_mut()
            .flat_map(|s| s.shards.iter_mut())
            .chain(self.caches.values_mut().flat_map(|c| c.shards.iter_mut()))
    }

    /// A node's declarations are "ensure": every object it declares that the cluster does
    /// not hold is created (all of them checked first, so a declaration that cannot be placed
    /// creates nothing and is refused); one the cluster holds keeps the cluster's record, and
    /// each that differs is named with its differing fields, for the node to warn about.
    fn ensure(&mut self, node: &NodeId, declarations: &Declarations) -> Applied {
        let new_streams = declarations.streams.iter().filter(|(k, _)| {
            !self.streams.contains_key(*k) && !self.deleted_streams.contains_key(*k)
        });
        for (k, s) in new_streams {
            let bad = self
                .check(s.shards, s.replication_factor)
                .map_err(|e| e.to_string());
            let bad = bad
                .err()
                .or_else(|| retention_error(&s.retention).map(|e| e.to_string()));
            if let Some(e) = bad {
                return self.refuse(node, format!("stream {k}: {e}"));
            }
        }
        for (k, c) in declarations
            .caches
            .iter()
            .filter(|(k, _)| !self.caches.contains_key(*k) && !self.deleted_caches.contains_key(*k))
        {
            if let Err(e) = self.check(c.shards, c.replication_factor) {
                return self.refuse(node, format!("cache {k}: {e}"));
            }
        }
        let (mut created, mut differences) = (false, Vec::new());
        // An operator's delete wins over a configuration: a deleted name is not brought back by
        // a node's declarations (only by a create, or by first use).
        let gone = "deleted by an operator; not created again from a configuration (create it with the admin API)";
        for (k, s) in &declarations.streams {
            match self.streams.get(k) {
                None if self.deleted_streams.contains_key(k) => {
                    differences.push(format!("stream {k}: {gone}"));
                }
                None => {
                    self.place_stream(k, *s);
                    created = true;
                }
                Some(p) if p.spec != *s => {
                    differences.push(format!("stream {k}: {}", p.spec.differences(s)));
                }
                Some(_) => {}
            }
        }
        for (k, c) in &declarations.caches {
            match self.caches.get(k) {
                None if self.deleted_caches.contains_key(k) => {
                    differences.push(format!("cache {k}: {gone}"));
                }
                None => {
                    self.place_cache(k, *c);
                    created = true;
                }
                Some(p) if p.spec != *c => {
                    differences.push(format!("cache {k}: {}", p.spec.differences(c)));
                }
                Some(_) => {}
            }
        }
        if self.declarations.is_none() {
            self.declarations = Some(declarations.clone());
        }
        self.refused.remove(node);
        let first = self.declared_by.insert(node.clone(), true).is_none();
        if !differences.is_empty() {
            Applied::DeclaredOtherwise {
                node: node.clone(),
                differences,
            }
        } else if created || first {
            Applied::Declared(node.clone())
        } else {
            Applied::Unchanged
        }
    }

    fn refuse(&mut self, node: &NodeId, reason: String) -> Applied {
        self.refused.insert(node.clone(), reason.clone());
        Applied::Refused {
            node: node.clone(),
            reason,
        }
    }

    /// Whether an operator's `spec` can be created here, naming the field that cannot: what
    /// the admin API answers `400` for, before anything is proposed. Names are the caller's
    /// to check (the protocol's rule lives with the broker).
    pub fn check_stream_spec(&self, spec: &StreamSpec) -> Result<(), SpecError> {
        if spec.shards == 0 || spec.shards > MAX_STREAM_SHARDS {
            return Err(SpecError {
                field: "shards",
                why: format!("must be 1..={MAX_STREAM_SHARDS}, not {}", spec.shards),
            });
        }
        if let Err(e) = self.check(spec.shards, spec.replication_factor) {
            return Err(SpecError {
                field: "replication_factor",
                why: e.to_string(),
            });
        }
        if let Some(e) = retention_error(&spec.retention) {
            return Err(e);
        }
        Ok(())
    }

    fn check(&self, shards: u32, rf: u8) -> Result<(), placement::PlacementError> {
        // A dry run on a scratch load: the same checks `place` makes.
        placement::place(&self.voters, &mut Load::default(), "", shards.min(1), rf).map(|_| ())?;
        if shards == 0 {
            return Err(placement::PlacementError::NoShards);
        }
        Ok(())
    }

    fn place(&mut self, key: &ObjectKey, kind: &str, shards: u32, rf: u8) -> Vec<ShardMeta> {
        let mut load = self.load();
        let name = format!("{kind}:{key}");
        placement::place(&self.voters, &mut load, &name, shards, rf)
            .expect("checked before placing")
            .into_iter()
            .map(|a| ShardMeta {
                leader: Some(a.leader().clone()),
                replica_storage: a
                    .replicas
                    .iter()
                    .map(|r| {
                        self.members
                            .get(r)
                            .map_or(String::new(), |m| m.storage_id.clone())
                    })
                    .collect(),
                replicas: a.replicas,
                generation: 1,
                quiet: None,
                resumed_at: None,
            })
            .collect()
    }

    fn place_stream(&mut self, key: &ObjectKey, spec: StreamSpec) {
        let mut shards = self.place(key, "stream", spec.shards, spec.replication_factor);
        // A name deleted before starts its next life above everything of the last.
        let tomb = self.deleted_streams.remove(key);
        let incarnation = tomb.map_or(0, |t| t.incarnation + 1);
        for m in &mut shards {
            m.generation += tomb.map_or(0, |t| t.generation);
        }
        let placed = PlacedStream {
            spec,
            shards,
            incarnation,
            born_above: tomb.map_or(0, |t| t.generation),
        };
        self.streams.insert(key.clone(), placed);
    }

    fn place_cache(&mut self, key: &ObjectKey, spec: CacheSpec) {
        let mut shards = self.place(key, "cache", spec.shards, spec.replication_factor);
        let tomb = self.deleted_caches.remove(key);
        for m in &mut shards {
            m.generation += tomb.map_or(0, |t| t.generation);
        }
        let incarnation = tomb.map_or(0, |t| t.incarnation + 1);
        let placed = PlacedCache {
            spec,
            shards,
            incarnation,
            born_above: tomb.map_or(0, |t| t.generation),
        };
        self.caches.insert(key.clone(), placed);
    }

    /// Members that can serve and have a client address, in name order: `topology`'s answer.
    pub fn serving_members(&self) -> impl Iterator<Item = (&NodeId, &str)> {
        self.members
            .iter()
            .filter(|(_, m)| m.up)
            .filter_map(|(n, m)| m.client_addr.as_deref().map(|a| (n, a)))
    }

    /// Serializes the whole state: a raft snapshot's data.
    pub fn snapshot(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("metadata always serializes")
    }

    pub fn restore(data: &[u8]) -> Result<Metadata, String> {
        serde_json::from_slice(data).map_err(|e| e.to_string())
    }
}

/// A retention of zero would keep nothing: refused, naming the field.
fn retention_error(r: &Retention) -> Option<SpecError> {
    let zero = |field: &'static str| SpecError {
        field,
        why: "0 would keep nothing: leave it out for the broker-wide setting".into(),
    };
    match (r.max_age_seconds, r.max_bytes) {
        (Some(0), _) => Some(zero("retention.max_age_seconds")),
        (_, Some(0)) => Some(zero("retention.max_bytes")),
        _ => None,
    }
}

/// Whether `shard` may pass from its leader to `next` without losing an acknowledged record.
///
/// A `quorum` shard always may: its acknowledged records are on a majority, and the named
/// node fences a majority and adopts the most advanced copy before it serves. A `leader`
/// shard acknowledges on its leader's own disk, so while that leader still holds its copy
/// (it may only have crashed), only a replica its last standing quiescence named level may
/// take it; nobody else, and not "nobody" either: the shard waits for its leader. A leader
/// whose copy is gone (back on an empty disk) lost what only it held, the one loss the spec
/// allows: any replica holding a copy may then lead.
pub fn may_hand_over(
    shard: &ShardMeta,
    consistency: Consistency,
    next: Option<&NodeId>,
    members: &BTreeMap<NodeId, Member>,
) -> Result<(), String> {
    let Some(current) = &shard.leader else {
        return Ok(());
    };
    if consistency == Consistency::Quorum
        || !shard.holds_copy(current, members)
        || next == Some(current)
        || shard.replicas.len() == 1 && next.is_none()
    {
        return Ok(());
    }
    match (&shard.quiet, next) {
        (Some(q), Some(n)) if q.level.contains(n) => Ok(()),
        (_, None) => Err(format!(
            "{current} may hold acknowledged records no other replica has: the shard waits for it"
        )),
        (_, Some(n)) => Err(format!(
            "{n} is not known to hold every record {current} acknowledged"
        )),
    }
}

fn assignments(shards: &[ShardMeta]) -> Vec<ShardAssignment> {
    shards
        .iter()
        .map(|s| {
            // Count the current leader first so moves are balanced by who serves now.
            let mut replicas = s.replicas.clone();
            if let Some(l) = &s.leader {
                if let Some(i) = replicas.iter().position(|r| r == l) {
                    replicas.swap(0, i);
                }
            }
            ShardAssignment { replicas }
        })
        .collect()
}

/// Maps keyed by [`ObjectKey`] as lists of pairs: JSON object keys must be strings, and a list
/// keeps the map's order on the wire too.
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<K: Serialize, V: Serialize, S: Serializer>(
        map: &BTreeMap<K, V>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_seq(map.iter())
    }

    pub(super) fn deserialize<'de, K, V, D>(d: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        Ok(Vec::<(K, V)>::deserialize(d)?.into_iter().collect())
    }
}

#[cfg(test)]
mod tests;
