//! A history checker for runs against a real cluster (the chaos test, `chaos/`): what the
//! clients were told about their publishes, set against what the shards hold when read back.
//! Pure: it takes the record of a run and returns a verdict, no I/O.
//!
//! The checks, each a [`Violation`] that names the shard, offset and payload:
//! - **lost write**: an acknowledged record is not at its offset with its payload;
//! - **conflict**: two reads disagree on what one offset holds;
//! - **gap**: a shard's offsets are not contiguous from the first one read;
//! - **duplicate**: a payload sits at more offsets than it was sent times;
//! - **phantom**: a payload no client sent.
//!
//! A publish that failed or whose outcome is unknown may or may not be in the log; either is
//! fine, and the [`Stats`] count how many were. Shards named in [`Tolerance::loss_allowed`]
//! (a `leader`-consistency shard whose leader came back on an empty disk: the one loss the
//! spec allows) report lost writes as tolerated instead of as violations; every other check
//! holds.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use bytes::Bytes;

/// One shard of one stream.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardId {
    pub stream: String,
    pub shard: u32,
}

impl ShardId {
    pub fn new(stream: &str, shard: u32) -> ShardId {
        ShardId {
            stream: stream.to_owned(),
            shard,
        }
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.stream, self.shard)
    }
}

/// What a client learned about one publish of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// The broker acknowledged the record at `offset` of `shard`.
    Acked {
        client: u32,
        shard: ShardId,
        offset: u64,
        payload: Bytes,
    },
    /// The broker refused it, saying it was not written.
    Failed { client: u32, payload: Bytes },
    /// No answer, a lost connection, or an answer that says the outcome is unknown.
    Unknown { client: u32, payload: Bytes },
}

impl Op {
    fn payload(&self) -> &Bytes {
        match self {
            Op::Acked { payload, .. }
            | Op::Failed { payload, .. }
            | Op::Unknown { payload, .. } => payload,
        }
    }
}

/// One read of a shard: `(offset, payload)` records. A shard may be read more than once
/// (from several replicas, or before and after a fault); the reads must agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub shard: ShardId,
    pub records: Vec<(u64, Bytes)>,
}

/// Where losing an acknowledged write is allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tolerance {
    pub loss_allowed: BTreeSet<ShardId>,
}

/// A broken promise, with what it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// An acknowledged record is not at its offset; `found` is what is there, if anything.
    Lost {
        shard: ShardId,
        offset: u64,
        payload: Bytes,
        client: u32,
        found: Option<Bytes>,
    },
    /// Two reads of `shard` hold different records at `offset`.
    Conflict {
        shard: ShardId,
        offset: u64,
        first: Bytes,
        second: Bytes,
    },
    /// No read holds offsets `from..to` of `shard`, though offsets on both sides were read.
    Gap { shard: ShardId, from: u64, to: u64 },
    /// `payload` sits at more places than it was sent times.
    Duplicate {
        payload: Bytes,
        at: Vec<(ShardId, u64)>,
        sent: usize,
        acked: bool,
    },
    /// A record no client sent.
    Phantom {
        shard: ShardId,
        offset: u64,
        payload: Bytes,
    },
}

impl Violation {
    /// `lost write`, `conflict`, `gap`, `duplicate` or `phantom`, as the message starts.
    pub fn kind(&self) -> &'static str {
        match self {
            Violation::Lost { .. } => "lost write",
            Violation::Conflict { .. } => "conflict",
            Violation::Gap { .. } => "gap",
            Violation::Duplicate { .. } => "duplicate",
            Violation::Phantom { .. } => "phantom",
        }
    }

    /// Sort key: kind, then place.
    fn key(&self) -> (u8, Option<(ShardId, u64)>) {
        match self {
            Violation::Lost { shard, offset, .. } => (0, Some((shard.clone(), *offset))),
            Violation::Conflict { shard, offset, .. } => (1, Some((shard.clone(), *offset))),
            Violation::Gap { shard, from, .. } => (2, Some((shard.clone(), *from))),
            Violation::Duplicate { at, .. } => (3, at.first().cloned()),
            Violation::Phantom { shard, offset, .. } => (4, Some((shard.clone(), *offset))),
        }
    }
}

/// A payload for a message: quoted text if it is printable ASCII, else hex (both cut at 48).
fn show(payload: &[u8]) -> String {
    const CUT: usize = 48;
    let head = &payload[..payload.len().min(CUT)];
    let more = if payload.len() > CUT { "…" } else { "" };
    if head.iter().all(|b| (0x20..0x7f).contains(b) && *b != b'"') {
        format!("\"{}{more}\"", String::from_utf8_lossy(head))
    } else {
        let hex: String = head.iter().map(|b| format!("{b:02x}")).collect();
        format!("0x{hex}{more}")
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Lost {
                shard,
                offset,
                payload,
                client,
                found,
            } => {
                write!(
                    f,
                    "lost write: {shard} offset {offset}: acked to client {client} with payload {}, read back ",
                    show(payload)
                )?;
                match found {
                    Some(p) => write!(f, "{}", show(p)),
                    None => f.write_str("nothing"),
                }
            }
            Violation::Conflict {
                shard,
                offset,
                first,
                second,
            } => write!(
                f,
                "conflict: {shard} offset {offset} read as {} and as {}",
                show(first),
                show(second)
            ),
            Violation::Gap { shard, from, to } => {
                if to - from == 1 {
                    write!(f, "gap: {shard} offset {from} missing")
                } else {
                    write!(f, "gap: {shard} offsets {from}..={} missing", to - 1)
                }
            }
            Violation::Duplicate {
                payload,
                at,
                sent,
                acked,
            } => {
                let places: Vec<String> =
                    at.iter().map(|(s, o)| format!("{s} offset {o}")).collect();
                write!(
                    f,
                    "duplicate: payload {} ({}) at {}, sent {sent} time{}",
                    show(payload),
                    if *acked { "acked" } else { "never acked" },
                    places.join(", "),
                    if *sent == 1 { "" } else { "s" }
                )
            }
            Violation::Phantom {
                shard,
                offset,
                payload,
            } => write!(
                f,
                "phantom: {shard} offset {offset} holds payload {}, which no client sent",
                show(payload)
            ),
        }
    }
}

/// Counts over the history.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub acked: usize,
    pub failed: usize,
    pub unknown: usize,
    /// Distinct `(shard, offset)` places read.
    pub records_read: usize,
    pub shards_read: usize,
    /// Failed publishes whose payload is in the log anyway.
    pub failed_visible: usize,
    /// Publishes of unknown outcome whose payload is in the log.
    pub unknown_visible: usize,
}

/// The verdict on one history.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub violations: Vec<Violation>,
    /// Lost writes on shards where [`Tolerance`] allows them.
    pub tolerated: Vec<Violation>,
    pub stats: Stats,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        writeln!(
            f,
            "history: {} acked, {} failed ({} visible), {} unknown ({} visible); {} records read on {} shards",
            s.acked, s.failed, s.failed_visible, s.unknown, s.unknown_visible, s.records_read, s.shards_read
        )?;
        for t in &self.tolerated {
            writeln!(f, "tolerated: {t}")?;
        }
        if self.violations.is_empty() {
            writeln!(f, "verdict: clean")
        } else {
            for v in &self.violations {
                writeln!(f, "violation: {v}")?;
            }
            writeln!(f, "verdict: {} violations", self.violations.len())
        }
    }
}

/// Checks `ops` against `reads`.
pub fn check(ops: &[Op], reads: &[Read], tolerance: &Tolerance) -> Report {
    let mut report = Report::default();
    let mut violations = Vec::new();

    // What each place holds, merged over every read; a disagreement is a conflict, reported
    // once per place and record.
    let mut held: BTreeMap<&ShardId, BTreeMap<u64, &Bytes>> = BTreeMap::new();
    let mut conflicts: BTreeSet<(&ShardId, u64, &Bytes)> = BTreeSet::new();
    for read in reads {
        let places = held.entry(&read.shard).or_default();
        for (offset, payload) in &read.records {
            match places.get(offset) {
                None => {
                    places.insert(*offset, payload);
                }
                Some(first) if *first == payload => {}
                Some(first) => {
                    if conflicts.insert((&read.shard, *offset, payload)) {
                        violations.push(Violation::Conflict {
                            shard: read.shard.clone(),
                            offset: *offset,
                            first: (*first).clone(),
                            second: payload.clone(),
                        });
                    }
                }
            }
        }
    }

    let mut sent: HashMap<&Bytes, usize> = HashMap::new();
    let mut acked: BTreeSet<&Bytes> = BTreeSet::new();
    for op in ops {
        *sent.entry(op.payload()).or_default() += 1;
        match op {
            Op::Acked {
                client,
                shard,
                offset,
                payload,
            } => {
                report.stats.acked += 1;
                acked.insert(payload);
                let found = held.get(shard).and_then(|p| p.get(offset)).copied();
                if found != Some(payload) {
                    let lost = Violation::Lost {
                        shard: shard.clone(),
                        offset: *offset,
                        payload: payload.clone(),
                        client: *client,
                        found: found.cloned(),
                    };
                    if tolerance.loss_allowed.contains(shard) {
                        report.tolerated.push(lost);
                    } else {
                        violations.push(lost);
                    }
                }
            }
            Op::Failed { .. } => report.stats.failed += 1,
            Op::Unknown { .. } => report.stats.unknown += 1,
        }
    }

    // Every place each payload is at, in shard and offset order.
    let mut places_of: BTreeMap<&Bytes, Vec<(ShardId, u64)>> = BTreeMap::new();
    for (shard, places) in &held {
        report.stats.shards_read += 1;
        report.stats.records_read += places.len();
        let mut offsets = places.keys().copied();
        if let Some(mut last) = offsets.next() {
            for offset in offsets {
                if offset > last + 1 {
                    violations.push(Violation::Gap {
                        shard: (*shard).clone(),
                        from: last + 1,
                        to: offset,
                    });
                }
                last = offset;
            }
        }
        for (offset, payload) in places {
            places_of
                .entry(payload)
                .or_default()
                .push(((*shard).clone(), *offset));
        }
    }
    for (payload, at) in places_of {
        let times = sent.get(payload).copied().unwrap_or(0);
        if times == 0 {
            for (shard, offset) in at {
                violations.push(Violation::Phantom {
                    shard,
                    offset,
                    payload: payload.clone(),
                });
            }
        } else if at.len() > times {
            violations.push(Violation::Duplicate {
                payload: payload.clone(),
                at,
                sent: times,
                acked: acked.contains(payload),
            });
        }
    }
    // Visible unacknowledged writes, for the stats: each op's payload is visible or not.
    let visible: BTreeSet<&Bytes> = reads
        .iter()
        .flat_map(|r| r.records.iter().map(|(_, p)| p))
        .collect();
    for op in ops {
        match op {
            Op::Failed { payload, .. } if visible.contains(payload) => {
                report.stats.failed_visible += 1
            }
            Op::Unknown { payload, .. } if visible.contains(payload) => {
                report.stats.unknown_visible += 1
            }
            _ => {}
        }
    }

    violations.sort_by_key(Violation::key);
    report.violations = violations;
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::from(s.to_owned())
    }

    fn acked(client: u32, stream: &str, shard: u32, offset: u64, payload: &str) -> Op {
        Op::Acked {
            client,
            shard: ShardId::new(stream, shard),
            offset,
            payload: b(payload),
        }
    }

    fn read(stream: &str, shard: u32, records: &[(u64, &str)]) -> Read {
        Read {
            shard: ShardId::new(stream, shard),
            records: records.iter().map(|(o, p)| (*o, b(p))).collect(),
        }
    }

    fn verdict(ops: &[Op], reads: &[Read]) -> String {
        check(ops, reads, &Tolerance::default()).to_string()
    }

    #[test]
    fn a_clean_history_with_unacked_writes_in_and_out_of_the_log() {
        let ops = [
            acked(1, "q", 0, 0, "a"),
            acked(2, "q", 0, 1, "b"),
            Op::Unknown {
                client: 1,
                payload: b("c"),
            },
            Op::Failed {
                client: 2,
                payload: b("d"),
            },
            acked(1, "q", 1, 0, "e"),
            // Sent twice (a retry), in the log twice: not a duplicate.
            Op::Unknown {
                client: 3,
                payload: b("f"),
            },
            acked(3, "q", 1, 2, "f"),
        ];
        let reads = [
            read("q", 0, &[(0, "a"), (1, "b"), (2, "c")]),
            read("q", 1, &[(0, "e"), (1, "f"), (2, "f")]),
            // A second read that agrees.
            read("q", 0, &[(1, "b")]),
        ];
        let report = check(&ops, &reads, &Tolerance::default());
        assert!(report.is_clean());
        assert_eq!(
            report.to_string(),
            "history: 4 acked, 1 failed (0 visible), 2 unknown (2 visible); 6 records read on 2 shards\n\
             verdict: clean\n"
        );
    }

    #[test]
    fn an_acked_record_missing_or_replaced_is_a_lost_write() {
        let ops = [
            acked(1, "q", 0, 0, "a"),
            acked(1, "q", 0, 1, "b"),
            acked(2, "q", 0, 2, "c"),
            Op::Unknown {
                client: 2,
                payload: b("x"),
            },
            acked(2, "q", 3, 0, "z"),
        ];
        let reads = [read("q", 0, &[(0, "a"), (1, "x")])];
        assert_eq!(
            verdict(&ops, &reads),
            "history: 4 acked, 0 failed (0 visible), 1 unknown (1 visible); 2 records read on 1 shards\n\
             violation: lost write: q/0 offset 1: acked to client 1 with payload \"b\", read back \"x\"\n\
             violation: lost write: q/0 offset 2: acked to client 2 with payload \"c\", read back nothing\n\
             violation: lost write: q/3 offset 0: acked to client 2 with payload \"z\", read back nothing\n\
             verdict: 3 violations\n"
        );
    }

    #[test]
    fn a_loss_where_allowed_is_tolerated_and_the_other_checks_still_hold() {
        let ops = [acked(1, "l", 0, 0, "a"), acked(1, "l", 0, 1, "b")];
        let reads = [read("l", 0, &[(0, "a"), (2, "zz")])];
        let tolerance = Tolerance {
            loss_allowed: [ShardId::new("l", 0)].into(),
        };
        assert_eq!(
            check(&ops, &reads, &tolerance).to_string(),
            "history: 2 acked, 0 failed (0 visible), 0 unknown (0 visible); 2 records read on 1 shards\n\
             tolerated: lost write: l/0 offset 1: acked to client 1 with payload \"b\", read back nothing\n\
             violation: gap: l/0 offset 1 missing\n\
             violation: phantom: l/0 offset 2 holds payload \"zz\", which no client sent\n\
             verdict: 2 violations\n"
        );
    }

    #[test]
    fn reads_that_disagree_on_an_offset_conflict() {
        let ops = [
            acked(1, "q", 0, 0, "a"),
            Op::Unknown {
                client: 1,
                payload: b("b"),
            },
            Op::Unknown {
                client: 2,
                payload: b("c"),
            },
        ];
        let reads = [
            read("q", 0, &[(0, "a"), (1, "b")]),
            read("q", 0, &[(0, "a"), (1, "c")]),
            // The same disagreement seen again is reported once.
            read("q", 0, &[(1, "c")]),
        ];
        assert_eq!(
            verdict(&ops, &reads),
            "history: 1 acked, 0 failed (0 visible), 2 unknown (2 visible); 2 records read on 1 shards\n\
             violation: conflict: q/0 offset 1 read as \"b\" and as \"c\"\n\
             verdict: 1 violations\n"
        );
    }

    #[test]
    fn holes_between_offsets_are_gaps() {
        let ops = [
            acked(1, "q", 0, 5, "a"),
            acked(1, "q", 0, 7, "b"),
            acked(1, "q", 0, 11, "c"),
        ];
        // The first offset read is the shard's start: nothing below 5 is asked for.
        let reads = [read("q", 0, &[(5, "a"), (7, "b"), (11, "c")])];
        assert_eq!(
            verdict(&ops, &reads),
            "history: 3 acked, 0 failed (0 visible), 0 unknown (0 visible); 3 records read on 1 shards\n\
             violation: gap: q/0 offset 6 missing\n\
             violation: gap: q/0 offsets 8..=10 missing\n\
             verdict: 2 violations\n"
        );
    }

    #[test]
    fn a_payload_at_more_offsets_than_sends_is_a_duplicate_not_a_loss() {
        let ops = [
            acked(1, "q", 0, 0, "a"),
            Op::Unknown {
                client: 2,
                payload: b("u"),
            },
        ];
        let reads = [
            read("q", 0, &[(0, "a"), (1, "u"), (2, "a"), (3, "u")]),
            read("q", 1, &[(0, "u")]),
        ];
        assert_eq!(
            verdict(&ops, &reads),
            "history: 1 acked, 0 failed (0 visible), 1 unknown (1 visible); 5 records read on 2 shards\n\
             violation: duplicate: payload \"a\" (acked) at q/0 offset 0, q/0 offset 2, sent 1 time\n\
             violation: duplicate: payload \"u\" (never acked) at q/0 offset 1, q/0 offset 3, q/1 offset 0, sent 1 time\n\
             verdict: 2 violations\n"
        );
    }

    #[test]
    fn a_record_nobody_sent_is_a_phantom() {
        let ops = [acked(1, "q", 0, 0, "a")];
        let reads = [read("q", 0, &[(0, "a"), (1, "\u{1}bin")])];
        assert_eq!(
            verdict(&ops, &reads),
            "history: 1 acked, 0 failed (0 visible), 0 unknown (0 visible); 2 records read on 1 shards\n\
             violation: phantom: q/0 offset 1 holds payload 0x0162696e, which no client sent\n\
             verdict: 1 violations\n"
        );
    }

    #[test]
    fn a_visible_failed_write_is_counted() {
        let ops = [Op::Failed {
            client: 1,
            payload: b("f"),
        }];
        let report = check(&ops, &[read("q", 0, &[(0, "f")])], &Tolerance::default());
        assert!(report.is_clean());
        assert_eq!(report.stats.failed_visible, 1);
    }

    #[test]
    fn each_message_starts_with_its_kind() {
        let ops = [acked(1, "q", 0, 0, "a"), acked(1, "q", 0, 9, "b")];
        let reads = [
            read("q", 0, &[(0, "a"), (2, "a"), (3, "p")]),
            read("q", 0, &[(0, "x")]),
        ];
        let report = check(&ops, &reads, &Tolerance::default());
        let kinds: Vec<&str> = report.violations.iter().map(Violation::kind).collect();
        assert_eq!(
            kinds,
            ["lost write", "conflict", "gap", "duplicate", "phantom"]
        );
        for v in &report.violations {
            assert!(v.to_string().starts_with(&format!("{}: ", v.kind())), "{v}");
        }
    }
}
