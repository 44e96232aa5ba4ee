//! Control of a running broker: the [`RunningBroker`] handle an embedder or the process
//! holds, and the commands ([`Control`]) it, the ops endpoint and the file watcher send to
//! the drive loop, which owns the engine and is the only one to touch it.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use futures_channel::oneshot;

use crate::ops::http::{self, ScrapeRequest};
use crate::ops::stream_delete;
use crate::{config, files, reload, tls};

/// What the rest of the process asks of the drive loop, which owns the engine.
pub(crate) enum Control {
    /// A metrics snapshot, for the ops endpoint.
    Scrape(ScrapeRequest),
    /// A rotated certificate and key (`Engine::set_tls_identity`).
    TlsIdentity(felix_engine::TlsIdentity),
    /// A changed JWKS document (`Engine::set_jwks`).
    Jwks(Vec<u8>),
    /// An operator's stream deletion (`ops/stream_delete.rs`).
    DeleteStream(stream_delete::DeleteRequest),
    /// An operator's abandon of a shard's records (`ops/abandon.rs`).
    Abandon(crate::ops::abandon::AbandonRequest),
    /// An admin API request (`ops/streams.rs`): run on the engine, the closure answers.
    Admin(crate::ops::http::AdminJob),
    /// A waiter on the change counter (`ops/changes.rs`), registered on the loop.
    Changes(crate::ops::changes::ChangesRequest),
}

/// A broker running in the background on some runtime. Dropping it stops the broker too
/// (at once, without draining or waiting); [`RunningBroker::shutdown`] — or awaiting the
/// handle — drains it, closes its connections and syncs its logs, and waits for all that.
pub struct RunningBroker {
    pub(crate) runtime: &'static str,
    pub(crate) local_addr: SocketAddr,
    pub(crate) files: Option<Arc<files::FileExecutor>>,
    pub(crate) ca_cert_pem: String,
    pub(crate) dev_token: Option<String>,
    pub(crate) stop: Option<oneshot::Sender<()>>,
    pub(crate) stopped: Option<oneshot::Receiver<()>>,
    pub(crate) ops: Option<http::OpsServer>,
    pub(crate) ops_state: Arc<http::OpsState>,
    pub(crate) watcher: Option<reload::Watcher>,
    /// Resolves with the reason when the broker stops itself (its cluster refused it).
    pub(crate) failed: Option<oneshot::Receiver<String>>,
}

impl RunningBroker {
    /// Resolves with the reason if the broker stops by itself: a cluster refused this node
    /// (a declaration it could never place, naming the stream). Never resolves otherwise.
    pub fn take_failure(&mut self) -> Option<oneshot::Receiver<String>> {
        self.failed.take()
    }

    /// Resolves once the broker reports ready (what `/readyz` answers): at once for a single
    /// node after start, once it has joined for a cluster member. `Err` if the broker stopped
    /// first.
    pub async fn until_ready(&self) -> Result<(), oneshot::Canceled> {
        self.ops_state.until_ready().await
    }

    /// In a cluster, resolves the next time this node applies cluster metadata (a member
    /// joining or going down, a placement): what a test waits for between looks at the
    /// topology, instead of polling it. Register before looking, then look, then wait. `Err` if
    /// the broker stopped first.
    pub fn metadata_changed(
        &self,
    ) -> impl std::future::Future<Output = Result<(), oneshot::Canceled>> {
        self.ops_state.next_metadata_change()
    }

    /// Resolves with this node's change counter once it is past `after` (at once if it is):
    /// what `GET /v1/cluster/changes` waits on (docs/operations.md names what moves it). Start
    /// with `after` 0, look at the state, and wait past the counter last answered before
    /// looking again; the caller bounds the wait. `Err` if the broker stopped first.
    pub fn changed_after(
        &self,
        after: u64,
    ) -> impl std::future::Future<Output = Result<u64, oneshot::Canceled>> {
        let (reply, rx) = oneshot::channel();
        // A broker gone drops the request, and with it `reply`: `rx` resolves `Err`.
        let _ = self.ops_state.control.unbounded_send(Control::Changes(
            crate::ops::changes::ChangesRequest { after, reply },
        ));
        rx
    }

    /// The runtime it runs on (`"tokio"`, `"smol"`).
    pub fn runtime(&self) -> &'static str {
        self.runtime
    }

    /// The bound address (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The PEM clients should trust: the generated CA, or the configured certificate chain.
    pub fn ca_cert_pem(&self) -> &str {
        &self.ca_cert_pem
    }

    /// The dev-mode token (tenant `t1`, every permission); `None` with a JWKS.
    pub fn dev_token(&self) -> Option<&str> {
        self.dev_token.as_deref()
    }

    /// Where `/metrics`, `/livez` and `/readyz` are served, when enabled.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.ops.as_ref().map(http::OpsServer::local_addr)
    }

    /// Serves this certificate chain (PEM, leaf first) and key to new connections from now
    /// on; established ones keep theirs. Fails if the PEM does not parse; a key the engine
    /// refuses is logged and the old identity stays.
    pub fn rotate_tls(&self, cert_pem: &[u8], key_pem: &[u8]) -> io::Result<()> {
        let identity = tls::from_pem(cert_pem, key_pem)?;
        self.send_control(Control::TlsIdentity(identity))
    }

    /// Verifies new streams' tokens against this JWKS document from now on (only for a
    /// broker started with a JWKS); authenticated streams keep their identity.
    pub fn rotate_jwks(&self, jwks: Vec<u8>) -> io::Result<()> {
        self.send_control(Control::Jwks(jwks))
    }

    /// How many changed certificate, key or JWKS files the watcher could not use (each is
    /// logged, and the files in use stay). Zero when nothing is watched.
    pub fn reload_refusals(&self) -> u64 {
        self.watcher.as_ref().map_or(0, |w| w.refused())
    }

    /// Watches the files `reload` names (the configured certificate, key and JWKS) and
    /// rotates whenever they change, polling every `reload.interval`. Replaces an earlier
    /// watch; stops with the broker.
    pub fn watch_files(&mut self, reload: &config::Reload) -> io::Result<()> {
        self.watcher = None;
        self.watcher = reload::Watcher::spawn(reload, self.ops_state.control.clone())?;
        Ok(())
    }

    /// Deletes a stream (trusted: no token is checked; the ops endpoint's
    /// `DELETE /v1/streams/…` checks one). Its subscriptions end — with `stream_deleted`
    /// where the client offered it — and the next publish or subscribe creates it afresh.
    /// On a cluster node it asks the control plane for the delete (one `DeleteStream`
    /// command, carried out by every node as it applies it) and resolves once asked: `Ok`
    /// does not yet mean applied (the ops endpoint's `DELETE` waits for that).
    pub async fn delete_stream(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
    ) -> Result<(), felix_engine::DeleteStreamError> {
        let stopped =
            || felix_engine::DeleteStreamError::Unavailable("the broker has stopped".into());
        let (tx, rx) = oneshot::channel();
        let req = stream_delete::DeleteRequest {
            token: None,
            tenant: tenant.into(),
            namespace: namespace.into(),
            stream: stream.into(),
            reply: Box::new(move |outcome| {
                let _ = tx.send(outcome);
            }),
        };
        self.send_control(Control::DeleteStream(req))
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    fn send_control(&self, control: Control) -> io::Result<()> {
        self.ops_state
            .control
            .unbounded_send(control)
            .map_err(|_| io::Error::other("the broker has stopped"))
    }

    /// What the file executor has done (with a storage directory), readable from any thread
    /// while the broker runs.
    pub fn file_stats(&self) -> Option<files::FileStats> {
        self.files.as_ref().map(|f| f.stats())
    }

    /// A handle on the file executor's counters that outlives this value.
    pub fn file_executor(&self) -> Option<Arc<files::FileExecutor>> {
        self.files.clone()
    }

    /// Stops gracefully and waits until done: drains first (new connections and new work
    /// are refused `draining`, answers already owed are delivered, held ones once their
    /// logs sync; at most 10 s), then closes every connection with code 0, syncs the logs
    /// and ends the drive loop. `/readyz` turns 503 at once.
    pub async fn shutdown(mut self) -> io::Result<()> {
        self.ops_state.set_ready(false);
        if let Some(stop) = self.stop.take() {
            // A value asks for the graceful drain (dropping the sender stops at once).
            let _ = stop.send(());
        }
        match self.stopped.take() {
            Some(stopped) => stopped
                .await
                .map_err(|_| io::Error::other("the broker task ended without stopping")),
            None => Ok(()),
        }
    }
}

/// Awaiting the handle shuts the broker down cleanly, as [`RunningBroker::shutdown`].
impl std::future::IntoFuture for RunningBroker {
    type Output = io::Result<()>;
    type IntoFuture = std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<()>> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.shutdown())
    }
}

impl Drop for RunningBroker {
    fn drop(&mut self) {
        // Dropping the sender is the stop signal.
        drop(self.stop.take());
    }
}

impl fmt::Debug for RunningBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunningBroker")
            .field("runtime", &self.runtime)
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}
