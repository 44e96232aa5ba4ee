//! The 12-byte frame header and the incremental frame decoder.
//!
//! ```text
//! magic u32 = "FLX1" | version u16 = 1 | flags u16 | length u32      (all big-endian)
//! ```
//!
//! The decoder enforces the payload limit on the header alone, before it buffers a byte of
//! the payload, so an oversize `length` costs the receiver twelve bytes.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::DecodeError;
use crate::flags::Flags;

/// `"FLX1"`.
pub const MAGIC: u32 = 0x464C_5831;
/// The only protocol version; capabilities are negotiated, never versioned.
pub const VERSION: u16 = 1;
/// Size of the frame header.
pub const HEADER_LEN: usize = 12;
/// Default payload limit on an authenticated stream (16 MiB).
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 16 * 1024 * 1024;
/// Default payload limit before the stream has authenticated (64 KiB).
pub const DEFAULT_PREAUTH_MAX_FRAME_BYTES: u32 = 64 * 1024;

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The flag word, already validated.
    pub flags: Flags,
    /// Payload length in bytes.
    pub length: u32,
}

impl FrameHeader {
    /// Parses and checks a header: magic, version, flags, and `length <= limit`.
    pub fn decode(bytes: &[u8; HEADER_LEN], limit: u32) -> Result<FrameHeader, DecodeError> {
        let magic = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if magic != MAGIC {
            return Err(DecodeError::BadMagic { found: magic });
        }
        let version = u16::from_be_bytes([bytes[4], bytes[5]]);
        if version != VERSION {
            return Err(DecodeError::BadVersion { found: version });
        }
        let flags = Flags(u16::from_be_bytes([bytes[6], bytes[7]])).validate_frame()?;
        let length = u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if length > limit {
            return Err(DecodeError::FrameTooLarge { length, limit });
        }
        Ok(FrameHeader { flags, length })
    }

    /// The header's 12 bytes.
    pub fn to_bytes(self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(&MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&VERSION.to_be_bytes());
        out[6..8].copy_from_slice(&self.flags.0.to_be_bytes());
        out[8..12].copy_from_slice(&self.length.to_be_bytes());
        out
    }
}

/// A whole frame: validated flags and the payload, a cheap `Bytes` handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The frame's flags (validated when decoded).
    pub flags: Flags,
    /// The payload.
    pub payload: Bytes,
}

impl Frame {
    /// A frame with the given flags and payload.
    pub fn new(flags: Flags, payload: Bytes) -> Frame {
        Frame { flags, payload }
    }

    /// Appends header and payload to `out`. Panics if the payload exceeds `u32::MAX` bytes,
    /// which no encoder in this crate produces.
    pub fn encode_into(&self, out: &mut impl BufMut) {
        encode_frame_header(self.flags, self.payload.len(), out);
        out.put_slice(&self.payload);
    }

    /// Header and payload as one buffer.
    pub fn to_bytes(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(HEADER_LEN + self.payload.len());
        self.encode_into(&mut out);
        out.freeze()
    }
}

/// Writes a frame header announcing `len` payload bytes.
pub fn encode_frame_header(flags: Flags, len: usize, out: &mut impl BufMut) {
    let length = u32::try_from(len).expect("frame payload exceeds u32::MAX bytes");
    out.put_slice(&FrameHeader { flags, length }.to_bytes());
}

/// Decodes frames from a byte stream fed in chunks of any size.
///
/// Feed bytes with [`FrameDecoder::feed`] (or [`FrameDecoder::feed_bytes`] to hand over a
/// `Bytes` without copying when it holds whole frames), then drain with
/// [`FrameDecoder::next_frame`] until it returns `Ok(None)`. After an error the decoder is
/// poisoned: the stream is out of sync and every later call returns the same error.
///
/// The limit applies to the next header decoded and can be raised once the stream
/// authenticates ([`FrameDecoder::set_max_payload`]).
#[derive(Debug)]
pub struct FrameDecoder {
    buf: BytesMut,
    max_payload: u32,
    pending: Option<FrameHeader>,
    poisoned: Option<DecodeError>,
}

impl FrameDecoder {
    /// A decoder refusing payloads above `max_payload` bytes.
    pub fn new(max_payload: u32) -> FrameDecoder {
        FrameDecoder {
            buf: BytesMut::new(),
            max_payload,
            pending: None,
            poisoned: None,
        }
    }

    /// Changes the payload limit for headers not yet decoded.
    pub fn set_max_payload(&mut self, max_payload: u32) {
        self.max_payload = max_payload;
    }

    /// The payload limit in force.
    pub fn max_payload(&self) -> u32 {
        self.max_payload
    }

    /// Bytes received and not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Appends received bytes.
    pub fn feed(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Appends received bytes held in a `Bytes`. When nothing is buffered the chunk becomes
    /// the buffer without a copy where `Bytes` allows it, so frames split from it share its
    /// allocation.
    pub fn feed_bytes(&mut self, chunk: Bytes) {
        if self.buf.is_empty() {
            match chunk.try_into_mut() {
                Ok(owned) => self.buf = owned,
                Err(shared) => self.buf.extend_from_slice(&shared),
            }
        } else {
            self.buf.extend_from_slice(&chunk);
        }
    }

    /// Returns the next whole frame, `Ok(None)` if more bytes are needed, or the error that
    /// ends the stream.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, DecodeError> {
        if let Some(err) = &self.poisoned {
            return Err(err.clone());
        }
        let header = match self.pending {
            Some(h) => h,
            None => {
                if self.buf.len() < HEADER_LEN {
                    return Ok(None);
                }
                let raw: [u8; HEADER_LEN] = self.buf[..HEADER_LEN].try_into().expect("12 bytes");
                match FrameHeader::decode(&raw, self.max_payload) {
                    Ok(h) => {
                        self.buf.advance(HEADER_LEN);
                        self.pending = Some(h);
                        h
                    }
                    Err(e) => {
                        self.poisoned = Some(e.clone());
                        return Err(e);
                    }
                }
            }
        };
        let len = header.length as usize;
        if self.buf.len() < len {
            // No reserve from the header's length: a sender could announce the limit on
            // every stream and never send the body. The buffer grows only with the bytes that
            // arrive (`feed`), which the transport's flow control bounds.
            return Ok(None);
        }
        self.pending = None;
        let payload = self.buf.split_to(len).freeze();
        Ok(Some(Frame {
            flags: header.flags,
            payload,
        }))
    }

    /// The header of the frame being assembled, if one has been read.
    pub fn pending_header(&self) -> Option<FrameHeader> {
        self.pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_bytes(flags: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&MAGIC.to_be_bytes());
        v.extend_from_slice(&1u16.to_be_bytes());
        v.extend_from_slice(&flags.to_be_bytes());
        v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn decodes_one_byte_at_a_time() {
        let mut wire = frame_bytes(0, b"{\"type\":\"ok\"}");
        wire.extend(frame_bytes(0x0009, b"abc"));
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES);
        let mut frames = Vec::new();
        for b in &wire {
            d.feed(std::slice::from_ref(b));
            while let Some(f) = d.next_frame().unwrap() {
                frames.push(f);
            }
        }
        assert_eq!(frames.len(), 2);
        assert_eq!(&frames[0].payload[..], b"{\"type\":\"ok\"}");
        assert_eq!(frames[1].flags, Flags(0x0009));
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn bad_magic_and_version_are_refused() {
        let mut wire = frame_bytes(0, b"x");
        wire[0] = b'G';
        let mut d = FrameDecoder::new(100);
        d.feed(&wire);
        assert!(matches!(d.next_frame(), Err(DecodeError::BadMagic { .. })));
        // Poisoned: the same error again.
        assert!(matches!(d.next_frame(), Err(DecodeError::BadMagic { .. })));

        let mut wire = frame_bytes(0, b"x");
        wire[5] = 2;
        let mut d = FrameDecoder::new(100);
        d.feed(&wire);
        assert_eq!(d.next_frame(), Err(DecodeError::BadVersion { found: 2 }));
    }

    #[test]
    fn oversize_is_refused_on_the_header_alone() {
        let mut d = FrameDecoder::new(DEFAULT_PREAUTH_MAX_FRAME_BYTES);
        let header = FrameHeader {
            flags: Flags::NONE,
            length: DEFAULT_PREAUTH_MAX_FRAME_BYTES + 1,
        };
        d.feed(&header.to_bytes());
        assert_eq!(
            d.next_frame(),
            Err(DecodeError::FrameTooLarge {
                length: DEFAULT_PREAUTH_MAX_FRAME_BYTES + 1,
                limit: DEFAULT_PREAUTH_MAX_FRAME_BYTES
            })
        );
        // Exactly at the limit is fine.
        let mut d = FrameDecoder::new(16);
        d.feed(&frame_bytes(0, &[b'a'; 16]));
        assert_eq!(d.next_frame().unwrap().unwrap().payload.len(), 16);
    }

    #[test]
    fn a_header_alone_reserves_nothing_for_its_body() {
        // A peer can send headers announcing the limit and then stall: memory must follow the
        // bytes that arrived, not the length a header claims.
        let claimed = DEFAULT_MAX_FRAME_BYTES;
        let mut d = FrameDecoder::new(claimed);
        let header = FrameHeader {
            flags: Flags::NONE,
            length: claimed,
        };
        d.feed(&header.to_bytes());
        assert_eq!(d.next_frame(), Ok(None));
        assert!(d.buf.capacity() < 4096, "reserved {}", d.buf.capacity());
        d.feed(&[b'a'; 100]);
        assert_eq!(d.next_frame(), Ok(None));
        assert!(d.buf.capacity() < 4096, "reserved {}", d.buf.capacity());
        // The body still decodes once it is all there.
        d.feed(&vec![b'a'; claimed as usize - 100]);
        assert_eq!(
            d.next_frame().unwrap().unwrap().payload.len(),
            claimed as usize
        );
    }

    #[test]
    fn unknown_flag_is_refused() {
        let mut d = FrameDecoder::new(100);
        d.feed(&frame_bytes(0x8000, b""));
        assert!(matches!(d.next_frame(), Err(DecodeError::Flags(_))));
    }

    #[test]
    fn truncated_header_and_body_wait_for_more() {
        let wire = frame_bytes(0, b"hello");
        let mut d = FrameDecoder::new(100);
        d.feed(&wire[..7]);
        assert_eq!(d.next_frame(), Ok(None));
        d.feed(&wire[7..14]);
        assert_eq!(d.next_frame(), Ok(None));
        assert_eq!(d.pending_header().unwrap().length, 5);
        d.feed(&wire[14..]);
        assert_eq!(&d.next_frame().unwrap().unwrap().payload[..], b"hello");
    }

    #[test]
    fn feed_bytes_shares_the_allocation() {
        let wire = Bytes::from(frame_bytes(0x0001, &[7u8; 64]));
        let mut d = FrameDecoder::new(100);
        d.feed_bytes(wire);
        let f = d.next_frame().unwrap().unwrap();
        assert_eq!(f.payload.len(), 64);
    }

    #[test]
    fn encode_round_trips() {
        let f = Frame::new(Flags(0x0024), Bytes::from_static(b"payload"));
        let bytes = f.to_bytes();
        assert_eq!(&bytes[..], &frame_bytes(0x0024, b"payload")[..]);
        let mut d = FrameDecoder::new(100);
        d.feed(&bytes);
        assert_eq!(d.next_frame().unwrap().unwrap(), f);
    }
}
