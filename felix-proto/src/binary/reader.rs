//! A bounds-checked big-endian cursor over a payload, and the length-prefix writers the
//! encoders share. Every read names its field so a truncation error says where it happened.

use std::ops::Range;

use bytes::BufMut;

use crate::error::DecodeError;

/// Reads fields front to back from a borrowed payload. Never allocates.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes not yet read.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Offset of the next byte to read.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    /// The next `len` bytes.
    pub(crate) fn take(
        &mut self,
        len: usize,
        field: &'static str,
    ) -> Result<&'a [u8], DecodeError> {
        let available = self.remaining();
        if len > available {
            return Err(DecodeError::Truncated {
                field,
                needed: len,
                available,
            });
        }
        let out = &self.buf[self.pos..self.pos + len];
        self.pos += len;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let bytes = self.take(N, field)?;
        Ok(bytes.try_into().expect("take returned N bytes"))
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        self.array(field).map(u16::from_be_bytes)
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        self.array(field).map(u32::from_be_bytes)
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        self.array(field).map(u64::from_be_bytes)
    }

    /// A `u16` length and that many bytes.
    pub(crate) fn bytes16(&mut self, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let len = self.u16(field)?;
        self.take(len.into(), field)
    }

    /// A `u8` length and that many bytes.
    pub(crate) fn bytes8(&mut self, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let len = self.u8(field)?;
        self.take(len.into(), field)
    }

    /// A `u16` length and that many bytes of UTF-8.
    pub(crate) fn str16(&mut self, field: &'static str) -> Result<&'a str, DecodeError> {
        let bytes = self.bytes16(field)?;
        std::str::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8 { field })
    }

    /// Checks that `count` records of at least `min_record` bytes each can fit in what is
    /// left, so a forged count fails before anything is sized from it.
    pub(crate) fn check_count(
        &self,
        count: u32,
        min_record: usize,
        field: &'static str,
    ) -> Result<(), DecodeError> {
        let needed = (count as usize).saturating_mul(min_record);
        let available = self.remaining();
        if needed > available {
            return Err(DecodeError::Truncated {
                field,
                needed,
                available,
            });
        }
        Ok(())
    }

    /// Ends the layout: every byte must have been consumed.
    pub(crate) fn finish(self, layout: &'static str) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(DecodeError::TrailingBytes { layout, extra }),
        }
    }
}

/// Walks `count` records (`[u64 timestamp]` when `timestamped`, `[u32 len][bytes]`) without
/// keeping anything, so a view can promise its iterator will not fail. The count is checked
/// against the remaining bytes first: a forged count costs one comparison.
pub(crate) fn skip_records(
    r: &mut Reader<'_>,
    count: u32,
    timestamped: bool,
) -> Result<(), DecodeError> {
    let min_record = if timestamped { 12 } else { 4 };
    r.check_count(count, min_record, "records")?;
    for _ in 0..count {
        if timestamped {
            r.u64("timestamp_micros")?;
        }
        let len = r.u32("payload length")?;
        r.take(len as usize, "payload")?;
    }
    Ok(())
}

/// Iterates records that [`skip_records`] already validated; yields each record's timestamp
/// (when the batch has them) and its payload's range in the buffer.
#[derive(Debug, Clone)]
pub(crate) struct RecordCursor<'a> {
    buf: &'a [u8],
    pos: usize,
    left: u32,
    timestamped: bool,
}

impl<'a> RecordCursor<'a> {
    pub(crate) fn new(buf: &'a [u8], pos: usize, count: u32, timestamped: bool) -> Self {
        RecordCursor {
            buf,
            pos,
            left: count,
            timestamped,
        }
    }

    pub(crate) fn left(&self) -> usize {
        self.left as usize
    }

    fn be<const N: usize>(&mut self) -> [u8; N] {
        let out = self.buf[self.pos..self.pos + N]
            .try_into()
            .expect("validated record");
        self.pos += N;
        out
    }

    pub(crate) fn next_record(&mut self) -> Option<(Option<u64>, Range<usize>)> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let timestamp = self.timestamped.then(|| u64::from_be_bytes(self.be()));
        let len = u32::from_be_bytes(self.be()) as usize;
        let start = self.pos;
        self.pos += len;
        Some((timestamp, start..self.pos))
    }
}

/// Writes a `u16` length prefix and the bytes.
///
/// # Panics
/// If `bytes` is longer than `u16::MAX`: the field cannot be encoded, and cutting an
/// identifier short would name something else.
pub(crate) fn put_bytes16(out: &mut impl BufMut, bytes: &[u8], field: &'static str) {
    let len = u16::try_from(bytes.len())
        .unwrap_or_else(|_| panic!("{field} is {} bytes, over the u16 limit", bytes.len()));
    out.put_u16(len);
    out.put_slice(bytes);
}

/// Writes a `u8` length prefix and the bytes.
///
/// # Panics
/// If `bytes` is longer than `u8::MAX`.
pub(crate) fn put_bytes8(out: &mut impl BufMut, bytes: &[u8], field: &'static str) {
    let len = u8::try_from(bytes.len())
        .unwrap_or_else(|_| panic!("{field} is {} bytes, over the u8 limit", bytes.len()));
    out.put_u8(len);
    out.put_slice(bytes);
}

/// Writes a `u32` length prefix and the bytes.
///
/// # Panics
/// If `bytes` is longer than `u32::MAX` (no frame could carry it anyway).
pub(crate) fn put_bytes32(out: &mut impl BufMut, bytes: &[u8], field: &'static str) {
    let len = u32::try_from(bytes.len())
        .unwrap_or_else(|_| panic!("{field} is {} bytes, over the u32 limit", bytes.len()));
    out.put_u32(len);
    out.put_slice(bytes);
}

/// `s` cut to at most `u16::MAX` bytes on a character boundary. Used for human-readable
/// text (ack messages and reasons), where a shortened text is better than no ack at all.
pub(crate) fn clip_text16(s: &str) -> &str {
    let max = usize::from(u16::MAX);
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_big_endian_and_reports_truncation() {
        let mut r = Reader::new(&[0, 1, 0, 0, 0, 2, 9]);
        assert_eq!(r.u16("a"), Ok(1));
        assert_eq!(r.u32("b"), Ok(2));
        assert_eq!(
            r.u64("c"),
            Err(DecodeError::Truncated {
                field: "c",
                needed: 8,
                available: 1
            })
        );
        // A failed read consumes nothing.
        assert_eq!(r.u8("d"), Ok(9));
        assert_eq!(r.finish("x"), Ok(()));
    }

    #[test]
    fn count_check_saturates() {
        let r = Reader::new(&[0; 8]);
        assert!(r.check_count(2, 4, "n").is_ok());
        assert_eq!(
            r.check_count(u32::MAX, usize::MAX, "n"),
            Err(DecodeError::Truncated {
                field: "n",
                needed: usize::MAX,
                available: 8
            })
        );
    }

    #[test]
    fn clip_keeps_char_boundaries() {
        let s = "é".repeat(40_000); // 80,000 bytes
        let clipped = clip_text16(&s);
        assert!(clipped.len() <= usize::from(u16::MAX));
        assert_eq!(clipped.len() % 2, 0);
        assert_eq!(clip_text16("short"), "short");
    }
}
