//! A session's side of the cluster: which shard a request is for, and what to answer when
//! another node leads it (felix-cluster's `routing` decides; this file only applies it).

use felix_cluster::routing::{route, RequestClass, Route};
use felix_proto::message::{
    BrokerEndpoint, ErrorMessage, Message, NotLeader, PublishError, ShardKind, ShardOwner,
    ShardOwnersView, TopologyView,
};
use felix_proto::routing::shard_for_key;
use felix_proto::{ErrorCode, Features};

use super::{Session, SessionCx};
use crate::broker::encode_message;

/// The shard a request is for.
pub(super) struct Target<'a> {
    class: RequestClass,
    cache: bool,
    tenant: &'a str,
    namespace: &'a str,
    name: &'a str,
    shard: Option<u64>,
    key: Option<&'a [u8]>,
    /// How a refusal is shaped for this request.
    answer: Answer,
}

#[derive(Clone, Copy)]
enum Answer {
    /// A JSON publish: `publish_error` for this request id.
    JsonPublish(Option<u64>),
    /// A binary publish: a failed ack for this request id (none for an unacked one).
    BinaryAck(Option<u64>),
    /// Everything else: an `error` (or `not_leader` where that may be sent).
    Error,
}

macro_rules! stream_target {
    ($class:expr, $m:expr, $shard:expr, $key:expr, $answer:expr) => {
        Some(Target {
            class: $class,
            cache: false,
            tenant: &$m.tenant_id,
            namespace: &$m.namespace,
            name: &$m.stream,
            shard: $shard,
            key: $key,
            answer: $answer,
        })
    };
}

macro_rules! cache_target {
    ($class:expr, $m:expr) => {
        Some(Target {
            class: $class,
            cache: true,
            tenant: &$m.tenant_id,
            namespace: &$m.namespace,
            name: &$m.cache,
            shard: None,
            key: None,
            answer: Answer::Error,
        })
    };
}

/// A binary publish batch's shard.
pub(super) fn binary_publish_target<'a>(
    (tenant, namespace, name): (&'a str, &'a str, &'a str),
    key: Option<&'a [u8]>,
    request_id: Option<u64>,
) -> Target<'a> {
    Target {
        class: RequestClass::Publish,
        cache: false,
        tenant,
        namespace,
        name,
        shard: None,
        key,
        answer: Answer::BinaryAck(request_id),
    }
}

/// The shard `msg` is for, and how it routes; `None` for a request any node answers.
pub(super) fn target(msg: &Message) -> Option<Target<'_>> {
    use RequestClass as C;
    match msg {
        Message::Publish(p) => {
            let answer = Answer::JsonPublish(p.request_id);
            stream_target!(C::Publish, p, p.shard, p.key.as_deref(), answer)
        }
        Message::PublishBatch(p) => {
            let answer = Answer::JsonPublish(p.request_id);
            stream_target!(C::Publish, p, p.shard, p.key.as_deref(), answer)
        }
        Message::Subscribe(s) => stream_target!(C::Subscribe, s, s.shard, None, Answer::Error),
        Message::Commit(c) => stream_target!(C::LeaderOnly, c, c.shard, None, Answer::Error),
        Message::PublishIf(p) => {
            stream_target!(C::LeaderOnly, p, p.shard, p.key.as_deref(), Answer::Error)
        }
        Message::PublishIdempotent(p) => {
            stream_target!(C::LeaderOnly, p, p.shard, p.key.as_deref(), Answer::Error)
        }
        Message::StateGet(g) => stream_target!(C::LeaderOnly, g, g.shard, None, Answer::Error),
        Message::StreamRead(r) => {
            stream_target!(C::LeaderOnly, r, Some(r.shard), None, Answer::Error)
        }
        Message::OffsetForTime(o) => {
            stream_target!(C::LeaderOnly, o, Some(o.shard), None, Answer::Error)
        }
        Message::GroupPoll(g) => stream_target!(C::Group, g, Some(g.shard), None, Answer::Error),
        Message::GroupAck(g) => stream_target!(C::Group, g, Some(g.shard), None, Answer::Error),
        Message::GroupNack(g) => stream_target!(C::Group, g, Some(g.shard), None, Answer::Error),
        Message::GroupExtend(g) => stream_target!(C::Group, g, Some(g.shard), None, Answer::Error),
        Message::GroupDeadLetter(g) => {
            stream_target!(C::Group, g, Some(g.shard), None, Answer::Error)
        }
        Message::GroupDeadLetters(g) => {
            stream_target!(C::Group, g, Some(g.shard), None, Answer::Error)
        }
        Message::GroupDiscard(g) => stream_target!(C::Group, g, Some(g.shard), None, Answer::Error),
        Message::GroupRedrive(g) => stream_target!(C::Group, g, Some(g.shard), None, Answer::Error),
        Message::GroupSeek(g) => stream_target!(C::Group, g, Some(g.shard), None, Answer::Error),
        Message::GroupDescribe(g) => {
            stream_target!(C::Group, g, Some(g.shard), None, Answer::Error)
        }
        Message::GroupDelete(g) => stream_target!(C::Group, g, Some(g.shard), None, Answer::Error),
        Message::CacheWatch(w) => cache_target!(C::CacheWatch, w),
        Message::CachePut(p) => cache_target!(C::CacheOp, p),
        Message::CacheGet(g) => cache_target!(C::CacheOp, g),
        Message::CacheDelete(d) => cache_target!(C::CacheOp, d),
        Message::CounterAdd(a) => cache_target!(C::CacheOp, a),
        Message::CounterGet(g) => cache_target!(C::CacheOp, g),
        Message::CachePutIf(p) => cache_target!(C::CacheOp, p),
        Message::CacheDeleteIf(d) => cache_target!(C::CacheOp, d),
        _ => None,
    }
}

impl Session {
    /// In a cluster, answers a request for a shard this node does not lead and returns true;
    /// returns false when the request is served here (or there is no cluster).
    pub(super) fn answered_elsewhere(&mut self, t: &Target<'_>, cx: &mut SessionCx<'_>) -> bool {
        let Some(cluster) = cx.core.cluster.as_mut() else {
            return false;
        };
        let owner = if t.cache {
            cluster.cache_owner(t.tenant, t.namespace, t.name)
        } else {
            match cluster.stream_width(t.tenant, t.namespace, t.name) {
                Some(width) => {
                    let shard = match t.shard {
                        Some(s) => u32::try_from(s).unwrap_or(u32::MAX),
                        None => shard_for_key(t.key, width, cx.core.routing_mapping),
                    };
                    cluster.stream_owner(t.tenant, t.namespace, t.name, shard)
                }
                None => None,
            }
        };
        let owner = match owner {
            Some(o) => o,
            None => {
                // Not placed yet: a stream is placed on first use, and this request is
                // refused so that its retry finds the placement.
                if !t.cache {
                    let shards = cx.core.default_shards;
                    cluster.place_stream(cx.now, t.tenant, t.namespace, t.name, shards);
                }
                let what = if t.cache { "cache" } else { "stream" };
                let message = format!(
                    "{what} {}/{}/{} is not placed in the cluster yet; retry",
                    t.tenant, t.namespace, t.name
                );
                self.refuse_routed(t, ErrorCode::ShardUnavailable, message);
                return true;
            }
        };
        let redirect = self.negotiated().features.contains(Features::REDIRECT);
        match route(t.class, &owner, redirect) {
            Route::Serve => false,
            Route::Redirect {
                node,
                addr,
                generation,
            } => {
                self.push_message(&Message::NotLeader(NotLeader {
                    node_id: node.0,
                    addr,
                    generation,
                }));
                true
            }
            Route::NotLeaderError { node } => {
                let message = format!("shard is led by {node}");
                self.refuse_routed(t, ErrorCode::NotLeader, message);
                true
            }
            Route::Forward { to } => {
                // Forwarding is not wired yet: the client's own routing (shard_owners) sends
                // these to the owner, and a stale route gets a redirect-class refusal.
                let message = format!("shard is led by {to}; send it there");
                self.refuse_routed(t, ErrorCode::NotLeader, message);
                true
            }
            Route::Unavailable(why) => {
                let message = format!("no node serves this shard ({})", why.reason());
                self.refuse_routed(t, ErrorCode::ShardUnavailable, message);
                true
            }
        }
    }

    fn refuse_routed(&mut self, t: &Target<'_>, code: ErrorCode, message: String) {
        let coded = self.negotiated().error_codes();
        match t.answer {
            Answer::JsonPublish(Some(request_id)) => {
                self.push_message(&Message::PublishError(PublishError {
                    request_id,
                    message,
                    retry: coded.then_some(code.default_retry()),
                    code: coded.then_some(code),
                    detail: None,
                }))
            }
            Answer::BinaryAck(Some(id)) => self.push_ack_error(id, code, &message),
            // Nobody waits for an unacked publish.
            Answer::BinaryAck(None) => {}
            _ => {
                let msg = if coded {
                    ErrorMessage::coded(code, message)
                } else {
                    ErrorMessage::plain(message)
                };
                self.push_frame(encode_message(&Message::Error(msg)));
            }
        }
    }

    /// The cluster's `topology`: every serving member at its advertised address.
    pub(super) fn cluster_topology(&mut self, cx: &SessionCx<'_>) -> bool {
        let Some(cluster) = cx.core.cluster.as_ref() else {
            return false;
        };
        let brokers = cluster
            .topology()
            .into_iter()
            .map(|(node_id, addr)| BrokerEndpoint { node_id, addr })
            .collect();
        self.push_message(&Message::TopologyView(TopologyView { brokers }));
        true
    }

    /// `shard_owners` from the metadata; `None` outside a cluster or for an object not
    /// placed (the caller answers as a single node would).
    pub(super) fn cluster_owners(
        &self,
        cx: &SessionCx<'_>,
        kind: ShardKind,
        names: (&str, &str, &str),
        request_id: u64,
    ) -> Option<Message> {
        let cluster = cx.core.cluster.as_ref()?;
        let cache = matches!(kind, ShardKind::Cache);
        let owners = cluster.owners(cache, names.0, names.1, names.2)?;
        Some(Message::ShardOwnersView(ShardOwnersView {
            request_id,
            owners: owners
                .into_iter()
                .enumerate()
                .map(|(shard, o)| ShardOwner {
                    shard: shard as u64,
                    unavailable: o.node_id.is_none().then(|| "not_assigned".to_owned()),
                    node_id: o.node_id,
                    addr: o.addr,
                    generation: Some(o.generation),
                })
                .collect(),
        }))
    }
}
