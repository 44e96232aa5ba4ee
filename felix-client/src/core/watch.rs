//! Cache watches: `cache_watch` on its own stream, answered `cache_watch_started`; then the
//! changes on the event stream the broker opens for it (JSON `cache_event` frames, possibly
//! ended by `cache_watch_lagged`).

use bytes::Bytes;
use felix_proto::message::{self, CursorErrorReason, Message};
use felix_proto::{Features, Frame};

use super::auth::Capabilities;
use super::codec::{frame_bytes, refusal};
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

/// What one watch event frame (or the stream's end) meant.
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

/// The broker's confirmation of a watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchStarted {
    /// The id the event stream's hello will carry.
    pub subscription_id: u64,
    /// Where live delivery began: every change at or past it is delivered.
    pub resume_offset: u64,
    /// The requested history was collapsed by compaction: current values came instead.
    pub resnapshot: bool,
    /// For a retained watch, how many current values come first.
    pub retained_count: Option<u64>,
}

/// What the answer on a watch stream said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchReply {
    Started(WatchStarted),
    /// The requested `from_offset` cannot be served (`subscribe_cursor_error`).
    CursorRefused {
        reason: CursorErrorReason,
        requested: u64,
        available: u64,
    },
    /// Any other refusal (`error`, `unsupported`).
    Refused(ClientError),
}

/// Builds the `cache_watch` frame; refused locally unless the broker advertised
/// `FEATURE_CACHE_WATCH`.
pub fn watch_frame(
    caps: &Capabilities,
    tenant: &str,
    namespace: &str,
    cache: &str,
    filter: WatchFilter,
    start: WatchStart,
) -> Result<Bytes, ClientError> {
    if !caps.broker_has(Features::CACHE_WATCH) {
        return Err(ClientError::Usage(
            "the broker does not serve cache watches".into(),
        ));
    }
    let (key, prefix) = match filter {
        WatchFilter::Key(k) => (Some(k), None),
        WatchFilter::Prefix(p) => (None, Some(p)),
    };
    Ok(frame_bytes(&Message::CacheWatch(message::CacheWatch {
        tenant_id: tenant.to_owned(),
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
    })))
}

/// Reads the answer on the watch stream. `Err` for a frame that does not answer
/// `cache_watch`.
pub fn read_watch_answer(frame: &Frame) -> Result<WatchReply, ClientError> {
    if !frame.flags.is_empty() {
        return Err(ClientError::protocol("a binary answer to cache_watch"));
    }
    match Message::decode(&frame.payload)? {
        Message::CacheWatchStarted(s) => Ok(WatchReply::Started(WatchStarted {
            subscription_id: s.subscription_id,
            resume_offset: s.resume_offset,
            resnapshot: s.resnapshot == Some(true),
            retained_count: s.retained_count,
        })),
        Message::Error(e) => Ok(WatchReply::Refused(refusal(e))),
        Message::SubscribeCursorError(e) => Ok(WatchReply::CursorRefused {
            reason: e.reason,
            requested: e.requested,
            available: e.available,
        }),
        Message::Unsupported(u) => Ok(WatchReply::Refused(ClientError::Unsupported {
            request_type: u.request_type,
        })),
        // Routing, not a refusal: a cluster front end follows it with the same request.
        Message::NotLeader(n) => Ok(WatchReply::Refused(ClientError::NotLeader {
            node_id: n.node_id,
            addr: n.addr,
            generation: n.generation,
        })),
        other => Err(ClientError::protocol(format!(
            "{} answered cache_watch",
            other.type_name()
        ))),
    }
}

/// Reads the answer on the watch stream: `cache_watch_started`, or a refusal.
pub fn read_watch_reply(frame: &Frame) -> Result<WatchStarted, ClientError> {
    match read_watch_answer(frame)? {
        WatchReply::Started(started) => Ok(started),
        WatchReply::CursorRefused {
            requested,
            available,
            ..
        } => Err(ClientError::server(
            Some(felix_proto::ErrorCode::InvalidRequest),
            None,
            format!("cursor: requested {requested}, available {available}"),
        )),
        WatchReply::Refused(e) => Err(e),
    }
}

/// A watch's event-stream frame as a cluster front end reads it: an item, or the move that
/// ended the watch (the cache's shard went to another owner; watch again there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchFrame {
    Item(CacheWatchItem),
    /// `shard_moved`: the old owner offered every change before `resume_from`.
    Moved {
        resume_from: Option<u64>,
        node_id: Option<String>,
        addr: Option<String>,
    },
}

/// Where a moved watch is made again: the first change not delivered, or the move's resume
/// point when that is later (the old owner offered everything before it). Never earlier, so
/// nothing is repeated; never past an undelivered change the old owner held back.
pub fn resume_after_move(next: u64, resume_from: Option<u64>) -> u64 {
    resume_from.map_or(next, |m| next.max(m))
}

/// Reads one frame of a watch's event stream after its hello, a move included.
pub fn read_watch_frame(frame: &Frame) -> Result<WatchFrame, ClientError> {
    if !frame.flags.is_empty() {
        return Err(ClientError::protocol("a binary frame on a cache watch"));
    }
    match Message::decode(&frame.payload)? {
        Message::CacheEvent(e) => Ok(WatchFrame::Item(CacheWatchItem::Change(CacheChange {
            key: e.key,
            value: e.value,
            offset: e.offset,
            expires_at_millis: e.expires_at_millis.filter(|&ms| ms != 0),
        }))),
        Message::CacheWatchLagged(l) => Ok(WatchFrame::Item(CacheWatchItem::Lagged {
            resume_from: l.resume_from,
        })),
        Message::ShardMoved(m) => Ok(WatchFrame::Moved {
            resume_from: m.resume_from,
            node_id: m.node_id,
            addr: m.addr,
        }),
        Message::Error(e) => Err(refusal(e)),
        other => Err(ClientError::protocol(format!(
            "{} on a cache watch",
            other.type_name()
        ))),
    }
}

/// Reads one frame of a watch's event stream after its hello: a change, or the lag that
/// ends the watch. A broker `error` is `Err(ClientError::Server)`; a move, which only a
/// cluster front end follows ([`read_watch_frame`]), is a protocol error here.
pub fn read_watch_event(frame: &Frame) -> Result<CacheWatchItem, ClientError> {
    match read_watch_frame(frame)? {
        WatchFrame::Item(item) => Ok(item),
        WatchFrame::Moved { .. } => Err(ClientError::protocol("shard_moved on a cache watch")),
    }
}
