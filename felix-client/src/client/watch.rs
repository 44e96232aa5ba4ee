//! Cache watches: `cache_watch` on its own stream, then the changes on the event stream the
//! broker opens for it (JSON `cache_event` frames, possibly ended by `cache_watch_lagged`).

use std::sync::Arc;

use bytes::Bytes;
use felix_proto::message::{self, Message};
use felix_proto::{Features, Frame, FrameDecoder};

use super::{open_authenticated, read_error, read_frame, write_error, Client, Inner};
use crate::error::ClientError;

/// Which keys a watch follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchFilter {
    /// Exactly this key.
    Key(String),
    /// Every key starting with this (empty: every key).
    Prefix(String),
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// Changes from now on.
    Live,
    /// Each matching key's current value first, then changes.
    Retained,
    /// Stored changes from this offset (the first one not seen), then live ones.
    From(u64),
}

/// One change: `value` is `None` for a delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheChange {
    pub key: String,
    pub value: Option<Bytes>,
    /// The change's cache-log offset; resume from `offset + 1`.
    pub offset: u64,
    /// Absolute Unix milliseconds the value expires at, if it does.
    pub expires_at_millis: Option<u64>,
}

/// What [`CacheWatch::next`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheWatchItem {
    Change(CacheChange),
    /// The watch fell behind and ended; re-watching from `resume_from` is gapless.
    Lagged {
        resume_from: u64,
    },
    /// The broker finished the event stream without a reason.
    End,
}

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
}

impl CacheWatch {
    pub fn id(&self) -> u64 {
        self.subscription_id
    }

    /// Where live delivery began: every change at or past it is delivered.
    pub fn resume_offset(&self) -> u64 {
        self.resume_offset
    }

    /// The requested history was collapsed by compaction: current values came instead.
    pub fn resnapshot(&self) -> bool {
        self.resnapshot
    }

    /// For a retained watch, how many current values come first.
    pub fn retained_count(&self) -> Option<u64> {
        self.retained_count
    }

    /// The next change, or how the watch ended (repeated on every later call). A broker
    /// `error` on the stream is an error. Cancel-safe.
    pub async fn next(&mut self) -> Result<CacheWatchItem, ClientError> {
        loop {
            if let Some(end) = &self.end {
                return Ok(end.clone());
            }
            if let Some(frame) = self.decoder.next_frame()? {
                match watch_frame(&frame)? {
                    CacheWatchItem::Change(c) => return Ok(CacheWatchItem::Change(c)),
                    end => self.end = Some(end),
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

fn watch_frame(frame: &Frame) -> Result<CacheWatchItem, ClientError> {
    if !frame.flags.is_empty() {
        return Err(ClientError::protocol("a binary frame on a cache watch"));
    }
    match Message::decode(&frame.payload)? {
        Message::CacheEvent(e) => Ok(CacheWatchItem::Change(CacheChange {
            key: e.key,
            value: e.value,
            offset: e.offset,
            expires_at_millis: e.expires_at_millis.filter(|&ms| ms != 0),
        })),
        Message::CacheWatchLagged(l) => Ok(CacheWatchItem::Lagged {
            resume_from: l.resume_from,
        }),
        Message::Error(e) => Err(ClientError::server(e.code, e.retry, e.message)),
        other => Err(ClientError::protocol(format!(
            "{} on a cache watch",
            other.type_name()
        ))),
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
        let inner = &self.inner;
        if !inner.caps.broker_has(Features::CACHE_WATCH) {
            return Err(ClientError::Usage(
                "the broker does not serve cache watches".into(),
            ));
        }
        let timeout = inner.config.request_timeout;
        let (key, prefix) = match filter {
            WatchFilter::Key(k) => (Some(k), None),
            WatchFilter::Prefix(p) => (None, Some(p)),
        };
        let request = Message::CacheWatch(message::CacheWatch {
            tenant_id: inner.config.tenant.clone(),
            namespace: namespace.to_owned(),
            cache: cache.to_owned(),
            key,
            prefix,
            shard: None,
            from_offset: match start {
                WatchStart::From(n) => Some(n),
                _ => None,
            },
            retained: (start == WatchStart::Retained).then_some(true),
            subscription_id: None,
        });
        let mut frame = Vec::new();
        request.encode_frame_into(&mut frame);
        let (mut send, mut recv, mut decoder, _caps) =
            open_authenticated(&*inner.runtime, &inner.conn, &inner.config).await?;
        send.write_chunk(Bytes::from(frame))
            .await
            .map_err(write_error)?;
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
        if !reply.flags.is_empty() {
            return Err(ClientError::protocol("a binary answer to cache_watch"));
        }
        let started = match Message::decode(&reply.payload)? {
            Message::CacheWatchStarted(s) => s,
            Message::Error(e) => return Err(ClientError::server(e.code, e.retry, e.message)),
            Message::SubscribeCursorError(e) => {
                return Err(ClientError::server(
                    Some(felix_proto::ErrorCode::InvalidRequest),
                    None,
                    format!(
                        "cursor: requested {}, available {}",
                        e.requested, e.available
                    ),
                ))
            }
            Message::Unsupported(u) => {
                return Err(ClientError::Unsupported {
                    request_type: u.request_type,
                })
            }
            other => {
                return Err(ClientError::protocol(format!(
                    "{} answered cache_watch",
                    other.type_name()
                )))
            }
        };
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
            resnapshot: started.resnapshot == Some(true),
            retained_count: started.retained_count,
            recv: events.recv,
            decoder: events.decoder,
            end: None,
            _client: self.inner.clone(),
        })
    }
}
