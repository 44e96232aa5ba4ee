//! Wall-clock time without a clock: the runtime names one moment twice at construction (an
//! `Instant` and the Unix time it stood for), and every later Unix time is derived from the
//! `now` each input carries. Token expiry, record timestamps, cache TTLs and compaction all
//! read it here, so the arithmetic exists once.

use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UnixAnchor {
    at: Instant,
    micros: u64,
}

impl UnixAnchor {
    pub(crate) fn new(at: Instant, unix_micros: u64) -> UnixAnchor {
        UnixAnchor {
            at,
            micros: unix_micros,
        }
    }

    /// Unix microseconds at `now` (before the anchor too: inputs may carry an earlier
    /// `now` than construction's in a simulator).
    pub(crate) fn unix_micros(&self, now: Instant) -> u64 {
        match now.checked_duration_since(self.at) {
            Some(d) => self.micros.saturating_add(d.as_micros() as u64),
            None => self
                .micros
                .saturating_sub(self.at.duration_since(now).as_micros() as u64),
        }
    }

    pub(crate) fn unix_ms(&self, now: Instant) -> u64 {
        self.unix_micros(now) / 1000
    }

    pub(crate) fn unix_secs(&self, now: Instant) -> u64 {
        self.unix_micros(now) / 1_000_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn unix_time_follows_now_either_side_of_the_anchor() {
        let t0 = Instant::now();
        let a = UnixAnchor::new(t0 + Duration::from_secs(10), 5_000_000_000);
        assert_eq!(a.unix_micros(t0 + Duration::from_secs(11)), 5_001_000_000);
        assert_eq!(a.unix_micros(t0 + Duration::from_secs(9)), 4_999_000_000);
        assert_eq!(a.unix_ms(t0 + Duration::from_millis(10_001)), 5_000_001);
        assert_eq!(a.unix_secs(t0 + Duration::from_secs(12)), 5_002);
    }
}
