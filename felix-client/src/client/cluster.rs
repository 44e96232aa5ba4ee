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
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_proto::{Features, Frame};
use tokio::sync::OnceCell;

use super::{Client, ClientConfig, Subscription};
use crate::core::cluster::{
    Attempts, Cluster, ClusterConfig, Cursor, Next, Object, OneShot, OneShotStep, Redirects,
    Resend, Route,
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
    /// Set by [`ClusterShared::close_all`]: the background refresh stops (it would dial
    /// again what the application closed).
    closed: std::sync::atomic::AtomicBool,
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
            closed: std::sync::atomic::AtomicBool::new(false),
        });
        let entry = shared.entry().await?;
        let runtime = shared.runtime.clone();
        runtime.spawn(Box::pin(refresh_topology_loop(
            Arc::downgrade(&shared),
            shared.runtime.clone(),
        )));
        Ok(Client {
            inner: entry.inner.clone(),
            cluster: Some(shared),
        })
    }

    /// Closes every broker's connection.
    pub(crate) fn close_all(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
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

    /// The entry broker's connection, dialling in the core's order when there is none. A
    /// new entry is asked `topology` at once (the first ask after reaching an
    /// entry, which the core sends to it); the periodic refresh is the background loop's
    /// ([`refresh_topology_loop`]), so no call waits for it.
    async fn entry(&self) -> Result<Client, ClientError> {
        let current = self.core().entry();
        let node = match current {
            Some(addr) => self.node(addr).await.ok(),
            None => None,
        };
        let node = match node {
            Some(node) => node,
            None => self.dial().await?.1,
        };
        // A new entry (dialled here, or reached by another call's connection) is asked now.
        if self.core().topology_due_after_connect(Instant::now()) {
            self.refresh_topology(&node).await;
        }
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

    /// Asks `topology` if the core says it is due, of the broker the core picks (the entry
    /// first, then each live known broker in turn); when that broker cannot be reached or
    /// does not answer, of `entry` instead. Either way the core hears the outcome.
    async fn refresh_topology(&self, entry: &Client) {
        let target = {
            let mut core = self.core();
            let now = Instant::now();
            if !core.topology_due(now) {
                return;
            }
            core.begin_topology(now);
            core.topology_target(now)
        };
        let Some(target) = target else { return };
        let mut view = None;
        if target != entry.inner.config.addr {
            if let Ok(node) = self.node(target).await {
                view = ask_topology(&node).await;
            }
        }
        if view.is_none() {
            view = ask_topology(entry).await;
        }
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

    /// `shard_owners` for `object` asked now (retried as a read: the core's classes), the
    /// answer kept for routing. Without `FEATURE_SHARD_OWNERS` negotiated with the entry,
    /// what is known (nothing: calls go through the entry).
    async fn owners_now(&self, object: &Object) -> Result<Vec<Option<SocketAddr>>, ClientError> {
        let entry = self.entry().await?;
        if !entry
            .capabilities()
            .features()
            .contains(Features::SHARD_OWNERS)
        {
            self.core().handle_owners_failed(object, Instant::now());
            return Ok(Vec::new());
        }
        let frame = shard_owners_frame(
            &self.config.tenant,
            &object.namespace,
            &object.name,
            object.kind,
        );
        let view = self
            .one_shot_retried(frame, Resend::Always, read_shard_owners)
            .await?;
        let mut core = self.core();
        core.handle_shard_owners(object, &view, Instant::now());
        Ok(core.owners(object).unwrap_or_default())
    }

    /// Where a call goes: the core's route, after dialling or asking owners as it says.
    async fn resolve(
        &self,
        object: &Object,
        key: Option<&[u8]>,
        shard: Option<u32>,
    ) -> Result<SocketAddr, ClientError> {
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

    /// After a failed attempt (`sent`: whether its request reached a connection): the core
    /// decides whether another is made, and its backoff is slept here; `Err` is the error
    /// the call ends with. Every retried call's loop ends in this.
    async fn back_off(
        &self,
        attempts: &mut Attempts,
        error: ClientError,
        sent: bool,
    ) -> Result<(), ClientError> {
        let next = self
            .core()
            .next_attempt(attempts, error, sent, Instant::now());
        match next {
            Next::GiveUp(e) => Err(e),
            Next::RetryAfter { delay, .. } => {
                self.sleep(delay).await;
                Ok(())
            }
        }
    }

    /// One attempt of a call that may be redirected: `call` at `node` and, while it fails
    /// `not_leader` (the broker named the owner instead of forwarding), at the broker named,
    /// within the hop bound and unless the core refuses the redirect ([`Redirects`],
    /// [`Cluster::check_redirect`]). `object`: the routed stream or cache, whose remembered
    /// owner a refusal makes stale; `None` for a call that entered at the entry broker.
    /// Returns the broker that answered, and its answer.
    async fn follow_redirects<T, F: Future<Output = Result<T, ClientError>>>(
        &self,
        mut node: Client,
        object: Option<&Object>,
        call: &mut impl FnMut(Client) -> F,
    ) -> Result<(SocketAddr, T), (ClientError, bool)> {
        let hops = self.core().config().max_redirect_hops;
        let mut redirects = Redirects::new(node.inner.config.addr, hops);
        loop {
            let at = node.inner.config.addr;
            let conn = node.inner.conn.clone();
            match call(node).await {
                Ok(v) => return Ok((at, v)),
                Err(ClientError::NotLeader {
                    node_id,
                    addr,
                    generation,
                }) => {
                    if let Some(object) = object {
                        self.core().handle_stale_owner(object);
                    }
                    let to = redirects
                        .follow(&node_id, addr.as_deref(), generation)
                        .and_then(|to| self.core().check_redirect(to, Instant::now()))
                        .map_err(|e| (e, true))?;
                    node = self.node(to).await.map_err(|e| (e, false))?;
                }
                Err(e) => {
                    match object {
                        Some(object) => self.after_failure(at, &conn, object, &e),
                        None => self.connection_failed(at, &conn, &e),
                    }
                    let sent =
                        !matches!(e, ClientError::Usage(_) | ClientError::Unsupported { .. });
                    return Err((e, sent));
                }
            }
        }
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
            self.back_off(&mut attempts, error, sent).await?;
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
            self.back_off(&mut attempts, error, sent).await?;
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
        let node = self.node(addr).await.map_err(|e| (e, false))?;
        self.follow_redirects(node, Some(object), &mut |node: Client| async move {
            node.subscribe_here(namespace, stream, start, shard).await
        })
        .await
    }

    /// Runs `call` at the entry broker and, while it fails `not_leader` (the broker named
    /// the owner instead of forwarding, to a client that offered `FEATURE_REDIRECT`), at the
    /// named owner, within the hop bound; a failed attempt is retried as the core decides
    /// (`resend`: whether an unknown outcome is sent again), each attempt entering at the
    /// entry broker of the moment. For the group calls.
    pub(crate) async fn redirected<'a, T>(
        &self,
        resend: Resend,
        mut call: impl FnMut(Client) -> NodeCall<'a, T>,
    ) -> Result<T, ClientError> {
        let mut attempts = self.core().attempts(resend, Instant::now());
        loop {
            let (error, sent) = match self.redirected_attempt(&mut call).await {
                Ok(v) => return Ok(v),
                Err(failed) => failed,
            };
            self.back_off(&mut attempts, error, sent).await?;
        }
    }

    async fn redirected_attempt<'a, T>(
        &self,
        call: &mut impl FnMut(Client) -> NodeCall<'a, T>,
    ) -> Result<T, (ClientError, bool)> {
        let node = self.entry().await.map_err(|e| (e, false))?;
        let (_, v) = self.follow_redirects(node, None, call).await?;
        Ok(v)
    }

    /// A broker whose connection closed under a call is forgotten and reported lost, so the
    /// next attempt enters elsewhere.
    fn connection_failed(&self, addr: SocketAddr, conn: &quinn::Connection, e: &ClientError) {
        if matches!(e, ClientError::Connection(_)) && conn.close_reason().is_some() {
            self.node_failed(addr);
        }
    }

    /// One request frame and its one answer, read by `read`: at the entry broker and then
    /// wherever the core's [`OneShot`] follows a `not_leader` to; a failed attempt (an
    /// answer `read` refuses, a lost connection, a redirect past the bound) retried as the
    /// core decides, `resend` saying whether an unknown outcome is sent again. Each attempt
    /// enters at the entry broker of the moment with the same bytes.
    pub(crate) async fn one_shot_retried<T>(
        &self,
        frame: Bytes,
        resend: Resend,
        read: impl Fn(&Frame) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let hops = self.core().config().max_redirect_hops;
        let mut attempts = self.core().attempts(resend, Instant::now());
        let mut call: Option<OneShot> = None;
        loop {
            let (error, sent) = match self.one_shot_attempt(&frame, hops, &mut call).await {
                Ok(answer) => match read(&answer) {
                    Ok(v) => return Ok(v),
                    Err(e) => (e, true),
                },
                Err(failed) => failed,
            };
            self.back_off(&mut attempts, error, sent).await?;
        }
    }

    async fn one_shot_attempt(
        &self,
        frame: &Bytes,
        hops: usize,
        call: &mut Option<OneShot>,
    ) -> Result<Frame, (ClientError, bool)> {
        let mut node = self.entry().await.map_err(|e| (e, false))?;
        let entry = node.inner.config.addr;
        let call = match call {
            Some(call) => {
                call.retry_at(entry);
                call
            }
            None => call.insert(OneShot::new(frame.clone(), entry, hops)),
        };
        loop {
            let addr = node.inner.config.addr;
            let conn = node.inner.conn.clone();
            let answer = match node.one_shot_sent(call.request().clone()).await {
                Ok(answer) => answer,
                Err((e, sent)) => {
                    self.connection_failed(addr, &conn, &e);
                    return Err((e, sent));
                }
            };
            match call.handle_answer(answer).map_err(|e| (e, true))? {
                OneShotStep::Answered(answer) => return Ok(answer),
                OneShotStep::SendTo(to) => {
                    let to = self
                        .core()
                        .check_redirect(to, Instant::now())
                        .map_err(|e| (e, true))?;
                    node = self.node(to).await.map_err(|e| (e, false))?
                }
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
            self.back_off(&mut attempts, error, sent).await?;
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
        let node = self.node(addr).await.map_err(|e| (e, false))?;
        let watched = self
            .follow_redirects(node, Some(object), &mut |node: Client| {
                let filter = filter.clone();
                async move { node.watch_cache(namespace, cache, filter, start).await }
            })
            .await?;
        Ok(watched.1)
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
        let n = self
            .one_shot_retried(frame, Resend::Always, read_stream_shards)
            .await?;
        u32::try_from(n).map_err(|_| ClientError::protocol(format!("{n} shards")))
    }
}

/// `topology` from `node`, when negotiated (not merely advertised: a client configured
/// without `FEATURE_TOPOLOGY` in its offer keeps to its seeds, say seeds that are proxies);
/// `None` when not negotiated, refused or failed.
async fn ask_topology(node: &Client) -> Option<felix_proto::message::TopologyView> {
    if !node.capabilities().features().contains(Features::TOPOLOGY) {
        return None;
    }
    match node.one_shot(topology_frame()).await {
        Ok(frame) => read_topology(&frame).ok(),
        Err(_) => None,
    }
}

/// The periodic `topology` refresh, in the background so no call pays for it: sleeps until
/// the core's next deadline (or an interval when there is no entry: calls dial one), then
/// asks as [`ClusterShared::refresh_topology`] does. It holds the client weakly and ends once
/// every handle to it is dropped or it is closed.
async fn refresh_topology_loop(me: Weak<ClusterShared>, runtime: Arc<dyn quinn::Runtime>) {
    loop {
        let wake = {
            let Some(shared) = me.upgrade() else { return };
            let core = shared.core();
            let now = Instant::now();
            core.poll_timeout()
                .unwrap_or(now + core.topology_interval())
                .max(now + crate::core::cluster::MIN_TOPOLOGY_INTERVAL)
        };
        let mut timer = runtime.new_timer(wake);
        poll_fn(|cx| timer.as_mut().poll(cx)).await;
        let Some(shared) = me.upgrade() else { return };
        if shared.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let entry = shared.core().entry();
        if let Some(addr) = entry {
            if let Ok(node) = shared.node(addr).await {
                shared.refresh_topology(&node).await;
            }
        }
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
        cluster.owners_now(&Object::stream(namespace, stream)).await
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
        cluster.owners_now(&Object::cache(namespace, cache)).await
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
