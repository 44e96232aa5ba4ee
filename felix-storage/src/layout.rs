//! Where things live under the storage root: escaped directory names and file names.
//!
//! ```text
//! <root>/streams/<tenant>/<namespace>/<stream>/<shard>/<base:020>.seg
//! <root>/caches/<tenant>/<namespace>/<cache>/<shard>/<base:020>.seg
//! <root>/counters/<tenant>/<namespace>/<cache>/<shard>/<base:020>.seg
//! <root>/groups/<tenant>/<namespace>/<stream>/<shard>/<base:020>.seg
//! ```
//!
//! Names come from clients, so each becomes one safe path component: bytes in
//! `[A-Za-z0-9_-]` stay, every other byte is `%XX` (upper-case hex). No escaped name can be
//! `.`, `..`, contain `/`, or collide with another name. The empty name is `~` (a byte `~`
//! itself escapes to `%7E`). A component longer than [`MAX_COMPONENT_BYTES`] keeps a prefix
//! and ends in `~` plus a 64-bit FNV-1a of the whole name, to stay under filesystem limits.

use std::fmt::Write;

/// Longest escaped component kept verbatim; most filesystems allow 255 bytes.
pub const MAX_COMPONENT_BYTES: usize = 200;

/// Top-level directory of stream logs under the storage root.
pub const STREAMS_DIR: &str = "streams";
/// Top-level directory of cache logs.
pub const CACHES_DIR: &str = "caches";
/// Top-level directory of counter logs (one per cache that has counters).
pub const COUNTERS_DIR: &str = "counters";
/// Top-level directory of consumer-group logs (one per group per stream shard).
pub const GROUPS_DIR: &str = "groups";

const SEGMENT_SUFFIX: &str = ".seg";
const COMPACT_SUFFIX: &str = ".compact";

/// One client-chosen name as a path component.
pub fn escape(name: &str) -> String {
    if name.is_empty() {
        return "~".into();
    }
    let mut out = String::with_capacity(name.len());
    for &b in name.as_bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    if out.len() > MAX_COMPONENT_BYTES {
        // Cut on a whole escape so the prefix stays readable, then name the whole.
        let mut cut = MAX_COMPONENT_BYTES - 17;
        while out.as_bytes()[cut - 1] == b'%' || out.as_bytes()[cut - 2] == b'%' {
            cut -= 1;
        }
        out.truncate(cut);
        let _ = write!(out, "~{:016x}", fnv1a64(name.as_bytes()));
    }
    out
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The directory of one shard of a durable stream.
pub fn stream_shard_dir(tenant: &str, namespace: &str, stream: &str, shard: u32) -> String {
    format!(
        "streams/{}/{}/{}/{shard}",
        escape(tenant),
        escape(namespace),
        escape(stream)
    )
}

/// The directory of one shard of a cache.
pub fn cache_shard_dir(tenant: &str, namespace: &str, cache: &str, shard: u32) -> String {
    format!(
        "caches/{}/{}/{}/{shard}",
        escape(tenant),
        escape(namespace),
        escape(cache)
    )
}

/// The directory of the counters of one shard of a cache (a root of their own).
pub fn counter_shard_dir(tenant: &str, namespace: &str, cache: &str, shard: u32) -> String {
    format!(
        "counters/{}/{}/{}/{shard}",
        escape(tenant),
        escape(namespace),
        escape(cache)
    )
}

pub fn segment_name(base: u64) -> String {
    format!("{base:020}{SEGMENT_SUFFIX}")
}

/// Compaction writes its output here first; a leftover one is an unfinished pass.
pub fn compact_name(base: u64) -> String {
    format!("{base:020}{COMPACT_SUFFIX}")
}

/// What a file in a shard directory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileName {
    Segment(u64),
    CompactTemp(u64),
    Other,
}

pub fn parse_name(name: &str) -> FileName {
    let digits = |s: &str| s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit());
    if let Some(stem) = name.strip_suffix(SEGMENT_SUFFIX) {
        if digits(stem) {
            if let Ok(base) = stem.parse() {
                return FileName::Segment(base);
            }
        }
    }
    if let Some(stem) = name.strip_suffix(COMPACT_SUFFIX) {
        if digits(stem) {
            if let Ok(base) = stem.parse() {
                return FileName::CompactTemp(base);
            }
        }
    }
    FileName::Other
}

pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_escape_to_single_safe_components() {
        assert_eq!(escape("orders"), "orders");
        assert_eq!(escape("a/b"), "a%2Fb");
        assert_eq!(escape(".."), "%2E%2E");
        assert_eq!(escape(""), "~");
        assert_eq!(escape("~"), "%7E");
        assert_eq!(escape("é"), "%C3%A9");
        assert_ne!(escape("a.b"), escape("a%2Eb"));
        assert_eq!(
            stream_shard_dir("t1", "ns", "s/x", 3),
            "streams/t1/ns/s%2Fx/3"
        );
        assert_eq!(cache_shard_dir("t", "n", "c", 0), "caches/t/n/c/0");
    }

    #[test]
    fn long_names_are_bounded_and_still_distinct() {
        let a = "x".repeat(1000);
        let b = format!("{}y", "x".repeat(999));
        assert!(escape(&a).len() <= MAX_COMPONENT_BYTES);
        assert_ne!(escape(&a), escape(&b));
        let c = "/".repeat(300);
        let e = escape(&c);
        assert!(e.len() <= MAX_COMPONENT_BYTES);
        // The cut never leaves half an escape before the hash.
        assert_eq!(e.split('~').next().unwrap().len() % 3, 0, "{e}");
    }

    #[test]
    fn file_names_parse_back() {
        assert_eq!(parse_name(&segment_name(42)), FileName::Segment(42));
        assert_eq!(parse_name(&compact_name(7)), FileName::CompactTemp(7));
        assert_eq!(
            parse_name(&segment_name(u64::MAX)),
            FileName::Segment(u64::MAX)
        );
        assert_eq!(parse_name("42.seg"), FileName::Other);
        assert_eq!(parse_name("notes.txt"), FileName::Other);
        assert_eq!(join("a/b", "c"), "a/b/c");
    }
}
