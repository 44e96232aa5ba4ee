//! Bytes on disk: the segment header, log entries, and the scanner that walks them.
//!
//! `docs/storage-format.md` is the normative description; this file implements it. All
//! integers are little-endian. One entry holds one publish batch: its base offset, record
//! count, append time, publisher and payloads, so record `i` of an entry has offset
//! `base + i`. The CRC32C covers the length field and the body, so a damaged length is
//! caught like any other damaged byte once the body is there to check.
//!
//! A *skip* entry holds no record: it says that its offsets hold nothing. Only a follower
//! writes one, where shipped entries of a compacted log jump, so its own log stays
//! contiguous (see [`encode_skip`]).

use bytes::{BufMut, Bytes, BytesMut};

/// First bytes of every segment file.
pub const SEGMENT_MAGIC: [u8; 4] = *b"FXLS";
/// Version of the segment and entry layout. A reader refuses versions it does not know.
pub const FORMAT_VERSION: u16 = 1;
/// Size of the segment header.
pub const SEGMENT_HEADER_LEN: u64 = 32;
/// Header flag: a compaction output covering `[base, end)` with gaps between its offsets.
const FLAG_COMPACTED: u16 = 1;

/// Length and CRC in front of every entry body.
pub const ENTRY_HEADER_LEN: usize = 8;
/// Fixed part of a batch body: kind, publisher length, flags, count, base offset, time.
pub const BATCH_FIXED_LEN: usize = 24;
/// Per-record cost inside an entry: the payload length.
pub const RECORD_OVERHEAD: usize = 4;
/// Largest entry (header included) a writer produces; a scanned length beyond it is damage.
pub const MAX_ENTRY_BYTES: usize = 64 << 20;
/// Longest publisher name an entry carries.
pub const MAX_PUBLISHER_BYTES: usize = 255;

const ENTRY_KIND_BATCH: u8 = 1;
/// Entry kind: offsets `[base, base + count)` hold no record.
const ENTRY_KIND_SKIP: u8 = 2;
/// Size of a skip entry: the entry header and the fixed part of a body, nothing after.
pub const SKIP_ENTRY_LEN: usize = ENTRY_HEADER_LEN + BATCH_FIXED_LEN;
/// Entry flag: a producer mark (id, sequence, payload digest) follows the publisher.
const ENTRY_FLAG_PRODUCER: u16 = 1;
/// Entry flag: a state block (length-prefixed, see `broker/commit.rs`) follows.
const ENTRY_FLAG_STATE: u16 = 2;
const PRODUCER_MARK_LEN: usize = 24;

/// An idempotent producer's batch as the log keeps it, so recovery can rebuild every
/// producer's place from the log alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerMark {
    pub producer: u64,
    pub sequence: u64,
    /// A digest of the batch's payloads, to tell a re-send from a reused sequence.
    pub digest: u64,
}

/// What an entry carries besides its records (both optional; none is a plain batch).
#[derive(Debug, Clone, Copy, Default)]
pub struct EntryExt<'a> {
    pub producer: Option<ProducerMark>,
    /// An atomic commit's state changes, opaque here.
    pub state: Option<&'a [u8]>,
}

impl EntryExt<'_> {
    pub const NONE: EntryExt<'static> = EntryExt {
        producer: None,
        state: None,
    };

    fn flags(&self) -> u16 {
        let mut f = 0;
        if self.producer.is_some() {
            f |= ENTRY_FLAG_PRODUCER;
        }
        if self.state.is_some() {
            f |= ENTRY_FLAG_STATE;
        }
        f
    }

    fn len(&self) -> usize {
        self.producer.map_or(0, |_| PRODUCER_MARK_LEN) + self.state.map_or(0, |s| 4 + s.len())
    }
}

/// The extension of an entry recovery scanned, with the offsets it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedExt {
    pub base: u64,
    pub count: u32,
    pub producer: Option<ProducerMark>,
    pub state: Option<Bytes>,
}

/// The fixed header at the start of every segment file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The first offset this segment covers; also its file name.
    pub base: u64,
    /// For a compaction output: the exclusive end of the offset range it replaces. Offsets in
    /// it may have gaps (dropped records) but stay below this.
    pub compacted_end: Option<u64>,
}

/// Why a segment header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    Short,
    AllZero,
    Magic,
    Version(u16),
    Checksum,
    Layout(&'static str),
}

impl HeaderError {
    pub fn describe(self) -> String {
        match self {
            HeaderError::Short => "segment header is cut short".into(),
            HeaderError::AllZero => "segment header is all zero".into(),
            HeaderError::Magic => "segment header has the wrong magic".into(),
            HeaderError::Version(v) => format!("segment format version {v} is not supported"),
            HeaderError::Checksum => "segment header checksum mismatch".into(),
            HeaderError::Layout(why) => format!("segment header: {why}"),
        }
    }
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_LEN as usize] {
        let mut b = [0u8; SEGMENT_HEADER_LEN as usize];
        b[0..4].copy_from_slice(&SEGMENT_MAGIC);
        b[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        let flags = if self.compacted_end.is_some() {
            FLAG_COMPACTED
        } else {
            0
        };
        b[6..8].copy_from_slice(&flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.base.to_le_bytes());
        b[16..24].copy_from_slice(&self.compacted_end.unwrap_or(0).to_le_bytes());
        // 24..28 reserved, zero.
        let crc = crc32c::crc32c(&b[..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<SegmentHeader, HeaderError> {
        let n = SEGMENT_HEADER_LEN as usize;
        if b.len() < n {
            return Err(HeaderError::Short);
        }
        let b = &b[..n];
        if b.iter().all(|&x| x == 0) {
            return Err(HeaderError::AllZero);
        }
        if b[0..4] != SEGMENT_MAGIC {
            return Err(HeaderError::Magic);
        }
        if crc32c::crc32c(&b[..28]) != u32_at(b, 28) {
            return Err(HeaderError::Checksum);
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != FORMAT_VERSION {
            return Err(HeaderError::Version(version));
        }
        let flags = u16::from_le_bytes([b[6], b[7]]);
        if flags & !FLAG_COMPACTED != 0 {
            return Err(HeaderError::Layout("unknown flags"));
        }
        if u32_at(b, 24) != 0 {
            return Err(HeaderError::Layout("reserved bytes are not zero"));
        }
        let base = u64_at(b, 8);
        let end = u64_at(b, 16);
        let compacted_end = if flags & FLAG_COMPACTED != 0 {
            if end < base {
                return Err(HeaderError::Layout("compacted range ends before it starts"));
            }
            Some(end)
        } else {
            if end != 0 {
                return Err(HeaderError::Layout("end offset set on a plain segment"));
            }
            None
        };
        Ok(SegmentHeader {
            base,
            compacted_end,
        })
    }
}

/// Encoded size of an entry holding these payloads.
pub fn entry_len<P: AsRef<[u8]>>(publisher: &[u8], payloads: &[P]) -> usize {
    entry_len_ext(publisher, payloads, &EntryExt::NONE)
}

/// Encoded size of an entry holding these payloads and this extension.
pub fn entry_len_ext<P: AsRef<[u8]>>(
    publisher: &[u8],
    payloads: &[P],
    ext: &EntryExt<'_>,
) -> usize {
    ext.len()
        + ENTRY_HEADER_LEN
        + BATCH_FIXED_LEN
        + publisher.len()
        + payloads
            .iter()
            .map(|p| RECORD_OVERHEAD + p.as_ref().len())
            .sum::<usize>()
}

/// Appends one entry to `out`. The caller has checked the limits (publisher ≤ 255 bytes,
/// at least one payload, total ≤ [`MAX_ENTRY_BYTES`]).
pub fn encode_entry<P: AsRef<[u8]>>(
    out: &mut BytesMut,
    base_offset: u64,
    time_us: u64,
    publisher: &[u8],
    payloads: &[P],
) {
    encode_entry_ext(
        out,
        base_offset,
        time_us,
        publisher,
        payloads,
        &EntryExt::NONE,
    )
}

/// [`encode_entry`] with an extension (producer mark, state block) between the publisher
/// and the records.
pub fn encode_entry_ext<P: AsRef<[u8]>>(
    out: &mut BytesMut,
    base_offset: u64,
    time_us: u64,
    publisher: &[u8],
    payloads: &[P],
    ext: &EntryExt<'_>,
) {
    debug_assert!(publisher.len() <= MAX_PUBLISHER_BYTES && !payloads.is_empty());
    let total = entry_len_ext(publisher, payloads, ext);
    let body_len = (total - ENTRY_HEADER_LEN) as u32;
    out.reserve(total);
    let start = out.len();
    out.put_u32_le(body_len);
    out.put_u32_le(0); // CRC, filled below
    out.put_u8(ENTRY_KIND_BATCH);
    out.put_u8(publisher.len() as u8);
    out.put_u16_le(ext.flags());
    out.put_u32_le(payloads.len() as u32);
    out.put_u64_le(base_offset);
    out.put_u64_le(time_us);
    out.put_slice(publisher);
    if let Some(m) = ext.producer {
        out.put_u64_le(m.producer);
        out.put_u64_le(m.sequence);
        out.put_u64_le(m.digest);
    }
    if let Some(state) = ext.state {
        out.put_u32_le(state.len() as u32);
        out.put_slice(state);
    }
    for p in payloads {
        out.put_u32_le(p.as_ref().len() as u32);
        out.put_slice(p.as_ref());
    }
    let crc = entry_crc(&out[start..start + 4], &out[start + ENTRY_HEADER_LEN..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Appends a skip entry: offsets `[base, base + count)` hold no record. A follower of a
/// compacted log writes these where the shipped offsets jump, so its log stays contiguous
/// (every segment, scan and cut keeps the rule that an entry starts where the one before it
/// ended) while readers, replay and compaction find nothing there. `time_us` is stored as
/// any entry's time. `count` is at least 1.
pub fn encode_skip(out: &mut BytesMut, base: u64, count: u32, time_us: u64) {
    debug_assert!(count > 0);
    let start = out.len();
    out.reserve(SKIP_ENTRY_LEN);
    out.put_u32_le(BATCH_FIXED_LEN as u32);
    out.put_u32_le(0); // CRC, filled below
    out.put_u8(ENTRY_KIND_SKIP);
    out.put_u8(0);
    out.put_u16_le(0);
    out.put_u32_le(count);
    out.put_u64_le(base);
    out.put_u64_le(time_us);
    let crc = entry_crc(&out[start..start + 4], &out[start + ENTRY_HEADER_LEN..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Records in an entry this log holds (validated when written or scanned): its count, or
/// none for a skip entry.
pub(crate) fn records_in(entry: &[u8]) -> u32 {
    if entry[ENTRY_HEADER_LEN] == ENTRY_KIND_SKIP {
        0
    } else {
        u32_at(entry, ENTRY_HEADER_LEN + 4)
    }
}

fn entry_crc(len_field: &[u8], body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(len_field), body)
}

/// What the scanner learned about one whole, valid entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryMeta {
    pub base: u64,
    /// Offsets the entry covers: its records, or for a skip entry the offsets it skips.
    pub count: u32,
    pub time_us: u64,
    /// Encoded size, header included.
    pub len: u32,
    /// A skip entry ([`encode_skip`]): its offsets hold no record.
    pub skip: bool,
}

impl EntryMeta {
    /// One past the last offset in the entry.
    pub fn end(&self) -> u64 {
        self.base + u64::from(self.count)
    }

    /// Records the entry holds (none for a skip entry).
    pub fn records(&self) -> u32 {
        if self.skip {
            0
        } else {
            self.count
        }
    }
}

/// Why an entry was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// The length field is zero, too small for a body, or past [`MAX_ENTRY_BYTES`].
    Length(u32),
    Checksum,
    Layout(&'static str),
}

impl Damage {
    pub fn describe(self) -> String {
        match self {
            Damage::Length(n) => format!("entry length {n} is impossible"),
            Damage::Checksum => "entry checksum mismatch".into(),
            Damage::Layout(why) => format!("entry layout: {why}"),
        }
    }
}

/// One step of a scan over bytes that start at an entry boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A whole valid entry; the next starts `meta.len` bytes on.
    Entry(EntryMeta),
    /// The bytes end inside an entry: it needs `need` bytes from its start (just the
    /// header's 8 if even the length is cut).
    Partial { need: u64 },
    /// The entry here is damaged. `len` is its declared size when the length was plausible.
    Damaged { damage: Damage, len: Option<u32> },
    /// No bytes left.
    End,
}

/// Looks at the entry at the start of `buf`.
pub fn step(buf: &[u8]) -> Step {
    if buf.is_empty() {
        return Step::End;
    }
    if buf.len() < ENTRY_HEADER_LEN {
        return Step::Partial {
            need: ENTRY_HEADER_LEN as u64,
        };
    }
    let body_len = u32_at(buf, 0);
    let total = body_len as usize + ENTRY_HEADER_LEN;
    if (body_len as usize) < BATCH_FIXED_LEN || total > MAX_ENTRY_BYTES {
        return Step::Damaged {
            damage: Damage::Length(body_len),
            len: None,
        };
    }
    if buf.len() < total {
        return Step::Partial { need: total as u64 };
    }
    let damaged = |damage| Step::Damaged {
        damage,
        len: Some(total as u32),
    };
    let body = &buf[ENTRY_HEADER_LEN..total];
    if entry_crc(&buf[0..4], body) != u32_at(buf, 4) {
        return damaged(Damage::Checksum);
    }
    match check_body(body) {
        Ok((count, base, time_us)) => Step::Entry(EntryMeta {
            base,
            count,
            time_us,
            len: total as u32,
            skip: body[0] == ENTRY_KIND_SKIP,
        }),
        Err(why) => damaged(Damage::Layout(why)),
    }
}

/// Validates a body whose CRC matched: a known kind, no unknown flags, and payload lengths
/// that fill it exactly (a skip entry: the fixed part alone, no publisher, no flags). A CRC
/// that matches over a malformed body means a writer bug or a newer format, and guessing
/// at either is worse than refusing.
fn check_body(body: &[u8]) -> Result<(u32, u64, u64), &'static str> {
    let skip = match body[0] {
        ENTRY_KIND_BATCH => false,
        ENTRY_KIND_SKIP => true,
        _ => return Err("unknown entry kind"),
    };
    let flags = u16::from_le_bytes([body[2], body[3]]);
    if flags & !(ENTRY_FLAG_PRODUCER | ENTRY_FLAG_STATE) != 0 {
        return Err("unknown entry flags");
    }
    let count = u32_at(body, 4);
    if count == 0 {
        return Err("an entry with no records");
    }
    let base = u64_at(body, 8);
    let time_us = u64_at(body, 16);
    if base.checked_add(u64::from(count)).is_none() {
        return Err("offsets overflow");
    }
    if skip {
        if body[1] != 0 || flags != 0 || body.len() != BATCH_FIXED_LEN {
            return Err("a skip entry with a publisher, flags or payloads");
        }
        return Ok((count, base, time_us));
    }
    let mut at = records_at(body).ok_or("the extension runs past the entry")?;
    for _ in 0..count {
        if body.len() < at + RECORD_OVERHEAD {
            return Err("payload lengths run past the entry");
        }
        let n = u32_at(body, at) as usize;
        at += RECORD_OVERHEAD;
        if body.len() - at < n {
            return Err("payload lengths run past the entry");
        }
        at += n;
    }
    if at != body.len() {
        return Err("payloads do not fill the entry");
    }
    Ok((count, base, time_us))
}

/// Where the parts of an entry body lie after the fixed part and the publisher.
struct ExtLayout {
    /// The producer mark's position, if the flags announce one.
    producer: Option<usize>,
    /// The state block's bytes (after its length), if the flags announce one.
    state: Option<std::ops::Range<usize>>,
    /// Where the records start.
    records: usize,
}

/// The layout of the extension an entry body's flags announce. `None` when it runs past
/// the body.
fn ext_layout(body: &[u8]) -> Option<ExtLayout> {
    let flags = u16::from_le_bytes([body[2], body[3]]);
    let mut at = BATCH_FIXED_LEN + body[1] as usize;
    let producer = (flags & ENTRY_FLAG_PRODUCER != 0).then_some(at);
    if producer.is_some() {
        at += PRODUCER_MARK_LEN;
    }
    let mut state = None;
    if flags & ENTRY_FLAG_STATE != 0 {
        if body.len() < at + 4 {
            return None;
        }
        let start = at + 4;
        at = start + u32_at(body, at) as usize;
        state = Some(start..at);
    }
    (at <= body.len()).then_some(ExtLayout {
        producer,
        state,
        records: at,
    })
}

/// Where an entry body's records start (see [`ext_layout`]).
fn records_at(body: &[u8]) -> Option<usize> {
    ext_layout(body).map(|l| l.records)
}

/// The extension of an entry [`step`] has validated, if it has one.
pub fn scanned_ext(entry: &[u8], meta: &EntryMeta) -> Option<ScannedExt> {
    let body = &entry[ENTRY_HEADER_LEN..];
    let flags = u16::from_le_bytes([body[2], body[3]]);
    if flags == 0 {
        return None;
    }
    let layout = ext_layout(body).expect("validated by step");
    let producer = layout.producer.map(|at| ProducerMark {
        producer: u64_at(body, at),
        sequence: u64_at(body, at + 8),
        digest: u64_at(body, at + 16),
    });
    // A copy: the scan's read buffer is not kept alive by it.
    let state = layout.state.map(|r| Bytes::copy_from_slice(&body[r]));
    Some(ScannedExt {
        base: meta.base,
        count: meta.count,
        producer,
        state,
    })
}

/// A decoded entry; payloads and publisher are slices of the buffer it was read into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedEntry {
    pub base: u64,
    pub time_us: u64,
    pub publisher: Option<Bytes>,
    pub payloads: Vec<Bytes>,
}

/// Decodes an entry [`step`] has already validated (`entry` is exactly its bytes). A skip
/// entry decodes with no payloads.
pub fn decode_entry(entry: &Bytes) -> DecodedEntry {
    let body = entry.slice(ENTRY_HEADER_LEN..);
    let publisher_len = body[1] as usize;
    let count = if body[0] == ENTRY_KIND_SKIP {
        0
    } else {
        u32_at(&body, 4) as usize
    };
    let base = u64_at(&body, 8);
    let time_us = u64_at(&body, 16);
    let publisher =
        (publisher_len > 0).then(|| body.slice(BATCH_FIXED_LEN..BATCH_FIXED_LEN + publisher_len));
    let mut payloads = Vec::with_capacity(count);
    let mut at = records_at(&body).expect("validated by step");
    for _ in 0..count {
        let n = u32_at(&body, at) as usize;
        at += RECORD_OVERHEAD;
        payloads.push(body.slice(at..at + n));
        at += n;
    }
    DecodedEntry {
        base,
        time_us,
        publisher,
        payloads,
    }
}

pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(base: u64, payloads: &[&[u8]]) -> BytesMut {
        let mut out = BytesMut::new();
        encode_entry(&mut out, base, 1_700_000_000_000_000, b"alice", payloads);
        out
    }

    #[test]
    fn an_entry_round_trips_and_knows_its_size() {
        let payloads: [&[u8]; 3] = [b"a", b"", b"hello"];
        let buf = one(41, &payloads).freeze();
        assert_eq!(buf.len(), entry_len(b"alice", &payloads));
        let Step::Entry(meta) = step(&buf) else {
            panic!("not an entry: {:?}", step(&buf))
        };
        assert_eq!((meta.base, meta.count, meta.end()), (41, 3, 44));
        assert_eq!(meta.len as usize, buf.len());
        let d = decode_entry(&buf);
        assert_eq!(d.base, 41);
        assert_eq!(d.time_us, 1_700_000_000_000_000);
        assert_eq!(d.publisher.as_deref(), Some(&b"alice"[..]));
        assert_eq!(d.payloads, vec![&b"a"[..], b"", b"hello"]);
    }

    #[test]
    fn an_entry_without_publisher_decodes_none() {
        let mut out = BytesMut::new();
        encode_entry(&mut out, 0, 5, b"", &[b"x"]);
        assert_eq!(decode_entry(&out.freeze()).publisher, None);
    }

    #[test]
    fn pinned_bytes_of_a_small_entry() {
        // Golden bytes: changing the layout must be a deliberate, versioned decision.
        let mut out = BytesMut::new();
        encode_entry(&mut out, 7, 9, b"p", &[b"xy"]);
        let expect_body: Vec<u8> = [
            &[1u8, 1, 0, 0][..],
            &1u32.to_le_bytes(),
            &7u64.to_le_bytes(),
            &9u64.to_le_bytes(),
            b"p",
            &2u32.to_le_bytes(),
            b"xy",
        ]
        .concat();
        assert_eq!(&out[0..4], &(expect_body.len() as u32).to_le_bytes());
        assert_eq!(&out[8..], &expect_body[..]);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&out[0..4]), &expect_body);
        assert_eq!(&out[4..8], &crc.to_le_bytes());
    }

    #[test]
    fn every_cut_of_an_entry_is_partial_and_every_flipped_byte_is_damage() {
        let buf = one(3, &[b"payload-one", b"two"]);
        for cut in 1..buf.len() {
            match step(&buf[..cut]) {
                Step::Partial { need } => {
                    assert!(
                        need == 8 || need == buf.len() as u64,
                        "cut {cut}: need {need}"
                    )
                }
                other => panic!("cut {cut}: {other:?}"),
            }
        }
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x10;
            assert!(
                matches!(step(&bad), Step::Damaged { .. } | Step::Partial { .. }),
                "flip at {i} went unnoticed"
            );
        }
    }

    #[test]
    fn a_zero_length_is_damage_not_an_entry() {
        assert!(matches!(
            step(&[0u8; 64]),
            Step::Damaged {
                damage: Damage::Length(0),
                len: None
            }
        ));
    }

    #[test]
    fn a_valid_crc_over_a_malformed_body_is_refused() {
        // Count says 2 records but only one fits: the CRC is right, the layout is not.
        let mut out = BytesMut::new();
        encode_entry(&mut out, 0, 0, b"", &[b"abc"]);
        out[12..16].copy_from_slice(&2u32.to_le_bytes());
        let crc = entry_crc(&out[0..4], &out[8..]);
        out[4..8].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            step(&out),
            Step::Damaged {
                damage: Damage::Layout(_),
                ..
            }
        ));
    }

    #[test]
    fn headers_round_trip_and_refuse_damage() {
        for h in [
            SegmentHeader {
                base: 0,
                compacted_end: None,
            },
            SegmentHeader {
                base: 1 << 40,
                compacted_end: Some((1 << 40) + 17),
            },
        ] {
            let b = h.encode();
            assert_eq!(SegmentHeader::decode(&b), Ok(h));
            assert_eq!(SegmentHeader::decode(&b[..31]), Err(HeaderError::Short));
            let mut bad = b;
            bad[9] ^= 1;
            assert_eq!(SegmentHeader::decode(&bad), Err(HeaderError::Checksum));
        }
        assert_eq!(SegmentHeader::decode(&[0u8; 32]), Err(HeaderError::AllZero));
    }

    #[test]
    fn an_extension_round_trips_and_leaves_the_records_where_they_were() {
        let mark = ProducerMark {
            producer: 0xfeed,
            sequence: 7,
            digest: 0xabcdef,
        };
        let state = b"state-block";
        for ext in [
            EntryExt {
                producer: Some(mark),
                state: None,
            },
            EntryExt {
                producer: None,
                state: Some(&state[..]),
            },
            EntryExt {
                producer: Some(mark),
                state: Some(&state[..]),
            },
        ] {
            let payloads: [&[u8]; 2] = [b"one", b"two"];
            let mut out = BytesMut::new();
            encode_entry_ext(&mut out, 10, 99, b"pub", &payloads, &ext);
            let buf = out.freeze();
            assert_eq!(buf.len(), entry_len_ext(b"pub", &payloads, &ext));
            let Step::Entry(meta) = step(&buf) else {
                panic!("not an entry")
            };
            let d = decode_entry(&buf);
            assert_eq!(d.payloads, vec![&b"one"[..], b"two"]);
            let scanned = scanned_ext(&buf, &meta).expect("has an extension");
            assert_eq!((scanned.base, scanned.count), (10, 2));
            assert_eq!(scanned.producer, ext.producer);
            assert_eq!(scanned.state.as_deref(), ext.state);
        }
        let mut plain = BytesMut::new();
        encode_entry(&mut plain, 0, 0, b"", &[b"x"]);
        let Step::Entry(meta) = step(&plain) else {
            panic!()
        };
        assert_eq!(scanned_ext(&plain, &meta), None);
    }

    #[test]
    fn a_skip_entry_covers_its_offsets_and_holds_no_record() {
        let mut out = BytesMut::new();
        encode_skip(&mut out, 100, 7, 9);
        let buf = out.freeze();
        // Golden bytes, as for a batch: kind 2, no publisher, no flags, count, base, time.
        let expect_body: Vec<u8> = [
            &[2u8, 0, 0, 0][..],
            &7u32.to_le_bytes(),
            &100u64.to_le_bytes(),
            &9u64.to_le_bytes(),
        ]
        .concat();
        assert_eq!(buf.len(), SKIP_ENTRY_LEN);
        assert_eq!(&buf[0..4], &24u32.to_le_bytes());
        assert_eq!(&buf[8..], &expect_body[..]);
        let Step::Entry(meta) = step(&buf) else {
            panic!("not an entry: {:?}", step(&buf))
        };
        assert_eq!((meta.base, meta.count, meta.end()), (100, 7, 107));
        assert_eq!((meta.skip, meta.records(), meta.time_us), (true, 0, 9));
        assert_eq!(meta.len as usize, SKIP_ENTRY_LEN);
        let d = decode_entry(&buf);
        assert_eq!((d.base, d.time_us, d.publisher), (100, 9, None));
        assert!(d.payloads.is_empty());
        assert_eq!(scanned_ext(&buf, &meta), None);
        let Step::Entry(batch) = step(&one(3, &[b"x"])) else {
            panic!()
        };
        assert_eq!((batch.skip, batch.records()), (false, 1));
        for i in 0..buf.len() {
            let mut bad = BytesMut::from(&buf[..]);
            bad[i] ^= 0x10;
            assert!(
                matches!(step(&bad), Step::Damaged { .. } | Step::Partial { .. }),
                "flip at {i} went unnoticed"
            );
        }
    }

    #[test]
    fn a_skip_entry_with_anything_after_its_fixed_part_is_refused() {
        // A skip entry is exactly its fixed part: a publisher length, a flag or a payload
        // behind a matching CRC is refused, as any malformed body is.
        for (at, byte, extra) in [(9usize, 1u8, 1usize), (10, 1, 0), (0, 0, 4)] {
            let mut out = BytesMut::new();
            encode_skip(&mut out, 5, 2, 0);
            out.extend_from_slice(&vec![0u8; extra]);
            let body_len = (out.len() - ENTRY_HEADER_LEN) as u32;
            out[0..4].copy_from_slice(&body_len.to_le_bytes());
            if at != 0 {
                out[at] = byte;
            }
            let crc = entry_crc(&out[0..4], &out[8..]);
            out[4..8].copy_from_slice(&crc.to_le_bytes());
            assert!(
                matches!(
                    step(&out),
                    Step::Damaged {
                        damage: Damage::Layout(_),
                        ..
                    }
                ),
                "byte {at} = {byte}, {extra} extra: {:?}",
                step(&out)
            );
        }
    }

    #[test]
    fn a_state_length_past_the_body_is_refused() {
        let mut out = BytesMut::new();
        let ext = EntryExt {
            producer: None,
            state: Some(b"abc"),
        };
        encode_entry_ext(&mut out, 0, 0, b"", &[b"x"], &ext);
        // Claim a longer state block, then re-seal the CRC.
        out[32..36].copy_from_slice(&1000u32.to_le_bytes());
        let crc = entry_crc(&out[0..4], &out[8..]);
        out[4..8].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(step(&out), Step::Damaged { .. }));
    }
}
