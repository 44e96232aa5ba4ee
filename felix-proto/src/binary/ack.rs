//! The binary publish ack (`0x0010`) and its tails: error code (`0x0200`), error detail
//! (`0x0400`), forwarded owner (`0x0080`) and offset (`0x1000`).
//!
//! ```text
//! [u8 status 0 ok | 1 error][u64 request_id][u16 msg_len][msg]
//! [u16 code][u8 retry]                                   error ack with 0x0200
//! [u16 reason_len][reason][u64 retry_after_ms]           error ack with 0x0400
//! [u16 node_id_len][node_id][u16 addr_len][addr][u64 generation]   with 0x0080
//! [u64 offset]                                           ok ack with 0x1000
//! ```
//!
//! The code, detail and offset tails belong to one status each. A bit that does not apply
//! to the ack's status announces no field and is ignored on decode, so such a frame does
//! not re-encode byte for byte; a broker never sends one.

use bytes::{BufMut, Bytes, BytesMut};

use super::expect_layout;
use super::reader::{clip_text16, put_bytes16, Reader};
use crate::error::{DecodeError, ErrorCode, RetryClass};
use crate::flags::Flags;
use crate::frame::Frame;

const LAYOUT: &str = "binary publish ack";

/// The binary answer to an acked publish batch.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct PublishAck {
    /// The batch's `request_id`.
    pub request_id: u64,
    /// Whether the batch was written.
    pub result: AckResult,
    /// `0x0080`: the batch was forwarded, and this is who owns its shard.
    pub owner: Option<AckOwner>,
}

/// The outcome an ack reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckResult {
    /// Status 0. An ok ack's message is empty on the wire; one that is not is ignored.
    Ok {
        /// `0x1000`: the offset of the batch's first record.
        offset: Option<u64>,
    },
    /// Status 1.
    Err {
        /// Error text, UTF-8. Cut to 65,535 bytes on encode.
        message: String,
        /// `0x0200`: the error code and retry class. An [`ErrorCode::Other`] has no number
        /// and goes out as `internal`.
        code: Option<(ErrorCode, RetryClass)>,
        /// `0x0400`: only valid with `code`; alone it makes a frame receivers refuse.
        detail: Option<AckDetail>,
    },
}

/// `publish_error.detail` in binary.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct AckDetail {
    /// E.g. `"moving"` for `shard_unavailable`; empty when there is none. Cut to 65,535
    /// bytes on encode.
    #[cfg_attr(feature = "arbitrary", arbitrary(with = super::arb::short_string))]
    pub reason: String,
    /// Suggested wait before retrying; 0 for none.
    pub retry_after_ms: u64,
}

/// The owner a forwarded batch was written by.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct AckOwner {
    #[cfg_attr(feature = "arbitrary", arbitrary(with = super::arb::short_string))]
    pub node_id: String,
    /// Where clients reach the owner. `None` (sent as empty) when the cluster does not know.
    #[cfg_attr(feature = "arbitrary", arbitrary(with = super::arb::non_empty_short_string_opt))]
    pub addr: Option<String>,
    /// The ownership generation this answer was true for.
    pub generation: u64,
}

impl PublishAck {
    /// A successful ack.
    pub fn ok(request_id: u64, offset: Option<u64>) -> PublishAck {
        PublishAck {
            request_id,
            result: AckResult::Ok { offset },
            owner: None,
        }
    }

    /// The exact flag word this ack is sent with.
    pub fn flags(&self) -> Flags {
        let mut flags = Flags::BINARY_PUBLISH_ACK;
        match &self.result {
            AckResult::Ok { offset } => {
                if offset.is_some() {
                    flags |= Flags::BINARY_PUBLISH_ACK_OFFSET;
                }
            }
            AckResult::Err { code, detail, .. } => {
                if code.is_some() {
                    flags |= Flags::BINARY_PUBLISH_ACK_CODE;
                }
                if detail.is_some() {
                    flags |= Flags::BINARY_PUBLISH_ACK_DETAIL;
                }
            }
        }
        if self.owner.is_some() {
            flags |= Flags::BINARY_PUBLISH_ACK_OWNER;
        }
        flags
    }

    /// Decodes a payload received with `flags`.
    pub fn decode(flags: Flags, payload: &Bytes) -> Result<PublishAck, DecodeError> {
        let flags = expect_layout(flags, Flags::BINARY_PUBLISH_ACK, LAYOUT)?;
        let mut r = Reader::new(payload);
        let status = r.u8("status")?;
        if status > 1 {
            return Err(DecodeError::InvalidValue {
                field: "status",
                detail: format!("{status} is neither 0 (ok) nor 1 (error)"),
            });
        }
        let request_id = r.u64("request_id")?;
        let message = r.bytes16("message")?;
        let mut result = if status == 0 {
            AckResult::Ok { offset: None }
        } else {
            let message = std::str::from_utf8(message)
                .map_err(|_| DecodeError::InvalidUtf8 { field: "message" })?;
            let code = if flags.contains(Flags::BINARY_PUBLISH_ACK_CODE) {
                let number = r.u16("code")?;
                let retry = r.u8("retry")?;
                Some((
                    ErrorCode::from_number(number),
                    RetryClass::from_number(retry),
                ))
            } else {
                None
            };
            let detail = if flags.contains(Flags::BINARY_PUBLISH_ACK_DETAIL) {
                let reason = r.str16("reason")?.to_owned();
                Some(AckDetail {
                    reason,
                    retry_after_ms: r.u64("retry_after_ms")?,
                })
            } else {
                None
            };
            AckResult::Err {
                message: message.to_owned(),
                code,
                detail,
            }
        };
        let owner = if flags.contains(Flags::BINARY_PUBLISH_ACK_OWNER) {
            let node_id = r.str16("node_id")?.to_owned();
            let addr = r.str16("addr")?;
            let addr = (!addr.is_empty()).then(|| addr.to_owned());
            Some(AckOwner {
                node_id,
                addr,
                generation: r.u64("generation")?,
            })
        } else {
            None
        };
        if let AckResult::Ok { offset } = &mut result {
            if flags.contains(Flags::BINARY_PUBLISH_ACK_OFFSET) {
                *offset = Some(r.u64("offset")?);
            }
        }
        r.finish(LAYOUT)?;
        Ok(PublishAck {
            request_id,
            result,
            owner,
        })
    }

    /// Payload size in bytes.
    pub fn encoded_len(&self) -> usize {
        let mut len = 1 + 8 + 2;
        match &self.result {
            AckResult::Ok { offset } => len += if offset.is_some() { 8 } else { 0 },
            AckResult::Err {
                message,
                code,
                detail,
            } => {
                len += clip_text16(message).len();
                len += if code.is_some() { 3 } else { 0 };
                len += detail
                    .as_ref()
                    .map_or(0, |d| 2 + clip_text16(&d.reason).len() + 8);
            }
        }
        if let Some(owner) = &self.owner {
            len += 2 + owner.node_id.len() + 2 + owner.addr.as_ref().map_or(0, String::len) + 8;
        }
        len
    }

    /// Appends the payload (no frame header) to `out`.
    ///
    /// # Panics
    /// If the owner's node id or address is over 65,535 bytes.
    pub fn encode_into(&self, out: &mut impl BufMut) {
        out.put_u8(match self.result {
            AckResult::Ok { .. } => 0,
            AckResult::Err { .. } => 1,
        });
        out.put_u64(self.request_id);
        match &self.result {
            AckResult::Ok { .. } => out.put_u16(0),
            AckResult::Err {
                message,
                code,
                detail,
            } => {
                put_bytes16(out, clip_text16(message).as_bytes(), "message");
                if let Some((code, retry)) = code {
                    out.put_u16(code.number());
                    out.put_u8(retry.number());
                }
                if let Some(detail) = detail {
                    put_bytes16(out, clip_text16(&detail.reason).as_bytes(), "reason");
                    out.put_u64(detail.retry_after_ms);
                }
            }
        }
        if let Some(owner) = &self.owner {
            put_bytes16(out, owner.node_id.as_bytes(), "node_id");
            put_bytes16(out, owner.addr.as_deref().unwrap_or("").as_bytes(), "addr");
            out.put_u64(owner.generation);
        }
        if let AckResult::Ok {
            offset: Some(offset),
        } = self.result
        {
            out.put_u64(offset);
        }
    }

    /// The ack as a frame.
    pub fn to_frame(&self) -> Frame {
        let mut out = BytesMut::with_capacity(self.encoded_len());
        self.encode_into(&mut out);
        Frame::new(self.flags(), out.freeze())
    }
}

#[cfg(feature = "arbitrary")]
impl<'u> arbitrary::Arbitrary<'u> for AckResult {
    fn arbitrary(u: &mut arbitrary::Unstructured<'u>) -> arbitrary::Result<Self> {
        use super::arb;
        if u.arbitrary()? {
            return Ok(AckResult::Ok {
                offset: u.arbitrary()?,
            });
        }
        let message = arb::short_string(u)?;
        // Codes come from numbers so they survive the trip (an `Other` string has none), and
        // a detail only with a code, the only way it can be sent.
        let code = if u.arbitrary()? {
            let number: u16 = u.arbitrary()?;
            let retry = *u.choose(&RetryClass::ALL)?;
            Some((ErrorCode::from_number(number), retry))
        } else {
            None
        };
        let detail = if code.is_some() { u.arbitrary()? } else { None };
        Ok(AckResult::Err {
            message,
            code,
            detail,
        })
    }
}
