//! The client's error type, shared by the Sans-IO core and the async front end.

use std::fmt;

use felix_proto::{DecodeError, ErrorCode, RetryClass};

/// Why a client call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientError {
    /// The broker refused the request. `code` and `retry` are present when the broker sent
    /// them (it does to a client that offered `FEATURE_ERROR_CODES`, or on a binary ack with
    /// `0x0200`); an uncoded refusal has neither.
    Server {
        code: Option<ErrorCode>,
        retry: Option<RetryClass>,
        message: String,
    },
    /// The broker answered `unsupported`: it does not know this request type.
    Unsupported { request_type: String },
    /// The connection or stream went away (reset, closed, timed out, refused by TLS...).
    Connection(String),
    /// The broker sent something this client cannot accept: a frame that does not decode,
    /// an answer to no request, an answer out of the negotiated order.
    Protocol(String),
    /// The client refused to send: the call needs a capability the broker did not
    /// advertise, or its arguments cannot be encoded.
    Usage(String),
    /// No answer arrived within the configured time.
    Timeout(&'static str),
    /// The broker does not own the shard and named the one that does (`not_leader`, sent to
    /// a client that offered `FEATURE_REDIRECT`). The client follows it itself; a caller
    /// sees it only when the redirect could not be followed.
    NotLeader {
        node_id: String,
        addr: Option<String>,
        generation: u64,
    },
}

impl ClientError {
    /// The broker's error code, if this is a coded refusal.
    pub fn code(&self) -> Option<&ErrorCode> {
        match self {
            ClientError::Server { code, .. } => code.as_ref(),
            ClientError::NotLeader { .. } => Some(&ErrorCode::NotLeader),
            _ => None,
        }
    }

    /// The retry class the broker attached, if any.
    pub fn retry(&self) -> Option<RetryClass> {
        match self {
            ClientError::Server { retry, .. } => *retry,
            ClientError::NotLeader { .. } => Some(RetryClass::Redirect),
            _ => None,
        }
    }

    pub(crate) fn protocol(what: impl fmt::Display) -> ClientError {
        ClientError::Protocol(what.to_string())
    }

    pub(crate) fn server(
        code: Option<ErrorCode>,
        retry: Option<RetryClass>,
        message: String,
    ) -> Self {
        ClientError::Server {
            code,
            retry,
            message,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Server {
                code,
                retry,
                message,
            } => {
                f.write_str("broker refused the request")?;
                if let Some(code) = code {
                    write!(f, " ({code}")?;
                    if let Some(retry) = retry {
                        write!(f, ", {retry}")?;
                    }
                    f.write_str(")")?;
                }
                write!(f, ": {message}")
            }
            ClientError::Unsupported { request_type } => {
                write!(f, "broker does not support request type {request_type:?}")
            }
            ClientError::Connection(m) => write!(f, "connection failed: {m}"),
            ClientError::Protocol(m) => write!(f, "protocol violation by the broker: {m}"),
            ClientError::Usage(m) => write!(f, "request not sent: {m}"),
            ClientError::Timeout(what) => write!(f, "timed out waiting for {what}"),
            ClientError::NotLeader {
                node_id,
                addr,
                generation,
            } => write!(
                f,
                "not the shard's leader: {node_id} at {} leads it (generation {generation})",
                addr.as_deref().unwrap_or("an unpublished address")
            ),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<DecodeError> for ClientError {
    fn from(e: DecodeError) -> Self {
        ClientError::Protocol(e.to_string())
    }
}
