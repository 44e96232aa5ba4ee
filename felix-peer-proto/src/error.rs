//! Why a peer frame could not be decoded or encoded.

use std::fmt;

use crate::limits::Limit;
use crate::scope::ShardId;

/// Why bytes from a peer were refused. A link that gets any of these from its frame decoder
/// is out of sync and is closed; the two generation variants are answers about one message,
/// not about the link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerDecodeError {
    /// The header does not start with `FXP`.
    BadMagic { found: [u8; 3] },
    /// The header's framing version is not 1.
    BadVersion { found: u8 },
    /// The header names a kind the table does not hold.
    UnknownKind { code: u16 },
    /// The header announces a body over the receiver's limit.
    FrameTooLarge { length: u32, limit: u32 },
    /// A field runs past the end of the body.
    Truncated {
        field: &'static str,
        needed: usize,
        available: usize,
    },
    /// A length or count is over its named limit.
    OverLimit {
        limit: Limit,
        field: &'static str,
        got: u64,
    },
    /// A field holds a value its type does not allow (an unknown enum number, a bool that is
    /// neither 0 nor 1).
    InvalidValue { field: &'static str, value: u64 },
    /// A string field is not UTF-8.
    BadUtf8 { field: &'static str },
    /// Bytes are left after the message ended.
    TrailingBytes { extra: usize },
    /// A shard-scoped message names a generation older than the receiver's.
    StaleGeneration { got: u64, current: u64 },
    /// A shard-scoped message names a shard the receiver does not know.
    UnknownShard { shard: Box<ShardId> },
}

impl fmt::Display for PeerDecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerDecodeError::BadMagic { found } => write!(f, "bad peer frame magic {found:02x?}"),
            PeerDecodeError::BadVersion { found } => {
                write!(f, "unsupported peer framing version {found}")
            }
            PeerDecodeError::UnknownKind { code } => write!(f, "unknown peer kind {code:#06x}"),
            PeerDecodeError::FrameTooLarge { length, limit } => {
                write!(f, "peer frame body of {length} bytes exceeds {limit}")
            }
            PeerDecodeError::Truncated {
                field,
                needed,
                available,
            } => write!(
                f,
                "truncated: {field} needs {needed} bytes, {available} remain"
            ),
            PeerDecodeError::OverLimit { limit, field, got } => write!(
                f,
                "{field} is {got}, over {} ({})",
                limit.name(),
                limit.max()
            ),
            PeerDecodeError::InvalidValue { field, value } => {
                write!(f, "{field} has no value {value}")
            }
            PeerDecodeError::BadUtf8 { field } => write!(f, "{field} is not valid UTF-8"),
            PeerDecodeError::TrailingBytes { extra } => {
                write!(f, "{extra} trailing bytes after the message")
            }
            PeerDecodeError::StaleGeneration { got, current } => {
                write!(f, "stale generation {got}, current is {current}")
            }
            PeerDecodeError::UnknownShard { shard } => write!(f, "unknown shard {shard}"),
        }
    }
}

impl std::error::Error for PeerDecodeError {}

/// Why a message could not be encoded: a field is over its limit, so the peer would refuse
/// the frame. Nothing is left in the output buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerEncodeError {
    /// A length or count is over its named limit.
    OverLimit {
        limit: Limit,
        field: &'static str,
        got: u64,
    },
}

impl fmt::Display for PeerEncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerEncodeError::OverLimit { limit, field, got } => write!(
                f,
                "cannot encode: {field} is {got}, over {} ({})",
                limit.name(),
                limit.max()
            ),
        }
    }
}

impl std::error::Error for PeerEncodeError {}
