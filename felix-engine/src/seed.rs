//! Every random choice the endpoint makes, derived from the configured seed.
//!
//! quinn-proto takes an RNG seed for its endpoint, but draws connection ids, the stateless
//! reset key and the token key from the OS unless told otherwise. Each gets its own key here,
//! derived with HMAC-SHA256 from the seed and a label, so a seed reproduces a run and one
//! derived value reveals nothing about another.

use std::sync::Arc;

use quinn_proto::{ConnectionId, ConnectionIdGenerator};
use ring::{hkdf, hmac};

/// `HMAC-SHA256(seed, label)`.
pub(crate) fn derive(seed: &[u8; 32], label: &[u8]) -> [u8; 32] {
    let key = hmac::Key::new(hmac::HMAC_SHA256, seed);
    let tag = hmac::sign(&key, label);
    let mut out = [0u8; 32];
    out.copy_from_slice(tag.as_ref());
    out
}

/// The key that signs stateless reset tokens.
pub(crate) fn reset_key(seed: &[u8; 32]) -> Arc<hmac::Key> {
    Arc::new(hmac::Key::new(
        hmac::HMAC_SHA256,
        &derive(seed, b"felix quic reset key"),
    ))
}

/// The key that protects address-validation tokens.
pub(crate) fn token_key(seed: &[u8; 32]) -> Arc<hkdf::Prk> {
    let ikm = derive(seed, b"felix quic token key");
    Arc::new(hkdf::Salt::new(hkdf::HKDF_SHA256, &[]).extract(&ikm))
}

/// The seed quinn-proto's endpoint RNG starts from.
pub(crate) fn endpoint_rng_seed(seed: &[u8; 32]) -> [u8; 32] {
    derive(seed, b"felix quic endpoint rng")
}

/// Length of the connection ids we issue (quinn's default).
pub(crate) const CID_LEN: usize = 8;

/// Connection ids from a keyed counter: `HMAC(key, n)` truncated. Unpredictable without the
/// seed, reproducible with it.
pub(crate) struct SeededCidGenerator {
    key: hmac::Key,
    counter: u64,
}

impl SeededCidGenerator {
    pub(crate) fn new(seed: &[u8; 32]) -> SeededCidGenerator {
        SeededCidGenerator {
            key: hmac::Key::new(hmac::HMAC_SHA256, &derive(seed, b"felix quic cid")),
            counter: 0,
        }
    }
}

impl ConnectionIdGenerator for SeededCidGenerator {
    fn generate_cid(&mut self) -> ConnectionId {
        self.counter += 1;
        let tag = hmac::sign(&self.key, &self.counter.to_be_bytes());
        ConnectionId::new(&tag.as_ref()[..CID_LEN])
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

/// The destination ids a dialing endpoint (the peer links) puts on its first packets:
/// quinn-proto draws them from the OS unless given these (RFC 9000 asks for at least 8
/// unpredictable bytes).
pub(crate) fn initial_dst_cids(seed: &[u8; 32]) -> Arc<dyn Fn() -> ConnectionId + Send + Sync> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, &derive(seed, b"felix quic initial dcid"));
    // An atomic, not a lock: quinn-proto asks for a `Fn` shared across connects.
    let counter = std::sync::atomic::AtomicU64::new(0);
    Arc::new(move || {
        let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let tag = hmac::sign(&key, &n.to_be_bytes());
        ConnectionId::new(&tag.as_ref()[..16])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_ids_other_seed_other_ids() {
        let mut a = SeededCidGenerator::new(&[1; 32]);
        let mut b = SeededCidGenerator::new(&[1; 32]);
        let mut c = SeededCidGenerator::new(&[2; 32]);
        let (a1, a2) = (a.generate_cid(), a.generate_cid());
        assert_ne!(a1, a2);
        assert_eq!(a1, b.generate_cid());
        assert_ne!(a1, c.generate_cid());
        assert_eq!(a1.len(), CID_LEN);
    }

    #[test]
    fn labels_separate_keys() {
        assert_ne!(derive(&[0; 32], b"a"), derive(&[0; 32], b"b"));
    }
}
