//! The key → shard function. Every client and broker must compute the same shard for a key,
//! or one key ends up on two shards and loses its ordering; so this is pinned to the
//! reference's function and to its vector table (see the tests).

/// How a key's hash is mapped onto a stream's shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RoutingMapping {
    /// `hash % shards`. The default.
    #[default]
    Modulo,
    /// Lamping & Veach jump consistent hash: widening a stream moves only the keys that must move.
    JumpHash,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The 64-bit hash a key routes by: FNV-1a over the bytes, then the splitmix64 finalizer
/// (FNV-1a alone leaves the low bits, which `%` uses, poorly mixed).
pub fn key_hash(key: &[u8]) -> u64 {
    let mut h = FNV_OFFSET;
    for &byte in key {
        h ^= u64::from(byte);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    h
}

/// Jump consistent hash, in floating point exactly as the paper states it, so every
/// implementation rounds the same way.
fn jump_hash(mut key: u64, buckets: u32) -> u32 {
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

/// The shard a record with this routing key lands on. No key, or a stream of zero or one
/// shard, is shard 0. An empty key is a key: it hashes like any other.
pub fn shard_for_key(key: Option<&[u8]>, shards: u32, mapping: RoutingMapping) -> u32 {
    let Some(key) = key else { return 0 };
    if shards <= 1 {
        return 0;
    }
    let h = key_hash(key);
    match mapping {
        RoutingMapping::Modulo => (h % u64::from(shards)) as u32,
        RoutingMapping::JumpHash => jump_hash(h, shards),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Key, finalized hash, shards for 2, 3, 4, 8, 16 under modulo, then under jump hash.
    type VectorRow = (&'static [u8], u64, [u32; 5], [u32; 5]);

    /// Every row of the vector table in routing.md.
    const VECTORS: &[VectorRow] = &[
        (b"", 0xf52a15e9a9b5e89b, [1, 0, 3, 3, 11], [0, 0, 0, 5, 11]),
        (b"a", 0x02c0bdbf481420f8, [0, 1, 0, 0, 8], [1, 1, 1, 1, 9]),
        (
            b"user-42",
            0x7a1596f0e94b5793,
            [1, 1, 3, 3, 3],
            [1, 1, 3, 3, 9],
        ),
        (b"k1", 0x1f015d6af2b2eec6, [0, 1, 2, 6, 6], [1, 2, 2, 4, 4]),
        (
            b"orders/123",
            0x67c04f87b691dc8d,
            [1, 0, 1, 5, 13],
            [1, 2, 2, 2, 2],
        ),
    ];
    const WIDTHS: [u32; 5] = [2, 3, 4, 8, 16];

    #[test]
    fn every_vector_row_matches() {
        for &(key, hash, modulo, jump) in VECTORS {
            let name = String::from_utf8_lossy(key);
            assert_eq!(key_hash(key), hash, "hash of {name:?}");
            for (i, &n) in WIDTHS.iter().enumerate() {
                assert_eq!(
                    shard_for_key(Some(key), n, RoutingMapping::Modulo),
                    modulo[i],
                    "modulo {name:?} over {n}"
                );
                assert_eq!(
                    shard_for_key(Some(key), n, RoutingMapping::JumpHash),
                    jump[i],
                    "jump {name:?} over {n}"
                );
            }
        }
    }

    #[test]
    fn no_key_and_narrow_streams_are_shard_zero() {
        for mapping in [RoutingMapping::Modulo, RoutingMapping::JumpHash] {
            assert_eq!(shard_for_key(None, 16, mapping), 0);
            assert_eq!(shard_for_key(Some(b"user-42"), 1, mapping), 0);
            assert_eq!(shard_for_key(Some(b"user-42"), 0, mapping), 0);
        }
        // The empty key is not "no key": over 2 shards it lands on 1.
        assert_eq!(shard_for_key(Some(b""), 2, RoutingMapping::Modulo), 1);
    }

    #[test]
    fn jump_hash_moves_only_to_the_new_bucket_when_widening() {
        for i in 0u32..2000 {
            let key = i.to_be_bytes();
            let before = shard_for_key(Some(&key), 7, RoutingMapping::JumpHash);
            let after = shard_for_key(Some(&key), 8, RoutingMapping::JumpHash);
            assert!(
                after == before || after == 7,
                "key {i}: {before} -> {after}"
            );
            assert!(after < 8);
        }
    }
}
