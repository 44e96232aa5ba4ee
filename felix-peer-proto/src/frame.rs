//! The 10-byte peer frame header and the incremental decoder a link feeds.
//!
//! ```text
//! magic "FXP" · version u8 = 1 · kind u16 · body length u32        (big-endian)
//! ```
//!
//! The kind and the length are checked on the header alone: an unknown kind or an oversized
//! body costs the receiver ten bytes, never a buffer of the announced size.

use bytes::{Buf, Bytes, BytesMut};

use crate::error::PeerDecodeError;
use crate::limits::MAX_FRAME_BODY_BYTES;
use crate::scope::GenerationView;
use crate::{decode_body, PeerKind, PeerMessage};

/// The first three header bytes.
pub const MAGIC: [u8; 3] = *b"FXP";
/// The framing version. Message changes are negotiated by the hello's protocol version; this
/// byte changes only if the header itself does.
pub const FRAMING_VERSION: u8 = 1;
/// Header size.
pub const HEADER_LEN: usize = 10;

/// A checked header: a known kind and a body within the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerHeader {
    /// The message kind.
    pub kind: PeerKind,
    /// Body length in bytes.
    pub length: u32,
}

impl PeerHeader {
    /// Parses and checks a header against a body limit.
    pub fn decode(bytes: &[u8; HEADER_LEN], max_body: u32) -> Result<PeerHeader, PeerDecodeError> {
        let magic = [bytes[0], bytes[1], bytes[2]];
        if magic != MAGIC {
            return Err(PeerDecodeError::BadMagic { found: magic });
        }
        if bytes[3] != FRAMING_VERSION {
            return Err(PeerDecodeError::BadVersion { found: bytes[3] });
        }
        let code = u16::from_be_bytes([bytes[4], bytes[5]]);
        let kind = PeerKind::from_code(code).ok_or(PeerDecodeError::UnknownKind { code })?;
        let length = u32::from_be_bytes([bytes[6], bytes[7], bytes[8], bytes[9]]);
        if length > max_body {
            return Err(PeerDecodeError::FrameTooLarge {
                length,
                limit: max_body,
            });
        }
        Ok(PeerHeader { kind, length })
    }

    /// The header's bytes.
    pub fn to_bytes(self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..3].copy_from_slice(&MAGIC);
        out[3] = FRAMING_VERSION;
        out[4..6].copy_from_slice(&self.kind.code().to_be_bytes());
        out[6..].copy_from_slice(&self.length.to_be_bytes());
        out
    }
}

/// One whole frame off a link: its kind and its body, not yet decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerFrame {
    /// The kind the header named.
    pub kind: PeerKind,
    /// The body, a cheap handle on the link's buffer.
    pub body: Bytes,
}

impl PeerFrame {
    /// Decodes the body; shard-scoped kinds are checked against `view`.
    pub fn decode<V: GenerationView + ?Sized>(
        &self,
        view: &V,
    ) -> Result<PeerMessage, PeerDecodeError> {
        decode_body(self.kind, &self.body, view)
    }
}

/// Splits a peer stream, fed in chunks of any size, into [`PeerFrame`]s.
///
/// Feed bytes with [`PeerFrameDecoder::feed`] (or [`PeerFrameDecoder::feed_bytes`]), then
/// drain [`PeerFrameDecoder::next_frame`] until `Ok(None)`. A bad header poisons the decoder:
/// the stream is out of sync, and every later call returns the same error. A body that fails
/// to decode does not: it is one bad message, reported by [`PeerFrame::decode`].
#[derive(Debug)]
pub struct PeerFrameDecoder {
    buf: BytesMut,
    max_body: u32,
    pending: Option<PeerHeader>,
    poisoned: Option<PeerDecodeError>,
}

impl Default for PeerFrameDecoder {
    fn default() -> Self {
        PeerFrameDecoder::new(MAX_FRAME_BODY_BYTES)
    }
}

impl PeerFrameDecoder {
    /// A decoder refusing bodies over `max_body` bytes. A value above
    /// [`MAX_FRAME_BODY_BYTES`] is lowered to it: no sender may exceed the protocol's limit.
    pub fn new(max_body: u32) -> PeerFrameDecoder {
        PeerFrameDecoder {
            buf: BytesMut::new(),
            max_body: max_body.min(MAX_FRAME_BODY_BYTES),
            pending: None,
            poisoned: None,
        }
    }

    /// The body limit in force.
    pub fn max_body(&self) -> u32 {
        self.max_body
    }

    /// Bytes received and not yet returned in a frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Appends received bytes.
    pub fn feed(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Appends received bytes held in a `Bytes`, without a copy when nothing is buffered and
    /// the chunk is uniquely owned.
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

    /// The next whole frame, `Ok(None)` when more bytes are needed, or the error that ends
    /// the stream.
    pub fn next_frame(&mut self) -> Result<Option<PeerFrame>, PeerDecodeError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let header = match self.pending {
            Some(h) => h,
            None => {
                if self.buf.len() < HEADER_LEN {
                    return Ok(None);
                }
                let raw: [u8; HEADER_LEN] = self.buf[..HEADER_LEN].try_into().expect("10 bytes");
                match PeerHeader::decode(&raw, self.max_body) {
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
        // No reservation for the announced length: the buffer grows with the bytes that
        // actually arrive, so a header alone never costs its body's size.
        let len = header.length as usize;
        if self.buf.len() < len {
            return Ok(None);
        }
        self.pending = None;
        Ok(Some(PeerFrame {
            kind: header.kind,
            body: self.buf.split_to(len).freeze(),
        }))
    }
}
