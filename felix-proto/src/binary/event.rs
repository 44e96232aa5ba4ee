//! Binary event batches, broker → subscriber: legacy (`0x0002`, with a subscription id) and
//! shared (`0x0004`, without, so one encoded frame serves every subscriber), with their
//! optional fields.
//!
//! ```text
//! [u64 subscription_id]                  legacy 0x0002 only
//! [u64 base_offset]                      with 0x0020
//! [u64 skipped_before]                   with 0x0800 (needs 0x0020)
//! [u8 publisher_len][publisher]          with 0x2000
//! [u32 count]
//! count × ([u64 timestamp_micros] with 0x4000, [u32 len][payload])
//! ```

use std::iter::FusedIterator;

use bytes::{BufMut, Bytes, BytesMut};

use super::expect_layout;
use super::reader::{put_bytes32, put_bytes8, skip_records, Reader, RecordCursor};
use crate::error::DecodeError;
use crate::flags::Flags;
use crate::frame::{encode_frame_header, Frame, HEADER_LEN};

const LAYOUT: &str = "binary event batch";

/// Everything in an event batch before its events, borrowed. Used to encode the broker's
/// fan-out frame ([`encode_event_batch_frame`]) and as the parsed part of an
/// [`EventBatchView`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventBatchHeader<'a> {
    /// `Some` selects the legacy per-subscriber layout (`0x0002`), `None` the shared one
    /// (`0x0004`).
    pub subscription_id: Option<u64>,
    /// `0x0020`: the offset of the first event; event `i` is at `base_offset + i`.
    pub base_offset: Option<u64>,
    /// `0x0800`: offsets just below `base_offset` that hold no event. Only valid with
    /// `base_offset`; alone it makes a frame receivers refuse.
    pub skipped_before: Option<u64>,
    /// `0x2000`: the principal that published the events, at most 255 bytes.
    pub publisher: Option<&'a [u8]>,
    /// `0x4000`: every event is preceded by its append time.
    pub timestamps: bool,
}

impl EventBatchHeader<'_> {
    /// The flag word these fields need.
    pub fn flags(&self) -> Flags {
        let mut flags = if self.subscription_id.is_some() {
            Flags::BINARY_EVENT_BATCH
        } else {
            Flags::BINARY_EVENT_BATCH_SHARED
        };
        if self.base_offset.is_some() {
            flags |= Flags::EVENT_BATCH_OFFSETS;
        }
        if self.skipped_before.is_some() {
            flags |= Flags::EVENT_BATCH_SKIPPED;
        }
        if self.publisher.is_some() {
            flags |= Flags::EVENT_BATCH_PUBLISHER;
        }
        if self.timestamps {
            flags |= Flags::EVENT_BATCH_TIMESTAMPS;
        }
        flags
    }

    /// Encoded size up to and including the count.
    fn encoded_len(&self) -> usize {
        let word = |present: bool| if present { 8 } else { 0 };
        word(self.subscription_id.is_some())
            + word(self.base_offset.is_some())
            + word(self.skipped_before.is_some())
            + self.publisher.map_or(0, |p| 1 + p.len())
            + 4
    }

    /// Encoded size of one event with a payload of `len` bytes.
    fn event_len(&self, len: usize) -> usize {
        if self.timestamps {
            12 + len
        } else {
            4 + len
        }
    }

    fn write(&self, count: usize, out: &mut impl BufMut) {
        if let Some(id) = self.subscription_id {
            out.put_u64(id);
        }
        if let Some(offset) = self.base_offset {
            out.put_u64(offset);
        }
        if let Some(skipped) = self.skipped_before {
            out.put_u64(skipped);
        }
        if let Some(publisher) = self.publisher {
            put_bytes8(out, publisher, "publisher");
        }
        out.put_u32(u32::try_from(count).expect("more than u32::MAX events in one batch"));
    }

    fn write_event(&self, timestamp_micros: u64, payload: &[u8], out: &mut impl BufMut) {
        if self.timestamps {
            out.put_u64(timestamp_micros);
        }
        put_bytes32(out, payload, "payload");
    }
}

/// One delivered event.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Event {
    /// `0x4000`: the record's append time, microseconds since the Unix epoch.
    pub timestamp_micros: Option<u64>,
    /// The record, a slice of the frame it arrived in.
    #[cfg_attr(feature = "arbitrary", arbitrary(with = super::arb::bytes))]
    pub payload: Bytes,
}

/// A binary event batch, owned. Publisher and payloads are slices of the frame they were
/// decoded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventBatch {
    /// `Some` ⇔ legacy `0x0002` layout.
    pub subscription_id: Option<u64>,
    /// `0x0020`.
    pub base_offset: Option<u64>,
    /// `0x0800`, only valid with `base_offset`.
    pub skipped_before: Option<u64>,
    /// `0x2000`, at most 255 bytes.
    pub publisher: Option<Bytes>,
    /// Timestamps are all or none: if any event has one the batch carries `0x4000`, and an
    /// event without one is sent as time 0.
    pub events: Vec<Event>,
}

impl EventBatch {
    /// The borrowed header of this batch.
    pub fn header(&self) -> EventBatchHeader<'_> {
        EventBatchHeader {
            subscription_id: self.subscription_id,
            base_offset: self.base_offset,
            skipped_before: self.skipped_before,
            publisher: self.publisher.as_deref(),
            timestamps: self.events.iter().any(|e| e.timestamp_micros.is_some()),
        }
    }

    /// The exact flag word this batch is sent with.
    pub fn flags(&self) -> Flags {
        self.header().flags()
    }

    /// Decodes a payload received with `flags` (`0x0002` or `0x0004` and modifiers).
    pub fn decode(flags: Flags, payload: &Bytes) -> Result<EventBatch, DecodeError> {
        EventBatchView::parse(flags, payload).map(|view| view.to_batch())
    }

    /// Payload size in bytes.
    pub fn encoded_len(&self) -> usize {
        let header = self.header();
        header.encoded_len()
            + self
                .events
                .iter()
                .map(|e| header.event_len(e.payload.len()))
                .sum::<usize>()
    }

    /// Appends the payload (no frame header) to `out`.
    ///
    /// # Panics
    /// If the publisher is over 255 bytes or a payload over `u32::MAX`.
    pub fn encode_into(&self, out: &mut impl BufMut) {
        let header = self.header();
        header.write(self.events.len(), out);
        for event in &self.events {
            header.write_event(event.timestamp_micros.unwrap_or(0), &event.payload, out);
        }
    }

    /// The batch as a frame.
    pub fn to_frame(&self) -> Frame {
        let mut out = BytesMut::with_capacity(self.encoded_len());
        self.encode_into(&mut out);
        Frame::new(self.flags(), out.freeze())
    }
}

/// Encodes a whole event-batch frame, header included, in one allocation of exactly its
/// size: the buffer the broker encodes once and hands to every subscriber as `Bytes` clones.
///
/// `events` yields `(timestamp_micros, payload)`; the timestamp is written only when
/// `header.timestamps` is set (pass 0 otherwise). It is walked twice, once to size the
/// buffer and once to fill it, hence `Clone`:
///
/// ```
/// # use bytes::Bytes;
/// # use felix_proto::binary::{encode_event_batch_frame, EventBatchHeader};
/// let payloads = [Bytes::from_static(b"a"), Bytes::from_static(b"bc")];
/// let header = EventBatchHeader { base_offset: Some(7), ..Default::default() };
/// let frame = encode_event_batch_frame(&header, payloads.iter().map(|p| (0, &p[..])));
/// assert_eq!(frame.len(), 12 + 8 + 4 + (4 + 1) + (4 + 2));
/// ```
///
/// # Panics
/// As [`EventBatch::encode_into`], or if the payload exceeds `u32::MAX` bytes.
pub fn encode_event_batch_frame<'p, I>(header: &EventBatchHeader<'_>, events: I) -> Bytes
where
    I: IntoIterator<Item = (u64, &'p [u8])>,
    I::IntoIter: Clone,
{
    let events = events.into_iter();
    let (count, records_len) = events.clone().fold((0usize, 0usize), |(n, len), (_, p)| {
        (n + 1, len + header.event_len(p.len()))
    });
    let payload_len = header.encoded_len() + records_len;
    let mut out = Vec::with_capacity(HEADER_LEN + payload_len);
    encode_frame_header(header.flags(), payload_len, &mut out);
    header.write(count, &mut out);
    for (timestamp, payload) in events {
        header.write_event(timestamp, payload, &mut out);
    }
    assert_eq!(
        out.len(),
        HEADER_LEN + payload_len,
        "events iterator changed between passes"
    );
    Bytes::from(out)
}

/// A parsed event batch that borrows its frame: the subscriber's receive path.
///
/// [`EventBatchView::parse`] validates the whole layout without allocating; after that
/// [`EventBatchView::events`] cannot fail.
#[derive(Debug, Clone)]
pub struct EventBatchView<'a> {
    /// Everything before the events.
    pub header: EventBatchHeader<'a>,
    payload: &'a Bytes,
    count: u32,
    records_at: usize,
}

impl<'a> EventBatchView<'a> {
    /// Parses and validates a payload received with `flags`.
    pub fn parse(flags: Flags, payload: &'a Bytes) -> Result<EventBatchView<'a>, DecodeError> {
        let flags = expect_layout(
            flags,
            Flags::BINARY_EVENT_BATCH | Flags::BINARY_EVENT_BATCH_SHARED,
            LAYOUT,
        )?;
        let mut r = Reader::new(payload);
        let mut field = |present: Flags, name| -> Result<Option<u64>, DecodeError> {
            if flags.contains(present) {
                r.u64(name).map(Some)
            } else {
                Ok(None)
            }
        };
        let subscription_id = field(Flags::BINARY_EVENT_BATCH, "subscription_id")?;
        let base_offset = field(Flags::EVENT_BATCH_OFFSETS, "base_offset")?;
        let skipped_before = field(Flags::EVENT_BATCH_SKIPPED, "skipped_before")?;
        let publisher = if flags.contains(Flags::EVENT_BATCH_PUBLISHER) {
            Some(r.bytes8("publisher")?)
        } else {
            None
        };
        let timestamps = flags.contains(Flags::EVENT_BATCH_TIMESTAMPS);
        let count = r.u32("event count")?;
        let records_at = r.position();
        skip_records(&mut r, count, timestamps)?;
        r.finish(LAYOUT)?;
        Ok(EventBatchView {
            header: EventBatchHeader {
                subscription_id,
                base_offset,
                skipped_before,
                publisher,
                timestamps,
            },
            payload,
            count,
            records_at,
        })
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// True for a batch of no events.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The publisher as a `Bytes` slice of the frame.
    pub fn publisher_bytes(&self) -> Option<Bytes> {
        self.header.publisher.map(|p| self.payload.slice_ref(p))
    }

    /// The events, in order; payloads are slices of the frame.
    pub fn events(&self) -> Events<'a> {
        Events {
            frame: self.payload,
            cursor: RecordCursor::new(
                self.payload,
                self.records_at,
                self.count,
                self.header.timestamps,
            ),
        }
    }

    /// The owned batch (nothing is copied but the `Vec` of events).
    pub fn to_batch(&self) -> EventBatch {
        EventBatch {
            subscription_id: self.header.subscription_id,
            base_offset: self.header.base_offset,
            skipped_before: self.header.skipped_before,
            publisher: self.publisher_bytes(),
            events: self.events().collect(),
        }
    }
}

/// The events of an [`EventBatchView`].
#[derive(Debug, Clone)]
pub struct Events<'a> {
    frame: &'a Bytes,
    cursor: RecordCursor<'a>,
}

impl Iterator for Events<'_> {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        self.cursor
            .next_record()
            .map(|(timestamp_micros, range)| Event {
                timestamp_micros,
                payload: self.frame.slice(range),
            })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.cursor.left(), Some(self.cursor.left()))
    }
}

impl ExactSizeIterator for Events<'_> {}
impl FusedIterator for Events<'_> {}

#[cfg(feature = "arbitrary")]
impl<'u> arbitrary::Arbitrary<'u> for EventBatch {
    fn arbitrary(u: &mut arbitrary::Unstructured<'u>) -> arbitrary::Result<Self> {
        use super::arb;
        let subscription_id = u.arbitrary()?;
        let base_offset: Option<u64> = u.arbitrary()?;
        // Only encodable batches: no skip count without an offset, timestamps all or none.
        let skipped_before = if base_offset.is_some() {
            u.arbitrary()?
        } else {
            None
        };
        let publisher = arb::publisher_opt(u)?;
        let timestamps: bool = u.arbitrary()?;
        let events = arb::payloads(u)?
            .into_iter()
            .map(|payload| {
                let timestamp_micros = if timestamps {
                    Some(u.arbitrary()?)
                } else {
                    None
                };
                Ok(Event {
                    timestamp_micros,
                    payload,
                })
            })
            .collect::<arbitrary::Result<_>>()?;
        Ok(EventBatch {
            subscription_id,
            base_offset,
            skipped_before,
            publisher,
            events,
        })
    }
}
