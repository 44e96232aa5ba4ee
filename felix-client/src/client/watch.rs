//! Cache watches over the network: `cache_watch` on its own stream, then the changes on
//! the event stream the broker opens for it. The frames are `core::watch`.

use std::sync::Arc;

use felix_proto::FrameDecoder;

use super::{open_authenticated, read_error, read_frame, write_error, Client, Inner};
use crate::core::cluster::parse_addr;
use crate::core::watch::{
    read_watch_frame, read_watch_reply, resume_after_move, watch_frame, CacheWatchItem,
    WatchFilter, WatchFrame, WatchStart,
};
use crate::error::ClientError;

/// A live cache watch.
pub struct CacheWatch {
    subscription_id: u64,
    resume_offset: u64,
    resnapshot: bool,
    retained_count: Option<u64>,
    recv: quinn::RecvStream,
    decoder: FrameDecoder,
    end: Option<CacheWatchItem>,
    _client: Arc<Inner>,
    /// In a cluster: how to watch again after a lost broker.
    resume: Option<Box<WatchResume>>,
}

/// What a cluster watch needs to be made again where it left off.
pub(crate) struct WatchResume {
    pub(crate) cluster: Arc<super::cluster::ClusterShared>,
    pub(crate) namespace: String,
    pub(crate) cache: String,
    pub(crate) filter: WatchFilter,
    /// The first change offset not delivered yet.
    pub(crate) next: u64,
}

impl CacheWatch {
    pub fn id(&self) -> u64 {
        self.subscription_id
    }

    /// The broker this watch is on now (in a cluster, another after a redirect, a move or
    /// a lost broker).
    pub fn broker(&self) -> std::net::SocketAddr {
        self._client.config.addr
    }

    /// Where live delivery began: every change at or past it is delivered.
    pub fn resume_offset(&self) -> u64 {
        self.resume_offset
    }

    /// The requested history was collapsed by compaction: current values came instead.
    pub fn resnapshot(&self) -> bool {
        self.resnapshot
    }

    pub(crate) fn set_resume(&mut self, resume: WatchResume) {
        self.resume = Some(Box::new(resume));
    }

    /// For a retained watch, how many current values come first.
    pub fn retained_count(&self) -> Option<u64> {
        self.retained_count
    }

    /// The next change, or how the watch ended (repeated on every later call). A broker
    /// `error` on the stream is an error. Cancel-safe.
    ///
    /// In a cluster neither a lost broker nor a move (`shard_moved`) is an end: the watch is
    /// made again, at the owner the move names (else the cache's owner), from the first
    /// change not delivered or the move's resume point, so no change is missed or repeated.
    pub async fn next(&mut self) -> Result<CacheWatchItem, ClientError> {
        loop {
            let frame = self.next_here().await;
            let Some(resume) = self.resume.as_mut() else {
                return match frame? {
                    WatchFrame::Item(item) => Ok(item),
                    WatchFrame::Moved { .. } => {
                        Err(ClientError::protocol("shard_moved on a cache watch"))
                    }
                };
            };
            let mut at = None;
            match frame {
                Ok(WatchFrame::Item(CacheWatchItem::Change(c))) => {
                    resume.next = resume.next.max(c.offset + 1);
                    return Ok(CacheWatchItem::Change(c));
                }
                Ok(WatchFrame::Item(item)) => return Ok(item),
                Ok(WatchFrame::Moved {
                    resume_from, addr, ..
                }) => {
                    resume.next = resume_after_move(resume.next, resume_from);
                    // No address (or one that does not parse): the owners are asked again.
                    at = Some(addr.as_deref().and_then(parse_addr));
                }
                Err(e @ (ClientError::Server { .. } | ClientError::Protocol(_))) => return Err(e),
                Err(_) => {
                    if self._client.conn.close_reason().is_some() {
                        resume.cluster.node_failed(self._client.config.addr);
                    }
                }
            }
            // Cloned, not taken: a dropped call leaves the watch able to resume.
            let (cluster, namespace, cache, filter, next) = (
                resume.cluster.clone(),
                resume.namespace.clone(),
                resume.cache.clone(),
                resume.filter.clone(),
                resume.next,
            );
            *self = cluster
                .watch(&namespace, &cache, filter, WatchStart::From(next), at)
                .await?;
        }
    }

    async fn next_here(&mut self) -> Result<WatchFrame, ClientError> {
        loop {
            if let Some(end) = &self.end {
                return Ok(WatchFrame::Item(end.clone()));
            }
            if let Some(frame) = self.decoder.next_frame()? {
                match read_watch_frame(&frame)? {
                    WatchFrame::Item(CacheWatchItem::Change(c)) => {
                        return Ok(WatchFrame::Item(CacheWatchItem::Change(c)))
                    }
                    WatchFrame::Item(end) => self.end = Some(end),
                    // The move ends this stream; the caller watches again elsewhere.
                    moved @ WatchFrame::Moved { .. } => return Ok(moved),
                }
                continue;
            }
            match self.recv.read_chunk(usize::MAX, true).await {
                Ok(Some(chunk)) => self.decoder.feed_bytes(chunk.bytes),
                Ok(None) if self.decoder.buffered() == 0 => self.end = Some(CacheWatchItem::End),
                Ok(None) => return Err(ClientError::protocol("watch stream ended mid-frame")),
                Err(e) => return Err(read_error(e)),
            }
        }
    }
}

impl Client {
    /// Watches one key or prefix of `namespace/cache` on a new stream, and waits for both
    /// `cache_watch_started` and the broker's event stream.
    pub async fn watch_cache(
        &self,
        namespace: &str,
        cache: &str,
        filter: WatchFilter,
        start: WatchStart,
    ) -> Result<CacheWatch, ClientError> {
        // A cluster client watches at the cache's owner, and resumes there.
        if let Some(cluster) = &self.cluster {
            return Box::pin(cluster.clone().watch(namespace, cache, filter, start, None)).await;
        }
        let inner = &self.inner;
        let frame = watch_frame(
            &inner.caps,
            &inner.config.tenant,
            namespace,
            cache,
            filter,
            start,
        )?;
        let timeout = inner.config.request_timeout;
        let (mut send, mut recv, mut decoder, _caps) =
            open_authenticated(&*inner.runtime, &inner.conn, &inner.config).await?;
        send.write_chunk(frame).await.map_err(write_error)?;
        let _ = send.finish();
        let reply = read_frame(
            &*inner.runtime,
            &mut recv,
            &mut decoder,
            timeout,
            "the cache_watch answer",
        )
        .await?
        .ok_or_else(|| ClientError::Connection("watch stream ended with no answer".into()))?;
        let started = read_watch_reply(&reply)?;
        drop(recv);
        let events = crate::runtime::timeout(
            &*inner.runtime,
            timeout,
            inner.events.wait(started.subscription_id),
        )
        .await
        .map_err(|_| ClientError::Timeout("the watch's event stream"))??;
        Ok(CacheWatch {
            subscription_id: started.subscription_id,
            resume_offset: started.resume_offset,
            resnapshot: started.resnapshot,
            retained_count: started.retained_count,
            recv: events.recv,
            decoder: events.decoder,
            end: None,
            _client: self.inner.clone(),
            resume: None,
        })
    }
}
