//! The cache: plain and conditional reads and writes, watches, and counters.

use std::fmt;

use bytes::Bytes;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

/// `cache_put`. `ttl_ms` is always on the wire, `null` for no expiry, as the real client
/// sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CachePut {
    pub tenant_id: String,
    pub namespace: String,
    pub cache: String,
    pub key: String,
    #[serde(with = "crate::message::fields::b64")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_bytes))]
    pub value: Bytes,
    /// With one, answered `cache_ok`; without, plain `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<u64>,
    #[serde(default)]
    pub ttl_ms: Option<u64>,
}

/// `cache_get`, answered with `cache_value`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CacheGet {
    pub tenant_id: String,
    pub namespace: String,
    pub cache: String,
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<u64>,
}

/// `cache_delete`, answered with `cache_value` holding what was removed
/// (`FEATURE_CACHE_DELETE`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CacheDelete {
    pub tenant_id: String,
    pub namespace: String,
    pub cache: String,
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<u64>,
}

/// `cache_value`. `value` is always on the wire, `null` on a miss.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CacheValue {
    pub tenant_id: String,
    pub namespace: String,
    pub cache: String,
    pub key: String,
    #[serde(default, with = "crate::message::fields::opt_b64")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_opt_bytes))]
    pub value: Option<Bytes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<u64>,
    /// Only on a get's hit, to a client that offered `FEATURE_CACHE_CONDITIONAL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
}

/// `cache_ok`: a cache write (or a group settle) that carried a `request_id` succeeded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CacheOk {
    pub request_id: u64,
}

/// The condition of a `cache_put_if`: `"absent"` or `{"version": n}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum CacheCondition {
    /// The key has no live entry.
    Absent,
    /// The key's live entry has this version.
    Version(u64),
}

impl Serialize for CacheCondition {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            CacheCondition::Absent => s.serialize_str("absent"),
            CacheCondition::Version(v) => {
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry("version", v)?;
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for CacheCondition {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ConditionVisitor;
        impl<'de> Visitor<'de> for ConditionVisitor {
            type Value = CacheCondition;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#""absent" or {"version": <u64>}"#)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<CacheCondition, E> {
                match s {
                    "absent" => Ok(CacheCondition::Absent),
                    other => Err(E::unknown_variant(other, &["absent", "version"])),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CacheCondition, A::Error> {
                let mut version = None;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key == "version" {
                        version = Some(map.next_value::<u64>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                version
                    .map(CacheCondition::Version)
                    .ok_or_else(|| de::Error::missing_field("version"))
            }
        }
        d.deserialize_any(ConditionVisitor)
    }
}

/// `cache_put_if`: stores the value only if the key meets `condition`
/// (`FEATURE_CACHE_CONDITIONAL`). Answered with `cache_condition_result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CachePutIf {
    pub tenant_id: String,
    pub namespace: String,
    pub cache: String,
    pub key: String,
    #[serde(with = "crate::message::fields::b64")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_bytes))]
    pub value: Bytes,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    pub condition: CacheCondition,
    pub request_id: u64,
}

/// `cache_delete_if`: removes the key only if its live entry has `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CacheDeleteIf {
    pub tenant_id: String,
    pub namespace: String,
    pub cache: String,
    pub key: String,
    pub version: u64,
    pub request_id: u64,
}

/// `cache_condition_result`: whether a conditional write was made. A refusal is an answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CacheConditionResult {
    pub applied: bool,
    /// The version written, or the key's current one; absent with no live entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    pub request_id: u64,
}

/// `cache_watch`: subscribe to changes of one key or one prefix (exactly one of the two;
/// the broker refuses both or neither). It carries no `request_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CacheWatch {
    pub tenant_id: String,
    pub namespace: String,
    pub cache: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Read by a prefix watch; a key watch routes itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u64>,
    /// The first change the client has not seen; absent means live changes only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_offset: Option<u64>,
    /// Current state first (`FEATURE_CACHE_WATCH_RETAINED`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retained: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscription_id: Option<u64>,
}

/// `cache_watch_started`: confirms a watch; the id opens its event stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CacheWatchStarted {
    pub subscription_id: u64,
    /// Where live delivery begins.
    pub resume_offset: u64,
    /// True when compaction collapsed the requested history (absent means false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resnapshot: Option<bool>,
    /// How many retained values precede live delivery; present exactly for a retained watch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retained_count: Option<u64>,
}

/// `cache_event`: one change on a watch's event stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CacheEvent {
    pub key: String,
    /// Absent means the key was deleted.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::message::fields::opt_b64"
    )]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_opt_bytes))]
    pub value: Option<Bytes>,
    /// The change's cache-log offset, the resume anchor.
    pub offset: u64,
    /// Absolute Unix milliseconds; `0` or absent means never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_millis: Option<u64>,
}

/// `cache_watch_lagged`: the watch fell behind; re-watch from `resume_from`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CacheWatchLagged {
    pub resume_from: u64,
}

/// `counter_add`: folds a signed delta into a counter (`FEATURE_COUNTERS`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CounterAdd {
    pub tenant_id: String,
    pub namespace: String,
    pub cache: String,
    pub key: String,
    pub delta: i64,
    pub request_id: u64,
}

/// `counter_get`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CounterGet {
    pub tenant_id: String,
    pub namespace: String,
    pub cache: String,
    pub key: String,
    pub request_id: u64,
}

/// `counter_value`: the sum (including an add's own delta). Absent means never written,
/// which is not a sum of zero.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CounterValue {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<i64>,
    pub request_id: u64,
}
