//! Feature bits: which requests exist. A separate number space from frame flags.
//!
//! The set is 64 bits wide here. The low word travels as `client_features` / `server_features`
//! and the high word as `client_features_hi` / `server_features_hi`; bit 31 of the low word
//! (`EXTENDED`) is not a feature but the marker that the high word is present. [`Features`]
//! never stores that marker: it is added and read only at the wire boundary
//! ([`Features::to_words`], [`Features::from_words`]).

use std::fmt;

/// A set of feature bits, low word in bits 0..32, extended word in bits 32..64.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Features(pub u64);

/// One row of the feature table.
#[derive(Debug, Clone, Copy)]
pub struct FeatureSpec {
    /// The bit in the 64-bit set (extended features are `1 << 32` and up).
    pub bit: u64,
    /// Its name as the protocol documents it (without the `FEATURE_` prefix).
    pub name: &'static str,
}

macro_rules! feature_table {
    ($( $(#[$doc:meta])* $name:ident = $bit:expr; )*) => {
        impl Features {
            $( $(#[$doc])* pub const $name: Features = Features($bit); )*
            /// Every feature this crate knows.
            pub const KNOWN: Features = Features(0 $(| $bit)*);
        }
        /// The feature table.
        pub const FEATURE_TABLE: &[FeatureSpec] = &[ $( FeatureSpec { bit: $bit, name: stringify!($name) }, )* ];
    };
}

feature_table! {
    /// The broker answers `topology`.
    TOPOLOGY = 0x0001;
    /// The peer understands `not_leader`.
    REDIRECT = 0x0002;
    /// The broker accepts `cache_delete`.
    CACHE_DELETE = 0x0004;
    /// `group_poll`, `group_ack`, `group_nack`.
    CONSUMER_GROUP = 0x0008;
    /// `group_dead_letters`, `group_discard`, `group_redrive`.
    GROUP_DEAD_LETTERS = 0x0010;
    /// The broker answers `stream_shards`.
    STREAM_SHARDS = 0x0020;
    /// The broker accepts `cache_watch`.
    CACHE_WATCH = 0x0040;
    /// Retained delivery on a `cache_watch`.
    CACHE_WATCH_RETAINED = 0x0080;
    /// `counter_add`, `counter_get`.
    COUNTERS = 0x0100;
    /// `producer_init`, `publish_idempotent`.
    IDEMPOTENT_PRODUCER = 0x0200;
    /// The broker answers `cache_shards`.
    CACHE_SHARDS = 0x0400;
    /// The client reads `code`, `retry` and `detail` on errors.
    ERROR_CODES = 0x0800;
    /// The client reads `shard_moved`.
    SHARD_MOVED = 0x1000;
    /// Unknown requests are answered `unsupported` and the stream is kept.
    UNSUPPORTED = 0x2000;
    /// The client reads `publish_refused` with `sequence_reused`.
    SEQUENCE_REUSED = 0x4000;
    /// Acked publishes are pipelined under a `publish_window`.
    PUBLISH_PIPELINE = 0x8000;
    /// `commit` and `state_get`.
    ATOMIC_COMMIT = 0x1_0000;
    /// The publish window is per stream.
    STREAM_PUBLISH_WINDOW = 0x2_0000;
    /// The broker answers `shard_owners`.
    SHARD_OWNERS = 0x4_0000;
    /// Acked publishes are answered after the write, with offsets.
    ACK_ON_COMMIT = 0x8_0000;
    /// `group_poll` may name its consumer (and reclaim).
    GROUP_CONSUMER = 0x10_0000;
    /// The client reads `subscription_lagged`.
    SUBSCRIPTION_LAGGED = 0x20_0000;
    /// `skipped_before` on group records.
    GROUP_SKIPPED = 0x40_0000;
    /// `publisher` on group records.
    GROUP_PUBLISHER = 0x80_0000;
    /// `group_seek`, `group_describe`, `group_delete`.
    GROUP_ADMIN = 0x100_0000;
    /// `cache_put_if`, `cache_delete_if`; `version` on `cache_value`.
    CACHE_CONDITIONAL = 0x200_0000;
    /// `offset_for_time`; `timestamp_micros` on group records.
    RECORD_TIMESTAMPS = 0x400_0000;
    /// `group_extend`, `group_dead_letter`, nack delay and attempts, poll visibility.
    GROUP_CLAIM_CONTROL = 0x800_0000;
    /// `publish_if`, and `expected_offset` on `commit`.
    PUBLISH_CONDITIONAL = 0x1000_0000;
    /// `stream_read`.
    STREAM_READ = 0x2000_0000;
    /// `queue_capacity` on `subscribe`.
    SUBSCRIBE_QUEUE = 0x4000_0000;
    /// Extended word bit 0: `shard_inspect`, `subscriptions_list`.
    INSPECT = 1 << 32;
    /// Extended word bit 1: the client reads `stream_deleted`.
    STREAM_DELETED = 1 << 33;
    /// Extended word bit 2: `publish_width` and `stale_width`.
    PUBLISH_WIDTH = 1 << 34;
    /// Extended word bit 3: an explicit `shard` on publish requests.
    EXPLICIT_SHARD = 1 << 35;
}

/// Bit 31 of the low word: "a second word follows". Never a member of a [`Features`] set.
pub const FEATURE_EXTENDED_MARKER: u32 = 0x8000_0000;

impl Features {
    /// No features.
    pub const NONE: Features = Features(0);

    /// True when every bit of `other` is set.
    pub const fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }
    /// The bits set in both.
    pub const fn intersection(self, other: Features) -> Features {
        Features(self.0 & other.0)
    }
    /// The bits set in either.
    pub const fn union(self, other: Features) -> Features {
        Features(self.0 | other.0)
    }
    /// This set without the bits of `other`.
    pub const fn without(self, other: Features) -> Features {
        Features(self.0 & !other.0)
    }
    /// The extended word (bits 32..64).
    pub const fn hi(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// Reads a peer's advertisement. The `_hi` word counts only when the low word carries the
    /// extended marker; the marker itself is not kept. Words wider than 32 bits are cut to
    /// their low 32 bits, as a peer that decodes them as `u32` would have to refuse them.
    pub fn from_words(lo: Option<u64>, hi: Option<u64>) -> Features {
        let lo = lo.unwrap_or(0) as u32;
        let hi = if lo & FEATURE_EXTENDED_MARKER != 0 {
            hi.unwrap_or(0) as u32
        } else {
            0
        };
        Features(u64::from(lo & !FEATURE_EXTENDED_MARKER) | (u64::from(hi) << 32))
    }

    /// Writes this set as wire words: the low word (with the marker when a high word is
    /// sent) and the high word, present only when non-zero.
    pub fn to_words(self) -> (u32, Option<u32>) {
        let lo = self.0 as u32 & !FEATURE_EXTENDED_MARKER;
        match self.hi() {
            0 => (lo, None),
            hi => (lo | FEATURE_EXTENDED_MARKER, Some(hi)),
        }
    }

    /// True when the peer that sent this set also sent the extended marker, i.e. reads a
    /// `_hi` word. Kept separately by negotiation; see [`crate::negotiate`].
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for Features {
    type Output = Features;
    fn bitor(self, rhs: Features) -> Features {
        self.union(rhs)
    }
}
impl std::ops::BitAnd for Features {
    type Output = Features;
    fn bitand(self, rhs: Features) -> Features {
        self.intersection(rhs)
    }
}

impl fmt::Debug for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Features({:#x}", self.0)?;
        let mut sep = ": ";
        for spec in FEATURE_TABLE {
            if self.0 & spec.bit != 0 {
                write!(f, "{sep}{}", spec.name)?;
                sep = " | ";
            }
        }
        let unknown = self.0 & !Features::KNOWN.0;
        if unknown != 0 {
            write!(f, "{sep}UNKNOWN({unknown:#x})")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_real_client_offer_decodes() {
        // felix-client 0.6.2: client_features 0xFB77FFFF, client_features_hi 0xF.
        let f = Features::from_words(Some(4_218_945_535), Some(15));
        assert!(f.contains(Features::CACHE_WATCH | Features::SUBSCRIBE_QUEUE));
        assert!(!f.contains(Features::ACK_ON_COMMIT));
        assert!(!f.contains(Features::RECORD_TIMESTAMPS));
        assert!(f.contains(Features::EXPLICIT_SHARD | Features::INSPECT));
        assert_eq!(
            f.0 & u64::from(FEATURE_EXTENDED_MARKER),
            0,
            "marker is not a feature"
        );
        assert_eq!(f.to_words(), (4_218_945_535, Some(15)));
    }

    #[test]
    fn hi_word_without_marker_is_ignored() {
        assert_eq!(Features::from_words(Some(1), Some(1)), Features::TOPOLOGY);
        assert_eq!(Features::TOPOLOGY.to_words(), (1, None));
        assert_eq!(
            Features::INSPECT.to_words(),
            (FEATURE_EXTENDED_MARKER, Some(1))
        );
    }

    #[test]
    fn table_bits_are_distinct() {
        let mut seen = 0u64;
        for spec in FEATURE_TABLE {
            assert_eq!(spec.bit.count_ones(), 1, "{}", spec.name);
            assert_eq!(seen & spec.bit, 0, "{}", spec.name);
            seen |= spec.bit;
        }
        assert_eq!(seen & u64::from(FEATURE_EXTENDED_MARKER), 0);
    }
}
