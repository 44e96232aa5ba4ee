//! The session's side of cache watches, counters and conditional cache writes: check the
//! request and its permission, call the broker, queue the answer. The state lives in
//! `broker/watch.rs`, `broker/counters.rs` and the cache log.

use felix_proto::message::{self, CacheConditionResult, CacheWatchStarted, CounterValue, Message};
use felix_proto::{ErrorCode, Features};

use super::{encode_message, FailAnswer, FrameResult, Session, SessionCx};
use crate::broker::{CacheKey, Condition, SubscribeError, WatchFilter, WatchStart};
use felix_auth::Action;

impl Session {
    /// `cache_watch`: answered `cache_watch_started`, then the changes arrive on an event
    /// stream the connection opens (like a subscription's).
    pub(super) fn on_cache_watch(
        &mut self,
        w: message::CacheWatch,
        cx: &mut SessionCx<'_>,
    ) -> FrameResult {
        if !advertised(cx, Features::CACHE_WATCH) {
            return self.on_unsupported(&Message::CacheWatch(w), cx);
        }
        cx.core.stats.cache_requests += 1;
        let Some(mut key) =
            self.cache_scope(&w.tenant_id, &w.namespace, &w.cache, Action::CacheRead)
        else {
            return FrameResult::Continue;
        };
        // A watch reads one shard: a key's own (hashed as a `cache_get` is), or for a prefix
        // the `shard` named, required on a cache of several (shard 0 alone would look like
        // the whole prefix while covering only the keys that hash to it).
        let width = super::cache_width(cx, &w.tenant_id, &w.namespace, &w.cache);
        let filter = match (w.key, w.prefix) {
            (Some(k), None) => {
                key.shard = felix_cluster::routing::cache_shard(k.as_bytes(), width);
                WatchFilter::Key(k)
            }
            (None, Some(_)) if w.shard.is_none() && width > 1 => {
                self.push_error(
                    ErrorCode::InvalidRequest,
                    format!(
                        "a prefix watch names its shard: the cache has {width} shards \
                         (one watch per shard covers the prefix; cache_shards says how many)"
                    ),
                );
                return FrameResult::Continue;
            }
            (None, Some(_)) if w.shard.is_some_and(|s| s >= u64::from(width)) => {
                self.push_error(
                    ErrorCode::InvalidRequest,
                    format!(
                        "shard {} is out of range: the cache has {width} shard{}",
                        w.shard.unwrap_or(0),
                        if width == 1 { "" } else { "s" }
                    ),
                );
                return FrameResult::Continue;
            }
            (None, Some(p)) => {
                key.shard = w.shard.unwrap_or(0) as u32;
                WatchFilter::Prefix(p)
            }
            _ => {
                self.push_error(
                    ErrorCode::InvalidRequest,
                    "a cache watch names exactly one of key and prefix".into(),
                );
                return FrameResult::Continue;
            }
        };
        let retained = w.retained == Some(true);
        let start = match (retained, w.from_offset) {
            (true, Some(_)) => {
                self.push_error(
                    ErrorCode::InvalidRequest,
                    "retained and from_offset together would deliver every value twice".into(),
                );
                return FrameResult::Continue;
            }
            (true, None) => WatchStart::Retained,
            (false, Some(n)) => WatchStart::From(n),
            (false, None) => WatchStart::Live,
        };
        if cx.conn.subscriptions >= cx.core.limits.max_subscriptions_per_connection {
            self.push_error(
                ErrorCode::LimitExceeded,
                format!(
                    "too many subscriptions on one connection (max_subscriptions_per_connection {})",
                    cx.core.limits.max_subscriptions_per_connection
                ),
            );
            return FrameResult::Continue;
        }
        let unix = cx.core.unix_micros(cx.now);
        let owner = cx.ch.0 as u64;
        match cx
            .core
            .broker
            .cache_watch(cx.now, unix, &key, filter, start, owner)
        {
            Ok(started) => {
                let subscription_id = match w.subscription_id {
                    Some(id) => id,
                    None => cx.core.next_subscription_id(),
                };
                cx.core.stats.subscriptions += 1;
                if self.negotiated().features.contains(Features::SHARD_MOVED) {
                    cx.core
                        .broker
                        .watch_ends_on_move(started.id, subscription_id);
                }
                self.push_message(&Message::CacheWatchStarted(CacheWatchStarted {
                    subscription_id,
                    resume_offset: started.resume_offset,
                    resnapshot: started.resnapshot.then_some(true),
                    retained_count: started.retained_count,
                }));
                self.open_event_stream(cx, started.id, subscription_id);
            }
            Err(SubscribeError::Broker(e)) if self.stalls(&e) => {}
            Err(SubscribeError::Broker(e)) => self.push_broker_error(e),
            Err(SubscribeError::Cursor {
                reason,
                requested,
                available,
            }) => self.push_cursor_error(reason, requested, available),
        }
        FrameResult::Continue
    }

    /// `counter_add`: answered `counter_value` with the sum including the delta, once the
    /// add is durable.
    pub(super) fn on_counter_add(
        &mut self,
        a: message::CounterAdd,
        cx: &mut SessionCx<'_>,
    ) -> FrameResult {
        if !advertised(cx, Features::COUNTERS) {
            return self.on_unsupported(&Message::CounterAdd(a), cx);
        }
        cx.core.stats.cache_requests += 1;
        let names = (&a.tenant_id[..], &a.namespace[..], &a.cache[..]);
        let Some(key) = self.cache_key_scope(cx, names, &a.key, Action::CacheWrite) else {
            return FrameResult::Continue;
        };
        let unix = cx.core.unix_micros(cx.now);
        match cx
            .core
            .broker
            .counter_add(cx.now, unix, &key, &a.key, a.delta)
        {
            Ok((log, end, sum)) => {
                let answer = encode_message(&Message::CounterValue(CounterValue {
                    value: Some(sum),
                    request_id: a.request_id,
                }));
                self.push_after_durable(cx, log, end, answer, FailAnswer::Error);
            }
            Err(e) if self.stalls(&e) => {}
            Err(e) => self.push_broker_error(e),
        }
        FrameResult::Continue
    }

    /// `counter_get`: the durable sum, absent for a counter never written.
    pub(super) fn on_counter_get(
        &mut self,
        g: message::CounterGet,
        cx: &mut SessionCx<'_>,
    ) -> FrameResult {
        if !advertised(cx, Features::COUNTERS) {
            return self.on_unsupported(&Message::CounterGet(g), cx);
        }
        cx.core.stats.cache_requests += 1;
        let names = (&g.tenant_id[..], &g.namespace[..], &g.cache[..]);
        let Some(key) = self.cache_key_scope(cx, names, &g.key, Action::CacheRead) else {
            return FrameResult::Continue;
        };
        match cx.core.broker.counter_get(cx.now, &key, &g.key) {
            Ok(value) => self.push_message(&Message::CounterValue(CounterValue {
                value,
                request_id: g.request_id,
            })),
            Err(e) if self.stalls(&e) => {}
            Err(e) => self.push_broker_error(e),
        }
        FrameResult::Continue
    }

    /// The version for a get's `cache_value`: only to a client that offered
    /// FEATURE_CACHE_CONDITIONAL (anyone else gets the frame it always got). Read in the
    /// same step as the get, so it names the value the get returns.
    pub(super) fn value_version(
        &self,
        cx: &mut SessionCx<'_>,
        key: &CacheKey,
        k: &str,
    ) -> Option<u64> {
        if !self
            .negotiated()
            .features
            .contains(Features::CACHE_CONDITIONAL)
        {
            return None;
        }
        let unix = cx.core.unix_micros(cx.now);
        cx.core.broker.cache_version(cx.now, unix, key, k)
    }

    /// `cache_put_if`: answered `cache_condition_result`, once durable on a durable cache.
    pub(super) fn on_cache_put_if(
        &mut self,
        p: message::CachePutIf,
        cx: &mut SessionCx<'_>,
    ) -> FrameResult {
        if !advertised(cx, Features::CACHE_CONDITIONAL) {
            return self.on_unsupported(&Message::CachePutIf(p), cx);
        }
        cx.core.stats.cache_requests += 1;
        let names = (&p.tenant_id[..], &p.namespace[..], &p.cache[..]);
        let Some(key) = self.cache_key_scope(cx, names, &p.key, Action::CacheWrite) else {
            return FrameResult::Continue;
        };
        let condition = match p.condition {
            message::CacheCondition::Absent => Condition::Absent,
            message::CacheCondition::Version(v) => Condition::Version(v),
        };
        let unix = cx.core.unix_micros(cx.now);
        let result = cx
            .core
            .broker
            .cache_put_if(cx.now, unix, &key, &p.key, p.value, p.ttl_ms, condition);
        self.answer_conditional(cx, result, p.request_id);
        FrameResult::Continue
    }

    /// `cache_delete_if`: answered `cache_condition_result`.
    pub(super) fn on_cache_delete_if(
        &mut self,
        d: message::CacheDeleteIf,
        cx: &mut SessionCx<'_>,
    ) -> FrameResult {
        if !advertised(cx, Features::CACHE_CONDITIONAL) {
            return self.on_unsupported(&Message::CacheDeleteIf(d), cx);
        }
        cx.core.stats.cache_requests += 1;
        let names = (&d.tenant_id[..], &d.namespace[..], &d.cache[..]);
        let Some(key) = self.cache_key_scope(cx, names, &d.key, Action::CacheWrite) else {
            return FrameResult::Continue;
        };
        let unix = cx.core.unix_micros(cx.now);
        let result = cx
            .core
            .broker
            .cache_delete_if(cx.now, unix, &key, &d.key, d.version);
        self.answer_conditional(cx, result, d.request_id);
        FrameResult::Continue
    }

    fn answer_conditional(
        &mut self,
        cx: &mut SessionCx<'_>,
        result: Result<crate::broker::Conditional, crate::broker::BrokerError>,
        request_id: u64,
    ) {
        match result {
            Ok(c) => {
                let frame = encode_message(&Message::CacheConditionResult(CacheConditionResult {
                    applied: c.applied,
                    version: c.version,
                    request_id,
                }));
                match c.durable_at {
                    Some((log, end)) => {
                        self.push_after_durable(cx, log, end, frame, FailAnswer::Error)
                    }
                    None => self.push_frame(frame),
                }
            }
            Err(e) if self.stalls(&e) => {}
            Err(e) => self.push_broker_error(e),
        }
    }
}

/// This broker advertises `feature` (its handler is live); otherwise the request is
/// answered as unsupported.
fn advertised(cx: &SessionCx<'_>, feature: Features) -> bool {
    cx.core.capabilities.features.contains(feature)
}
