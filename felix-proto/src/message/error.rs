//! Refusals and the escape hatches: `error`, `not_leader`, `unsupported`, `extension`.

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, RetryClass};

/// Why a request failed, in machine-readable form. Every field is optional.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ErrorDetail {
    /// E.g. `moving` for `shard_unavailable`, `publish_queue_full` for `overloaded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A suggested wait before retrying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

/// `error`. `code`, `retry` and `detail` go only to a client that offered
/// `FEATURE_ERROR_CODES`; without them the frame is the pre-codes one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ErrorMessage {
    /// Prose for people.
    pub message: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::message::fields::opt_code"
    )]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_opt_code))]
    pub code: Option<ErrorCode>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::message::fields::opt_retry"
    )]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_opt_retry))]
    pub retry: Option<RetryClass>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<ErrorDetail>,
}

impl ErrorMessage {
    /// An uncoded error, as a client without `FEATURE_ERROR_CODES` gets it.
    pub fn plain(message: impl Into<String>) -> ErrorMessage {
        ErrorMessage {
            message: message.into(),
            code: None,
            retry: None,
            detail: None,
        }
    }

    /// A coded error with the code's default retry class.
    pub fn coded(code: ErrorCode, message: impl Into<String>) -> ErrorMessage {
        let retry = code.default_retry();
        ErrorMessage {
            message: message.into(),
            code: Some(code),
            retry: Some(retry),
            detail: None,
        }
    }
}

/// `not_leader`: another broker owns the shard. Sent only to a client that offered
/// `FEATURE_REDIRECT`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct NotLeader {
    pub node_id: String,
    /// The owner's client-facing listener; absent when the cluster was not told one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// The assignment epoch the answer describes.
    pub generation: u64,
}

/// `unsupported`: the answer to a request whose `type` the broker does not know (or an
/// `extension` it does not implement), to a client that offered `FEATURE_UNSUPPORTED`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Unsupported {
    /// The refused request's `type`.
    pub request_type: String,
    /// The extension name, when the refused request was an `extension`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<u64>,
}

/// `extension`: a request named by string rather than by a message type of its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Extension {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<u64>,
    /// Whatever the extension defines; `null` (or absent) when there is none.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_json))]
    pub body: serde_json::Value,
}
