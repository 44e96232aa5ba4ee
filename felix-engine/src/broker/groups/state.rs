//! One consumer group on one shard: the claim and cursor rules, as plain state.
//!
//! Offsets below `cursor` are finished (settled, dead-lettered or skipped), except the
//! few an operator redrove, which are owed again without moving the cursor back. Offsets
//! from `cursor` up to `next_fresh` were handed out at least once; those not finished are
//! in `inflight`, each claimed, owed (to anyone), delayed (a nack with a delay) or
//! reserved (for the connection that reclaimed a named consumer's claims). The cursor
//! moves only over a contiguous run of finished offsets.
//!
//! Durable changes come out as [`Write`]s for the group log; the in-flight state is
//! memory only, by design (a restart redelivers from the cursor: at-least-once).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

/// Entries `reclaimed_by` may hold beyond one per record in flight before it is pruned to
/// the members holding claims: it stays below `max_in_flight` plus this, and a prune runs
/// at most once per this many new member names.
pub(crate) const RECLAIMED_BY_SLACK: usize = 1024;

/// A change the group log must record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    /// Every offset below this is finished.
    Cursor(u64),
    /// The offset was given up on: listed as a dead letter.
    Dead(u64),
    /// A dead letter dropped by an operator.
    Discard(u64),
    /// A dead letter put back: owed again (below the cursor, so it needs its own record).
    Redrive(u64),
    /// A redriven record was finished.
    Done(u64),
}

/// Why a settle was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GroupError {
    /// Malformed or impossible (past the tail, already finished): `invalid_request`.
    Invalid(String),
    /// The claim named no longer stands, or the record was not handed out since this
    /// state was built: `stale_claim`.
    Stale(String),
}

/// A named member: the principal the connection authenticated as and the name it gave.
pub(crate) type Member = (String, String);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Hold {
    Claimed {
        until: Instant,
        conn: u64,
        member: Option<Member>,
    },
    Owed,
    Delayed(Instant),
    /// Reserved for the connection that reclaimed a member's claims, until `until`.
    Reserved {
        until: Instant,
        conn: u64,
    },
}

impl Hold {
    fn deadline(&self) -> Option<Instant> {
        match self {
            Hold::Claimed { until, .. } | Hold::Reserved { until, .. } => Some(*until),
            Hold::Delayed(at) => Some(*at),
            Hold::Owed => None,
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    /// Deliveries so far.
    attempts: u32,
    hold: Hold,
}

/// A record handed out by [`GroupState::take`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handout {
    pub(crate) offset: u64,
    pub(crate) attempts: u32,
    /// Offsets directly below it settled without delivery (retention removed them).
    pub(crate) skipped_before: u64,
}

/// What a poll asks for.
#[derive(Debug, Clone)]
pub(crate) struct Take<'a> {
    pub(crate) max: usize,
    pub(crate) visibility: Duration,
    pub(crate) conn: u64,
    pub(crate) member: Option<&'a Member>,
    pub(crate) reclaim: bool,
}

/// The shard as a poll sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShardView {
    /// Oldest offset retention kept.
    pub(crate) oldest: u64,
    /// Every record below this is readable (durable and released).
    pub(crate) tail: u64,
}

/// Bounds a group works under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub(crate) max_in_flight: usize,
    pub(crate) max_attempts: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct GroupState {
    /// Has a durable position (written at least once, or recovered).
    exists: bool,
    cursor: u64,
    next_fresh: u64,
    /// A settle for an offset not handed out since this state was built is taken only
    /// below this (a claim from before a restart); at or above, it is stale.
    accept_below: u64,
    inflight: BTreeMap<u64, Entry>,
    /// Owed entries, lowest first.
    owed: BTreeSet<u64>,
    /// (deadline, offset) of every claimed, reserved or delayed entry.
    deadlines: BTreeSet<(Instant, u64)>,
    /// Settled before being handed out here (a claim from before a restart), at or above
    /// `next_fresh`.
    presettled: BTreeSet<u64>,
    dead: BTreeSet<u64>,
    /// Redriven records below the cursor, still owed (durable).
    redriven: BTreeSet<u64>,
    /// The newest connection each member reclaimed from. Pruned to the members holding
    /// claims once it outgrows them by [`RECLAIMED_BY_SLACK`] (see `reserve`).
    reclaimed_by: HashMap<Member, u64>,
    /// The newest connection among the pruned entries: a member without an entry reclaims
    /// only from a connection newer than this, so pruning never lets an older connection
    /// take a newer one's claims.
    reclaim_floor: Option<u64>,
    /// Records retention removed before the group reached them.
    pub(crate) skipped: u64,
}

impl GroupState {
    /// A group as the log left it: `cursor` (if it has one), its dead letters and the
    /// redriven records still owed. `tail` is the shard's readable tail now.
    pub(crate) fn recovered(
        cursor: Option<u64>,
        dead: BTreeSet<u64>,
        redriven: BTreeSet<u64>,
        tail: u64,
    ) -> GroupState {
        let at = cursor.unwrap_or(0);
        let mut g = GroupState {
            exists: cursor.is_some(),
            cursor: at,
            next_fresh: at,
            accept_below: tail,
            inflight: BTreeMap::new(),
            owed: BTreeSet::new(),
            deadlines: BTreeSet::new(),
            presettled: BTreeSet::new(),
            dead,
            redriven: BTreeSet::new(),
            reclaimed_by: HashMap::new(),
            reclaim_floor: None,
            skipped: 0,
        };
        for off in redriven {
            g.owe_redriven(off);
        }
        g
    }

    fn owe_redriven(&mut self, off: u64) {
        if off < self.cursor {
            self.redriven.insert(off);
        }
        self.inflight.insert(
            off,
            Entry {
                attempts: 0,
                hold: Hold::Owed,
            },
        );
        self.owed.insert(off);
    }

    // ---- getters ------------------------------------------------------------------------

    pub(crate) fn exists(&self) -> bool {
        self.exists
    }

    pub(crate) fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Handed out and not finished, owed ones excluded.
    pub(crate) fn in_flight(&self) -> usize {
        self.inflight.len() - self.owed.len()
    }

    pub(crate) fn owed(&self) -> usize {
        self.owed.len()
    }

    pub(crate) fn dead_letters(&self) -> Vec<u64> {
        self.dead.iter().copied().collect()
    }

    /// The earliest moment a claim lapses or a delayed record comes due.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(at, _)| at)
    }

    // ---- the rules ----------------------------------------------------------------------

    fn set_hold(&mut self, off: u64, hold: Hold) {
        let Some(e) = self.inflight.get_mut(&off) else {
            return;
        };
        if let Some(at) = e.hold.deadline() {
            self.deadlines.remove(&(at, off));
        }
        if e.hold == Hold::Owed {
            self.owed.remove(&off);
        }
        if let Some(at) = hold.deadline() {
            self.deadlines.insert((at, off));
        }
        if hold == Hold::Owed {
            self.owed.insert(off);
        }
        e.hold = hold;
    }

    /// Removes a finished entry; records what that makes durable.
    fn finish(&mut self, off: u64, writes: &mut Vec<Write>) {
        if let Some(e) = self.inflight.remove(&off) {
            if let Some(at) = e.hold.deadline() {
                self.deadlines.remove(&(at, off));
            }
            self.owed.remove(&off);
        }
        if self.redriven.remove(&off) {
            writes.push(Write::Done(off));
        }
        self.advance(writes);
    }

    /// Moves the cursor over the contiguous run of finished offsets.
    fn advance(&mut self, writes: &mut Vec<Write>) {
        while self.presettled.first() == Some(&self.next_fresh)
            && self.inflight.range(self.cursor..).next().is_none()
        {
            self.presettled.pop_first();
            self.next_fresh += 1;
        }
        let low = self
            .inflight
            .range(self.cursor..)
            .next()
            .map_or(self.next_fresh, |(&k, _)| k);
        if low > self.cursor || !self.exists {
            self.cursor = self.cursor.max(low);
            self.exists = true;
            writes.push(Write::Cursor(self.cursor));
        }
    }

    /// Lapsed claims and reservations and due delayed records become owed.
    pub(crate) fn expire(&mut self, now: Instant) {
        while let Some(&(at, off)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.set_hold(off, Hold::Owed);
        }
    }

    /// Hands out up to `t.max` records: this connection's reserved claims first, then owed
    /// records lowest first, then fresh ones under the in-flight cap. A record past its
    /// attempt bound is dead-lettered instead. Retention-removed offsets are skipped.
    pub(crate) fn take(
        &mut self,
        now: Instant,
        t: &Take<'_>,
        view: ShardView,
        bounds: Bounds,
        writes: &mut Vec<Write>,
    ) -> Vec<Handout> {
        self.expire(now);
        if t.reclaim {
            if let Some(member) = t.member {
                self.reserve(now, t.conn, member, t.visibility);
            }
        }
        let mut out: Vec<Handout> = Vec::new();
        let mut candidates: Vec<u64> = Vec::new();
        // Reserved for this connection, lowest first.
        candidates.extend(self.inflight.iter().filter_map(|(&k, e)| match e.hold {
            Hold::Reserved { conn, .. } if conn == t.conn => Some(k),
            _ => None,
        }));
        candidates.extend(self.owed.iter().copied());
        let mut i = 0;
        while out.len() < t.max && i < candidates.len() {
            let off = candidates[i];
            i += 1;
            if off < view.oldest {
                // Retention removed it: nobody can have it.
                self.skipped += 1;
                self.finish(off, writes);
                continue;
            }
            self.hand(now, off, t, bounds, writes, 0, &mut out);
        }
        // Fresh records.
        let mut skipped = 0;
        if self.next_fresh < view.oldest {
            skipped = view.oldest - self.next_fresh;
            self.skipped += skipped;
            self.presettled = self.presettled.split_off(&view.oldest);
            self.next_fresh = view.oldest;
            self.advance(writes);
        }
        while out.len() < t.max
            && self.next_fresh < view.tail
            && self.inflight.len() < bounds.max_in_flight
        {
            let off = self.next_fresh;
            self.next_fresh += 1;
            if self.presettled.remove(&off) {
                self.advance(writes);
                continue;
            }
            self.inflight.insert(
                off,
                Entry {
                    attempts: 0,
                    hold: Hold::Owed,
                },
            );
            self.owed.insert(off);
            self.hand(now, off, t, bounds, writes, skipped, &mut out);
            skipped = 0;
        }
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn hand(
        &mut self,
        now: Instant,
        off: u64,
        t: &Take<'_>,
        bounds: Bounds,
        writes: &mut Vec<Write>,
        skipped_before: u64,
        out: &mut Vec<Handout>,
    ) {
        let Some(e) = self.inflight.get_mut(&off) else {
            return;
        };
        e.attempts += 1;
        let attempts = e.attempts;
        if attempts > bounds.max_attempts {
            // Listed first, then finished: the order a crash between the two cannot hurt.
            self.dead.insert(off);
            writes.push(Write::Dead(off));
            self.finish(off, writes);
            return;
        }
        self.set_hold(
            off,
            Hold::Claimed {
                until: now + t.visibility,
                conn: t.conn,
                member: t.member.cloned(),
            },
        );
        out.push(Handout {
            offset: off,
            attempts,
            skipped_before,
        });
    }

    /// Reserves for `conn` every claim `member` holds from an older connection, once per
    /// connection and never for one older than the last that reclaimed.
    fn reserve(&mut self, now: Instant, conn: u64, member: &Member, visibility: Duration) {
        let last = self
            .reclaimed_by
            .get(member)
            .copied()
            .or(self.reclaim_floor);
        if last.is_some_and(|c| c >= conn) {
            return;
        }
        self.reclaimed_by.insert(member.clone(), conn);
        if self.reclaimed_by.len() > self.inflight.len() + RECLAIMED_BY_SLACK {
            self.prune_reclaimed_by(member);
        }
        let held: Vec<u64> = self
            .inflight
            .iter()
            .filter_map(|(&k, e)| match &e.hold {
                Hold::Claimed {
                    conn: c, member: m, ..
                } if *c != conn && m.as_ref() == Some(member) => Some(k),
                _ => None,
            })
            .collect();
        for off in held {
            self.set_hold(
                off,
                Hold::Reserved {
                    until: now + visibility,
                    conn,
                },
            );
        }
    }

    /// Common checks for an offset the group is not tracking. `Ok(true)`: a harmless
    /// duplicate, answered ok; `Ok(false)`: a claim from before this state, taken.
    fn untracked(&mut self, off: u64, tail: u64, what: &str) -> Result<bool, GroupError> {
        if off >= tail {
            return Err(GroupError::Invalid(format!(
                "offset {off} is at or past the shard's tail {tail}: it was never handed out"
            )));
        }
        if off < self.next_fresh {
            return Ok(true);
        }
        if off < self.accept_below {
            return Ok(false);
        }
        Err(GroupError::Stale(format!(
            "offset {off} was not handed out by this group since its state was built; {what} not applied"
        )))
    }

    /// A record claimed for a poll that could not carry it (its answer was full): owed
    /// again, and the delivery that never happened is not counted.
    pub(crate) fn hand_back(&mut self, off: u64) {
        if let Some(e) = self.inflight.get_mut(&off) {
            e.attempts = e.attempts.saturating_sub(1);
            self.set_hold(off, Hold::Owed);
        }
    }

    /// `group_ack`: finishes a record, whoever holds the claim.
    pub(crate) fn ack(
        &mut self,
        off: u64,
        tail: u64,
        writes: &mut Vec<Write>,
    ) -> Result<(), GroupError> {
        if self.inflight.contains_key(&off) {
            self.finish(off, writes);
            return Ok(());
        }
        if !self.untracked(off, tail, "the ack was")? {
            self.presettled.insert(off);
            self.advance(writes);
        }
        Ok(())
    }

    /// Keeps the entries of members that hold a claim (and `keep`'s); what the others
    /// guarded is kept as the floor. One entry per member name ever seen would otherwise
    /// stay for the group's life. Runs once per [`RECLAIMED_BY_SLACK`] new names at most,
    /// and walks the records in flight.
    fn prune_reclaimed_by(&mut self, keep: &Member) {
        let holding: HashSet<&Member> = self
            .inflight
            .values()
            .filter_map(|e| match &e.hold {
                Hold::Claimed {
                    member: Some(m), ..
                } => Some(m),
                _ => None,
            })
            .collect();
        let mut floor = self.reclaim_floor;
        self.reclaimed_by.retain(|m, &mut c| {
            let stays = m == keep || holding.contains(m);
            if !stays {
                floor = floor.max(Some(c));
            }
            stays
        });
        self.reclaim_floor = floor;
    }

    #[cfg(test)]
    fn reclaimed_by_len(&self) -> usize {
        self.reclaimed_by.len()
    }

    /// `group_nack`: hands a record back, at once or after `delay`. With `attempts` set,
    /// only the claim made with that delivery count is handed back.
    pub(crate) fn nack(
        &mut self,
        now: Instant,
        off: u64,
        delay: Option<Duration>,
        attempts: Option<u64>,
        tail: u64,
    ) -> Result<(), GroupError> {
        let Some(e) = self.inflight.get(&off) else {
            // Finished already (a duplicate), or a claim from before this state: the record
            // is delivered again either way.
            return self.untracked(off, tail, "the nack was").map(|_| ());
        };
        if let Some(n) = attempts {
            let standing = matches!(e.hold, Hold::Claimed { until, .. } if until > now);
            if !standing || u64::from(e.attempts) != n {
                return Err(GroupError::Stale(format!(
                    "the claim on offset {off} from delivery {n} no longer stands"
                )));
            }
        }
        let hold = match delay {
            Some(d) if !d.is_zero() => Hold::Delayed(now + d),
            _ => Hold::Owed,
        };
        self.set_hold(off, hold);
        Ok(())
    }

    /// `group_extend`: keeps the claim made with delivery `attempts` standing for `by`.
    pub(crate) fn extend(
        &mut self,
        now: Instant,
        off: u64,
        attempts: u64,
        by: Duration,
    ) -> Result<(), GroupError> {
        let stale = || {
            GroupError::Stale(format!(
                "the claim on offset {off} from delivery {attempts} no longer stands"
            ))
        };
        let e = self.inflight.get(&off).ok_or_else(stale)?;
        match &e.hold {
            Hold::Claimed {
                until,
                conn,
                member,
            } if *until > now && u64::from(e.attempts) == attempts => {
                let hold = Hold::Claimed {
                    until: now + by,
                    conn: *conn,
                    member: member.clone(),
                };
                self.set_hold(off, hold);
                Ok(())
            }
            _ => Err(stale()),
        }
    }

    /// `group_dead_letter`: lists a record as a dead letter, then finishes it.
    pub(crate) fn dead_letter(
        &mut self,
        off: u64,
        tail: u64,
        writes: &mut Vec<Write>,
    ) -> Result<(), GroupError> {
        if !self.inflight.contains_key(&off) {
            if self.untracked(off, tail, "the dead letter was")? {
                return Err(GroupError::Invalid(format!(
                    "offset {off} is already finished"
                )));
            }
            // A claim from before this state: track it so it can be finished.
            self.inflight.insert(
                off,
                Entry {
                    attempts: 0,
                    hold: Hold::Owed,
                },
            );
            self.owed.insert(off);
        }
        self.dead.insert(off);
        writes.push(Write::Dead(off));
        self.finish(off, writes);
        Ok(())
    }

    /// Removes `off` from the dead letters; refused if it is not one.
    fn take_dead(&mut self, off: u64) -> Result<(), GroupError> {
        if self.dead.remove(&off) {
            Ok(())
        } else {
            Err(GroupError::Invalid(format!(
                "offset {off} is not a dead letter of this group"
            )))
        }
    }

    /// `group_discard`: drops a dead letter.
    pub(crate) fn discard(&mut self, off: u64, writes: &mut Vec<Write>) -> Result<(), GroupError> {
        self.take_dead(off)?;
        writes.push(Write::Discard(off));
        Ok(())
    }

    /// `group_redrive`: a dead letter is owed again with its attempts reset; the cursor
    /// does not move back.
    pub(crate) fn redrive(&mut self, off: u64, writes: &mut Vec<Write>) -> Result<(), GroupError> {
        self.take_dead(off)?;
        writes.push(Write::Redrive(off));
        self.owe_redriven(off);
        Ok(())
    }

    /// `group_seek`: moves the cursor; every standing claim is void and the new state takes
    /// no settle from before it. Dead letters stay; redriven records stay owed.
    pub(crate) fn seek(&mut self, to: u64, writes: &mut Vec<Write>) {
        let redriven = std::mem::take(&mut self.redriven);
        let dead = std::mem::take(&mut self.dead);
        let skipped = self.skipped;
        *self = GroupState::recovered(Some(to), dead, redriven, to);
        self.skipped = skipped;
        writes.push(Write::Cursor(to));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        max_in_flight: 100,
        max_attempts: 3,
    };

    fn take(conn: u64, max: usize) -> Take<'static> {
        Take {
            max,
            visibility: Duration::from_secs(30),
            conn,
            member: None,
            reclaim: false,
        }
    }

    fn view(tail: u64) -> ShardView {
        ShardView { oldest: 0, tail }
    }

    fn offsets(h: &[Handout]) -> Vec<u64> {
        h.iter().map(|h| h.offset).collect()
    }

    fn fresh() -> GroupState {
        GroupState::recovered(None, BTreeSet::new(), BTreeSet::new(), 0)
    }

    #[test]
    fn the_cursor_moves_only_over_a_contiguous_run_of_settled_records() {
        let now = Instant::now();
        let mut g = fresh();
        let mut w = Vec::new();
        let got = g.take(now, &take(1, 5), view(5), BOUNDS, &mut w);
        assert_eq!(offsets(&got), vec![0, 1, 2, 3, 4]);
        w.clear();
        g.ack(1, 5, &mut w).unwrap();
        g.ack(2, 5, &mut w).unwrap();
        assert_eq!(
            g.cursor(),
            0,
            "0 is still claimed: the cursor stays below the gap"
        );
        assert!(!w.iter().any(|x| matches!(x, Write::Cursor(c) if *c > 0)));
        g.ack(0, 5, &mut w).unwrap();
        assert_eq!(g.cursor(), 3);
        assert_eq!(w.last(), Some(&Write::Cursor(3)));
        g.ack(4, 5, &mut w).unwrap();
        assert_eq!(g.cursor(), 3);
        g.ack(3, 5, &mut w).unwrap();
        assert_eq!(g.cursor(), 5);
        // A duplicate below the cursor is harmless; past the tail is invalid.
        assert_eq!(g.ack(2, 5, &mut w), Ok(()));
        assert!(matches!(g.ack(5, 5, &mut w), Err(GroupError::Invalid(_))));
    }

    #[test]
    fn a_claimed_record_goes_to_nobody_else_until_its_claim_lapses() {
        let now = Instant::now();
        let mut g = fresh();
        let mut w = Vec::new();
        let t = Take {
            visibility: Duration::from_secs(1),
            ..take(1, 2)
        };
        assert_eq!(
            offsets(&g.take(now, &t, view(2), BOUNDS, &mut w)),
            vec![0, 1]
        );
        assert!(g
            .take(now, &take(2, 10), view(2), BOUNDS, &mut w)
            .is_empty());
        let later = now + Duration::from_millis(999);
        assert!(g
            .take(later, &take(2, 10), view(2), BOUNDS, &mut w)
            .is_empty());
        let lapsed = now + Duration::from_secs(1);
        let again = g.take(lapsed, &take(2, 10), view(2), BOUNDS, &mut w);
        assert_eq!(offsets(&again), vec![0, 1]);
        assert!(again.iter().all(|h| h.attempts == 2));
        // The first consumer's claim is gone: extending it names a stale delivery.
        assert!(matches!(
            g.extend(lapsed, 0, 1, Duration::from_secs(5)),
            Err(GroupError::Stale(_))
        ));
        assert_eq!(g.extend(lapsed, 0, 2, Duration::from_secs(5)), Ok(()));
    }

    #[test]
    fn reclaimed_by_is_pruned_to_the_members_holding_claims_and_never_steals_after() {
        let now = Instant::now();
        let mut g = fresh();
        let mut w = Vec::new();
        let member = |n: usize| ("p".to_owned(), format!("m{n}"));
        let poll = |conn: u64, m: &'static Member, max: usize| Take {
            member: Some(m),
            reclaim: true,
            ..take(conn, max)
        };
        // A member holding a claim from connection 1.
        let holder: &'static Member = Box::leak(Box::new(member(0)));
        assert_eq!(
            offsets(&g.take(now, &poll(1, holder, 1), view(1), BOUNDS, &mut w)),
            vec![0]
        );
        // Many one-off member names, each reclaiming once from a newer connection.
        let names = 3 * RECLAIMED_BY_SLACK;
        for n in 1..=names {
            let m: &'static Member = Box::leak(Box::new(member(n)));
            g.take(now, &poll(1 + n as u64, m, 0), view(1), BOUNDS, &mut w);
            assert!(
                g.reclaimed_by_len() <= g.in_flight() + RECLAIMED_BY_SLACK + 1,
                "{} entries after {n} names",
                g.reclaimed_by_len()
            );
        }
        assert!(g.reclaimed_by_len() < names / 2, "pruned");
        // The holder kept its entry; a member pruned away cannot reclaim from a connection
        // older than the ones pruned (it would take a newer connection's claims).
        let pruned: &'static Member = Box::leak(Box::new(member(1)));
        let newer = 5 * names as u64;
        let plain = Take {
            reclaim: false,
            ..poll(newer, pruned, 1)
        };
        assert_eq!(
            offsets(&g.take(now, &plain, view(2), BOUNDS, &mut w)),
            vec![1]
        );
        let old_conn = 2;
        assert!(
            g.take(now, &poll(old_conn, pruned, 1), view(2), BOUNDS, &mut w)
                .is_empty(),
            "the old connection took the newer one's claim"
        );
        // A new incarnation of the holder (a newer connection) still reclaims its claim.
        let newest = 10 * names as u64;
        let got = g.take(now, &poll(newest, holder, 1), view(2), BOUNDS, &mut w);
        assert_eq!(
            offsets(&got),
            vec![0],
            "reclaimed by the holder's new connection"
        );
    }

    #[test]
    fn a_nack_redelivers_with_the_attempt_counted_and_a_delay_holds_it_back() {
        let now = Instant::now();
        let mut g = fresh();
        let mut w = Vec::new();
        g.take(now, &take(1, 1), view(1), BOUNDS, &mut w);
        g.nack(now, 0, None, Some(1), 1).unwrap();
        let again = g.take(now, &take(1, 1), view(1), BOUNDS, &mut w);
        assert_eq!(again[0].attempts, 2);
        // A second nack naming the first delivery is stale.
        assert!(matches!(
            g.nack(now, 0, None, Some(1), 1),
            Err(GroupError::Stale(_))
        ));
        g.nack(now, 0, Some(Duration::from_secs(2)), Some(2), 1)
            .unwrap();
        assert_eq!(
            g.in_flight(),
            1,
            "a delayed record keeps its place in flight"
        );
        assert!(g.take(now, &take(1, 1), view(1), BOUNDS, &mut w).is_empty());
        assert_eq!(g.next_deadline(), Some(now + Duration::from_secs(2)));
        let due = g.take(
            now + Duration::from_secs(2),
            &take(1, 1),
            view(1),
            BOUNDS,
            &mut w,
        );
        assert_eq!(due[0].attempts, 3);
    }

    #[test]
    fn a_record_past_its_attempts_is_dead_lettered_and_the_cursor_passes_it() {
        let now = Instant::now();
        let mut g = fresh();
        let mut w = Vec::new();
        for attempt in 1..=3 {
            let got = g.take(now, &take(1, 1), view(2), BOUNDS, &mut w);
            assert_eq!(
                got[0],
                Handout {
                    offset: 0,
                    attempts: attempt,
                    skipped_before: 0
                }
            );
            g.nack(now, 0, None, None, 2).unwrap();
        }
        w.clear();
        let got = g.take(now, &take(1, 1), view(2), BOUNDS, &mut w);
        assert_eq!(
            offsets(&got),
            vec![1],
            "the fourth attempt dead-letters 0 instead"
        );
        assert_eq!(g.dead_letters(), vec![0]);
        assert_eq!(w[..2], [Write::Dead(0), Write::Cursor(1)]);
        // Redrive: owed again with attempts reset, the cursor stays.
        g.ack(1, 2, &mut w).unwrap();
        assert_eq!(g.cursor(), 2);
        w.clear();
        g.redrive(0, &mut w).unwrap();
        assert_eq!(w, vec![Write::Redrive(0)]);
        assert_eq!(g.cursor(), 2);
        let got = g.take(now, &take(1, 5), view(2), BOUNDS, &mut w);
        assert_eq!(
            got,
            vec![Handout {
                offset: 0,
                attempts: 1,
                skipped_before: 0
            }]
        );
        w.clear();
        g.ack(0, 2, &mut w).unwrap();
        assert_eq!(w, vec![Write::Done(0)]);
        assert_eq!(g.cursor(), 2);
        assert!(g.dead_letters().is_empty());
    }

    #[test]
    fn discard_and_dead_letter_by_hand() {
        let now = Instant::now();
        let mut g = fresh();
        let mut w = Vec::new();
        g.take(now, &take(1, 2), view(2), BOUNDS, &mut w);
        g.dead_letter(0, 2, &mut w).unwrap();
        assert_eq!(g.cursor(), 1);
        assert!(matches!(
            g.dead_letter(0, 2, &mut w),
            Err(GroupError::Invalid(_))
        ));
        w.clear();
        g.discard(0, &mut w).unwrap();
        assert_eq!(w, vec![Write::Discard(0)]);
        assert!(matches!(g.discard(0, &mut w), Err(GroupError::Invalid(_))));
        assert!(matches!(g.redrive(0, &mut w), Err(GroupError::Invalid(_))));
    }

    #[test]
    fn a_named_consumer_reclaims_its_claims_once_per_connection() {
        let now = Instant::now();
        let mut g = fresh();
        let mut w = Vec::new();
        let member: Member = ("alice".into(), "worker-1".into());
        let named = |conn| Take {
            member: Some(&member),
            reclaim: true,
            ..take(conn, 2)
        };
        assert_eq!(
            offsets(&g.take(now, &named(1), view(4), BOUNDS, &mut w)),
            vec![0, 1]
        );
        // The process restarts on connection 2 and reclaims: it gets its claims back first,
        // counted as another attempt, before the fresh records.
        let got = g.take(now, &named(2), view(4), BOUNDS, &mut w);
        assert_eq!(
            got.iter()
                .map(|h| (h.offset, h.attempts))
                .collect::<Vec<_>>(),
            vec![(0, 2), (1, 2)]
        );
        // Another member gets only fresh records.
        assert_eq!(
            offsets(&g.take(now, &take(3, 10), view(4), BOUNDS, &mut w)),
            vec![2, 3]
        );
        // A second reclaim on connection 2, or one from the older connection 1, takes nothing.
        g.nack(now, 2, None, None, 4).unwrap();
        let got = g.take(now, &named(2), view(4), BOUNDS, &mut w);
        assert_eq!(offsets(&got), vec![2], "an ordinary poll: only owed work");
        assert!(g.take(now, &named(1), view(4), BOUNDS, &mut w).is_empty());
    }

    #[test]
    fn the_in_flight_cap_stops_fresh_records() {
        let now = Instant::now();
        let mut g = fresh();
        let mut w = Vec::new();
        let bounds = Bounds {
            max_in_flight: 2,
            max_attempts: 3,
        };
        assert_eq!(g.take(now, &take(1, 10), view(10), bounds, &mut w).len(), 2);
        assert!(g
            .take(now, &take(1, 10), view(10), bounds, &mut w)
            .is_empty());
        g.ack(0, 10, &mut w).unwrap();
        assert_eq!(
            offsets(&g.take(now, &take(1, 10), view(10), bounds, &mut w)),
            vec![2]
        );
    }

    #[test]
    fn retention_skips_are_counted_and_never_stall_the_group() {
        let now = Instant::now();
        let mut g = fresh();
        let mut w = Vec::new();
        let got = g.take(
            now,
            &take(1, 10),
            ShardView { oldest: 4, tail: 6 },
            BOUNDS,
            &mut w,
        );
        assert_eq!(
            got[0],
            Handout {
                offset: 4,
                attempts: 1,
                skipped_before: 4
            }
        );
        assert_eq!(g.skipped, 4);
        assert_eq!(g.cursor(), 4);
    }

    #[test]
    fn after_a_restart_settles_from_old_claims_are_taken_and_new_ones_are_stale() {
        let now = Instant::now();
        // Recovered at cursor 2 with the shard's tail at 5.
        let mut g = GroupState::recovered(Some(2), BTreeSet::new(), BTreeSet::new(), 5);
        let mut w = Vec::new();
        g.ack(3, 7, &mut w).unwrap();
        assert!(matches!(g.ack(5, 7, &mut w), Err(GroupError::Stale(_))));
        let got = g.take(now, &take(1, 10), view(7), BOUNDS, &mut w);
        assert_eq!(
            offsets(&got),
            vec![2, 4, 5, 6],
            "3 was settled by its old claim"
        );
        g.ack(2, 7, &mut w).unwrap();
        assert_eq!(g.cursor(), 4);
    }

    #[test]
    fn a_seek_voids_claims_and_keeps_dead_letters() {
        let now = Instant::now();
        let mut g = fresh();
        let mut w = Vec::new();
        g.take(now, &take(1, 3), view(10), BOUNDS, &mut w);
        g.dead_letter(0, 10, &mut w).unwrap();
        g.seek(5, &mut w);
        assert_eq!(g.cursor(), 5);
        assert_eq!(g.dead_letters(), vec![0]);
        assert_eq!(g.in_flight(), 0);
        assert!(matches!(g.ack(6, 10, &mut w), Err(GroupError::Stale(_))));
        assert_eq!(
            g.ack(1, 10, &mut w),
            Ok(()),
            "below the new position: a duplicate"
        );
        assert_eq!(
            offsets(&g.take(now, &take(1, 2), view(10), BOUNDS, &mut w)),
            vec![5, 6]
        );
    }

    /// A seeded random workload of several consumers over the rules: no record is handed to
    /// a second consumer while a claim on it stands, and after a final drain every record
    /// is finished (acknowledged or dead-lettered) and the cursor is at the tail.
    #[test]
    fn random_workloads_lose_nothing_and_never_double_claim() {
        for seed in 1..=40u64 {
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut next = move |n: u64| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng % n.max(1)
            };
            let start = Instant::now();
            let mut now = start;
            let mut g = fresh();
            let mut w = Vec::new();
            let mut tail = 0u64;
            // offset -> (consumer, attempts, until) for every claim a consumer was given.
            let mut claims: BTreeMap<u64, (u64, u32, Instant)> = BTreeMap::new();
            let mut acked: BTreeSet<u64> = BTreeSet::new();
            let bounds = Bounds {
                max_in_flight: 16,
                max_attempts: 3,
            };
            for _ in 0..400 {
                match next(8) {
                    0 => tail += 1 + next(4),
                    1 | 2 => {
                        let conn = 1 + next(3);
                        let t = Take {
                            visibility: Duration::from_millis(50 + next(200)),
                            ..take(conn, 1 + next(5) as usize)
                        };
                        for h in g.take(now, &t, view(tail), bounds, &mut w) {
                            if let Some(&(holder, _, until)) = claims.get(&h.offset) {
                                assert!(
                                    until <= now || holder == conn,
                                    "seed {seed}: {} handed to {conn} while {holder} holds it",
                                    h.offset
                                );
                            }
                            assert!(
                                !acked.contains(&h.offset),
                                "seed {seed}: finished record handed out"
                            );
                            claims.insert(h.offset, (conn, h.attempts, now + t.visibility));
                        }
                    }
                    3 | 4 => {
                        // A consumer acks one of its standing claims.
                        let standing: Vec<u64> = claims
                            .iter()
                            .filter(|(_, &(_, _, until))| until > now)
                            .map(|(&o, _)| o)
                            .collect();
                        if let Some(&off) = standing.get(next(standing.len() as u64 + 1) as usize) {
                            g.ack(off, tail, &mut w).unwrap();
                            claims.remove(&off);
                            assert!(acked.insert(off), "seed {seed}: {off} acked twice");
                        }
                    }
                    5 => {
                        let standing: Vec<(u64, u32)> = claims
                            .iter()
                            .filter(|(_, &(_, _, until))| until > now)
                            .map(|(&o, &(_, a, _))| (o, a))
                            .collect();
                        if let Some(&(off, a)) =
                            standing.get(next(standing.len() as u64 + 1) as usize)
                        {
                            g.nack(now, off, None, Some(u64::from(a)), tail).unwrap();
                            claims.remove(&off);
                        }
                    }
                    6 => now += Duration::from_millis(next(150)),
                    _ => {
                        let dead = g.dead_letters();
                        if let Some(&off) = dead.get(next(dead.len() as u64 + 1) as usize) {
                            g.redrive(off, &mut w).unwrap();
                        }
                    }
                }
            }
            // Drain: one patient consumer takes and acks everything that is left.
            for _ in 0..200 {
                now += Duration::from_secs(1);
                let got = g.take(now, &take(9, 1000), view(tail), bounds, &mut w);
                if got.is_empty() && g.owed() == 0 && g.in_flight() == 0 {
                    break;
                }
                for h in got {
                    g.ack(h.offset, tail, &mut w).unwrap();
                    acked.insert(h.offset);
                }
            }
            let dead: BTreeSet<u64> = g.dead_letters().into_iter().collect();
            for off in 0..tail {
                assert!(
                    acked.contains(&off) ^ dead.contains(&off),
                    "seed {seed}: offset {off} is neither acked nor a dead letter (or both)"
                );
            }
            assert_eq!(g.cursor(), tail, "seed {seed}");
        }
    }
}
