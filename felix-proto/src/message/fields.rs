//! Field codecs shared by the message families: base64 byte fields, error codes and retry
//! classes as their wire strings, routing names, and the `arbitrary` generators for the
//! types that have no `Arbitrary` of their own.

use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::Bytes;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, RetryClass};
use crate::routing::RoutingMapping;

/// Every base64 failure raised inside serde starts with this, so [`super::Message::decode`]
/// can tell it apart from other shape errors and report [`crate::DecodeError::InvalidBase64`].
pub(crate) const BASE64_ERROR_PREFIX: &str = "invalid base64: ";

struct Base64Visitor;

impl<'de> Visitor<'de> for Base64Visitor {
    type Value = Bytes;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a standard padded base64 string")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Bytes, E> {
        STANDARD
            .decode(s)
            .map(Bytes::from)
            .map_err(|e| E::custom(format_args!("{BASE64_ERROR_PREFIX}{e}")))
    }
}

/// Values up to this many bytes are encoded on the stack (a 768-byte value is 1024 base64).
const STACK_BASE64_INPUT: usize = 768;

fn serialize_base64<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    // Encoded whole, then written as one string: `collect_str` over a `Base64Display` went
    // through `fmt::Write` a few bytes at a time and cost more than the rest of a cache
    // answer's encoding (docs/performance.md, profile). Small values need no allocation.
    if bytes.len() <= STACK_BASE64_INPUT {
        let mut buf = [0u8; STACK_BASE64_INPUT / 3 * 4];
        let n = STANDARD
            .encode_slice(bytes, &mut buf)
            .expect("the buffer holds the encoding");
        let text = std::str::from_utf8(&buf[..n]).expect("base64 is ASCII");
        return s.serialize_str(text);
    }
    s.serialize_str(&STANDARD.encode(bytes))
}

/// A required byte field.
pub(crate) mod b64 {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(bytes: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        serialize_base64(bytes, s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        d.deserialize_str(Base64Visitor)
    }
}

/// An optional byte field; `null` and absent both read as `None`.
pub(crate) mod opt_b64 {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(bytes: &Option<Bytes>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(b) => serialize_base64(b, s),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Bytes>, D::Error> {
        struct OptVisitor;
        impl<'de> Visitor<'de> for OptVisitor {
            type Value = Option<Bytes>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a base64 string or null")
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_str(Base64Visitor).map(Some)
            }
        }
        d.deserialize_option(OptVisitor)
    }
}

/// A list of byte fields.
pub(crate) mod vec_b64 {
    use super::*;

    struct Item<'a>(&'a [u8]);
    impl Serialize for Item<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            serialize_base64(self.0, s)
        }
    }

    struct OwnedItem(Bytes);
    impl<'de> Deserialize<'de> for OwnedItem {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_str(Base64Visitor).map(OwnedItem)
        }
    }

    pub(crate) fn serialize<S: Serializer>(items: &[Bytes], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(items.iter().map(|b| Item(b)))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Bytes>, D::Error> {
        struct SeqVisitor;
        impl<'de> Visitor<'de> for SeqVisitor {
            type Value = Vec<Bytes>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of base64 strings")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                // Cap the hint: it comes from the peer.
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(OwnedItem(b)) = seq.next_element()? {
                    out.push(b);
                }
                Ok(out)
            }
        }
        d.deserialize_seq(SeqVisitor)
    }
}

struct NameVisitor<T>(fn(&str) -> T, &'static str);

impl<'de, T> Visitor<'de> for NameVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.1)
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<T, E> {
        Ok((self.0)(s))
    }
}

/// An optional error code; an unknown string is carried as [`ErrorCode::Other`].
pub(crate) mod opt_code {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        code: &Option<ErrorCode>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match code {
            Some(c) => s.serialize_str(c.as_str()),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<ErrorCode>, D::Error> {
        Option::<Code>::deserialize(d).map(|c| c.map(|Code(c)| c))
    }

    struct Code(ErrorCode);
    impl<'de> Deserialize<'de> for Code {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_str(NameVisitor(ErrorCode::from_name, "an error code string"))
                .map(Code)
        }
    }
}

/// An optional retry class; an unknown string reads as [`RetryClass::Fatal`].
pub(crate) mod opt_retry {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        retry: &Option<RetryClass>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match retry {
            Some(r) => s.serialize_str(r.as_str()),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<RetryClass>, D::Error> {
        Option::<Retry>::deserialize(d).map(|r| r.map(|Retry(r)| r))
    }

    struct Retry(RetryClass);
    impl<'de> Deserialize<'de> for Retry {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_str(NameVisitor(RetryClass::from_name, "a retry class string"))
                .map(Retry)
        }
    }
}

/// An optional routing name: `"modulo"` or `"jump_hash"`.
pub(crate) mod opt_routing {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        routing: &Option<RoutingMapping>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match routing {
            Some(RoutingMapping::Modulo) => s.serialize_str("modulo"),
            Some(RoutingMapping::JumpHash) => s.serialize_str("jump_hash"),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<RoutingMapping>, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "snake_case")]
        enum Name {
            Modulo,
            JumpHash,
        }
        Ok(Option::<Name>::deserialize(d)?.map(|n| match n {
            Name::Modulo => RoutingMapping::Modulo,
            Name::JumpHash => RoutingMapping::JumpHash,
        }))
    }
}

/// Reads any JSON value, keeping it only when it is a `u64`. Used for the `request_id` of a
/// message whose type is unknown: whatever that peer put there must not fail the decode.
pub(crate) mod lenient_u64 {
    use super::*;

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        Ok(serde_json::Value::deserialize(d)?.as_u64())
    }
}

#[cfg(feature = "arbitrary")]
pub(crate) use arb::*;

#[cfg(feature = "arbitrary")]
mod arb {
    use arbitrary::{Arbitrary, Result, Unstructured};
    use bytes::Bytes;
    use serde_json::{Map, Value};

    use crate::error::{ErrorCode, RetryClass};
    use crate::routing::RoutingMapping;

    pub(crate) fn arb_bytes(u: &mut Unstructured<'_>) -> Result<Bytes> {
        Ok(Bytes::from(Vec::<u8>::arbitrary(u)?))
    }

    pub(crate) fn arb_opt_bytes(u: &mut Unstructured<'_>) -> Result<Option<Bytes>> {
        Ok(if bool::arbitrary(u)? {
            Some(arb_bytes(u)?)
        } else {
            None
        })
    }

    pub(crate) fn arb_vec_bytes(u: &mut Unstructured<'_>) -> Result<Vec<Bytes>> {
        u.arbitrary_iter::<Vec<u8>>()?
            .map(|v| v.map(Bytes::from))
            .collect()
    }

    /// A known code, or an unknown one that is not the name of a known code (which would
    /// read back as the known variant).
    pub(crate) fn arb_opt_code(u: &mut Unstructured<'_>) -> Result<Option<ErrorCode>> {
        if !bool::arbitrary(u)? {
            return Ok(None);
        }
        if bool::arbitrary(u)? {
            return Ok(Some(u.choose(ErrorCode::KNOWN)?.clone()));
        }
        let name = String::arbitrary(u)?;
        Ok(Some(match ErrorCode::from_name(&name) {
            ErrorCode::Other(_) => ErrorCode::Other(name.into()),
            _ => ErrorCode::Other(format!("x-{name}").into()),
        }))
    }

    pub(crate) fn arb_opt_retry(u: &mut Unstructured<'_>) -> Result<Option<RetryClass>> {
        Ok(if bool::arbitrary(u)? {
            Some(*u.choose(&RetryClass::ALL)?)
        } else {
            None
        })
    }

    pub(crate) fn arb_opt_routing(u: &mut Unstructured<'_>) -> Result<Option<RoutingMapping>> {
        Ok(match u.int_in_range(0..=2u8)? {
            0 => None,
            1 => Some(RoutingMapping::Modulo),
            _ => Some(RoutingMapping::JumpHash),
        })
    }

    /// A small JSON value: scalars, and objects or arrays two levels deep. No floats, which
    /// need not print back identically.
    pub(crate) fn arb_json(u: &mut Unstructured<'_>) -> Result<Value> {
        arb_json_depth(u, 2)
    }

    /// Never `Some(null)`: that is written as `null` and reads back as `None`.
    pub(crate) fn arb_opt_json(u: &mut Unstructured<'_>) -> Result<Option<Value>> {
        if !bool::arbitrary(u)? {
            return Ok(None);
        }
        Ok(match arb_json(u)? {
            Value::Null => None,
            v => Some(v),
        })
    }

    fn arb_json_depth(u: &mut Unstructured<'_>, depth: u8) -> Result<Value> {
        let top = if depth == 0 { 4 } else { 6 };
        Ok(match u.int_in_range(0..=top)? {
            0 => Value::Null,
            1 => Value::Bool(bool::arbitrary(u)?),
            2 => Value::from(u64::arbitrary(u)?),
            3 => Value::from(i64::arbitrary(u)?),
            4 => Value::String(String::arbitrary(u)?),
            5 => {
                let n = u.int_in_range(0..=3)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(arb_json_depth(u, depth - 1)?);
                }
                Value::Array(items)
            }
            _ => {
                let n = u.int_in_range(0..=3)?;
                let mut map = Map::new();
                for _ in 0..n {
                    map.insert(String::arbitrary(u)?, arb_json_depth(u, depth - 1)?);
                }
                Value::Object(map)
            }
        })
    }
}
