//! Shard leases: who may write, and when the next generation may be granted.
//!
//! A lease on (shard, generation) is earned by a heartbeat the control plane answered. The
//! holder anchors it at the instant it *sent* that heartbeat, by its own monotonic clock — never
//! later than the control plane heard it — and stops writing `holder_margin` before the lease's
//! end. The control plane grants the next generation only `regrant_margin` after the lease's end,
//! counted from when it last heard the holder, by *its* clock. Neither side reads the other's
//! clock; safety needs only that each clock's rate stays within `drift_ppm` of real time, which
//! [`LeaseTerms::check`] verifies for the configured margins.

/// The durations every node of a cluster uses (milliseconds) and the drift bound they assume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTerms {
    pub lease_ms: u64,
    /// ε: how long before its lease's end a holder stops accepting writes. Covers drift and
    /// the time between the check and the record reaching disk.
    pub holder_margin_ms: u64,
    /// How long after a lease's end the control plane waits before granting the next one.
    pub regrant_margin_ms: u64,
    /// The largest rate error of any node's monotonic clock, parts per million.
    pub drift_ppm: u64,
}

/// Why a set of lease terms is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseTermsError {
    /// The holder would have no time to write at all.
    HolderMarginTooLarge {
        lease_ms: u64,
        holder_margin_ms: u64,
    },
    /// A drift rate of a million ppm or more lets a clock stand still.
    DriftTooLarge { drift_ppm: u64 },
    /// A fast control plane and a slow holder could see two leaders at once.
    Overlap {
        holder_stops_by_ms: u64,
        next_grant_from_ms: u64,
    },
}

impl std::fmt::Display for LeaseTermsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseTermsError::HolderMarginTooLarge {
                lease_ms,
                holder_margin_ms,
            } => write!(
                f,
                "holder margin {holder_margin_ms} ms leaves nothing of a {lease_ms} ms lease"
            ),
            LeaseTermsError::DriftTooLarge { drift_ppm } => {
                write!(f, "clock drift bound {drift_ppm} ppm must be below 1000000")
            }
            LeaseTermsError::Overlap {
                holder_stops_by_ms,
                next_grant_from_ms,
            } => write!(
                f,
                "leases could overlap: under the drift bound a holder may write until \
                 {holder_stops_by_ms} ms of real time while the next lease may start at \
                 {next_grant_from_ms} ms; raise the regrant margin or the holder margin"
            ),
        }
    }
}

const PPM: u64 = 1_000_000;

impl LeaseTerms {
    /// The defaults for a lease length: a quarter of it given up by the holder and a quarter
    /// waited by the control plane, safe for clocks within 1% of real time.
    pub fn for_lease(lease_ms: u64) -> LeaseTerms {
        LeaseTerms {
            lease_ms,
            holder_margin_ms: lease_ms / 4,
            regrant_margin_ms: lease_ms / 4,
            drift_ppm: 10_000,
        }
    }

    /// Refuses terms under which two holders could write at once.
    ///
    /// Measured in real time from the control plane hearing the holder's heartbeat (the anchor
    /// is at or before it): the holder stops at most `(L − ε) / (1 − ρ)` later, the control
    /// plane grants again at least `(L + m) / (1 + ρ)` later; the first must be strictly earlier.
    pub fn check(&self) -> Result<(), LeaseTermsError> {
        if self.holder_margin_ms >= self.lease_ms {
            return Err(LeaseTermsError::HolderMarginTooLarge {
                lease_ms: self.lease_ms,
                holder_margin_ms: self.holder_margin_ms,
            });
        }
        if self.drift_ppm >= PPM {
            return Err(LeaseTermsError::DriftTooLarge {
                drift_ppm: self.drift_ppm,
            });
        }
        let holder = u128::from(self.lease_ms - self.holder_margin_ms);
        let regrant = u128::from(self.lease_ms + self.regrant_margin_ms);
        let rho = u128::from(self.drift_ppm);
        let ppm = u128::from(PPM);
        // Cross-multiplied to stay in integers: holder / (1 − ρ) < regrant / (1 + ρ).
        if holder * (ppm + rho) >= regrant * (ppm - rho) {
            return Err(LeaseTermsError::Overlap {
                holder_stops_by_ms: (holder * ppm).div_ceil(ppm - rho) as u64,
                next_grant_from_ms: (regrant * ppm / (ppm + rho)) as u64,
            });
        }
        Ok(())
    }
}

/// A lease as its holder keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub generation: u64,
    /// The holder's monotonic clock when it sent the heartbeat the control plane answered.
    pub anchor_ms: u64,
}

impl Lease {
    /// The last instant, by the holder's clock, at which it may still accept a write.
    pub fn writable_until_ms(&self, terms: &LeaseTerms) -> u64 {
        self.anchor_ms + terms.lease_ms - terms.holder_margin_ms
    }

    /// A renewal counts only for the same generation and only when anchored later; a grant for
    /// another generation is a new lease, never an extension of this one.
    pub fn renew(&mut self, generation: u64, anchor_ms: u64) -> bool {
        let later = generation == self.generation && anchor_ms > self.anchor_ms;
        if later {
            self.anchor_ms = anchor_ms;
        }
        later
    }
}

/// Why a leader may not accept a write now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteRefused {
    /// No lease for this shard.
    NoLease,
    /// The shard is open at one generation and the lease is for another.
    GenerationMismatch { open: u64, leased: u64 },
    /// The lease ran out (by this node's clock, less the margin).
    Lapsed { writable_until_ms: u64, now_ms: u64 },
}

/// Checked at admission and again where a record takes its place in the log: a write that
/// waited in between reads the clock again.
pub fn may_write(
    lease: Option<&Lease>,
    open_generation: u64,
    now_ms: u64,
    terms: &LeaseTerms,
) -> Result<(), WriteRefused> {
    let lease = lease.ok_or(WriteRefused::NoLease)?;
    if lease.generation != open_generation {
        return Err(WriteRefused::GenerationMismatch {
            open: open_generation,
            leased: lease.generation,
        });
    }
    let until = lease.writable_until_ms(terms);
    if now_ms >= until {
        return Err(WriteRefused::Lapsed {
            writable_until_ms: until,
            now_ms,
        });
    }
    Ok(())
}

/// Whether the control plane may grant the shard's next generation to another node, having
/// last heard the holder at `last_heard_ms` by its own clock.
pub fn may_regrant(last_heard_ms: u64, now_ms: u64, terms: &LeaseTerms) -> bool {
    now_ms >= last_heard_ms + terms.lease_ms + terms.regrant_margin_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_safe_and_margins_cut_both_ways() {
        for lease in [100, 2000, 30_000] {
            assert_eq!(LeaseTerms::for_lease(lease).check(), Ok(()), "{lease}");
        }
        let mut t = LeaseTerms::for_lease(2000);
        t.regrant_margin_ms = 0;
        t.holder_margin_ms = 0;
        assert_eq!(
            t.check(),
            Err(LeaseTermsError::Overlap {
                holder_stops_by_ms: 2021,
                next_grant_from_ms: 1980
            })
        );
        // No drift: equal ends still touch, which is not strictly before.
        t.drift_ppm = 0;
        assert!(matches!(t.check(), Err(LeaseTermsError::Overlap { .. })));
        t.regrant_margin_ms = 1;
        assert_eq!(t.check(), Ok(()));
        t.holder_margin_ms = 2000;
        assert_eq!(
            t.check(),
            Err(LeaseTermsError::HolderMarginTooLarge {
                lease_ms: 2000,
                holder_margin_ms: 2000
            })
        );
        let mut fast = LeaseTerms::for_lease(2000);
        fast.drift_ppm = PPM;
        assert_eq!(
            fast.check(),
            Err(LeaseTermsError::DriftTooLarge { drift_ppm: PPM })
        );
    }

    #[test]
    fn the_safe_edge_of_the_drift_bound() {
        // L = 1000, ε = m = 250: safe iff 750 (1 + ρ) < 1250 (1 − ρ), i.e. ρ < 0.25.
        let mut t = LeaseTerms::for_lease(1000);
        t.drift_ppm = 249_999;
        assert_eq!(t.check(), Ok(()));
        t.drift_ppm = 250_000;
        assert!(matches!(t.check(), Err(LeaseTermsError::Overlap { .. })));
    }

    #[test]
    fn a_write_needs_the_lease_at_the_open_generation_and_before_its_margin() {
        let terms = LeaseTerms::for_lease(2000);
        let lease = Lease {
            generation: 4,
            anchor_ms: 10_000,
        };
        assert_eq!(may_write(None, 4, 0, &terms), Err(WriteRefused::NoLease));
        assert_eq!(
            may_write(Some(&lease), 5, 10_001, &terms),
            Err(WriteRefused::GenerationMismatch { open: 5, leased: 4 })
        );
        assert_eq!(may_write(Some(&lease), 4, 11_499, &terms), Ok(()));
        assert_eq!(
            may_write(Some(&lease), 4, 11_500, &terms),
            Err(WriteRefused::Lapsed {
                writable_until_ms: 11_500,
                now_ms: 11_500
            })
        );
    }

    #[test]
    fn renewal_extends_only_the_same_generation_forward() {
        let mut lease = Lease {
            generation: 4,
            anchor_ms: 10_000,
        };
        assert!(!lease.renew(5, 20_000), "another generation is a new lease");
        assert!(
            !lease.renew(4, 9_000),
            "an older heartbeat's answer arriving late"
        );
        assert_eq!(lease.anchor_ms, 10_000);
        assert!(lease.renew(4, 10_500));
        assert_eq!(lease.anchor_ms, 10_500);
    }

    #[test]
    fn regrant_waits_for_the_lease_and_its_margin() {
        let terms = LeaseTerms::for_lease(2000);
        assert!(!may_regrant(5_000, 7_499, &terms));
        assert!(may_regrant(5_000, 7_500, &terms));
    }
}
