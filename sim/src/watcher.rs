//! A worker's cache watch in durable runs: one prefix watch on the whole cache, kept up
//! across lags, refusals and reconnects by resuming from the offset after the last change
//! it saw. What it sees goes to [`WatchView`] (the `watch_gapless` invariant).

use std::time::Instant;

use bytes::Bytes;
use felix_proto::message::{self, Message};
use felix_proto::Frame;

use crate::client::{CACHE, NAMESPACE, TENANT};
use crate::invariants::watch_gapless::{WatchView, NAME};
use crate::oracle::Violation;

#[derive(Debug, Default)]
pub(crate) struct CacheWatcher {
    /// Where the next watch starts: the offset after the last change seen.
    pub(crate) resume: Option<u64>,
    /// The confirmed watch's subscription id.
    pub(crate) current: Option<u64>,
    pub(crate) view: WatchView,
    pub(crate) lagged: u64,
}

/// How a watch's event stream ended (read through `Debug` in the trace).
#[derive(Debug)]
#[allow(dead_code)]
pub(crate) enum WatchEnd {
    Lagged(u64),
    Error(String),
}

impl CacheWatcher {
    /// The `cache_watch` request for the next watch of the chain.
    pub(crate) fn request(&self) -> Bytes {
        let mut out = Vec::new();
        Message::CacheWatch(message::CacheWatch {
            tenant_id: TENANT.into(),
            namespace: NAMESPACE.into(),
            cache: CACHE.into(),
            key: None,
            prefix: Some(String::new()),
            shard: None,
            from_offset: self.resume,
            retained: None,
            subscription_id: None,
        })
        .encode_frame_into(&mut out);
        Bytes::from(out)
    }

    /// The answer to `cache_watch`. A refusal breaks the chain (the next watch starts
    /// live); a cursor refusal of a resume is a violation: every change seen was durable.
    pub(crate) fn on_answer(
        &mut self,
        now: Instant,
        who: &str,
        frame: &Frame,
    ) -> Result<String, Violation> {
        let msg = Message::decode(&frame.payload).map_err(|e| Violation {
            invariant: "broker_protocol",
            detail: format!("{who}: cache_watch answer: {e}"),
        })?;
        match msg {
            Message::CacheWatchStarted(s) => {
                let resnapshot = s.resnapshot == Some(true);
                self.current = Some(s.subscription_id);
                // The checkpoint: a later watch resumes here even if no change arrives, and
                // a resnapshot's values below it are current state, not history to replay.
                if self.resume.is_none() || resnapshot {
                    self.resume = Some(self.resume.unwrap_or(0).max(s.resume_offset));
                }
                self.view.on_started(now, s.resume_offset, resnapshot);
                Ok(format!(
                    "watch {} from {:?} resume_offset {} resnapshot {resnapshot}",
                    s.subscription_id, self.resume, s.resume_offset
                ))
            }
            Message::SubscribeCursorError(e) => Err(Violation {
                invariant: NAME,
                detail: format!(
                    "{who}: resuming the watch at {} was refused ({:?}, available {}): a change it saw is gone",
                    e.requested, e.reason, e.available
                ),
            }),
            other => {
                self.resume = None;
                self.view.restart();
                Ok(format!("watch refused: {other:?}"))
            }
        }
    }

    /// A frame on the watch's event stream (after its hello); `Some` when it ends it.
    pub(crate) fn on_event_frame(
        &mut self,
        who: &str,
        frame: &Frame,
    ) -> Result<Option<WatchEnd>, Violation> {
        let bad = |detail: String| Violation {
            invariant: "broker_protocol",
            detail: format!("{who}: {detail}"),
        };
        if !frame.flags.is_empty() {
            return Err(bad(format!(
                "a binary frame ({:#06x}) on a cache watch",
                frame.flags.0
            )));
        }
        match Message::decode(&frame.payload).map_err(|e| bad(e.to_string()))? {
            Message::CacheEvent(e) => {
                self.view.on_change(who, e.offset, e.value.as_ref())?;
                self.resume = Some(self.resume.map_or(e.offset + 1, |r| r.max(e.offset + 1)));
                Ok(None)
            }
            Message::CacheWatchLagged(l) => {
                self.view.on_lagged(who, l.resume_from)?;
                self.lagged += 1;
                self.resume = Some(l.resume_from);
                self.current = None;
                Ok(Some(WatchEnd::Lagged(l.resume_from)))
            }
            Message::Error(e) => {
                self.current = None;
                Ok(Some(WatchEnd::Error(e.message)))
            }
            other => Err(bad(format!("{} on a cache watch", other.type_name()))),
        }
    }
}
