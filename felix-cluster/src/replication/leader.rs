//! One shard's replication as its leader runs it: who is fed from where, how much is in
//! flight to each follower, the mark that releases acknowledgements, and the quorum deadline.
//!
//! Plain state driven by the engine, which does the reading and sending: the leader asks for
//! [`LeaderOutput::Ship`] (read the log's framed entries from an offset and send them), and is
//! told back what was sent ([`ShardLeader::shipped`]), what each follower reported, and how far
//! its own log is durable. It answers with the commit mark ([`LeaderOutput::Committed`]) and the
//! quorum publishes that ran out of time ([`LeaderOutput::TimedOut`]).
//!
//! Entries are shipped once the leader's own copy holds them durably, or, when the engine
//! reports writes ([`ShardLeader::written`]), once written: followers then sync in parallel
//! with the leader. A record counts as committed only once the leader itself holds it durably
//! (the quorum mark counts the leader among the holders), so a follower may hold records its
//! leader lost in a power cut; the leader never opens a generation twice
//! (`Command::Reopen`), and at the next one the epochs cut them away.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::divergence::{agreed_from, agreed_prefix, EpochLog};
use super::quorum::{QuorumMark, Report};
use super::Replica;
use crate::NodeId;

/// How a leader paces replication (each has a named limit in the engine's settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderSettings {
    /// Bytes shipped to one follower and not yet reported received.
    pub window_bytes: u64,
    /// The most one shipment reads.
    pub max_ship_bytes: usize,
    /// How long a quorum publish may wait for a majority.
    pub quorum_timeout: Duration,
    /// A shipment not reported received this long after it was sent is sent again (the
    /// follower drops what does not start at its end, and links can reorder or lose it).
    pub resend_after: Duration,
}

/// What the leader asks the engine to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderOutput {
    /// Read framed entries from `from` (at most `max_bytes`, at least one entry), send them
    /// to `to`, and report with [`ShardLeader::shipped`].
    Ship {
        to: NodeId,
        from: u64,
        max_bytes: usize,
    },
    /// Every record below `up_to` is committed: acknowledgements waiting on it go, and
    /// subscribers may see it.
    Committed { up_to: u64 },
    /// Quorum publishes ending at or below `up_to` did not reach a majority in time: their
    /// outcome is unknown (they may still be committed later).
    TimedOut { up_to: u64 },
}

/// Why a follower's request to be fed was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FollowRefused {
    /// Not in the shard's replica set.
    NotReplica,
}

/// The leader's answer to a follower's request to be fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowAnswer {
    /// Cut the copy at this offset (nothing to cut when it is the copy's end) and be fed
    /// from there: the end of the prefix both copies agree on.
    TruncateTo(u64),
    /// The copy cannot be fed from anything it holds (a new disk, or a log that stops agreeing
    /// with the leader's before the leader's first retained offset): drop it, start the log
    /// again empty at `from` (the leader's log start), and be fed from there.
    Rebuild { from: u64 },
}

/// A copy on a disk the metadata does not name for its replica, being fed until it is level.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NewDisk {
    storage_id: String,
    /// The leader's log end when the copy asked: it holds every record acknowledged at any
    /// generation so far (the fence adopted them, or this leadership wrote them). A copy
    /// durable to here has lost nothing its old disk was counted for.
    level_at: u64,
}

#[derive(Debug)]
struct Follower {
    replica: Replica,
    /// Where the next shipment starts; `None` until it asked to be fed at this generation.
    next: Option<u64>,
    /// The start of the read in flight for it, if any.
    reading: Option<u64>,
    /// Shipments it has not yet said it received: the start, end and bytes of each, and
    /// when it was sent.
    in_flight: VecDeque<(u64, u64, u64, Instant)>,
    in_flight_bytes: u64,
    report: Option<Report>,
    /// Fed onto a new disk: its reports count once it is level, not before.
    new_disk: Option<NewDisk>,
}

impl Follower {
    fn received(&mut self, end: u64) {
        while let Some(&(_, e, b, _)) = self.in_flight.front() {
            if e > end {
                break;
            }
            self.in_flight.pop_front();
            self.in_flight_bytes -= b;
        }
    }

    /// Forgets what is in flight and starts again from its oldest shipment.
    fn rewind(&mut self) {
        if let Some(&(start, _, _, _)) = self.in_flight.front() {
            self.next = Some(start);
        }
        self.in_flight.clear();
        self.in_flight_bytes = 0;
        self.reading = None;
    }
}

#[derive(Debug)]
pub struct ShardLeader {
    generation: u64,
    quorum: bool,
    settings: LeaderSettings,
    followers: Vec<Follower>,
    /// The leader's own log: its epochs and end.
    log: EpochLog,
    durable: u64,
    /// Written (maybe not synced) below this, as the engine reports it: shippable.
    written: u64,
    mark: QuorumMark,
    /// Quorum publishes owed an answer: the end of each, and when it times out.
    pending: VecDeque<(u64, Instant)>,
    out: VecDeque<LeaderOutput>,
    /// A `leader` shard's acknowledgements past this offset wait (`super::quiesce`).
    held_past: Option<u64>,
}

impl ShardLeader {
    /// Opens at `generation` over the leader's own log (`log`, durable up to `durable`), with
    /// `committed` known committed (everything the fence adopted). `quorum`: acknowledgements
    /// wait for a majority; otherwise the leader's own durability commits.
    pub fn new(
        generation: u64,
        followers: Vec<Replica>,
        quorum: bool,
        log: EpochLog,
        durable: u64,
        committed: u64,
        settings: LeaderSettings,
    ) -> ShardLeader {
        let followers = followers
            .into_iter()
            .map(|replica| Follower {
                replica,
                next: None,
                reading: None,
                in_flight: VecDeque::new(),
                in_flight_bytes: 0,
                report: None,
                new_disk: None,
            })
            .collect();
        let mut leader = ShardLeader {
            generation,
            quorum,
            settings,
            followers,
            log,
            durable,
            written: durable,
            mark: QuorumMark::starting_at(committed.min(durable)),
            pending: VecDeque::new(),
            out: VecDeque::new(),
            held_past: None,
        };
        leader.recompute();
        leader
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Everything below this is committed.
    pub fn commit(&self) -> u64 {
        if self.quorum {
            self.mark.get()
        } else {
            self.own_commit()
        }
    }

    /// A `leader` shard's commit: its own durability, up to a hold.
    fn own_commit(&self) -> u64 {
        self.held_past.map_or(self.durable, |h| self.durable.min(h))
    }

    /// Holds a `leader` shard's acknowledgements past `past` (or releases them, `None`):
    /// while the cluster records that its followers are level at `past`, nothing past it may
    /// be acknowledged (`super::quiesce`).
    pub fn hold(&mut self, past: Option<u64>) {
        if self.held_past != past {
            self.held_past = past;
            self.recompute();
        }
    }

    /// The leader's log end and how far its own copy is durable.
    pub fn end(&self) -> u64 {
        self.log.end
    }

    pub fn durable_end(&self) -> u64 {
        self.durable
    }

    /// Followers whose copies, on the disk the metadata counts, hold every record below
    /// `end` durably at this generation.
    pub fn level_with(&self, end: u64) -> Vec<NodeId> {
        self.followers
            .iter()
            .filter(|f| f.new_disk.is_none())
            .filter(|f| f.report.as_ref().is_some_and(|r| r.durable_end >= end))
            .map(|f| f.replica.node.clone())
            .collect()
    }

    /// The leader's epochs, for a follower's request to be fed and for fence answers.
    pub fn epochs(&self) -> &EpochLog {
        &self.log
    }

    /// Records the slowest follower lacks (durably): the bound on what a `leader` ack can
    /// lose at a failover. Followers that never reported count from zero.
    pub fn lag_records(&self) -> u64 {
        self.followers
            .iter()
            .map(|f| {
                let held = f.report.as_ref().map_or(0, |r| r.durable_end);
                self.log.end.saturating_sub(held)
            })
            .max()
            .unwrap_or(0)
    }

    /// The leader appended up to `end` (the log's next offset). A quorum publish among them
    /// is owed an answer by `now + quorum_timeout`: `owes_answer`.
    pub fn appended(&mut self, now: Instant, end: u64, owes_answer: bool) {
        self.extend_log(end);
        if self.quorum && owes_answer {
            self.pending
                .push_back((end, now + self.settings.quorum_timeout));
        }
    }

    /// The leader's own log holds records written at this generation up to `end`.
    fn extend_log(&mut self, end: u64) {
        if end <= self.log.end {
            return;
        }
        if self
            .log
            .epochs
            .last()
            .is_none_or(|&(g, _)| g != self.generation)
        {
            self.log.epochs.push((self.generation, self.log.end));
        }
        self.log.end = end;
    }

    /// The leader's own log holds (written, not yet synced) every record below `up_to`: it
    /// may be shipped now.
    pub fn written(&mut self, up_to: u64) {
        self.extend_log(up_to);
        if up_to > self.written {
            self.written = up_to;
            self.ship();
        }
    }

    /// The leader's own log is durable below `up_to`.
    pub fn durable(&mut self, up_to: u64) {
        // Not every write is announced by `appended` (only those owed an answer), but every
        // one becomes durable: the epochs a follower is compared with, and is cut to, must
        // hold everything shipped (shipping stops at `durable`), or a follower holding a
        // committed record the leader's epochs had not counted yet is cut below it.
        self.extend_log(up_to);
        if up_to > self.durable {
            self.durable = up_to;
            self.recompute();
            self.ship();
        }
    }

    /// A follower asks to be fed, describing its copy; `log_start` is the first offset the
    /// leader's log still holds. The answer is where it must cut its log and be fed from
    /// (the end of the prefix both copies agree on), or, when nothing it holds can be fed
    /// from, that it is rebuilt from `log_start`.
    ///
    /// A copy on a disk other than the one the metadata names (a wiped or replaced drive) is
    /// fed like any other, but its reports count for the quorum mark only once it is durable
    /// to the leader's log end as of its request (see [`ShardLeader::counted_storage`]): from
    /// then on it holds every record acknowledged before its old disk went, which is also
    /// when the control plane may record it. Counting it earlier would not break a quorum's
    /// overlap with a later fence (the fence counts only recorded disks, and the old one
    /// never answers again); one moment for both keeps "counted" meaning "a full copy".
    pub fn follow(
        &mut self,
        from: &NodeId,
        storage_id: &str,
        theirs: &EpochLog,
        log_start: u64,
    ) -> Result<FollowAnswer, FollowRefused> {
        self.follow_where(from, storage_id, theirs, log_start, |agreed, new_disk| {
            // A new disk keeps only what an earlier rebuild already fed it past the start.
            agreed.filter(|&a| !new_disk || a > log_start)
        })
    }

    /// [`follow`](Self::follow) for a log compaction rewrites (a stream shard's group log).
    /// Compaction drops records a later record made void (a dead letter and its discard),
    /// so a copy fed across a compacted part keeps what the leader no longer has: such a
    /// copy may be fed only from empty. One that would need a cut, or whose end lies below
    /// `complete_from` (where the leader's log starts holding every record), is rebuilt from
    /// `log_start`, as is a new disk not yet fed past it; the others are fed on from their
    /// end. The
    /// leader keeps compaction below what every follower holds (the engine bounds it by
    /// [`lag_records`](Self::lag_records)), so a follower being fed never meets a part
    /// compacted after it passed.
    pub fn follow_compacted(
        &mut self,
        from: &NodeId,
        storage_id: &str,
        theirs: &EpochLog,
        log_start: u64,
        complete_from: u64,
    ) -> Result<FollowAnswer, FollowRefused> {
        let end = theirs.end;
        self.follow_where(from, storage_id, theirs, log_start, |agreed, new_disk| {
            agreed.filter(|&a| a == end && end >= complete_from && (!new_disk || a > log_start))
        })
    }

    /// `follow`'s bookkeeping, with `feed_from` deciding from the agreed prefix (if any can
    /// be fed from) and whether the copy is on a new disk: `Some(at)` cuts there and feeds
    /// on, `None` rebuilds from `log_start`.
    fn follow_where(
        &mut self,
        from: &NodeId,
        storage_id: &str,
        theirs: &EpochLog,
        log_start: u64,
        feed_from: impl FnOnce(Option<u64>, bool) -> Option<u64>,
    ) -> Result<FollowAnswer, FollowRefused> {
        let log = &self.log;
        let f = self
            .followers
            .iter_mut()
            .find(|f| f.replica.node == *from)
            .ok_or(FollowRefused::NotReplica)?;
        // An empty id: the metadata had not recorded this replica's disk when this
        // leadership began (it is filled on the node's first join). The disk asking now is
        // the one the join records, so it is taken; a known id must match, or the copy is a
        // new disk's.
        if f.replica.storage_id.is_empty() {
            f.replica.storage_id = storage_id.to_owned();
        }
        f.new_disk = (f.replica.storage_id != storage_id).then(|| NewDisk {
            storage_id: storage_id.to_owned(),
            level_at: log.end,
        });
        let answer = match feed_from(agreement(theirs, log, log_start), f.new_disk.is_some()) {
            Some(agreed) => FollowAnswer::TruncateTo(agreed),
            None => FollowAnswer::Rebuild { from: log_start },
        };
        f.next = Some(match answer {
            FollowAnswer::TruncateTo(at) => at,
            FollowAnswer::Rebuild { from } => from,
        });
        // A read still in flight for an earlier request is ignored when it lands.
        f.reading = None;
        f.in_flight.clear();
        f.in_flight_bytes = 0;
        f.report = None;
        self.recompute();
        self.ship();
        Ok(answer)
    }

    /// The disk each follower's reports are counted from now: the metadata's, or a new one
    /// fed level since. The engine asks the control plane to record a new one, so that
    /// fences and promotions at later generations count it too.
    pub fn counted_storage(&self) -> impl Iterator<Item = &Replica> {
        self.followers.iter().map(|f| &f.replica)
    }

    /// The read asked for by `Ship { to, from, .. }` found entries up to `end` (`bytes` long)
    /// and they were sent at `now`. A stale read (the follower asked again meanwhile) is
    /// ignored.
    pub fn shipped(&mut self, now: Instant, to: &NodeId, from: u64, end: u64, bytes: u64) {
        let Some(f) = self.followers.iter_mut().find(|f| f.replica.node == *to) else {
            return;
        };
        if f.reading != Some(from) {
            return;
        }
        f.reading = None;
        if end > from {
            f.next = Some(end);
            f.in_flight.push_back((from, end, bytes, now));
            f.in_flight_bytes += bytes;
        }
        self.ship();
    }

    /// The read for `to` found nothing to send (its start is gone from the log, or the log
    /// failed): `to` is no longer fed until it asks again.
    pub fn ship_failed(&mut self, to: &NodeId) {
        if let Some(f) = self.followers.iter_mut().find(|f| f.replica.node == *to) {
            f.next = None;
            f.reading = None;
        }
    }

    /// A follower's report: how far it has received and made durable, at `generation`, on the
    /// disk `storage_id`.
    pub fn report(
        &mut self,
        from: &NodeId,
        generation: u64,
        storage_id: &str,
        end: u64,
        durable_end: u64,
    ) {
        let Some(f) = self.followers.iter_mut().find(|f| f.replica.node == *from) else {
            return;
        };
        if generation != self.generation || f.next.is_none() {
            return;
        }
        f.received(end);
        let level = f
            .new_disk
            .as_ref()
            .is_some_and(|d| d.storage_id == storage_id && durable_end >= d.level_at);
        if level {
            // From now on the copy counts from its new disk.
            f.replica.storage_id = storage_id.to_owned();
            f.new_disk = None;
        }
        let durable_end = f
            .report
            .as_ref()
            .map_or(durable_end, |r| r.durable_end.max(durable_end));
        f.report = Some(Report {
            generation,
            storage_id: storage_id.to_owned(),
            durable_end,
        });
        self.recompute();
        self.ship();
    }

    /// Times out quorum publishes past their deadline that the mark has not reached, and
    /// sends again shipments no follower report covered in time.
    pub fn handle_timeout(&mut self, now: Instant) {
        let resend_after = self.settings.resend_after;
        let mut rewound = false;
        for f in &mut self.followers {
            let stale = f
                .in_flight
                .front()
                .is_some_and(|&(_, _, _, at)| now.saturating_duration_since(at) >= resend_after);
            if stale {
                f.rewind();
                rewound = true;
            }
        }
        if rewound {
            self.ship();
        }
        let mut timed_out = None;
        while let Some(&(end, deadline)) = self.pending.front() {
            if deadline > now {
                break;
            }
            self.pending.pop_front();
            timed_out = Some(end);
        }
        if let Some(up_to) = timed_out {
            self.out.push_back(LeaderOutput::TimedOut { up_to });
        }
    }

    /// The next quorum deadline or resend.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let resend = self
            .followers
            .iter()
            .filter_map(|f| {
                f.in_flight
                    .front()
                    .map(|&(_, _, _, at)| at + self.settings.resend_after)
            })
            .min();
        self.pending
            .front()
            .map(|&(_, d)| d)
            .into_iter()
            .chain(resend)
            .min()
    }

    pub fn poll_output(&mut self) -> Option<LeaderOutput> {
        self.out.pop_front()
    }

    fn recompute(&mut self) {
        if !self.quorum {
            let durable = self.own_commit();
            let followers: &[(&Replica, Option<&Report>)] = &[];
            // With no followers counted the mark is the leader's own durable end.
            if let Some(up_to) = self.mark.update(self.generation, durable, followers) {
                self.out.push_back(LeaderOutput::Committed { up_to });
            }
            return;
        }
        let pairs: Vec<(&Replica, Option<&Report>)> = self
            .followers
            .iter()
            .map(|f| (&f.replica, f.report.as_ref()))
            .collect();
        if let Some(up_to) = self.mark.update(self.generation, self.durable, &pairs) {
            while self.pending.front().is_some_and(|&(end, _)| end <= up_to) {
                self.pending.pop_front();
            }
            self.out.push_back(LeaderOutput::Committed { up_to });
        }
    }

    /// Asks for a read for every follower that is fed, has nothing in flight, lacks durable
    /// entries, and has room in its window.
    fn ship(&mut self) {
        for f in &mut self.followers {
            let Some(next) = f.next else { continue };
            // At least one shipment is always allowed, however large.
            let in_window = f.in_flight_bytes < self.settings.window_bytes;
            let shippable = self.durable.max(self.written);
            if f.reading.is_none() && next < shippable && in_window {
                f.reading = Some(next);
                self.out.push_back(LeaderOutput::Ship {
                    to: f.replica.node.clone(),
                    from: next,
                    max_bytes: self.settings.max_ship_bytes,
                });
            }
        }
    }
}

/// How far a follower's copy agrees with the leader's log, counted only where the leader
/// still holds records: from 0 when the leader's log still starts there, else from
/// `log_start`, which both must hold at one generation (a record at one offset and
/// generation is the same record, and so is everything before it). `None`: nothing the
/// follower holds can be fed from.
fn agreement(theirs: &EpochLog, log: &EpochLog, log_start: u64) -> Option<u64> {
    let agreed = agreed_prefix(theirs, log);
    if agreed >= log_start {
        return Some(agreed);
    }
    agreed_from(theirs, log, log_start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(node: &str) -> Replica {
        Replica {
            node: NodeId::new(node),
            storage_id: format!("disk-{node}"),
        }
    }

    fn n(node: &str) -> NodeId {
        NodeId::new(node)
    }

    const SETTINGS: LeaderSettings = LeaderSettings {
        window_bytes: 100,
        max_ship_bytes: 64,
        quorum_timeout: Duration::from_millis(500),
        resend_after: Duration::from_millis(200),
    };

    fn leader(quorum: bool, followers: &[&str]) -> ShardLeader {
        let set = followers.iter().map(|f| r(f)).collect();
        ShardLeader::new(2, set, quorum, EpochLog::default(), 0, 0, SETTINGS)
    }

    fn drain(l: &mut ShardLeader) -> Vec<String> {
        std::iter::from_fn(|| l.poll_output())
            .map(|o| match o {
                LeaderOutput::Ship { to, from, .. } => format!("ship {to} from {from}"),
                LeaderOutput::Committed { up_to } => format!("committed {up_to}"),
                LeaderOutput::TimedOut { up_to } => format!("timed out {up_to}"),
            })
            .collect()
    }

    fn empty() -> EpochLog {
        EpochLog::default()
    }

    #[test]
    fn a_quorum_publish_commits_once_one_follower_of_two_holds_it_durably() {
        let t = Instant::now();
        let mut l = leader(true, &["n2", "n3"]);
        assert!(drain(&mut l).is_empty());
        assert_eq!(
            l.follow(&n("n2"), "disk-n2", &empty(), 0),
            Ok(FollowAnswer::TruncateTo(0))
        );
        assert_eq!(
            l.follow(&n("n3"), "disk-n3", &empty(), 0),
            Ok(FollowAnswer::TruncateTo(0))
        );
        l.appended(t, 3, true);
        // Not shipped before the leader's own copy is durable.
        assert!(drain(&mut l).is_empty());
        l.durable(3);
        assert_eq!(drain(&mut l), ["ship n2 from 0", "ship n3 from 0"]);
        l.shipped(t, &n("n2"), 0, 3, 40);
        l.shipped(t, &n("n3"), 0, 3, 40);
        // Received but not durable yet: nothing commits.
        l.report(&n("n2"), 2, "disk-n2", 3, 0);
        assert!(drain(&mut l).is_empty());
        assert_eq!(l.lag_records(), 3);
        l.report(&n("n2"), 2, "disk-n2", 3, 3);
        assert_eq!(drain(&mut l), ["committed 3"]);
        assert_eq!(l.commit(), 3);
        // The deadline passed after the commit: nothing times out; n3, silent, is sent its
        // shipment again.
        l.handle_timeout(t + Duration::from_secs(1));
        assert_eq!(drain(&mut l), ["ship n3 from 0"]);
        l.report(&n("n3"), 2, "disk-n3", 3, 3);
        assert_eq!(l.poll_timeout(), None);
    }

    #[test]
    fn written_entries_ship_before_the_leaders_sync_and_commit_only_once_it_holds_them() {
        let t = Instant::now();
        let mut l = leader(true, &["n2", "n3"]);
        for f in ["n2", "n3"] {
            let disk = format!("disk-{f}");
            assert_eq!(
                l.follow(&n(f), &disk, &empty(), 0),
                Ok(FollowAnswer::TruncateTo(0))
            );
        }
        l.appended(t, 3, true);
        assert!(drain(&mut l).is_empty(), "not written yet");
        l.written(3);
        assert_eq!(drain(&mut l), ["ship n2 from 0", "ship n3 from 0"]);
        l.shipped(t, &n("n2"), 0, 3, 40);
        l.shipped(t, &n("n3"), 0, 3, 40);
        // Both followers hold it durably before the leader does: no commit, since the
        // leader could still lose it.
        l.report(&n("n2"), 2, "disk-n2", 3, 3);
        l.report(&n("n3"), 2, "disk-n3", 3, 3);
        assert!(drain(&mut l).is_empty());
        assert_eq!(l.commit(), 0);
        l.durable(3);
        assert_eq!(drain(&mut l), ["committed 3"]);
    }

    #[test]
    fn a_write_owed_no_answer_counts_in_the_epochs_a_rejoining_follower_is_cut_to() {
        // Sim replicated seed 1529: a fire-and-forget record at 8 was committed (leader and
        // n2 durable), then n2 restarted and asked to be fed; the leader's epochs ended at 8
        // (the last write owed an answer), so n2 was told to cut the committed record.
        let t = Instant::now();
        let mut l = leader(true, &["n2", "n3"]);
        l.follow(&n("n2"), "disk-n2", &empty(), 0).unwrap();
        l.appended(t, 8, true);
        l.durable(9); // record 8 was a publish nobody waits for
        assert_eq!(drain(&mut l), ["ship n2 from 0"]);
        l.shipped(t, &n("n2"), 0, 9, 90);
        l.report(&n("n2"), 2, "disk-n2", 9, 9);
        assert_eq!(drain(&mut l), ["committed 9"]);
        assert_eq!(
            l.epochs(),
            &EpochLog {
                epochs: vec![(2, 0)],
                end: 9
            }
        );
        let n2 = EpochLog {
            epochs: vec![(2, 0)],
            end: 9,
        };
        assert_eq!(
            l.follow(&n("n2"), "disk-n2", &n2, 0),
            Ok(FollowAnswer::TruncateTo(9))
        );
    }

    #[test]
    fn a_replica_whose_disk_the_metadata_had_not_recorded_is_fed_and_then_known_by_it() {
        let t = Instant::now();
        let followers = vec![
            Replica {
                node: n("n2"),
                storage_id: String::new(),
            },
            Replica {
                node: n("n3"),
                storage_id: "disk-n3".into(),
            },
        ];
        let mut l = ShardLeader::new(2, followers, true, EpochLog::default(), 0, 0, SETTINGS);
        assert_eq!(
            l.follow(&n("n2"), "disk-n2", &empty(), 0),
            Ok(FollowAnswer::TruncateTo(0))
        );
        // Known from now on: another disk under that name is a new one, rebuilt.
        assert_eq!(
            l.follow(&n("n2"), "disk-n2-wiped", &empty(), 0),
            Ok(FollowAnswer::Rebuild { from: 0 })
        );
        l.follow(&n("n2"), "disk-n2", &empty(), 0).unwrap();
        l.appended(t, 1, true);
        l.durable(1);
        drain(&mut l);
        l.report(&n("n2"), 2, "disk-n2", 1, 1);
        assert_eq!(drain(&mut l), ["committed 1"]);
    }

    #[test]
    fn reports_from_another_generation_or_disk_count_for_nothing() {
        let t = Instant::now();
        let mut l = leader(true, &["n2", "n3"]);
        assert_eq!(
            l.follow(&n("n2"), "disk-n2-wiped", &empty(), 0),
            Ok(FollowAnswer::Rebuild { from: 0 })
        );
        assert_eq!(
            l.follow(&n("n9"), "disk-n9", &empty(), 0),
            Err(FollowRefused::NotReplica)
        );
        l.follow(&n("n2"), "disk-n2", &empty(), 0).unwrap();
        l.appended(t, 1, true);
        l.durable(1);
        drain(&mut l);
        l.report(&n("n2"), 1, "disk-n2", 1, 1);
        l.report(&n("n3"), 2, "disk-n3", 1, 1); // never asked to be fed
        assert!(drain(&mut l).is_empty());
        assert_eq!(l.commit(), 0);
    }

    #[test]
    fn without_a_majority_a_quorum_publish_times_out_and_may_still_commit_later() {
        let t = Instant::now();
        let mut l = leader(true, &["n2", "n3"]);
        l.follow(&n("n2"), "disk-n2", &empty(), 0).unwrap();
        l.appended(t, 2, true);
        l.appended(t + Duration::from_millis(100), 5, true);
        l.durable(5);
        drain(&mut l);
        assert_eq!(l.poll_timeout(), Some(t + Duration::from_millis(500)));
        l.handle_timeout(t + Duration::from_millis(499));
        assert!(drain(&mut l).is_empty());
        l.handle_timeout(t + Duration::from_millis(500));
        assert_eq!(drain(&mut l), ["timed out 2"]);
        l.handle_timeout(t + Duration::from_millis(600));
        assert_eq!(drain(&mut l), ["timed out 5"]);
        l.shipped(t, &n("n2"), 0, 5, 10);
        l.report(&n("n2"), 2, "disk-n2", 5, 5);
        assert_eq!(drain(&mut l), ["committed 5"]);
    }

    #[test]
    fn a_follower_gets_no_more_than_its_window_until_it_says_it_received() {
        let t = Instant::now();
        let mut l = leader(true, &["n2", "n3"]);
        l.follow(&n("n2"), "disk-n2", &empty(), 0).unwrap();
        l.appended(t, 10, true);
        l.durable(10);
        assert_eq!(drain(&mut l), ["ship n2 from 0"]);
        l.shipped(t, &n("n2"), 0, 4, 60);
        assert_eq!(drain(&mut l), ["ship n2 from 4"]);
        l.shipped(t, &n("n2"), 4, 8, 60);
        // 120 bytes unacknowledged, past the 100-byte window.
        assert!(drain(&mut l).is_empty());
        l.report(&n("n2"), 2, "disk-n2", 4, 0);
        assert_eq!(drain(&mut l), ["ship n2 from 8"]);
    }

    #[test]
    fn a_follower_that_asks_again_is_fed_from_the_agreed_prefix_and_a_stale_read_is_ignored() {
        let t = Instant::now();
        let mut l = ShardLeader::new(
            3,
            vec![r("n2")],
            true,
            EpochLog {
                epochs: vec![(1, 0), (3, 6)],
                end: 6,
            },
            6,
            6,
            SETTINGS,
        );
        l.appended(t, 9, true);
        l.durable(9);
        // The follower wrote 0..8 at generation 1: it agrees up to 6.
        let theirs = EpochLog {
            epochs: vec![(1, 0)],
            end: 8,
        };
        assert_eq!(
            l.follow(&n("n2"), "disk-n2", &theirs, 0),
            Ok(FollowAnswer::TruncateTo(6))
        );
        assert_eq!(drain(&mut l), ["ship n2 from 6"]);
        assert_eq!(
            l.follow(&n("n2"), "disk-n2", &theirs, 0),
            Ok(FollowAnswer::TruncateTo(6))
        );
        assert_eq!(drain(&mut l), ["ship n2 from 6"]);
        l.shipped(t, &n("n2"), 6, 9, 30);
        l.shipped(t, &n("n2"), 6, 9, 30); // the earlier read, landing late
        assert!(drain(&mut l).is_empty());
        l.report(&n("n3"), 3, "disk-n3", 9, 9);
        l.report(&n("n2"), 3, "disk-n2", 9, 9);
        assert_eq!(drain(&mut l), ["committed 9"]);
    }

    #[test]
    fn a_shipment_no_report_covers_is_sent_again_from_its_start() {
        let t = Instant::now();
        let mut l = leader(true, &["n2", "n3"]);
        l.follow(&n("n2"), "disk-n2", &empty(), 0).unwrap();
        l.appended(t, 2, true);
        l.durable(2);
        assert_eq!(drain(&mut l), ["ship n2 from 0"]);
        l.shipped(t, &n("n2"), 0, 2, 10);
        assert_eq!(l.poll_timeout(), Some(t + Duration::from_millis(200)));
        l.handle_timeout(t + Duration::from_millis(199));
        assert!(drain(&mut l).is_empty());
        // Lost on the way (or it arrived before the follower was ready for it).
        l.handle_timeout(t + Duration::from_millis(200));
        assert_eq!(drain(&mut l), ["ship n2 from 0"]);
        l.shipped(t + Duration::from_millis(200), &n("n2"), 0, 2, 10);
        l.report(&n("n2"), 2, "disk-n2", 2, 2);
        assert_eq!(drain(&mut l), ["committed 2"]);
        assert_eq!(l.poll_timeout(), None);
    }

    #[test]
    fn leader_consistency_commits_on_the_leaders_own_durability() {
        let t = Instant::now();
        let mut l = leader(false, &["n2", "n3"]);
        l.appended(t, 4, true);
        l.durable(4);
        assert_eq!(drain(&mut l), ["committed 4"]);
        assert_eq!(l.poll_timeout(), None);
        assert_eq!(l.lag_records(), 4);
    }

    #[test]
    fn a_set_of_one_needs_one() {
        let t = Instant::now();
        let mut l = leader(true, &[]);
        l.appended(t, 2, true);
        l.durable(2);
        assert_eq!(drain(&mut l), ["committed 2"]);
    }

    /// `G@S,…/END` → an epoch list and an end; `-/0` is an empty log.
    fn log(s: &str) -> EpochLog {
        let (epochs, end) = s.rsplit_once('/').unwrap();
        let epochs = epochs
            .split(',')
            .filter(|e| *e != "-")
            .map(|e| {
                let (g, start) = e.split_once('@').unwrap();
                (g.parse().unwrap(), start.parse().unwrap())
            })
            .collect();
        EpochLog {
            epochs,
            end: end.parse().unwrap(),
        }
    }

    #[test]
    fn a_compacted_logs_copy_is_fed_on_only_from_its_end_and_past_the_compacted_part() {
        // (disk asking, its copy, the leader's log, its first offset, where it holds every
        // record from) → the answer.
        let cases = [
            // Level with the leader's epochs, past the compacted part: fed on.
            ("disk-n2", "1@0/30", "1@0,2@30/40", 0, 20, "truncate to 30"),
            ("disk-n2", "1@0/20", "1@0,2@30/40", 0, 20, "truncate to 20"),
            // Its end lies in the compacted part: a record voided there may still be here.
            ("disk-n2", "1@0/15", "1@0,2@30/40", 0, 20, "rebuild from 0"),
            // It would need a cut (a dead leader's suffix): rebuilt, never cut.
            (
                "disk-n2",
                "1@0,3@32/35",
                "1@0,2@30/40",
                0,
                0,
                "rebuild from 0",
            ),
            ("disk-n2", "1@0/45", "1@0,2@30/40", 0, 0, "rebuild from 0"),
            // Empty where the leader starts: fed from there (the rebuild's own start).
            ("disk-n2", "-/0", "1@0,2@30/40", 0, 20, "rebuild from 0"),
            ("disk-n2", "-/0", "1@0,2@30/40", 0, 0, "truncate to 0"),
            // A new disk: rebuilt, unless a rebuild already fed it past the start.
            ("disk-n2-new", "-/0", "1@0,2@30/40", 0, 0, "rebuild from 0"),
            (
                "disk-n2-new",
                "1@0,2@30/33",
                "1@0,2@30/40",
                0,
                20,
                "truncate to 33",
            ),
        ];
        let mut got = Vec::new();
        for (disk, theirs, ours, start, complete, _) in cases {
            let mut l = ShardLeader::new(2, vec![r("n2")], true, log(ours), 0, 0, SETTINGS);
            let answer = l.follow_compacted(&n("n2"), disk, &log(theirs), start, complete);
            got.push(match answer {
                Ok(FollowAnswer::TruncateTo(t)) => format!("truncate to {t}"),
                Ok(FollowAnswer::Rebuild { from }) => format!("rebuild from {from}"),
                Err(e) => format!("{e:?}"),
            });
        }
        let want: Vec<&str> = cases.iter().map(|c| c.5).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_copy_that_cannot_be_fed_from_its_own_log_is_rebuilt_from_the_leaders_start() {
        // (disk asking, its copy, the leader's log, the leader's first retained offset) →
        // the answer. n2's copy lives on `disk-n2` as far as the metadata knows.
        let cases = [
            ("disk-n2", "1@0/30", "1@0,2@30/40", 0, "truncate to 30"),
            // Behind the leader's start: nothing it holds is still on the leader.
            ("disk-n2", "1@0/15", "1@0,2@30/40", 20, "rebuild from 20"),
            // Holds the start at the leader's generation: fed from where they part.
            ("disk-n2", "1@0/25", "1@0,2@30/40", 20, "truncate to 25"),
            // Holds the start, but written at a generation the leader's log lacks there.
            (
                "disk-n2",
                "1@0,3@18/35",
                "1@0,2@15/40",
                20,
                "rebuild from 20",
            ),
            // A copy started at the leader's start before (rebuilt there) is fed on.
            ("disk-n2", "2@20/33", "1@0,2@15/40", 20, "truncate to 33"),
            // A new disk is rebuilt from the start, even where the leader kept everything...
            ("disk-n2-new", "-/0", "1@0,2@30/40", 0, "rebuild from 0"),
            ("disk-n2-new", "-/0", "1@0,2@30/40", 20, "rebuild from 20"),
            // ...unless an earlier rebuild of that disk already fed it past the start.
            (
                "disk-n2-new",
                "2@20/33",
                "1@0,2@15/40",
                20,
                "truncate to 33",
            ),
            (
                "disk-n2-new",
                "1@0,2@30/32",
                "1@0,2@30/40",
                0,
                "truncate to 32",
            ),
        ];
        let mut got = Vec::new();
        for (disk, theirs, ours, start, _) in cases {
            let mut l = ShardLeader::new(2, vec![r("n2")], true, log(ours), 0, 0, SETTINGS);
            got.push(match l.follow(&n("n2"), disk, &log(theirs), start) {
                Ok(FollowAnswer::TruncateTo(t)) => format!("truncate to {t}"),
                Ok(FollowAnswer::Rebuild { from }) => format!("rebuild from {from}"),
                Err(e) => format!("{e:?}"),
            });
        }
        let want: Vec<&str> = cases.iter().map(|c| c.4).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_new_disk_counts_for_the_quorum_once_it_holds_the_leaders_log_as_of_its_request() {
        let t = Instant::now();
        let mut l = leader(true, &["n2", "n3"]);
        l.follow(&n("n2"), "disk-n2", &empty(), 0).unwrap();
        l.appended(t, 5, true);
        l.durable(5);
        drain(&mut l);
        l.shipped(t, &n("n2"), 0, 5, 50);
        l.report(&n("n2"), 2, "disk-n2", 5, 5);
        assert_eq!(drain(&mut l), ["committed 5"]);
        // n3 comes back on an empty disk while the leader holds 0..5.
        assert_eq!(
            l.follow(&n("n3"), "disk-n3-new", &empty(), 0),
            Ok(FollowAnswer::Rebuild { from: 0 })
        );
        assert_eq!(drain(&mut l), ["ship n3 from 0"]);
        l.shipped(t, &n("n3"), 0, 3, 30);
        // Half way, and n2 gone quiet: a write needs n3, which is not level yet.
        l.appended(t, 6, true);
        l.durable(6);
        drain(&mut l);
        l.report(&n("n3"), 2, "disk-n3-new", 3, 3);
        assert!(drain(&mut l).iter().all(|o| o.starts_with("ship")));
        assert_eq!(l.commit(), 5);
        let counted = |l: &ShardLeader| {
            l.counted_storage()
                .map(|r| format!("{}={}", r.node, r.storage_id))
                .collect::<Vec<_>>()
        };
        assert_eq!(counted(&l), ["n2=disk-n2", "n3=disk-n3"]);
        // Durable to 5, the leader's end when it asked: level, and counted from its new disk.
        l.shipped(t, &n("n3"), 3, 6, 30);
        l.report(&n("n3"), 2, "disk-n3-new", 6, 6);
        assert_eq!(drain(&mut l), ["committed 6"]);
        assert_eq!(counted(&l), ["n2=disk-n2", "n3=disk-n3-new"]);
        // The old disk is not heard from again: it no longer counts.
        l.report(&n("n3"), 2, "disk-n3", 9, 9);
        assert_eq!(l.commit(), 6);
    }
}
