//! Error codes and retry classes (as strings in JSON and as numbers in binary acks), and the
//! crate's decode error.

use std::fmt;

use crate::flags::FlagError;

macro_rules! error_codes {
    ($( $(#[$doc:meta])* $variant:ident = $num:literal, $name:literal, $retry:ident; )*) => {
        /// A typed error code. Codes this crate does not know are carried, never refused:
        /// [`ErrorCode::Other`] keeps an unknown string and [`ErrorCode::OtherNumber`] an unknown
        /// binary number, so they re-encode as they arrived.
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $( $(#[$doc])* $variant, )*
            /// A code string this crate does not know.
            Other(Box<str>),
            /// A binary code number this crate does not know.
            OtherNumber(u16),
        }

        impl ErrorCode {
            /// Every known code, in number order.
            pub const KNOWN: &'static [ErrorCode] = &[ $( ErrorCode::$variant, )* ];

            /// The code's wire string.
            pub fn as_str(&self) -> &str {
                match self {
                    $( ErrorCode::$variant => $name, )*
                    ErrorCode::Other(s) => s,
                    ErrorCode::OtherNumber(_) => "unknown",
                }
            }

            /// Reads a wire string; an unknown one is kept as [`ErrorCode::Other`].
            pub fn from_name(s: &str) -> ErrorCode {
                match s {
                    $( $name => ErrorCode::$variant, )*
                    other => ErrorCode::Other(other.into()),
                }
            }

            /// The `u16` a binary ack carries. An unknown string has no number and is sent as
            /// `internal` (13); `0` is never produced for a known code.
            pub fn number(&self) -> u16 {
                match self {
                    $( ErrorCode::$variant => $num, )*
                    ErrorCode::Other(_) => 13,
                    ErrorCode::OtherNumber(n) => *n,
                }
            }

            /// Reads a binary code number; an unknown one is kept as [`ErrorCode::OtherNumber`].
            pub fn from_number(n: u16) -> ErrorCode {
                match n {
                    $( $num => ErrorCode::$variant, )*
                    other => ErrorCode::OtherNumber(other),
                }
            }

            /// The retry class a broker sends with this code unless it knows better.
            pub fn default_retry(&self) -> RetryClass {
                match self {
                    $( ErrorCode::$variant => RetryClass::$retry, )*
                    ErrorCode::Other(_) | ErrorCode::OtherNumber(_) => RetryClass::Fatal,
                }
            }
        }
    };
}

error_codes! {
    /// The stream has not authenticated, or the credential was refused.
    Unauthenticated = 1, "unauthenticated", Fatal;
    /// The credential does not grant this operation.
    Forbidden = 2, "forbidden", Fatal;
    /// The tenant, namespace, stream or cache does not exist here.
    NotFound = 3, "not_found", RetryAfter;
    /// The request can never succeed as sent.
    InvalidRequest = 4, "invalid_request", Fatal;
    /// Nobody can serve the shard right now.
    ShardUnavailable = 5, "shard_unavailable", Retry;
    /// Another broker owns the shard.
    NotLeader = 6, "not_leader", Redirect;
    /// A majority did not confirm the write in time.
    QuorumTimeout = 7, "quorum_timeout", OutcomeUnknown;
    /// Leadership moved before a majority held the write.
    LeadershipLost = 8, "leadership_lost", OutcomeUnknown;
    /// The broker stopped waiting for the write's outcome.
    Unacknowledged = 9, "unacknowledged", OutcomeUnknown;
    /// The broker is shedding load.
    Overloaded = 10, "overloaded", RetryAfter;
    /// The request exceeds a configured limit.
    LimitExceeded = 11, "limit_exceeded", Fatal;
    /// The broker is shutting down.
    Draining = 12, "draining", Retry;
    /// Something failed inside the broker.
    Internal = 13, "internal", OutcomeUnknown;
    /// The storage layer failed.
    Storage = 14, "storage", OutcomeUnknown;
    /// The group has no record of handing this offset out.
    StaleClaim = 15, "stale_claim", Retry;
    /// The credential was revoked. The reference numbers stop at 15; we continue in the order
    /// the wire specification lists the codes.
    Revoked = 16, "revoked", Fatal;
    /// A keyed batch was routed by a width the stream does not have.
    StaleWidth = 17, "stale_width", Retry;
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorCode::OtherNumber(n) => write!(f, "unknown({n})"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// What a client may do after an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryClass {
    /// Nothing was applied; sending again is safe.
    Retry,
    /// Nothing was applied; wait first.
    RetryAfter,
    /// Nothing was applied; send to the shard's owner.
    Redirect,
    /// It may have been applied; only an idempotent request may be re-sent.
    OutcomeUnknown,
    /// Sending again fails the same way. Also the reading of any unknown class.
    Fatal,
}

impl RetryClass {
    /// Every class, in number order.
    pub const ALL: [RetryClass; 5] = [
        RetryClass::Retry,
        RetryClass::RetryAfter,
        RetryClass::Redirect,
        RetryClass::OutcomeUnknown,
        RetryClass::Fatal,
    ];

    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryClass::Retry => "retry",
            RetryClass::RetryAfter => "retry_after",
            RetryClass::Redirect => "redirect",
            RetryClass::OutcomeUnknown => "outcome_unknown",
            RetryClass::Fatal => "fatal",
        }
    }
    /// Reads a wire string; an unknown class is `fatal`, the reading that cannot duplicate a
    /// write.
    pub fn from_name(s: &str) -> RetryClass {
        match s {
            "retry" => RetryClass::Retry,
            "retry_after" => RetryClass::RetryAfter,
            "redirect" => RetryClass::Redirect,
            "outcome_unknown" => RetryClass::OutcomeUnknown,
            _ => RetryClass::Fatal,
        }
    }
    /// The byte a binary ack carries.
    pub fn number(self) -> u8 {
        match self {
            RetryClass::Retry => 1,
            RetryClass::RetryAfter => 2,
            RetryClass::Redirect => 3,
            RetryClass::OutcomeUnknown => 4,
            RetryClass::Fatal => 5,
        }
    }
    /// Reads the binary byte; an unknown one is `fatal`.
    pub fn from_number(n: u8) -> RetryClass {
        match n {
            1 => RetryClass::Retry,
            2 => RetryClass::RetryAfter,
            3 => RetryClass::Redirect,
            4 => RetryClass::OutcomeUnknown,
            _ => RetryClass::Fatal,
        }
    }
}

impl fmt::Display for RetryClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why bytes could not be decoded. Each variant names what was wrong so a broker can answer
/// with a specific message; all of them are `invalid_request` to a client ([`DecodeError::code`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The header's magic is not `FLX1`.
    BadMagic { found: u32 },
    /// The header's version is not 1.
    BadVersion { found: u16 },
    /// The header's flag word was refused.
    Flags(FlagError),
    /// The header announces a payload over the limit in force.
    FrameTooLarge { length: u32, limit: u32 },
    /// A field runs past the end of the payload.
    Truncated {
        field: &'static str,
        needed: usize,
        available: usize,
    },
    /// Bytes are left over after the layout ended.
    TrailingBytes { layout: &'static str, extra: usize },
    /// A text field is not UTF-8.
    InvalidUtf8 { field: &'static str },
    /// The JSON payload is not valid JSON or does not match its message's shape.
    InvalidJson { detail: String },
    /// A base64 field does not decode.
    InvalidBase64 { detail: String },
    /// A field holds a value the layout does not allow.
    InvalidValue { field: &'static str, detail: String },
    /// The frame's flags select a layout that is not valid where it arrived.
    UnexpectedLayout { flags: u16, expected: &'static str },
}

impl DecodeError {
    /// The code a broker answers a frame that fails this way with.
    pub fn code(&self) -> ErrorCode {
        ErrorCode::InvalidRequest
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::BadMagic { found } => write!(f, "bad frame magic {found:#010x}"),
            DecodeError::BadVersion { found } => write!(f, "unsupported frame version {found}"),
            DecodeError::Flags(e) => e.fmt(f),
            DecodeError::FrameTooLarge { length, limit } => {
                write!(
                    f,
                    "frame payload of {length} bytes exceeds the limit of {limit}"
                )
            }
            DecodeError::Truncated {
                field,
                needed,
                available,
            } => write!(
                f,
                "truncated: {field} needs {needed} bytes, {available} remain"
            ),
            DecodeError::TrailingBytes { layout, extra } => {
                write!(f, "{extra} trailing bytes after {layout}")
            }
            DecodeError::InvalidUtf8 { field } => write!(f, "{field} is not valid UTF-8"),
            DecodeError::InvalidJson { detail } => write!(f, "invalid JSON message: {detail}"),
            DecodeError::InvalidBase64 { detail } => write!(f, "invalid base64: {detail}"),
            DecodeError::InvalidValue { field, detail } => write!(f, "invalid {field}: {detail}"),
            DecodeError::UnexpectedLayout { flags, expected } => {
                write!(f, "frame flags {flags:#06x} are not {expected}")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

impl From<FlagError> for DecodeError {
    fn from(e: FlagError) -> Self {
        DecodeError::Flags(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_by_name_and_number() {
        for code in ErrorCode::KNOWN {
            assert_eq!(&ErrorCode::from_name(code.as_str()), code);
            assert_eq!(&ErrorCode::from_number(code.number()), code);
            assert_ne!(code.number(), 0);
        }
        assert_eq!(ErrorCode::Forbidden.number(), 2);
        assert_eq!(ErrorCode::StaleClaim.number(), 15);
    }

    #[test]
    fn unknown_codes_are_carried() {
        assert_eq!(
            ErrorCode::from_name("brand_new"),
            ErrorCode::Other("brand_new".into())
        );
        assert_eq!(ErrorCode::from_name("brand_new").as_str(), "brand_new");
        assert_eq!(ErrorCode::from_number(999).number(), 999);
    }

    #[test]
    fn unknown_retry_reads_as_fatal() {
        assert_eq!(RetryClass::from_name("maybe"), RetryClass::Fatal);
        assert_eq!(RetryClass::from_number(0), RetryClass::Fatal);
        assert_eq!(RetryClass::from_number(9), RetryClass::Fatal);
        for r in RetryClass::ALL {
            assert_eq!(RetryClass::from_name(r.as_str()), r);
            assert_eq!(RetryClass::from_number(r.number()), r);
        }
    }
}
