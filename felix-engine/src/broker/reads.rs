//! Bounded reads of a durable shard without subscribing: `stream_read` (one page of
//! records) and `offset_for_time` (the first offset appended at or after a time).
//!
//! Both are log reads (file operations like any other); their results come back through
//! the log's `Read` events, and the broker turns each into the encoded answer frame the
//! waiting session sends ([`Notice::Value`] with the frame as its value).

use std::collections::HashMap;
use std::time::Instant;

use bytes::Bytes;
use felix_proto::message::{
    CursorErrorReason, Message, OffsetValue, StreamRecord, StreamRecords, SubscribeCursorError,
};
use felix_proto::ErrorCode;

use super::encode::encode_message;
use super::{Broker, BrokerError, Notice, StreamKey};
use felix_storage::log::{ReadBatch, ReadError, ReadTicket, MAX_RECORDS_PER_READ, READ_MAX_BYTES};
use felix_storage::ops::LogId;

/// Payload bytes one `stream_read` page carries at most.
pub(crate) const PAGE_MAX_BYTES: usize = READ_MAX_BYTES as usize;
/// What an unread page counts against its connection's unwritten-answer budget: a full
/// page base64-encoded, plus the JSON around each of its records.
pub(crate) const PAGE_FRAME_RESERVE: usize = PAGE_MAX_BYTES / 3 * 4 + MAX_RECORDS_PER_READ * 96;

/// A `stream_read` as the session hands it over.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PageRequest {
    pub(crate) shard: u32,
    pub(crate) from: u64,
    pub(crate) end: Option<u64>,
    pub(crate) max_records: Option<u64>,
    pub(crate) max_bytes: Option<u64>,
    pub(crate) request_id: u64,
}

/// The answer to a read: the frame now, or once the log read `ticket` lands.
#[derive(Debug)]
pub(crate) enum ReadAnswer {
    Now(Bytes),
    Later { log: LogId, ticket: ReadTicket },
}

#[derive(Debug, Clone, Copy)]
enum PageKind {
    Records { end: Option<u64> },
    Time { at_micros: u64 },
}

#[derive(Debug)]
struct PendingPage {
    kind: PageKind,
    request_id: u64,
    /// The ticket the session waits on (a time search may take several reads).
    answer_ticket: ReadTicket,
}

/// Reads in flight, by log and ticket.
#[derive(Debug, Default)]
pub(crate) struct PageReads {
    pending: HashMap<(LogId, ReadTicket), PendingPage>,
}

fn cursor_error(reason: CursorErrorReason, requested: u64, available: u64) -> Bytes {
    encode_message(&Message::SubscribeCursorError(SubscribeCursorError {
        reason,
        requested,
        available,
    }))
}

fn records_frame(page: &ReadBatch, end: Option<u64>, request_id: u64) -> Bytes {
    let end = end.unwrap_or(u64::MAX);
    let mut records = Vec::with_capacity(page.record_count());
    let mut next_offset = page.next_offset.min(end);
    'batches: for b in &page.batches {
        for (i, payload) in b.payloads.iter().enumerate() {
            let offset = b.first_offset + i as u64;
            if offset >= end {
                next_offset = end;
                break 'batches;
            }
            records.push(StreamRecord {
                offset,
                payload: payload.clone(),
                publisher: b
                    .publisher
                    .as_ref()
                    .map(|p| String::from_utf8_lossy(p).into_owned()),
                timestamp_micros: Some(b.time_us),
            });
        }
    }
    encode_message(&Message::StreamRecords(StreamRecords {
        records,
        next_offset,
        request_id,
    }))
}

fn offset_frame(offset: Option<u64>, request_id: u64) -> Bytes {
    encode_message(&Message::OffsetValue(OffsetValue { offset, request_id }))
}

fn read_refusal(e: ReadError) -> BrokerError {
    match e {
        ReadError::Busy => BrokerError::new(
            ErrorCode::Overloaded,
            "the shard has too many reads in flight",
        ),
        other => BrokerError::storage(format!("the shard's log cannot be read: {other:?}")),
    }
}

impl Broker {
    /// The durable log of a shard, open, with the raw tail read back (see `prepare_shard`).
    fn readable_log(
        &mut self,
        now: Instant,
        key: &StreamKey,
        shard: u32,
        what: &str,
    ) -> Result<LogId, BrokerError> {
        if shard >= self.shard_count(key).unwrap_or(self.cfg.default_shards) {
            return Err(BrokerError::invalid(format!(
                "shard {shard} is out of range"
            )));
        }
        let (stream, tail) = self.prepare_shard(now, key, shard)?;
        match (tail, &self.streams[stream].shards[shard as usize].store) {
            (Some(_), Some(store)) => Ok(store.log),
            _ => Err(BrokerError::invalid(format!(
                "{what} needs a durable stream: an in-memory one has no log to read"
            ))),
        }
    }

    fn issue_read(
        &mut self,
        log: LogId,
        from: u64,
        (max_records, max_bytes): (usize, usize),
    ) -> Result<ReadTicket, BrokerError> {
        let logs = self.logs.as_mut().expect("durable");
        let shard_log = logs
            .slot_mut(log)
            .and_then(|s| s.log.stream_mut())
            .expect("a stream's log");
        let ticket = shard_log
            .read(from, max_records, max_bytes)
            .map_err(read_refusal)?;
        logs.mark_dirty(log);
        Ok(ticket)
    }

    /// One page of a durable shard's records (`stream_read`).
    pub(crate) fn stream_read(
        &mut self,
        now: Instant,
        key: &StreamKey,
        req: PageRequest,
    ) -> Result<ReadAnswer, BrokerError> {
        let log = self.readable_log(now, key, req.shard, "stream_read")?;
        let shard_log = self
            .logs
            .as_ref()
            .expect("durable")
            .slot(log)
            .expect("live");
        let (start, tail) = (
            shard_log.log.shard().start_offset(),
            shard_log.log.shard().next_offset(),
        );
        if req.from < start {
            let frame = cursor_error(CursorErrorReason::TooOld, req.from, start);
            return Ok(ReadAnswer::Now(frame));
        }
        if req.from > tail {
            let frame = cursor_error(CursorErrorReason::InFuture, req.from, tail);
            return Ok(ReadAnswer::Now(frame));
        }
        if req.end.is_some_and(|end| end <= req.from) {
            let empty = ReadBatch {
                batches: Vec::new(),
                next_offset: req.from,
            };
            return Ok(ReadAnswer::Now(records_frame(&empty, None, req.request_id)));
        }
        let cap = |asked: Option<u64>, max: usize| match asked {
            None | Some(0) => max,
            Some(n) => (n as usize).min(max),
        };
        let budget = (
            cap(req.max_records, MAX_RECORDS_PER_READ),
            cap(req.max_bytes, PAGE_MAX_BYTES),
        );
        let kind = PageKind::Records { end: req.end };
        self.start_page(log, req.from, budget, kind, req.request_id)
    }

    /// Issues the first read of a page and remembers what answers it.
    fn start_page(
        &mut self,
        log: LogId,
        from: u64,
        budget: (usize, usize),
        kind: PageKind,
        request_id: u64,
    ) -> Result<ReadAnswer, BrokerError> {
        let ticket = self.issue_read(log, from, budget)?;
        let page = PendingPage {
            kind,
            request_id,
            answer_ticket: ticket,
        };
        self.page_reads.pending.insert((log, ticket), page);
        Ok(ReadAnswer::Later { log, ticket })
    }

    /// The lowest offset on a durable shard whose stored append time is at or after
    /// `at_micros` (what that means when the clock stepped back: docs/stream-features.md).
    pub(crate) fn offset_for_time(
        &mut self,
        now: Instant,
        key: &StreamKey,
        shard: u32,
        at_micros: u64,
        request_id: u64,
    ) -> Result<ReadAnswer, BrokerError> {
        let log = self.readable_log(now, key, shard, "offset_for_time")?;
        let slot = self
            .logs
            .as_ref()
            .expect("durable")
            .slot(log)
            .expect("live");
        // The sparse index says where to start; the entries read from there say which.
        let Some(from) = slot.log.shard().seek_time(at_micros) else {
            return Ok(ReadAnswer::Now(offset_frame(None, request_id)));
        };
        let from = from.max(slot.log.shard().start_offset());
        let budget = (MAX_RECORDS_PER_READ, PAGE_MAX_BYTES);
        self.start_page(log, from, budget, PageKind::Time { at_micros }, request_id)
    }

    /// `log` is gone (its stream was deleted): every page read on it is answered with an
    /// error now, since its read will never land.
    pub(super) fn fail_page_reads(&mut self, log: LogId, why: &str) {
        let mut gone: Vec<_> = self
            .page_reads
            .pending
            .keys()
            .filter(|(l, _)| *l == log)
            .copied()
            .collect();
        // Ticket order, not the hash map's: the answers go out in this order.
        gone.sort_unstable_by_key(|(_, t)| t.0);
        for key in gone {
            let page = self.page_reads.pending.remove(&key).expect("listed");
            if let Some(logs) = self.logs.as_mut() {
                logs.notices.push_back(Notice::Value {
                    log,
                    ticket: page.answer_ticket,
                    value: Err(why.to_owned()),
                });
            }
        }
    }

    /// A log read landed: if it was one of ours, answer it (or read on) and give `None`;
    /// otherwise hand the result back for the catch-up readers.
    pub(super) fn on_page_read(
        &mut self,
        log: LogId,
        ticket: ReadTicket,
        result: Result<ReadBatch, ReadError>,
    ) -> Option<Result<ReadBatch, ReadError>> {
        let Some(page) = self.page_reads.pending.remove(&(log, ticket)) else {
            return Some(result);
        };
        let value = match (page.kind, result) {
            (_, Err(e)) => Err(format!("the shard's log cannot be read: {e:?}")),
            (PageKind::Records { end }, Ok(batch)) => {
                Ok(records_frame(&batch, end, page.request_id))
            }
            (PageKind::Time { at_micros }, Ok(batch)) => {
                // Everything below where the search started is older (`seek_time`), so the
                // first entry this recent in the pages read from there is the answer.
                let found = batch
                    .batches
                    .iter()
                    .find(|b| b.time_us >= at_micros)
                    .map(|b| b.first_offset);
                let durable = self.durable_offset(log);
                if found.is_none() && !batch.batches.is_empty() && batch.next_offset < durable {
                    // Not in this page: read on from where it stopped.
                    let budget = (MAX_RECORDS_PER_READ, PAGE_MAX_BYTES);
                    match self.issue_read(log, batch.next_offset, budget) {
                        Ok(next) => {
                            self.page_reads.pending.insert((log, next), page);
                            return None;
                        }
                        Err(e) => Err(e.message),
                    }
                } else {
                    Ok(offset_frame(found, page.request_id))
                }
            }
        };
        let logs = self.logs.as_mut().expect("durable");
        logs.notices.push_back(Notice::Value {
            log,
            ticket: page.answer_ticket,
            value: value.map(Some),
        });
        None
    }
}
