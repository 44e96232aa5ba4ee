//! The big-endian cursor every body decoder reads with, and the writers every encoder uses.
//! Each read names its field, so an error says where it happened; each length is checked
//! against its limit before the bytes behind it are looked at.

use bytes::{BufMut, Bytes};

use crate::error::{PeerDecodeError, PeerEncodeError};
use crate::limits::Limit;

/// Reads a body front to back. Byte fields are `Bytes` slices of the body, never copies;
/// the only allocations are strings and vectors whose sizes the bytes already read justify.
pub(crate) struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a Bytes) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], PeerDecodeError> {
        let available = self.remaining();
        if len > available {
            return Err(PeerDecodeError::Truncated {
                field,
                needed: len,
                available,
            });
        }
        let out = &self.buf[self.pos..self.pos + len];
        self.pos += len;
        Ok(out)
    }

    pub(crate) fn array<const N: usize>(
        &mut self,
        field: &'static str,
    ) -> Result<[u8; N], PeerDecodeError> {
        let bytes = self.take(N, field)?;
        Ok(bytes.try_into().expect("take returned N bytes"))
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, PeerDecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, PeerDecodeError> {
        self.array(field).map(u16::from_be_bytes)
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, PeerDecodeError> {
        self.array(field).map(u32::from_be_bytes)
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, PeerDecodeError> {
        self.array(field).map(u64::from_be_bytes)
    }

    pub(crate) fn i64(&mut self, field: &'static str) -> Result<i64, PeerDecodeError> {
        self.array(field).map(i64::from_be_bytes)
    }

    /// A byte that must be 0 or 1: anything else would give one value two encodings.
    pub(crate) fn bool(&mut self, field: &'static str) -> Result<bool, PeerDecodeError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(PeerDecodeError::InvalidValue {
                field,
                value: other.into(),
            }),
        }
    }

    /// A `u16` length (at most [`crate::limits::MAX_STRING_BYTES`]) and that many bytes of UTF-8.
    pub(crate) fn string(&mut self, field: &'static str) -> Result<String, PeerDecodeError> {
        let len = usize::from(self.u16(field)?);
        over(Limit::String, field, len)?;
        let bytes = self.take(len, field)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| PeerDecodeError::BadUtf8 { field })
    }

    /// A `u32` length (at most `limit`) and that many bytes, shared with the body.
    pub(crate) fn blob(
        &mut self,
        limit: Limit,
        field: &'static str,
    ) -> Result<Bytes, PeerDecodeError> {
        let len = self.u32(field)? as usize;
        over(limit, field, len)?;
        let start = self.pos;
        self.take(len, field)?;
        Ok(self.buf.slice(start..start + len))
    }

    /// A `u32` count (at most `limit`) of items at least `min_item` bytes long, checked
    /// against the bytes left so a forged count fails before anything is sized from it.
    pub(crate) fn count(
        &mut self,
        limit: Limit,
        min_item: usize,
        field: &'static str,
    ) -> Result<usize, PeerDecodeError> {
        let n = self.u32(field)? as usize;
        over(limit, field, n)?;
        let needed = n.saturating_mul(min_item);
        let available = self.remaining();
        if needed > available {
            return Err(PeerDecodeError::Truncated {
                field,
                needed,
                available,
            });
        }
        Ok(n)
    }

    /// Ends the body: every byte must have been read.
    pub(crate) fn finish(self) -> Result<(), PeerDecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(PeerDecodeError::TrailingBytes { extra }),
        }
    }
}

/// One message body: how it is written and read. The kind table maps each kind to one of
/// these; [`crate::PeerMessage`] dispatches through it.
pub(crate) trait Body: Sized {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError>;
    fn decode(r: &mut Reader<'_>) -> Result<Self, PeerDecodeError>;
}

/// A body the table marks shard-scoped: decoding checks its scope against the caller's view.
pub(crate) trait Scoped {
    fn scope(&self) -> &crate::scope::ShardScope;
}

fn over(limit: Limit, field: &'static str, got: usize) -> Result<(), PeerDecodeError> {
    if got > limit.max() {
        return Err(PeerDecodeError::OverLimit {
            limit,
            field,
            got: got as u64,
        });
    }
    Ok(())
}

/// Refuses `got` over `limit` on the sending side.
pub(crate) fn check(limit: Limit, field: &'static str, got: usize) -> Result<(), PeerEncodeError> {
    if got > limit.max() {
        return Err(PeerEncodeError::OverLimit {
            limit,
            field,
            got: got as u64,
        });
    }
    Ok(())
}

/// Writes a `u16` length and the string.
pub(crate) fn put_string(
    out: &mut Vec<u8>,
    s: &str,
    field: &'static str,
) -> Result<(), PeerEncodeError> {
    check(Limit::String, field, s.len())?;
    // MAX_STRING_BYTES fits a u16 (asserted in limits.rs).
    out.put_u16(s.len() as u16);
    out.put_slice(s.as_bytes());
    Ok(())
}

/// Writes a `u32` length (at most `limit`) and the bytes.
pub(crate) fn put_blob(
    out: &mut Vec<u8>,
    b: &[u8],
    limit: Limit,
    field: &'static str,
) -> Result<(), PeerEncodeError> {
    check(limit, field, b.len())?;
    // Every blob limit is below the frame body limit, itself a u32.
    out.put_u32(b.len() as u32);
    out.put_slice(b);
    Ok(())
}

/// Writes a `u32` count (at most `limit`).
pub(crate) fn put_count(
    out: &mut Vec<u8>,
    n: usize,
    limit: Limit,
    field: &'static str,
) -> Result<(), PeerEncodeError> {
    check(limit, field, n)?;
    out.put_u32(n as u32);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_read_consumes_nothing_and_a_count_saturates() {
        let b = Bytes::from_static(&[0, 1, 0xFF, 0xFF, 0xFF, 0xFF, 7]);
        let mut r = Reader::new(&b);
        assert_eq!(r.u16("a"), Ok(1));
        assert!(matches!(
            r.u64("b"),
            Err(PeerDecodeError::Truncated { needed: 8, .. })
        ));
        assert!(matches!(
            r.count(Limit::FrameBody, usize::MAX, "n"),
            Err(PeerDecodeError::OverLimit { .. })
        ));
        assert_eq!(r.u8("c"), Ok(7));
        assert_eq!(r.finish(), Ok(()));
    }

    #[test]
    fn bools_have_one_encoding_each() {
        let b = Bytes::from_static(&[0, 1, 2]);
        let mut r = Reader::new(&b);
        assert_eq!(r.bool("x"), Ok(false));
        assert_eq!(r.bool("x"), Ok(true));
        assert_eq!(
            r.bool("x"),
            Err(PeerDecodeError::InvalidValue {
                field: "x",
                value: 2
            })
        );
    }
}
