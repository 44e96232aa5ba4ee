//! The run's randomness: xoshiro256** seeded through SplitMix64. Small, fast and fully
//! determined by its seed; every component draws from its own stream ([`SimRng::fork`]) so
//! a change in how often one draws does not reshuffle the others.

use std::ops::Range;
use std::time::Duration;

#[derive(Debug, Clone)]
pub(crate) struct SimRng {
    s: [u64; 4],
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SimRng {
    pub(crate) fn new(seed: u64) -> SimRng {
        let mut x = seed;
        SimRng {
            s: [
                splitmix(&mut x),
                splitmix(&mut x),
                splitmix(&mut x),
                splitmix(&mut x),
            ],
        }
    }

    /// An independent stream named by `label`, derived from this one's seed state.
    pub(crate) fn fork(&self, label: &str) -> SimRng {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in label.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        SimRng::new(self.s[0] ^ self.s[2].rotate_left(17) ^ h)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `0..n` (`n` > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        // Multiply-shift: bias is below 2^-64 * n, irrelevant here.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    pub(crate) fn range(&mut self, r: Range<u64>) -> u64 {
        r.start + self.below((r.end - r.start).max(1))
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }

    /// A duration uniform in `[lo, hi)`.
    pub(crate) fn duration(&mut self, lo: Duration, hi: Duration) -> Duration {
        let lo_n = lo.as_nanos() as u64;
        let hi_n = (hi.as_nanos() as u64).max(lo_n + 1);
        Duration::from_nanos(self.range(lo_n..hi_n))
    }

    pub(crate) fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    pub(crate) fn seed32(&mut self) -> [u8; 32] {
        let mut s = [0u8; 32];
        self.fill(&mut s);
        s
    }

    pub(crate) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_forks_differ() {
        let (mut a, mut b) = (SimRng::new(1), SimRng::new(1));
        let xs: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..4).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(SimRng::new(2).next_u64(), SimRng::new(1).next_u64());
        let base = SimRng::new(1);
        assert_ne!(base.fork("net").next_u64(), base.fork("disk").next_u64());
        let mut r = SimRng::new(3);
        assert!((0..1000).all(|_| r.below(7) < 7));
    }
}
