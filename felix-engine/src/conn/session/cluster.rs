//! A session's side of the cluster: which shard a request is for, and what to answer when
//! another node leads it (felix-cluster's `routing` decides; this file only applies it).

use felix_cluster::routing::{route, RequestClass, Route};
use felix_proto::message::{
    BrokerEndpoint, ErrorMessage, Message, NotLeader, PublishError, ShardKind, ShardOwner,
    ShardOwnersView, TopologyView,
};
use felix_proto::{ErrorCode, Features};

use bytes::Bytes;
use felix_auth::{cache_object, name_charset_ok, stream_object, Action, NAME_MAX_BYTES};
use felix_cluster::routing::Owner;
use felix_proto::binary::{AckOwner, PublishAck};
use felix_proto::Flags;

use super::{FailAnswer, Held, Session, SessionCx};
use crate::broker::encode_message;
use crate::router::{ForwardOutcome, Located, ShardAsk};

/// A session's forward channel (ids: channel in the high half, sequence in the low).
pub(crate) struct Forwarding {
    channel: u32,
    seq: u32,
    /// Nodes the channel's `auth` has been sent to.
    opened: Vec<String>,
}

/// A forwarded request's place among the session's answers.
pub(crate) struct HeldForward {
    forward_id: u64,
    pub(super) answer: Option<Bytes>,
    fail: FailAnswer,
    /// Set the `0x0080` owner on a forwarded binary ack (the client offered it).
    hint: Option<AckOwner>,
}

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
    /// The request is owed an answer (forwards of one that is not hold no place).
    expects_answer: bool,
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
            expects_answer: true,
        })
    };
}

/// A cache request routes by its item key's shard (a prefix watch by the shard it names).
macro_rules! cache_target {
    ($class:expr, $m:expr, $shard:expr, $key:expr) => {
        Some(Target {
            class: $class,
            cache: true,
            tenant: &$m.tenant_id,
            namespace: &$m.namespace,
            name: &$m.cache,
            shard: $shard,
            key: $key,
            answer: Answer::Error,
            expects_answer: true,
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
        expects_answer: request_id.is_some(),
    }
}

/// How a request routes and whether it is owed an answer (the forwarding node and the leader
/// must agree on the second, so both ask this).
pub(crate) fn routing_target(msg: &Message) -> Option<(RequestClass, bool)> {
    target(msg).map(|t| (t.class, t.expects_answer))
}

/// A JSON publish is answered unless it asked for no ack (as the session's own rule).
fn acked(ack: Option<felix_proto::message::AckMode>) -> bool {
    ack.unwrap_or(felix_proto::message::AckMode::None) != felix_proto::message::AckMode::None
}

/// The shard `msg` is for, and how it routes; `None` for a request any node answers.
pub(super) fn target(msg: &Message) -> Option<Target<'_>> {
    use RequestClass as C;
    match msg {
        Message::Publish(p) => {
            let answer = Answer::JsonPublish(p.request_id);
            let t = stream_target!(C::Publish, p, p.shard, p.key.as_deref(), answer);
            t.map(|t| Target {
                expects_answer: acked(p.ack),
                ..t
            })
        }
        Message::PublishBatch(p) => {
            let answer = Answer::JsonPublish(p.request_id);
            let t = stream_target!(C::Publish, p, p.shard, p.key.as_deref(), answer);
            t.map(|t| Target {
                expects_answer: acked(p.ack),
                ..t
            })
        }
        Message::Subscribe(s) => stream_target!(C::Subscribe, s, s.shard, None, Answer::Error),
        // Routed by the entity key, as the broker places the commit: routed as shard 0, a
        // commit for another shard ran on shard 0's leader, on its follower copy.
        Message::Commit(c) => stream_target!(
            C::LeaderOnly,
            c,
            c.shard,
            Some(&c.entity_key[..]),
            Answer::Error
        ),
        Message::PublishIf(p) => {
            stream_target!(C::LeaderOnly, p, p.shard, p.key.as_deref(), Answer::Error)
        }
        Message::PublishIdempotent(p) => {
            stream_target!(C::LeaderOnly, p, p.shard, p.key.as_deref(), Answer::Error)
        }
        Message::StateGet(g) => stream_target!(
            C::LeaderOnly,
            g,
            g.shard,
            Some(&g.entity_key[..]),
            Answer::Error
        ),
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
        Message::CacheWatch(w) => match &w.key {
            Some(k) => cache_target!(C::CacheWatch, w, None, Some(k.as_bytes())),
            None => cache_target!(C::CacheWatch, w, w.shard, None),
        },
        Message::CachePut(p) => cache_target!(C::CacheOp, p, None, Some(p.key.as_bytes())),
        Message::CacheGet(g) => cache_target!(C::CacheOp, g, None, Some(g.key.as_bytes())),
        Message::CacheDelete(d) => cache_target!(C::CacheOp, d, None, Some(d.key.as_bytes())),
        Message::CounterAdd(a) => cache_target!(C::CacheOp, a, None, Some(a.key.as_bytes())),
        Message::CounterGet(g) => cache_target!(C::CacheOp, g, None, Some(g.key.as_bytes())),
        Message::CachePutIf(p) => cache_target!(C::CacheOp, p, None, Some(p.key.as_bytes())),
        Message::CacheDeleteIf(d) => {
            cache_target!(C::CacheOp, d, None, Some(d.key.as_bytes()))
        }
        _ => None,
    }
}

/// The permission a routed request needs and the object it is checked on; the object is
/// `None` when the names cannot form one (the request's handler refuses it as malformed).
/// Each arm is the check its handler makes, so a node checks it before routing: a request
/// the identity may not make is refused where it arrived, never forwarded or redirected.
pub(super) fn permission(msg: &Message) -> Option<(Action, Option<String>)> {
    use Action as A;
    let stream = |action, t: &str, n: &str, s: &str| Some((action, stream_object(t, n, s)));
    let cache = |action, t: &str, n: &str, c: &str| Some((action, cache_object(t, n, c)));
    let group = |action, t: &str, n: &str, s: &str, g: &str| {
        let ok = (1..=NAME_MAX_BYTES).contains(&g.len()) && name_charset_ok(g);
        let object = stream_object(t, n, s)
            .filter(|_| ok)
            .map(|o| format!("group:{}/{g}", &o["stream:".len()..]));
        Some((action, object))
    };
    match msg {
        Message::Publish(m) => stream(A::StreamPublish, &m.tenant_id, &m.namespace, &m.stream),
        Message::PublishBatch(m) => stream(A::StreamPublish, &m.tenant_id, &m.namespace, &m.stream),
        Message::Commit(m) => stream(A::StreamPublish, &m.tenant_id, &m.namespace, &m.stream),
        Message::PublishIf(m) => stream(A::StreamPublish, &m.tenant_id, &m.namespace, &m.stream),
        Message::PublishIdempotent(m) => {
            stream(A::StreamPublish, &m.tenant_id, &m.namespace, &m.stream)
        }
        Message::Subscribe(m) => stream(A::StreamSubscribe, &m.tenant_id, &m.namespace, &m.stream),
        Message::StateGet(m) => stream(A::StreamSubscribe, &m.tenant_id, &m.namespace, &m.stream),
        Message::StreamRead(m) => stream(A::StreamSubscribe, &m.tenant_id, &m.namespace, &m.stream),
        Message::OffsetForTime(m) => {
            stream(A::StreamSubscribe, &m.tenant_id, &m.namespace, &m.stream)
        }
        Message::GroupPoll(m) => group(
            A::GroupConsume,
            &m.tenant_id,
            &m.namespace,
            &m.stream,
            &m.group,
        ),
        Message::GroupAck(m) => group(
            A::GroupConsume,
            &m.tenant_id,
            &m.namespace,
            &m.stream,
            &m.group,
        ),
        Message::GroupNack(m) => group(
            A::GroupConsume,
            &m.tenant_id,
            &m.namespace,
            &m.stream,
            &m.group,
        ),
        Message::GroupExtend(m) => group(
            A::GroupConsume,
            &m.tenant_id,
            &m.namespace,
            &m.stream,
            &m.group,
        ),
        Message::GroupDeadLetter(m) => group(
            A::GroupConsume,
            &m.tenant_id,
            &m.namespace,
            &m.stream,
            &m.group,
        ),
        Message::GroupDeadLetters(m) => group(
            A::GroupConsume,
            &m.tenant_id,
            &m.namespace,
            &m.stream,
            &m.group,
        ),
        Message::GroupDescribe(m) => group(
            A::GroupConsume,
            &m.tenant_id,
            &m.namespace,
            &m.stream,
            &m.group,
        ),
        Message::GroupDiscard(m) => group(
            A::GroupManage,
            &m.tenant_id,
            &m.namespace,
            &m.stream,
            &m.group,
        ),
        Message::GroupRedrive(m) => group(
            A::GroupManage,
            &m.tenant_id,
            &m.namespace,
            &m.stream,
            &m.group,
        ),
        Message::GroupSeek(m) => group(
            A::GroupManage,
            &m.tenant_id,
            &m.namespace,
            &m.stream,
            &m.group,
        ),
        Message::GroupDelete(m) => group(
            A::GroupManage,
            &m.tenant_id,
            &m.namespace,
            &m.stream,
            &m.group,
        ),
        Message::CacheWatch(m) => cache(A::CacheRead, &m.tenant_id, &m.namespace, &m.cache),
        Message::CacheGet(m) => cache(A::CacheRead, &m.tenant_id, &m.namespace, &m.cache),
        Message::CounterGet(m) => cache(A::CacheRead, &m.tenant_id, &m.namespace, &m.cache),
        Message::CachePut(m) => cache(A::CacheWrite, &m.tenant_id, &m.namespace, &m.cache),
        Message::CacheDelete(m) => cache(A::CacheWrite, &m.tenant_id, &m.namespace, &m.cache),
        Message::CounterAdd(m) => cache(A::CacheWrite, &m.tenant_id, &m.namespace, &m.cache),
        Message::CachePutIf(m) => cache(A::CacheWrite, &m.tenant_id, &m.namespace, &m.cache),
        Message::CacheDeleteIf(m) => cache(A::CacheWrite, &m.tenant_id, &m.namespace, &m.cache),
        _ => None,
    }
}

/// Whether a request may go on to routing.
pub(super) enum MayRoute {
    /// The identity holds the permission: route it.
    Yes,
    /// Malformed names: not routed; its handler refuses it here.
    Handler,
    /// Refused `forbidden` here, already answered.
    Refused,
}

impl Session {
    /// Checks the permission `msg` needs before it is routed (see [`permission`]).
    pub(super) fn may_route(&mut self, msg: &Message, t: &Target<'_>) -> MayRoute {
        let Some((action, object)) = permission(msg) else {
            return MayRoute::Yes;
        };
        let Some(object) = object else {
            return MayRoute::Handler;
        };
        let identity = &self.auth.as_ref().expect("authenticated").identity;
        if identity.allows(action, &object) {
            return MayRoute::Yes;
        }
        let message = format!("{action} is not granted on {object}");
        self.refuse_routed(t, ErrorCode::Forbidden, message);
        MayRoute::Refused
    }

    /// It forwarded requests to other nodes (it has a forward channel).
    pub(crate) fn has_forwarded(&self) -> bool {
        self.auth.as_ref().is_some_and(|a| a.forwarding.is_some())
    }

    /// In a cluster, answers a request for a shard this node does not lead and returns true;
    /// returns false when the request is served here (or there is no cluster).
    pub(super) fn answered_elsewhere(&mut self, t: &Target<'_>, cx: &mut SessionCx<'_>) -> bool {
        let Some(router) = cx.core.router.as_mut() else {
            return false;
        };
        let ask = ShardAsk {
            cache: t.cache,
            names: (t.tenant, t.namespace, t.name),
            shard: t.shard,
            key: t.key,
        };
        let (shard, owner) = match router.locate(&ask, cx.core.routing_mapping) {
            Located::Handler => {
                self.placement_deadline = None;
                return false;
            }
            Located::Shard { shard, owner } => (shard, owner),
            Located::NotPlaced if !t.cache && !router.places_streams_on_first_use() => {
                // Only declared streams exist here: this one never will.
                self.placement_deadline = None;
                let message = format!(
                    "stream {}/{}/{} is not declared in the cluster ([[streams]] in the \
                     configuration)",
                    t.tenant, t.namespace, t.name
                );
                self.refuse_routed(t, ErrorCode::NotFound, message);
                return true;
            }
            Located::NotPlaced => {
                // Not placed yet: a stream is placed on first use. The request (and the rest
                // of its stream, which keeps their order) waits for the placement to apply,
                // for at most the forward timeout; a plain `publish()` of the real client makes
                // one attempt, so a refusal here would fail a first publish that did nothing
                // wrong. A forwarded request is not held: its forwarding node holds it.
                if !t.cache && !cx.core.forwarding_here {
                    let deadline = *self
                        .placement_deadline
                        .get_or_insert(cx.now + router.forward_timeout());
                    if cx.now < deadline {
                        let shards = cx.core.default_shards;
                        router.place_stream(cx.now, (t.tenant, t.namespace, t.name), shards);
                        self.stall_placement = true;
                        return true;
                    }
                }
                self.placement_deadline = None;
                let what = if t.cache { "cache" } else { "stream" };
                let message = if t.cache {
                    format!(
                        "cache {}/{}/{} is not declared in the cluster ([[caches]] in the \
                         configuration)",
                        t.tenant, t.namespace, t.name
                    )
                } else {
                    format!(
                        "{what} {}/{}/{} was not placed in the cluster in time; retry",
                        t.tenant, t.namespace, t.name
                    )
                };
                self.refuse_routed(t, ErrorCode::ShardUnavailable, message);
                return true;
            }
        };
        if matches!(owner, Owner::Local) {
            // Led here by the metadata, but a write (or a read of a copy being brought level)
            // needs this node's lease, and a replicated shard's fence done at the generation.
            let names = (t.tenant, t.namespace, t.name);
            if let Err(why) = router.ready_here(cx.now, t.cache, t.class, names, shard) {
                // Usually a matter of one round trip (a lease renewal, a fence): the request
                // and the rest of its stream wait for it, as for a placement, for at most the
                // forward timeout. A forwarded one waits half that: its forwarding node gives
                // up on it after the whole timeout, and must hear the refusal first (a
                // refusal is retryable; a forward that timed out has an unknown outcome).
                let hold = if cx.core.forwarding_here {
                    router.forward_timeout() / 2
                } else {
                    router.forward_timeout()
                };
                let deadline = *self.placement_deadline.get_or_insert(cx.now + hold);
                if cx.now < deadline {
                    self.stall_placement = true;
                    return true;
                }
                self.placement_deadline = None;
                self.refuse_routed(t, ErrorCode::ShardUnavailable, why.to_owned());
                return true;
            }
        }
        self.placement_deadline = None;
        let redirect = self.negotiated().features.contains(Features::REDIRECT);
        let (owner_addr, generation) = match &owner {
            Owner::Remote {
                addr, generation, ..
            } => (addr.clone(), *generation),
            _ => (None, 0),
        };
        match route(t.class, &owner, redirect) {
            Route::Serve => {
                let publish = matches!(t.answer, Answer::JsonPublish(_) | Answer::BinaryAck(_));
                if publish && !t.cache && matches!(owner, Owner::Local) {
                    router.note_write((t.tenant, t.namespace, t.name), shard);
                }
                false
            }
            Route::Redirect {
                node,
                addr,
                generation,
            } => {
                cx.core.metrics.redirects += 1;
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
            // A forwarded request runs here only because this node leads it; metadata that
            // says otherwise must not send it round again.
            Route::Forward { to } if cx.core.forwarding_here => {
                let message = format!("shard is led by {to}");
                self.refuse_routed(t, ErrorCode::NotLeader, message);
                true
            }
            Route::Forward { to } => {
                let hint = AckOwner {
                    node_id: to.0.clone(),
                    addr: owner_addr,
                    generation,
                };
                self.forward(t, &to, shard, hint, cx);
                true
            }
            Route::Unavailable(why) => {
                let message = format!("no node serves this shard ({})", why.reason());
                self.refuse_routed(t, ErrorCode::ShardUnavailable, message);
                true
            }
        }
    }

    /// Sends the request being handled to `to` and holds its answer's place.
    fn forward(
        &mut self,
        t: &Target<'_>,
        to: &felix_cluster::NodeId,
        shard: u32,
        hint: AckOwner,
        cx: &mut SessionCx<'_>,
    ) {
        let Some(frame) = self.forward_frame.take() else {
            self.refuse_routed(t, ErrorCode::ShardUnavailable, "cannot forward".into());
            return;
        };
        let offers_hint = self
            .negotiated()
            .flags
            .contains(Flags::BINARY_PUBLISH_ACK_OWNER);
        let router = cx.core.router.as_mut().expect("routed in a cluster");
        let scope = router.scope(
            t.cache,
            (t.tenant, t.namespace, t.name),
            shard,
            hint.generation,
        );
        let authed = self.auth.as_mut().expect("authenticated");
        let fw = authed.forwarding.get_or_insert_with(|| {
            Box::new(Forwarding {
                channel: router.new_channel(),
                seq: 0,
                opened: Vec::new(),
            })
        });
        let tenant = authed.identity.tenant.clone();
        let principal = authed.identity.subject.clone();
        let base = u64::from(fw.channel) << 32;
        if !fw.opened.contains(&to.0) {
            // The channel opens on that node with the client's own `auth`; its answer stays
            // there (a refusal makes every later forward answer `unauthenticated`).
            fw.opened.push(to.0.clone());
            let open = felix_peer_proto::Forward {
                forward_id: base,
                scope: scope.clone(),
                tenant: tenant.clone(),
                principal: principal.clone(),
                frame: authed.auth_frame.clone(),
            };
            router.channel_opened(fw.channel, (cx.ch, cx.stream), to, &open);
            router.forward(cx.now, to, open, None);
        }
        fw.seq = fw.seq.wrapping_add(1).max(1);
        let forward_id = base | u64::from(fw.seq);
        let answered = t.expects_answer;
        let forward = felix_peer_proto::Forward {
            forward_id,
            scope,
            tenant,
            principal,
            frame,
        };
        router.forward(cx.now, to, forward, answered.then_some((cx.ch, cx.stream)));
        cx.core.stats.forwards += 1;
        if answered {
            let fail = match t.answer {
                Answer::JsonPublish(Some(id)) => FailAnswer::JsonPublish(id),
                Answer::BinaryAck(Some(id)) => FailAnswer::BinaryAck(id),
                _ => FailAnswer::Error,
            };
            let hint = (offers_hint && matches!(t.answer, Answer::BinaryAck(_))).then_some(hint);
            self.held.push_back(Held::Forward(Box::new(HeldForward {
                forward_id,
                answer: None,
                fail,
                hint,
            })));
        }
    }

    /// The answer to a forward has come (or its refusal, or its timeout).
    pub(crate) fn fill_forward(&mut self, forward_id: u64, outcome: ForwardOutcome) {
        let coded = self
            .auth
            .as_ref()
            .is_some_and(|a| a.negotiated.error_codes());
        let Some(i) = self
            .held
            .iter()
            .position(|h| matches!(h, Held::Forward(f) if f.forward_id == forward_id))
        else {
            return;
        };
        let (fail, hint) = match &self.held[i] {
            Held::Forward(f) => (f.fail, f.hint.clone()),
            _ => unreachable!("found a forward"),
        };
        let frame = match outcome {
            ForwardOutcome::Answered(frame) => match hint {
                Some(owner) => with_owner(frame, owner),
                None => frame,
            },
            ForwardOutcome::Refused(code, message) => {
                self.fail_frame_coded(fail, code, &message, coded)
            }
        };
        if let Held::Forward(f) = &mut self.held[i] {
            f.answer = Some(frame);
        }
    }

    fn fail_frame_coded(
        &self,
        fail: FailAnswer,
        code: ErrorCode,
        message: &str,
        coded: bool,
    ) -> Bytes {
        match fail {
            FailAnswer::BinaryAck(id) => self.ack_error_frame(id, code, message),
            FailAnswer::JsonPublish(request_id) => {
                encode_message(&Message::PublishError(PublishError {
                    request_id,
                    message: message.to_owned(),
                    retry: coded.then_some(code.default_retry()),
                    code: coded.then_some(code),
                    detail: None,
                }))
            }
            FailAnswer::Error => self.error_frame(code, message.to_owned()),
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
        let Some(router) = cx.core.router.as_ref() else {
            return false;
        };
        let brokers = router
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
        let router = cx.core.router.as_ref()?;
        let cache = matches!(kind, ShardKind::Cache);
        let owners = router.owners(cache, names.0, names.1, names.2)?;
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

/// A forwarded binary ack with the `0x0080` owner set, so the client goes direct next time.
/// Anything else passes as it came.
fn with_owner(frame: Bytes, owner: AckOwner) -> Bytes {
    let mut decoder = felix_proto::frame::FrameDecoder::new(u32::MAX);
    decoder.feed_bytes(frame.clone());
    let Ok(Some(f)) = decoder.next_frame() else {
        return frame;
    };
    if !f.flags.contains(Flags::BINARY_PUBLISH_ACK) {
        return frame;
    }
    match PublishAck::decode(f.flags, &f.payload) {
        Ok(mut ack) => {
            ack.owner = Some(owner);
            super::ack_frame(&ack)
        }
        Err(_) => frame,
    }
}
