//! The binary publish batch (`0x0001`) and its prefixes: acked (`0x0008`), idempotent
//! (`0x0100`) and keyed (`0x0040`).
//!
//! ```text
//! [u64 request_id][u8 ack_mode]          with 0x0008
//! [u64 producer_id][u64 sequence]        with 0x0100 (needs 0x0008)
//! [u16 key_len][key]                     with 0x0040
//! [u16 len]tenant [u16 len]namespace [u16 len]stream
//! [u32 count] count × ([u32 len][payload])
//! ```

use std::iter::FusedIterator;

use bytes::{BufMut, Bytes, BytesMut};

use super::expect_layout;
use super::reader::{put_bytes16, put_bytes32, skip_records, Reader, RecordCursor};
use crate::error::DecodeError;
use crate::flags::Flags;
use crate::frame::{encode_frame_header, Frame, HEADER_LEN};

const LAYOUT: &str = "binary publish batch";

/// How an acked batch wants to be acknowledged. There is no "none": an unacknowledged
/// publish is a plain `0x0001` frame without the prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum AckMode {
    /// `1`: the ack is sent once every record is written.
    PerMessage,
    /// `2`: one ack for the batch as a unit.
    PerBatch,
}

impl AckMode {
    /// The wire byte.
    pub fn number(self) -> u8 {
        match self {
            AckMode::PerMessage => 1,
            AckMode::PerBatch => 2,
        }
    }

    /// Reads the wire byte; anything but 1 or 2 is refused.
    pub fn from_number(n: u8) -> Result<AckMode, DecodeError> {
        match n {
            1 => Ok(AckMode::PerMessage),
            2 => Ok(AckMode::PerBatch),
            other => Err(DecodeError::InvalidValue {
                field: "ack_mode",
                detail: format!("{other} is neither 1 (per_message) nor 2 (per_batch)"),
            }),
        }
    }
}

/// The acked prefix (`0x0008`): the batch is owed an ack carrying `request_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct AckedPrefix {
    /// Echoed by the ack; per publish stream, chosen by the client.
    pub request_id: u64,
    /// How the client wants the batch acknowledged.
    pub ack_mode: AckMode,
}

/// The idempotent prefix (`0x0100`): the producer and its sequence number for this batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ProducerSeq {
    /// From `producer_init_ok`.
    pub producer_id: u64,
    /// The batch's sequence number for that producer.
    pub sequence: u64,
}

/// Everything in a publish batch before its records, borrowed. Used to encode without
/// building a [`PublishBatch`] ([`encode_publish_batch_frame`]) and as the parsed part of a
/// [`PublishBatchView`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishBatchHeader<'a> {
    /// `0x0008`.
    pub acked: Option<AckedPrefix>,
    /// `0x0100`. Only valid with `acked` (the protocol has no unacked idempotent batch); a
    /// frame with it alone is refused by every receiver.
    pub idempotent: Option<ProducerSeq>,
    /// `0x0040`. An empty key is a key, unlike `None`.
    pub key: Option<&'a [u8]>,
    pub tenant_id: &'a str,
    pub namespace: &'a str,
    pub stream: &'a str,
}

impl PublishBatchHeader<'_> {
    /// The flag word these fields need.
    pub fn flags(&self) -> Flags {
        let mut flags = Flags::BINARY_PUBLISH_BATCH;
        if self.acked.is_some() {
            flags |= Flags::BINARY_PUBLISH_ACKED;
        }
        if self.idempotent.is_some() {
            flags |= Flags::BINARY_PUBLISH_IDEMPOTENT;
        }
        if self.key.is_some() {
            flags |= Flags::BINARY_PUBLISH_KEYED;
        }
        flags
    }

    /// Encoded size, up to and including the record count.
    fn encoded_len(&self) -> usize {
        let acked = if self.acked.is_some() { 9 } else { 0 };
        let idempotent = if self.idempotent.is_some() { 16 } else { 0 };
        let key = self.key.map_or(0, |k| 2 + k.len());
        acked
            + idempotent
            + key
            + 6
            + self.tenant_id.len()
            + self.namespace.len()
            + self.stream.len()
            + 4
    }

    /// Writes the prefixes, names and `count`.
    fn write(&self, count: usize, out: &mut impl BufMut) {
        if let Some(acked) = self.acked {
            out.put_u64(acked.request_id);
            out.put_u8(acked.ack_mode.number());
        }
        if let Some(seq) = self.idempotent {
            out.put_u64(seq.producer_id);
            out.put_u64(seq.sequence);
        }
        if let Some(key) = self.key {
            put_bytes16(out, key, "key");
        }
        put_bytes16(out, self.tenant_id.as_bytes(), "tenant_id");
        put_bytes16(out, self.namespace.as_bytes(), "namespace");
        put_bytes16(out, self.stream.as_bytes(), "stream");
        out.put_u32(u32::try_from(count).expect("more than u32::MAX payloads in one batch"));
    }
}

/// A binary publish batch, owned. Payloads and key are slices of the frame they were
/// decoded from, never copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishBatch {
    /// `0x0008`: the request id and ack mode; `None` for a fire-and-forget batch.
    pub acked: Option<AckedPrefix>,
    /// `0x0100`: the idempotent producer's id and sequence. Only valid with `acked`.
    pub idempotent: Option<ProducerSeq>,
    /// `0x0040`: the routing key, which picks the shard.
    pub key: Option<Bytes>,
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    /// The records, in order.
    pub payloads: Vec<Bytes>,
}

impl PublishBatch {
    /// The borrowed header of this batch.
    pub fn header(&self) -> PublishBatchHeader<'_> {
        PublishBatchHeader {
            acked: self.acked,
            idempotent: self.idempotent,
            key: self.key.as_deref(),
            tenant_id: &self.tenant_id,
            namespace: &self.namespace,
            stream: &self.stream,
        }
    }

    /// The exact flag word this batch is sent with.
    pub fn flags(&self) -> Flags {
        self.header().flags()
    }

    /// Decodes a payload received with `flags`. Payloads and key share `payload`'s memory.
    pub fn decode(flags: Flags, payload: &Bytes) -> Result<PublishBatch, DecodeError> {
        PublishBatchView::parse(flags, payload).map(|view| view.to_batch())
    }

    /// Payload size in bytes.
    pub fn encoded_len(&self) -> usize {
        self.header().encoded_len() + records_len(&self.payloads)
    }

    /// Appends the payload (no frame header) to `out`.
    ///
    /// # Panics
    /// If the key or a name is over 65,535 bytes, or a payload over `u32::MAX`.
    pub fn encode_into(&self, out: &mut impl BufMut) {
        self.header().write(self.payloads.len(), out);
        for payload in &self.payloads {
            put_bytes32(out, payload, "payload");
        }
    }

    /// The batch as a frame.
    pub fn to_frame(&self) -> Frame {
        let mut out = BytesMut::with_capacity(self.encoded_len());
        self.encode_into(&mut out);
        Frame::new(self.flags(), out.freeze())
    }
}

fn records_len<P: AsRef<[u8]>>(payloads: &[P]) -> usize {
    payloads.iter().map(|p| 4 + p.as_ref().len()).sum()
}

/// Encodes a whole publish frame, header included, in one allocation of exactly its size,
/// without building a [`PublishBatch`]. This is the client's send path.
///
/// # Panics
/// As [`PublishBatch::encode_into`], or if the payload exceeds `u32::MAX` bytes.
pub fn encode_publish_batch_frame<P: AsRef<[u8]>>(
    header: &PublishBatchHeader<'_>,
    payloads: &[P],
) -> Bytes {
    let payload_len = header.encoded_len() + records_len(payloads);
    let mut out = Vec::with_capacity(HEADER_LEN + payload_len);
    encode_frame_header(header.flags(), payload_len, &mut out);
    header.write(payloads.len(), &mut out);
    for payload in payloads {
        put_bytes32(&mut out, payload.as_ref(), "payload");
    }
    debug_assert_eq!(out.len(), HEADER_LEN + payload_len);
    Bytes::from(out)
}

/// A parsed publish batch that borrows its frame: the broker's receive path.
///
/// [`PublishBatchView::parse`] checks the whole layout up front (names are UTF-8, the count
/// fits, every record is in bounds, nothing trails), without allocating; after that
/// [`PublishBatchView::payloads`] cannot fail and yields each record as a `Bytes` slice.
#[derive(Debug, Clone)]
pub struct PublishBatchView<'a> {
    /// Everything before the records.
    pub header: PublishBatchHeader<'a>,
    payload: &'a Bytes,
    count: u32,
    records_at: usize,
}

impl<'a> PublishBatchView<'a> {
    /// Parses and validates a payload received with `flags`.
    pub fn parse(flags: Flags, payload: &'a Bytes) -> Result<PublishBatchView<'a>, DecodeError> {
        let flags = expect_layout(flags, Flags::BINARY_PUBLISH_BATCH, LAYOUT)?;
        let mut r = Reader::new(payload);
        let acked = if flags.contains(Flags::BINARY_PUBLISH_ACKED) {
            let request_id = r.u64("request_id")?;
            let ack_mode = AckMode::from_number(r.u8("ack_mode")?)?;
            Some(AckedPrefix {
                request_id,
                ack_mode,
            })
        } else {
            None
        };
        let idempotent = if flags.contains(Flags::BINARY_PUBLISH_IDEMPOTENT) {
            Some(ProducerSeq {
                producer_id: r.u64("producer_id")?,
                sequence: r.u64("sequence")?,
            })
        } else {
            None
        };
        let key = if flags.contains(Flags::BINARY_PUBLISH_KEYED) {
            Some(r.bytes16("key")?)
        } else {
            None
        };
        let tenant_id = r.str16("tenant_id")?;
        let namespace = r.str16("namespace")?;
        let stream = r.str16("stream")?;
        let count = r.u32("payload count")?;
        let records_at = r.position();
        skip_records(&mut r, count, false)?;
        r.finish(LAYOUT)?;
        Ok(PublishBatchView {
            header: PublishBatchHeader {
                acked,
                idempotent,
                key,
                tenant_id,
                namespace,
                stream,
            },
            payload,
            count,
            records_at,
        })
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// True for a batch of no records.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The routing key as a `Bytes` slice of the frame.
    pub fn key_bytes(&self) -> Option<Bytes> {
        self.header.key.map(|k| self.payload.slice_ref(k))
    }

    /// The records, in order, as slices of the frame.
    pub fn payloads(&self) -> Payloads<'a> {
        Payloads {
            frame: self.payload,
            cursor: RecordCursor::new(self.payload, self.records_at, self.count, false),
        }
    }

    /// The owned batch (the strings are copied, the key and payloads are not).
    pub fn to_batch(&self) -> PublishBatch {
        PublishBatch {
            acked: self.header.acked,
            idempotent: self.header.idempotent,
            key: self.key_bytes(),
            tenant_id: self.header.tenant_id.to_owned(),
            namespace: self.header.namespace.to_owned(),
            stream: self.header.stream.to_owned(),
            payloads: self.payloads().collect(),
        }
    }
}

/// The records of a [`PublishBatchView`].
#[derive(Debug, Clone)]
pub struct Payloads<'a> {
    frame: &'a Bytes,
    cursor: RecordCursor<'a>,
}

impl Iterator for Payloads<'_> {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        self.cursor
            .next_record()
            .map(|(_, range)| self.frame.slice(range))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.cursor.left(), Some(self.cursor.left()))
    }
}

impl ExactSizeIterator for Payloads<'_> {}
impl FusedIterator for Payloads<'_> {}

#[cfg(feature = "arbitrary")]
impl<'u> arbitrary::Arbitrary<'u> for PublishBatch {
    fn arbitrary(u: &mut arbitrary::Unstructured<'u>) -> arbitrary::Result<Self> {
        use super::arb;
        let acked: Option<AckedPrefix> = u.arbitrary()?;
        // Idempotence needs the acked prefix; generate only encodable batches.
        let idempotent = if acked.is_some() {
            u.arbitrary()?
        } else {
            None
        };
        Ok(PublishBatch {
            acked,
            idempotent,
            key: arb::short_bytes_opt(u)?,
            tenant_id: arb::short_string(u)?,
            namespace: arb::short_string(u)?,
            stream: arb::short_string(u)?,
            payloads: arb::payloads(u)?,
        })
    }
}
