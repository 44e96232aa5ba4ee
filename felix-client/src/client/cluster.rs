//! The front end of the cluster client: it carries [`crate::core::cluster::Cluster`]'s
//! decisions out over per-broker connections. Every decision (where to dial, where a call
//! goes, whether and when to try again, where a redirect leads, where a subscription
//! resumes) is the core's; this file dials, sleeps, reads the clock and reports outcomes.
//!
//! One connection per broker in use, opened on first use and shared by every role that
//! broker plays. A connection that fails (closed, or a request that outlived
//! `request_timeout`) is closed and reported lost; the next call dials another broker.

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_proto::{Features, Frame};
use tokio::sync::OnceCell;

use super::{Client, ClientConfig, Subscription};
use crate::core::cluster::{
    Cluster, ClusterConfig, Cursor, Next, Object, OneShot, OneShotStep, Redirects, Resend, Route,
};
use crate::core::stream_ops::{
    read_shard_owners, read_stream_shards, read_topology, shard_owners_frame, stream_shards_frame,
    topology_frame,
};
use crate::core::{Ack, Start};
use crate::error::ClientError;

/// A call's future on one broker's connection.
pub(crate) type NodeCall<'a, T> = Pin<Box<dyn Future<Output = Result<T, ClientError>> + Send + 'a>>;

/// One attempt's future; its error says whether the request reached a connection.
type AttemptCall<'a, T> = Pin<Box<dyn Future<Output = Result<T, (ClientError, bool)>> + Send + 'a>>;

/// What every clone of a cluster [`Client`] shares.
pub(crate) struct ClusterShared {
    config: ClientConfig,
    runtime: Arc<dyn quinn::Runtime>,
    core: Mutex<Cluster>,
    nodes: Mutex<HashMap<SocketAddr, Arc<OnceCell<Client>>>>,
}

impl Drop for ClusterShared {
    fn drop(&mut self) {
        self.close_all();
    }
}

/// How a cluster subscription is made again.
pub(crate) struct Resume {
    pub(crate) cluster: Arc<ClusterShared>,
    pub(crate) namespace: String,
    pub(crate) stream: String,
    pub(crate) shard: Option<u32>,
    pub(crate) cursor: Cursor,
    /// The broker it is on.
    pub(crate) node: SocketAddr,
}

impl ClusterShared {
    /// Dials the seeds in order until one answers, asks it `topology`, and returns the
    /// client. Every seed failing is one error naming each.
    pub(crate) async fn connect(
        config: ClientConfig,
        cluster: ClusterConfig,
    ) -> Result<Client, ClientError> {
        if cluster.seeds.is_empty() {
            return Err(ClientError::Usage("no broker address given".into()));
        }
        let shared = Arc::new(ClusterShared {
            runtime: config.runtime.quinn(),
            config,
            core: Mutex::new(Cluster::new(cluster)),
            nodes: Mutex::new(HashMap::new()),
        });
        let entry = shared.entry().await?;
        Ok(Client {
            inner: entry.inner.clone(),
            cluster: Some(shared),
        })
    }

    /// Closes every broker's connection.
    pub(crate) fn close_all(&self) {
        for cell in self.nodes.lock().expect("nodes").values() {
            if let Some(node) = cell.get() {
                node.inner.conn.close(0u32.into(), b"client closed");
            }
        }
    }

    fn core(&self) -> std::sync::MutexGuard<'_, Cluster> {
        self.core.lock().expect("cluster state")
    }

    /// The connection to `addr`, opened now if there is none. A failure to connect is
    /// reported to the core (the broker is tried last for a while).
    async fn node(&self, addr: SocketAddr) -> Result<Client, ClientError> {
        let cell = {
            let mut nodes = self.nodes.lock().expect("nodes");
            if nodes
                .get(&addr)
                .and_then(|c| c.get())
                .is_some_and(|n| n.inner.conn.close_reason().is_some())
            {
                nodes.remove(&addr);
            }
            nodes.entry(addr).or_default().clone()
        };
        let config = self.config.clone();
        let node = cell
            .get_or_try_init(|| Client::connect_node(config, addr))
            .await;
        match node {
            Ok(node) => {
                self.core().handle_connected(addr, Instant::now());
                Ok(node.clone())
            }
            Err(e) => {
                self.forget(addr, &cell);
                self.core().handle_connection_lost(addr, Instant::now());
                Err(e)
            }
        }
    }

    fn forget(&self, addr: SocketAddr, cell: &Arc<OnceCell<Client>>) {
        let mut nodes = self.nodes.lock().expect("nodes");
        if nodes.get(&addr).is_some_and(|c| Arc::ptr_eq(c, cell)) {
            nodes.remove(&addr);
        }
    }

    /// The broker at `addr` failed a call in a way that says the connection is gone or not
    /// answering: close it (so every call on it fails now, not at its own deadline) and
    /// report it lost.
    pub(crate) fn node_failed(&self, addr: SocketAddr) {
        let removed = self.nodes.lock().expect("nodes").remove(&addr);
        if let Some(node) = removed.as_ref().and_then(|c| c.get()) {
            node.inner.conn.close(0u32.into(), b"broker presumed lost");
        }
        self.core().handle_connection_lost(addr, Instant::now());
    }

    /// The entry broker's connection, dialling in the core's order when there is none, and
    /// asking `topology` when the core says it is due.
    async fn entry(&self) -> Result<Client, ClientError> {
        let current = self.core().entry();
        let node = match current {
            Some(addr) => match self.node(addr).await {
                Ok(node) => Some((addr, node)),
                Err(_) => None,
            },
            None => None,
        };
        let (addr, node) = match node {
            Some(found) => found,
            None => self.dial().await?,
        };
        let due = {
            let mut core = self.core();
            let now = Instant::now();
            let due = core.topology_due(now);
            if due {
                core.begin_topology(now);
            }
            due
        };
        if due {
            self.refresh_topology(&node).await;
        }
        let _ = addr;
        Ok(node)
    }

    async fn dial(&self) -> Result<(SocketAddr, Client), ClientError> {
        let order = self.core().dial_order(Instant::now());
        let mut failures = Vec::new();
        for addr in order {
            match self.node(addr).await {
                Ok(node) => return Ok((addr, node)),
                Err(e) => failures.push(format!("{addr}: {e}")),
            }
        }
        Err(ClientError::Connection(format!(
            "no broker answered ({})",
            failures.join("; ")
        )))
    }

    async fn refresh_topology(&self, node: &Client) {
        // Negotiated, not merely advertised: a client configured without `FEATURE_TOPOLOGY`
        // in its offer keeps to its seeds (say, seeds that are proxies).
        let view = if node.capabilities().features().contains(Features::TOPOLOGY) {
            match node.one_shot(topology_frame()).await {
                Ok(frame) => read_topology(&frame).ok(),
                Err(_) => None,
            }
        } else {
            None
        };
        self.core().handle_topology(view.as_ref(), Instant::now());
    }

    /// Asks the entry `shard_owners` for `object` (or records that it cannot be asked).
    async fn refresh_owners(&self, entry: SocketAddr, object: &Object) -> Result<(), ClientError> {
        let node = self.node(entry).await?;
        // Negotiated: without `FEATURE_SHARD_OWNERS` in its offer the client sends every call
        // to its entry broker, which forwards it or redirects a subscription.
        let view = if node
            .capabilities()
            .features()
            .contains(Features::SHARD_OWNERS)
        {
            let frame = shard_owners_frame(
                &self.config.tenant,
                &object.namespace,
                &object.name,
                object.kind,
            );
            match node.one_shot(frame).await {
                Ok(frame) => read_shard_owners(&frame).ok(),
                Err(_) => None,
            }
        } else {
            None
        };
        let now = Instant::now();
        match view {
            Some(view) => self.core().handle_shard_owners(object, &view, now),
            None => self.core().handle_owners_failed(object, now),
        }
        Ok(())
    }

    /// Where a call goes: the core's route, after dialling or asking owners as it says.
    async fn resolve(
        &self,
        object: &Object,
        key: Option<&[u8]>,
        shard: Option<u32>,
    ) -> Result<SocketAddr, ClientError> {
        // `topology` on its interval, through the entry, paid by the call that finds it due.
        if self.core().topology_due(Instant::now()) {
            self.entry().await?;
        }
        // Three rounds at most: dial, ask owners, route.
        for _ in 0..3 {
            let now = Instant::now();
            let route = {
                let core = self.core();
                match shard {
                    Some(s) => core.route_shard(object, s, now),
                    None => core.route(object, key, now),
                }
            };
            match route {
                Route::Owner { addr, .. } | Route::Entry { addr } => return Ok(addr),
                Route::Unavailable { shard, lost } => {
                    return Err(Route::unavailable_error(shard, lost))
                }
                Route::NoEntry => {
                    self.entry().await?;
                }
                Route::AskOwners { entry } => self.refresh_owners(entry, object).await?,
            }
        }
        self.core()
            .entry()
            .ok_or_else(|| ClientError::Connection("no broker is connected".into()))
    }

    async fn sleep(&self, delay: Duration) {
        let mut timer = self.runtime.new_timer(Instant::now() + delay);
        poll_fn(|cx| timer.as_mut().poll(cx)).await;
    }

    /// Runs `call` on the broker the core routes `object`/`key` to, retrying as the core
    /// decides. `sent` tells of a failure whether the request reached a connection.
    async fn routed<'a, T>(
        &self,
        object: &Object,
        key: Option<&[u8]>,
        resend: Resend,
        mut call: impl FnMut(Client) -> AttemptCall<'a, T>,
    ) -> Result<T, ClientError> {
        let mut attempts = self.core().attempts(resend, Instant::now());
        loop {
            let (error, sent) = match self.resolve(object, key, None).await {
                Err(e) => (e, false),
                Ok(addr) => match self.node(addr).await {
                    Err(e) => (e, false),
                    Ok(node) => {
                        let conn = node.inner.conn.clone();
                        match call(node).await {
                            Ok(v) => return Ok(v),
                            Err((e, sent)) => {
                                self.after_failure(addr, &conn, object, &e);
                                (e, sent)
                            }
                        }
                    }
                },
            };
            let next = self
                .core()
                .next_attempt(&mut attempts, error, sent, Instant::now());
            match next {
                Next::GiveUp(e) => return Err(e),
                Next::RetryAfter { delay, .. } => self.sleep(delay).await,
            }
        }
    }

    /// What a failed call at `addr` says: a broker whose connection closed is forgotten (a
    /// failed stream alone is replaced on the next call, the connection kept); an owner that
    /// refuses the shard as not its own is forgotten as owner. A call that outlived its
    /// deadline says nothing of the connection (a broker may hold a forwarded call for its
    /// own forward timeout); QUIC's keep-alives judge that.
    fn after_failure(
        &self,
        addr: SocketAddr,
        conn: &quinn::Connection,
        object: &Object,
        e: &ClientError,
    ) {
        match e {
            ClientError::Connection(_) if conn.close_reason().is_some() => self.node_failed(addr),
            ClientError::NotLeader { .. } => self.core().handle_stale_owner(object),
            ClientError::Server {
                code:
                    Some(
                        felix_proto::ErrorCode::NotLeader
                        | felix_proto::ErrorCode::ShardUnavailable,
                    ),
                ..
            } => self.core().handle_stale_owner(object),
            _ => {}
        }
    }

    pub(crate) async fn publish(
        &self,
        namespace: &str,
        stream: &str,
        payloads: &[Bytes],
        key: Option<&[u8]>,
        ack: Ack,
        at_least_once: bool,
    ) -> Result<Option<u64>, ClientError> {
        let object = Object::stream(namespace, stream);
        let resend = if at_least_once {
            Resend::Always
        } else {
            Resend::Never
        };
        let object = &object;
        self.routed(object, key, resend, |node| {
            Box::pin(async move {
                let (offset, owner) = node
                    .publish_here(namespace, stream, payloads, key, ack)
                    .await?;
                // A forwarded batch's ack names its shard's owner: the next goes there.
                if let Some(addr) = owner.and_then(|o| o.addr) {
                    self.core()
                        .handle_owner_hint(object, key, &addr, Instant::now());
                }
                Ok(offset)
            })
        })
        .await
    }

    /// A cache call routed to the cache's owner; `read` calls are re-sent on an unknown
    /// outcome, writes are not.
    pub(crate) async fn cache_call<'a, T: 'a>(
        &self,
        namespace: &str,
        cache: &str,
        key: &'a str,
        read: bool,
        mut call: impl FnMut(Client) -> NodeCall<'a, T>,
    ) -> Result<T, ClientError> {
        let object = Object::cache(namespace, cache);
        let resend = if read { Resend::Always } else { Resend::Never };
        self.routed(&object, Some(key.as_bytes()), resend, |node| {
            let fut = call(node);
            Box::pin(async move {
                fut.await.map_err(|e| {
                    let sent = !matches!(e, ClientError::Usage(_));
                    (e, sent)
                })
            })
        })
        .await
    }

    /// Subscribes to `shard` of the stream at its owner (or at `at`, a move's named owner),
    /// following redirects, retried as the core decides. The subscription resumes itself.
    pub(crate) async fn subscribe(
        self: Arc<Self>,
        namespace: &str,
        stream: &str,
        shard: Option<u32>,
        mut cursor: Cursor,
        at: Option<&str>,
    ) -> Result<Subscription, ClientError> {
        let object = Object::stream(namespace, stream);
        let mut attempts = self.core().attempts(Resend::Always, Instant::now());
        // A move's named owner is tried first, once.
        let mut first = at.and_then(crate::core::cluster::parse_addr);
        loop {
            let start = cursor.resume_start();
            let result = match first.take() {
                Some(addr) => {
                    self.subscribe_at(addr, &object, namespace, stream, shard, start)
                        .await
                }
                None => match self.resolve(&object, None, Some(shard.unwrap_or(0))).await {
                    Err(e) => Err((e, false)),
                    Ok(addr) => {
                        self.subscribe_at(addr, &object, namespace, stream, shard, start)
                            .await
                    }
                },
            };
            let (error, sent) = match result {
                Ok((addr, mut sub)) => {
                    cursor.handle_subscribed(sub.start_offset);
                    sub.resume = Some(Box::new(Resume {
                        cluster: self.clone(),
                        namespace: namespace.to_owned(),
                        stream: stream.to_owned(),
                        shard,
                        cursor,
                        node: addr,
                    }));
                    return Ok(sub);
                }
                Err(failed) => failed,
            };
            let next = self
                .core()
                .next_attempt(&mut attempts, error, sent, Instant::now());
            match next {
                Next::GiveUp(e) => return Err(e),
                Next::RetryAfter { delay, .. } => self.sleep(delay).await,
            }
        }
    }

    /// One subscribe attempt from `addr`, following `not_leader` within the hop bound.
    async fn subscribe_at(
        &self,
        addr: SocketAddr,
        object: &Object,
        namespace: &str,
        stream: &str,
        shard: Option<u32>,
        start: Start,
    ) -> Result<(SocketAddr, Subscription), (ClientError, bool)> {
        let hops = self.core().config().max_redirect_hops;
        let mut redirects = Redirects::new(addr, hops);
        let mut at = addr;
        loop {
            let node = self.node(at).await.map_err(|e| (e, false))?;
            match node.subscribe_here(namespace, stream, start, shard).await {
                Ok(sub) => return Ok((at, sub)),
                Err(ClientError::NotLeader {
                    node_id,
                    addr,
                    generation,
                }) => {
                    self.core().handle_stale_owner(object);
                    at = redirects
                        .follow(&node_id, addr.as_deref(), generation)
                        .map_err(|e| (e, true))?;
                }
                Err(e) => {
                    self.after_failure(at, &node.inner.conn, object, &e);
                    return Err((e, true));
                }
            }
        }
    }

    /// Runs `call` at the entry broker and, while it fails `not_leader` (the broker named
    /// the owner instead of forwarding, to a client that offered `FEATURE_REDIRECT`), at the
    /// named owner, within the hop bound. A `not_leader` applied nothing, so the same
    /// request goes on unchanged. For the calls that are not routed by key: commits, state
    /// reads, idempotent and conditional publishes, stream reads, group calls.
    pub(crate) async fn redirected<'a, T>(
        &self,
        mut call: impl FnMut(Client) -> NodeCall<'a, T>,
    ) -> Result<T, ClientError> {
        let mut node = self.entry().await?;
        let hops = self.core().config().max_redirect_hops;
        let mut redirects = Redirects::new(node.inner.config.addr, hops);
        loop {
            match call(node).await {
                Err(ClientError::NotLeader {
                    node_id,
                    addr,
                    generation,
                }) => {
                    let to = redirects.follow(&node_id, addr.as_deref(), generation)?;
                    node = self.node(to).await?;
                }
                other => return other,
            }
        }
    }

    /// One request frame and its one answer, at the entry broker and then wherever the
    /// core's [`OneShot`] follows a `not_leader` to.
    pub(crate) async fn one_shot_redirected(&self, frame: Bytes) -> Result<Frame, ClientError> {
        let mut node = self.entry().await?;
        let hops = self.core().config().max_redirect_hops;
        let mut call = OneShot::new(frame, node.inner.config.addr, hops);
        loop {
            let answer = node.one_shot(call.request().clone()).await?;
            match call.handle_answer(answer)? {
                OneShotStep::Answered(answer) => return Ok(answer),
                OneShotStep::SendTo(to) => node = self.node(to).await?,
            }
        }
    }

    /// The connection calls that are not routed go on: the entry broker's, the current one
    /// (another after a failover).
    pub(crate) async fn entry_node(&self) -> Result<Client, ClientError> {
        self.entry().await
    }

    /// A cache watch at the cache's owner from `start`, retried as the core decides (a watch
    /// changes nothing); it resumes itself after a lost broker or a move. `moved_to`: the
    /// watch moved, to this owner when it named one (tried first; the owners are asked
    /// again either way). A `not_leader` answer is followed within the hop bound.
    pub(crate) async fn watch(
        self: Arc<Self>,
        namespace: &str,
        cache: &str,
        filter: crate::core::WatchFilter,
        start: crate::core::WatchStart,
        moved_to: Option<Option<SocketAddr>>,
    ) -> Result<super::watch::CacheWatch, ClientError> {
        let object = Object::cache(namespace, cache);
        let mut named = None;
        if let Some(to) = moved_to {
            self.core().handle_stale_owner(&object);
            named = to;
        }
        let mut attempts = self.core().attempts(Resend::Always, Instant::now());
        loop {
            // A key watch reads its key's shard (hashed as a get is); a prefix watch, which
            // names no shard here, shard 0 (a cache of several refuses it: one per shard).
            let (key, shard) = match &filter {
                crate::core::WatchFilter::Key(k) => (Some(k.as_bytes()), None),
                crate::core::WatchFilter::Prefix(_) => (None, Some(0)),
            };
            let addr = match named.take() {
                Some(addr) => Ok(addr),
                None => self.resolve(&object, key, shard).await,
            };
            let (error, sent) = match addr {
                Err(e) => (e, false),
                Ok(addr) => match self
                    .watch_at(addr, &object, namespace, cache, &filter, start)
                    .await
                {
                    Ok(mut watch) => {
                        let next = match start {
                            crate::core::WatchStart::From(from) => from.max(watch.resume_offset()),
                            _ => watch.resume_offset(),
                        };
                        watch.set_resume(super::watch::WatchResume {
                            cluster: self.clone(),
                            namespace: namespace.to_owned(),
                            cache: cache.to_owned(),
                            filter,
                            next,
                        });
                        return Ok(watch);
                    }
                    Err(failed) => failed,
                },
            };
            let next = self
                .core()
                .next_attempt(&mut attempts, error, sent, Instant::now());
            match next {
                Next::GiveUp(e) => return Err(e),
                Next::RetryAfter { delay, .. } => self.sleep(delay).await,
            }
        }
    }

    /// One watch attempt from `addr`, following `not_leader` within the hop bound with the
    /// same start.
    async fn watch_at(
        &self,
        addr: SocketAddr,
        object: &Object,
        namespace: &str,
        cache: &str,
        filter: &crate::core::WatchFilter,
        start: crate::core::WatchStart,
    ) -> Result<super::watch::CacheWatch, (ClientError, bool)> {
        let hops = self.core().config().max_redirect_hops;
        let mut redirects = Redirects::new(addr, hops);
        let mut at = addr;
        loop {
            let node = self.node(at).await.map_err(|e| (e, false))?;
            match node
                .watch_cache(namespace, cache, filter.clone(), start)
                .await
            {
                Ok(watch) => return Ok(watch),
                Err(ClientError::NotLeader {
                    node_id,
                    addr,
                    generation,
                }) => {
                    self.core().handle_stale_owner(object);
                    at = redirects
                        .follow(&node_id, addr.as_deref(), generation)
                        .map_err(|e| (e, true))?;
                }
                Err(e) => {
                    self.after_failure(at, &node.inner.conn, object, &e);
                    return Err((e, true));
                }
            }
        }
    }

    /// How many shards `namespace/stream` has: from `shard_owners`, else `stream_shards`.
    pub(crate) async fn shard_count(
        &self,
        namespace: &str,
        stream: &str,
    ) -> Result<u32, ClientError> {
        let object = Object::stream(namespace, stream);
        self.resolve(&object, None, Some(0)).await?;
        if let Some(n) = self.core().shard_count(&object) {
            return Ok(n);
        }
        let entry = self.entry().await?;
        if !entry.capabilities().broker_has(Features::STREAM_SHARDS) {
            return Ok(1);
        }
        let frame = stream_shards_frame(&self.config.tenant, namespace, stream);
        let n = read_stream_shards(&self.one_shot_redirected(frame).await?)?;
        u32::try_from(n).map_err(|_| ClientError::protocol(format!("{n} shards")))
    }
}

/// One shard's `Subscription::next`, polled beside the others.
type NextItem<'a> =
    Pin<Box<dyn Future<Output = Result<super::SubscriptionItem, ClientError>> + Send + 'a>>;

/// What [`ShardedSubscription::next`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardedEvent {
    /// The shard it came from.
    pub shard: u32,
    /// The event, or that shard's end.
    pub item: super::SubscriptionItem,
}

/// One subscription per shard of a stream, merged: ordered within each shard only. Each
/// shard resumes itself after a lost broker or a move while the others keep delivering.
pub struct ShardedSubscription {
    shards: Vec<(u32, Subscription)>,
    /// The shard polled first next time, so no shard starves the others.
    turn: usize,
    ended: Vec<bool>,
}

impl ShardedSubscription {
    /// How many shards it covers.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// The last delivered offset of every shard that delivered one: what to resume from.
    pub fn positions(&self) -> HashMap<u32, u64> {
        self.shards
            .iter()
            .filter_map(|(shard, sub)| sub.position().map(|p| (*shard, p)))
            .collect()
    }

    /// The next event from whichever shard has one, the shards taken in turn so none
    /// starves the others. A shard's end is yielded once; once every shard has ended, an
    /// error. Cancel-safe as [`Subscription::next`] is.
    pub async fn next(&mut self) -> Result<ShardedEvent, ClientError> {
        let n = self.shards.len();
        let turn = self.turn;
        let ended = self.ended.clone();
        let mut futures: Vec<(usize, u32, NextItem<'_>)> = self
            .shards
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| !ended[*i])
            .map(|(i, (shard, sub))| {
                let fut: NextItem<'_> = Box::pin(sub.next());
                (i, *shard, fut)
            })
            .collect();
        if futures.is_empty() {
            return Err(ClientError::Connection(
                "every shard's subscription ended".into(),
            ));
        }
        futures.sort_by_key(|(i, _, _)| (i + n - turn) % n);
        let (i, shard, item) = poll_fn(|cx| {
            for (i, shard, fut) in futures.iter_mut() {
                if let std::task::Poll::Ready(item) = fut.as_mut().poll(cx) {
                    return std::task::Poll::Ready((*i, *shard, item));
                }
            }
            std::task::Poll::Pending
        })
        .await;
        drop(futures);
        self.turn = (i + 1) % n;
        let item = item?;
        if matches!(item, super::SubscriptionItem::End(_)) {
            self.ended[i] = true;
        }
        Ok(ShardedEvent { shard, item })
    }
}

impl Client {
    /// Subscribes to every shard of `namespace/stream`, each at its owner from `start` (or,
    /// for a shard in `resume`, from after the offset given there). Refused whole when any
    /// shard cannot be subscribed within the retry bounds: a subscription silently missing
    /// a shard would look complete.
    pub async fn subscribe_sharded(
        &self,
        namespace: &str,
        stream: &str,
        start: Start,
        resume: &HashMap<u32, u64>,
    ) -> Result<ShardedSubscription, ClientError> {
        let Some(cluster) = &self.cluster else {
            return Err(ClientError::Usage(
                "subscribe_sharded needs a client made with seeds (ClientConfig::with_seeds)"
                    .into(),
            ));
        };
        let count = cluster.shard_count(namespace, stream).await?;
        if count == 0 {
            return Err(ClientError::Server {
                code: Some(felix_proto::ErrorCode::NotFound),
                retry: None,
                message: format!("the broker knows of no stream {namespace}/{stream}"),
            });
        }
        let mut shards = Vec::with_capacity(count as usize);
        for shard in 0..count {
            let mut cursor = Cursor::new(start);
            if let Some(p) = resume.get(&shard) {
                cursor = Cursor::new(Start::Offset(p + 1));
                cursor.handle_delivered(*p);
            }
            let sub = cluster
                .clone()
                .subscribe(namespace, stream, Some(shard), cursor, None)
                .await
                .map_err(|e| {
                    ClientError::Connection(format!(
                        "could not subscribe to every shard of {stream}, so the subscription \
                         would be silently incomplete: shard {shard}: {e}"
                    ))
                })?;
            shards.push((shard, sub));
        }
        Ok(ShardedSubscription {
            ended: vec![false; shards.len()],
            shards,
            turn: 0,
        })
    }

    /// The brokers this client knows: the last `topology` answer, then every seed not in it.
    pub fn endpoints(&self) -> Vec<SocketAddr> {
        match &self.cluster {
            Some(c) => c.core().endpoints(),
            None => vec![self.inner.config.addr],
        }
    }

    /// The owner of every shard of `namespace/stream` as the cluster reports it now (asked
    /// again, not from the cache); `None` for a shard nobody serves.
    pub async fn shard_owners(
        &self,
        namespace: &str,
        stream: &str,
    ) -> Result<Vec<Option<SocketAddr>>, ClientError> {
        let Some(cluster) = &self.cluster else {
            return Err(ClientError::Usage(
                "shard_owners needs a client made with seeds".into(),
            ));
        };
        let object = Object::stream(namespace, stream);
        let entry = cluster.entry().await?;
        let addr = entry.inner.config.addr;
        cluster.refresh_owners(addr, &object).await?;
        Ok(cluster.core().owners(&object).unwrap_or_default())
    }

    /// The owner of every shard of the cache `namespace/cache`, as [`Client::shard_owners`].
    pub async fn cache_owners(
        &self,
        namespace: &str,
        cache: &str,
    ) -> Result<Vec<Option<SocketAddr>>, ClientError> {
        let Some(cluster) = &self.cluster else {
            return Err(ClientError::Usage(
                "cache_owners needs a client made with seeds".into(),
            ));
        };
        let object = Object::cache(namespace, cache);
        let entry = cluster.entry().await?;
        cluster
            .refresh_owners(entry.inner.config.addr, &object)
            .await?;
        Ok(cluster.core().owners(&object).unwrap_or_default())
    }

    /// The brokers this client holds a connection to.
    pub fn connected_brokers(&self) -> Vec<SocketAddr> {
        let Some(c) = &self.cluster else {
            return vec![self.inner.config.addr];
        };
        let mut out: Vec<SocketAddr> = c
            .nodes
            .lock()
            .expect("nodes")
            .iter()
            .filter(|(_, cell)| {
                cell.get()
                    .is_some_and(|n| n.inner.conn.close_reason().is_none())
            })
            .map(|(a, _)| *a)
            .collect();
        out.sort();
        out
    }
}
