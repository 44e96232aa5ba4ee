//! Frame flag bits: the word in every frame header that selects the payload layout.
//!
//! Every bit is declared once, in [`FLAG_TABLE`], with the bits it modifies. The table drives
//! validation, naming and [`Flags::KNOWN`]; nothing else in the crate lists bits by hand.
//!
//! A receiver refuses an unknown bit instead of masking it off: a flag changes how the body is
//! parsed, so ignoring one means misreading the payload (the acked prefix `0x0008` read as a
//! tenant length is the classic case).

use std::fmt;

/// A frame's flag word. Construct it freely; check it with [`Flags::validate_frame`] before
/// trusting it to pick a layout.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Flags(pub u16);

/// One row of the flag table.
#[derive(Debug, Clone, Copy)]
pub struct FlagSpec {
    /// The bit's mask.
    pub bit: u16,
    /// Its name as the protocol documents it.
    pub name: &'static str,
    /// The bits this one modifies: a frame carrying it must carry at least one of them.
    /// Zero for a base bit, which selects a layout on its own.
    pub requires_any: u16,
}

macro_rules! flag_table {
    ($( $(#[$doc:meta])* $name:ident = $bit:literal requires [$($req:ident)|*]; )*) => {
        impl Flags {
            $( $(#[$doc])* pub const $name: Flags = Flags($bit); )*
            /// Every bit this crate knows.
            pub const KNOWN: Flags = Flags(0 $(| $bit)*);
        }
        /// The flag table: every known bit, its name, and the bits it depends on.
        pub const FLAG_TABLE: &[FlagSpec] = &[
            $( FlagSpec { bit: $bit, name: stringify!($name), requires_any: 0 $(| Flags::$req.0)* }, )*
        ];
    };
}

flag_table! {
    /// The payload is a binary publish batch.
    BINARY_PUBLISH_BATCH = 0x0001 requires [];
    /// The payload is a legacy per-subscriber binary event batch.
    BINARY_EVENT_BATCH = 0x0002 requires [];
    /// The payload is a shared binary event batch (no subscription id).
    BINARY_EVENT_BATCH_SHARED = 0x0004 requires [];
    /// The publish batch carries a request id and ack mode and is owed an ack.
    BINARY_PUBLISH_ACKED = 0x0008 requires [BINARY_PUBLISH_BATCH];
    /// The payload is a binary publish acknowledgement.
    BINARY_PUBLISH_ACK = 0x0010 requires [];
    /// The event batch carries a base offset.
    EVENT_BATCH_OFFSETS = 0x0020 requires [BINARY_EVENT_BATCH | BINARY_EVENT_BATCH_SHARED];
    /// The publish batch carries a routing key prefix.
    BINARY_PUBLISH_KEYED = 0x0040 requires [BINARY_PUBLISH_BATCH];
    /// The ack names the shard's owner (the batch was forwarded).
    BINARY_PUBLISH_ACK_OWNER = 0x0080 requires [BINARY_PUBLISH_ACK];
    /// The acked batch carries an idempotent producer id and sequence.
    BINARY_PUBLISH_IDEMPOTENT = 0x0100 requires [BINARY_PUBLISH_ACKED];
    /// A failed ack carries an error code and retry class.
    BINARY_PUBLISH_ACK_CODE = 0x0200 requires [BINARY_PUBLISH_ACK];
    /// The error code is followed by its detail (reason, suggested wait).
    BINARY_PUBLISH_ACK_DETAIL = 0x0400 requires [BINARY_PUBLISH_ACK_CODE];
    /// The event batch carries `skipped_before` after its base offset.
    EVENT_BATCH_SKIPPED = 0x0800 requires [EVENT_BATCH_OFFSETS];
    /// A successful ack ends with the offset of the batch's first record.
    BINARY_PUBLISH_ACK_OFFSET = 0x1000 requires [BINARY_PUBLISH_ACK];
    /// The event batch names the principal that published it.
    EVENT_BATCH_PUBLISHER = 0x2000 requires [BINARY_EVENT_BATCH | BINARY_EVENT_BATCH_SHARED];
    /// Each event is preceded by its record's append time.
    EVENT_BATCH_TIMESTAMPS = 0x4000 requires [BINARY_EVENT_BATCH | BINARY_EVENT_BATCH_SHARED];
}

impl Flags {
    /// No flags: the payload is a JSON message.
    pub const NONE: Flags = Flags(0);
    /// What an absent advertisement means. Frozen: nothing is ever added to it.
    pub const ORIGINAL_V1: Flags = Flags(0x0001 | 0x0002 | 0x0004);
    /// The bits that select a layout on their own; a frame carries at most one.
    pub const BASES: Flags = Flags(0x0001 | 0x0002 | 0x0004 | 0x0010);

    /// The raw word.
    pub const fn bits(self) -> u16 {
        self.0
    }
    /// True when every bit of `other` is set here.
    pub const fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
    /// True when any bit of `other` is set here.
    pub const fn intersects(self, other: Flags) -> bool {
        self.0 & other.0 != 0
    }
    /// The bits set in both.
    pub const fn intersection(self, other: Flags) -> Flags {
        Flags(self.0 & other.0)
    }
    /// The bits set in either.
    pub const fn union(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }
    /// This word without the bits of `other`.
    pub const fn without(self, other: Flags) -> Flags {
        Flags(self.0 & !other.0)
    }
    /// True for a JSON frame.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Checks a frame's flags: no unknown bit, every modifier with one of its bases, and at
    /// most one base (a payload has one layout).
    pub fn validate_frame(self) -> Result<Flags, FlagError> {
        let unknown = self.0 & !Flags::KNOWN.0;
        if unknown != 0 {
            return Err(FlagError::Unknown { bits: unknown });
        }
        for spec in FLAG_TABLE {
            if self.0 & spec.bit != 0 && spec.requires_any != 0 && self.0 & spec.requires_any == 0 {
                return Err(FlagError::MissingBase {
                    modifier: spec.bit,
                    requires_any: spec.requires_any,
                });
            }
        }
        let bases = self.0 & Flags::BASES.0;
        if bases.count_ones() > 1 {
            return Err(FlagError::ConflictingLayouts { bits: bases });
        }
        Ok(self)
    }

    /// Drops every bit whose base is missing, repeatedly, so the result is a consistent set.
    /// Used on advertisements (offers are sets of capabilities, not layouts).
    pub fn closed(self) -> Flags {
        let mut bits = self.0 & Flags::KNOWN.0;
        loop {
            let before = bits;
            for spec in FLAG_TABLE {
                if bits & spec.bit != 0 && spec.requires_any != 0 && bits & spec.requires_any == 0 {
                    bits &= !spec.bit;
                }
            }
            if bits == before {
                return Flags(bits);
            }
        }
    }
}

impl std::ops::BitOr for Flags {
    type Output = Flags;
    fn bitor(self, rhs: Flags) -> Flags {
        self.union(rhs)
    }
}
impl std::ops::BitOrAssign for Flags {
    fn bitor_assign(&mut self, rhs: Flags) {
        self.0 |= rhs.0;
    }
}
impl std::ops::BitAnd for Flags {
    type Output = Flags;
    fn bitand(self, rhs: Flags) -> Flags {
        self.intersection(rhs)
    }
}

impl fmt::Debug for Flags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Flags({:#06x}", self.0)?;
        let mut sep = ": ";
        for spec in FLAG_TABLE {
            if self.0 & spec.bit != 0 {
                write!(f, "{sep}{}", spec.name)?;
                sep = " | ";
            }
        }
        let unknown = self.0 & !Flags::KNOWN.0;
        if unknown != 0 {
            write!(f, "{sep}UNKNOWN({unknown:#06x})")?;
        }
        f.write_str(")")
    }
}

/// Why a frame's flag word was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagError {
    /// Bits this crate does not know (bit 15 included).
    Unknown { bits: u16 },
    /// A modifier arrived without any of the bits it modifies.
    MissingBase { modifier: u16, requires_any: u16 },
    /// More than one layout-selecting bit.
    ConflictingLayouts { bits: u16 },
}

impl fmt::Display for FlagError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlagError::Unknown { bits } => write!(f, "unknown frame flag bits {bits:#06x}"),
            FlagError::MissingBase {
                modifier,
                requires_any,
            } => write!(
                f,
                "frame flag {modifier:#06x} requires one of {requires_any:#06x}"
            ),
            FlagError::ConflictingLayouts { bits } => {
                write!(f, "frame flags {bits:#06x} select more than one layout")
            }
        }
    }
}

impl std::error::Error for FlagError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_fifteen_distinct_bits_and_bit15_is_unknown() {
        assert_eq!(FLAG_TABLE.len(), 15);
        assert_eq!(Flags::KNOWN.0, 0x7fff);
        assert_eq!(
            Flags(0x8000).validate_frame(),
            Err(FlagError::Unknown { bits: 0x8000 })
        );
    }

    #[test]
    fn the_client_frames_validate() {
        for bits in [
            0x0000, 0x0001, 0x0009, 0x0041, 0x0049, 0x0149, 0x0010, 0x1010, 0x0210, 0x0610,
        ] {
            assert!(Flags(bits).validate_frame().is_ok(), "{bits:#x}");
        }
        for bits in [0x0002, 0x0022, 0x0024, 0x0824, 0x6024, 0x2004] {
            assert!(Flags(bits).validate_frame().is_ok(), "{bits:#x}");
        }
    }

    #[test]
    fn modifiers_without_their_base_are_refused() {
        for (bits, modifier) in [
            (0x0008, 0x0008),
            (0x0040, 0x0040),
            (0x0800 | 0x0004, 0x0800),
            (0x0400 | 0x0010, 0x0400),
            (0x0100 | 0x0001, 0x0100),
            (0x0020 | 0x0001, 0x0020),
            (0x1000, 0x1000),
        ] {
            match Flags(bits).validate_frame() {
                Err(FlagError::MissingBase { modifier: m, .. }) => assert_eq!(m, modifier),
                other => panic!("{bits:#x}: {other:?}"),
            }
        }
    }

    #[test]
    fn two_layouts_are_refused() {
        assert_eq!(
            Flags(0x0011).validate_frame(),
            Err(FlagError::ConflictingLayouts { bits: 0x0011 })
        );
        assert!(Flags(0x0006).validate_frame().is_err());
    }

    #[test]
    fn closed_drops_orphans_transitively() {
        // 0x0400 needs 0x0200 which needs 0x0010: without 0x0010 all three go.
        assert_eq!(Flags(0x0600).closed(), Flags(0));
        assert_eq!(Flags(0x1fff).closed(), Flags(0x1fff));
        assert_eq!(Flags(0x8001).closed(), Flags(0x0001));
    }

    #[test]
    fn debug_names_bits() {
        let s = format!("{:?}", Flags(0x0009));
        assert!(s.contains("BINARY_PUBLISH_BATCH") && s.contains("BINARY_PUBLISH_ACKED"));
    }
}
