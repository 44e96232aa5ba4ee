//! A worker's cache watch in durable runs: one prefix watch on the whole cache, kept up
//! across lags, refusals and reconnects by resuming from the offset after the last change
//! it saw. What it sees goes to [`WatchView`] (the `watch_gapless` invariant). The frames
//! are the client core's (`felix_client::core::watch_frame` and its readers).

use std::time::Instant;

use bytes::Bytes;
use felix_client::core::{
    read_watch_answer, read_watch_event, watch_frame, CacheWatchItem, Capabilities, WatchFilter,
    WatchReply, WatchStart,
};
use felix_client::ClientError;
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
    /// The `cache_watch` request for the next watch of the chain, on a stream
    /// authenticated with `caps`.
    pub(crate) fn request(&self, caps: &Capabilities) -> Result<Bytes, ClientError> {
        let start = self.resume.map_or(WatchStart::Live, WatchStart::From);
        watch_frame(
            caps,
            TENANT,
            NAMESPACE,
            CACHE,
            WatchFilter::Prefix(String::new()),
            start,
        )
    }

    /// The answer to `cache_watch`. A refusal breaks the chain (the next watch starts
    /// live); a cursor refusal of a resume is a violation: every change seen was durable.
    pub(crate) fn on_answer(
        &mut self,
        now: Instant,
        who: &str,
        frame: &Frame,
    ) -> Result<String, Violation> {
        let reply = read_watch_answer(frame).map_err(|e| Violation {
            invariant: "broker_protocol",
            detail: format!("{who}: cache_watch answer: {e}"),
        })?;
        match reply {
            WatchReply::Started(s) => {
                let resnapshot = s.resnapshot;
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
            WatchReply::CursorRefused {
                reason,
                requested,
                available,
            } => Err(Violation {
                invariant: NAME,
                detail: format!(
                    "{who}: resuming the watch at {requested} was refused ({reason:?}, available {available}): a change it saw is gone"
                ),
            }),
            WatchReply::Refused(e) => {
                self.resume = None;
                self.view.restart();
                Ok(format!("watch refused: {e}"))
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
        match read_watch_event(frame) {
            Ok(CacheWatchItem::Change(c)) => {
                self.view.on_change(who, c.offset, c.value.as_ref())?;
                self.resume = Some(self.resume.map_or(c.offset + 1, |r| r.max(c.offset + 1)));
                Ok(None)
            }
            Ok(CacheWatchItem::Lagged { resume_from }) => {
                self.view.on_lagged(who, resume_from)?;
                self.lagged += 1;
                self.resume = Some(resume_from);
                self.current = None;
                Ok(Some(WatchEnd::Lagged(resume_from)))
            }
            // The broker's `error` ends the watch.
            Err(ClientError::Server { message, .. }) => {
                self.current = None;
                Ok(Some(WatchEnd::Error(message)))
            }
            // Only the front end reads a stream's end as an item; this reader never does.
            Ok(CacheWatchItem::End) => Err(bad("an end item for a cache watch frame".into())),
            Err(e) => Err(bad(e.to_string())),
        }
    }
}
