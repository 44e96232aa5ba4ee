//! `testdata/replication/copy.txt`: one copy driven by scripted inputs, each case's outputs
//! exactly. A case starts with its setting lines, then inputs; every output is printed with
//! the number of the input line that produced it.
//!
//! Setting lines (no outputs):
//! - `copy kind=records|groups|values|counters me=a storage=sa [canary=promote-behind|ack-before-durable]`
//! - `view gen=G leader=N set=a:sa,b:sb,… [disks=b:sb2,…] [quorum]`: the metadata's view
//!   (each member's disk is its recorded one unless `disks` says otherwise);
//! - `log start=S end=E durable=D fence=F commit=C epochs=g:s,… [busy] [complete=X] [log-start=L]`.
//!
//! Inputs: `gen` (the view's generation reaches the copy), `open` (the log is open), `pass
//! at=MS [opened] [rider=b:sb,…|rider=none]`, `persisted` (the last state the copy asked
//! for is durable, and the log holds it), `refused` (the log refused it), `recv peer=N
//! <message> …`, `truncated end=E` or `truncated error`, `appended end=E` or `appended
//! error`, `written to=E`, `durable to=E`, `log-durable to=E end=E`, `owes at=MS end=E`,
//! `gate`, `timeout at=MS`, `read to=N from=F [base=B end=E bytes=N | error]`,
//! `refused-cut`; and the getters `role`, `caught-up [down]`, `writable`.

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::super::golden::{self, Block};
use super::*;
use crate::meta::{ObjectKey, ObjectKind};

fn epochs(s: Option<&String>) -> Vec<(u64, u64)> {
    match s.map(String::as_str) {
        None | Some("") | Some("-") => Vec::new(),
        Some(s) => s
            .split(',')
            .map(|e| {
                let (g, s) = e.split_once(':').unwrap();
                (g.parse().unwrap(), s.parse().unwrap())
            })
            .collect(),
    }
}

fn show_epochs(e: &[(u64, u64)]) -> String {
    if e.is_empty() {
        return "-".into();
    }
    e.iter()
        .map(|(g, s)| format!("{g}:{s}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn replicas(s: &str) -> Vec<Replica> {
    s.split(',')
        .filter(|r| !r.is_empty() && *r != "none")
        .map(|r| {
            let (n, s) = r.split_once(':').unwrap_or((r, ""));
            Replica {
                node: NodeId::new(n),
                storage_id: s.to_string(),
            }
        })
        .collect()
}

fn wire_epochs_of(e: &[pp::Epoch]) -> String {
    show_epochs(&from_wire(e))
}

fn show_message(m: &PeerMessage) -> String {
    match m {
        PeerMessage::Fence(f) => format!(
            "fence gen={} storage={}",
            f.scope.generation, f.leader_storage_id
        ),
        PeerMessage::FenceAnswer(a) => format!(
            "fence-answer gen={} storage={} last={} end={} durable={} commit={} epochs={}",
            a.scope.generation,
            a.storage_id,
            a.last_generation,
            a.end,
            a.durable_end,
            a.commit,
            wire_epochs_of(&a.epochs)
        ),
        PeerMessage::Follow(f) => format!(
            "follow gen={} storage={} end={} durable={} commit={} epochs={}",
            f.scope.generation,
            f.storage_id,
            f.end,
            f.durable_end,
            f.commit,
            wire_epochs_of(&f.epochs)
        ),
        PeerMessage::FollowFrom(f) => format!(
            "follow-from gen={} to={} leader-end={} commit={} epochs={}{}",
            f.scope.generation,
            f.truncate_to,
            f.leader_end,
            f.commit,
            wire_epochs_of(&f.epochs),
            if f.rebuild { " rebuild" } else { "" }
        ),
        PeerMessage::Replicate(r) => format!(
            "replicate gen={} base={} count={} commit={} bytes={}",
            r.scope.generation,
            r.base_offset,
            r.record_count,
            r.commit,
            r.entries.len()
        ),
        PeerMessage::ReplicaReport(r) => format!(
            "report gen={} storage={} end={} durable={}",
            r.scope.generation, r.storage_id, r.end, r.durable_end
        ),
        PeerMessage::LogStart(l) => {
            format!("log-start gen={} start={}", l.scope.generation, l.start)
        }
        PeerMessage::TailFetch(t) => format!(
            "tail-fetch gen={} from={} max={}",
            t.scope.generation, t.from, t.max_bytes
        ),
        PeerMessage::TailChunk(c) => format!(
            "tail-chunk gen={} base={} count={} bytes={} end={} last={}",
            c.scope.generation,
            c.base_offset,
            c.record_count,
            c.entries.len(),
            c.end,
            c.last
        ),
        PeerMessage::ReplicationRefused(r) => format!(
            "refused gen={} reason={:?} current={} ({})",
            r.scope.generation, r.reason, r.current_generation, r.detail
        ),
        other => format!("{other:?}"),
    }
}

fn show(o: &CopyOutput) -> String {
    match o {
        CopyOutput::Send { to, message } => format!("send {to} {}", show_message(message)),
        CopyOutput::Io(io) => match io {
            CopyIo::Persist(s) => format!(
                "io persist fence={} commit={} epochs={} log-start={}",
                s.fence_generation,
                s.commit,
                show_epochs(&s.epochs),
                s.log_start
            ),
            CopyIo::Read {
                from,
                max_bytes,
                purpose,
            } => match purpose {
                ReadPurpose::Ship { to, .. } => {
                    format!("io read from={from} max={max_bytes} ship-to={to}")
                }
                ReadPurpose::Tail { to, .. } => {
                    format!("io read from={from} max={max_bytes} tail-to={to}")
                }
            },
            CopyIo::Append { base, entries } => {
                format!("io append base={base} bytes={}", entries.len())
            }
            CopyIo::Truncate { to } => format!("io truncate to={to}"),
            CopyIo::TrimTo { start } => format!("io trim-to start={start}"),
            CopyIo::RestartAt { start } => format!("io restart-at start={start}"),
            CopyIo::Gate { committed } => format!("io gate committed={committed}"),
            CopyIo::Ungate => "io ungate".into(),
            CopyIo::BoundCompaction { below } => format!("io bound-compaction below={below}"),
            CopyIo::Moved { fenced_by: None } => "io moved (where the metadata says)".into(),
            CopyIo::Moved {
                fenced_by: Some((n, g)),
            } => format!("io moved to={n} gen={g}"),
            CopyIo::Committed { up_to } => format!("io committed up-to={up_to}"),
            CopyIo::TimedOut { up_to } if *up_to == u64::MAX => "io timed-out up-to=all".into(),
            CopyIo::TimedOut { up_to } => format!("io timed-out up-to={up_to}"),
        },
        CopyOutput::Propose(c) => match c {
            Command::Reopen {
                generation, leader, ..
            } => format!("propose reopen gen={generation} leader={leader}"),
            Command::RecordCopy {
                generation,
                node,
                storage_id,
                ..
            } => format!("propose record-copy gen={generation} node={node} storage={storage_id}"),
            other => format!("propose {other:?}"),
        },
        CopyOutput::Recheck => "recheck".into(),
        CopyOutput::Event(e) => format!("event {e:?}"),
    }
}

struct Script {
    base: Instant,
    copy: Option<LogCopy>,
    here: Here,
    view: ShardView,
    pos: LogPos,
    last_persist: Option<CopyState>,
}

impl Script {
    fn at(&self, f: &std::collections::BTreeMap<String, String>) -> Instant {
        self.base + Duration::from_millis(f.get("at").map_or(0, |v| v.parse().unwrap()))
    }

    fn scope(&self, f: &std::collections::BTreeMap<String, String>) -> pp::ShardScope {
        let copy = self.copy.as_ref().unwrap();
        let generation = f
            .get("gen")
            .map_or(self.view.generation, |g| g.parse().unwrap());
        copy.scope(generation)
    }

    fn message(&self, kind: &str, f: &std::collections::BTreeMap<String, String>) -> PeerMessage {
        let scope = self.scope(f);
        let n = |k: &str| golden::num(f, k);
        let storage = || f.get("storage").cloned().unwrap_or_default();
        match kind {
            "fence" => PeerMessage::Fence(pp::Fence {
                scope,
                leader_storage_id: storage(),
            }),
            "fence-answer" => {
                let e = epochs(f.get("epochs"));
                PeerMessage::FenceAnswer(pp::FenceAnswer {
                    scope,
                    storage_id: storage(),
                    last_generation: last_generation(&e, n("end")),
                    end: n("end"),
                    durable_end: f.get("durable").map_or(n("end"), |d| d.parse().unwrap()),
                    commit: f.get("commit").map_or(0, |d| d.parse().unwrap()),
                    epochs: wire_epochs(&e),
                })
            }
            "follow" => PeerMessage::Follow(pp::Follow {
                scope,
                storage_id: storage(),
                epochs: wire_epochs(&epochs(f.get("epochs"))),
                end: n("end"),
                durable_end: f.get("durable").map_or(n("end"), |d| d.parse().unwrap()),
                commit: f.get("commit").map_or(0, |d| d.parse().unwrap()),
            }),
            "follow-from" => PeerMessage::FollowFrom(pp::FollowFrom {
                scope,
                truncate_to: n("to"),
                leader_end: n("leader-end"),
                commit: f.get("commit").map_or(0, |d| d.parse().unwrap()),
                epochs: wire_epochs(&epochs(f.get("epochs"))),
                rebuild: f.contains_key("rebuild"),
            }),
            "replicate" => PeerMessage::Replicate(pp::Replicate {
                scope,
                base_offset: n("base"),
                record_count: n("count") as u32,
                commit: f.get("commit").map_or(0, |d| d.parse().unwrap()),
                entries: Bytes::from(vec![0u8; f.get("bytes").map_or(8, |b| b.parse().unwrap())]),
            }),
            "report" => PeerMessage::ReplicaReport(pp::ReplicaReport {
                scope,
                storage_id: storage(),
                end: n("end"),
                durable_end: n("durable"),
            }),
            "log-start" => PeerMessage::LogStart(pp::LogStart {
                scope,
                start: n("start"),
            }),
            "tail-fetch" => PeerMessage::TailFetch(pp::TailFetch {
                scope,
                from: n("from"),
                max_bytes: n("max") as u32,
            }),
            "tail-chunk" => {
                let bytes = f.get("bytes").map_or(0, |b| b.parse().unwrap());
                PeerMessage::TailChunk(pp::TailChunk {
                    scope,
                    base_offset: n("base"),
                    record_count: n("count") as u32,
                    entries: Bytes::from(vec![0u8; bytes]),
                    end: n("end"),
                    last: f.contains_key("last"),
                })
            }
            "refused" => PeerMessage::ReplicationRefused(pp::ReplicationRefused {
                scope,
                reason: pp::RefusalReason::NotOpen,
                current_generation: 0,
                detail: String::new(),
            }),
            other => panic!("unknown message {other}"),
        }
    }

    /// One line: a setting (no output) or an input (its outputs, drained).
    fn line(&mut self, line: &str) -> Vec<String> {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let f = golden::fields(rest);
        match word {
            "copy" => {
                let kind = match f["kind"].as_str() {
                    "records" => CopyKind::Records,
                    "groups" => CopyKind::Groups,
                    "values" => CopyKind::Values,
                    "counters" => CopyKind::Counters,
                    other => panic!("kind {other}"),
                };
                let canary = match f.get("canary").map(String::as_str) {
                    None => CopyCanary::None,
                    Some("promote-behind") => CopyCanary::PromoteBehind,
                    Some("ack-before-durable") => CopyCanary::AckBeforeDurable,
                    Some(other) => panic!("canary {other}"),
                };
                self.here = Here {
                    me: NodeId::new(f["me"].clone()),
                    storage_id: f["storage"].clone(),
                };
                let shard = ShardRef {
                    kind: if kind.primary() == CopyKind::Values {
                        ObjectKind::Cache
                    } else {
                        ObjectKind::Stream
                    },
                    key: ObjectKey::new("t", "ns", "s"),
                    shard: 0,
                };
                let wire = pp::ShardId {
                    cluster_id: "c".into(),
                    kind: kind.wire(),
                    tenant: "t".into(),
                    namespace: "ns".into(),
                    name: "s".into(),
                    shard: 0,
                };
                let settings = CopySettings {
                    leader: LeaderSettings {
                        window_bytes: 1 << 20,
                        max_ship_bytes: 1 << 16,
                        quorum_timeout: Duration::from_secs(5),
                        resend_after: Duration::from_secs(1),
                    },
                    retry: Duration::from_millis(200),
                    log_start_resend: Duration::from_secs(5),
                    tail_fetch_bytes: 1 << 20,
                    canary,
                };
                self.copy = Some(LogCopy::new(shard, kind, wire, settings));
                return Vec::new();
            }
            "view" => {
                let set = replicas(&f["set"]);
                let mut disks: BTreeMap<NodeId, String> = set
                    .iter()
                    .map(|r| (r.node.clone(), r.storage_id.clone()))
                    .collect();
                if let Some(d) = f.get("disks") {
                    disks.extend(replicas(d).into_iter().map(|r| (r.node, r.storage_id)));
                }
                self.view = ShardView {
                    generation: golden::num(&f, "gen"),
                    leader: f
                        .get("leader")
                        .filter(|l| *l != "none")
                        .map(|l| NodeId::new(l.clone())),
                    replicas: set,
                    member_disks: disks,
                    quorum: f.contains_key("quorum"),
                };
                return Vec::new();
            }
            "log" => {
                let n = |k: &str, d: u64| f.get(k).map_or(d, |v| v.parse().unwrap());
                let end = n("end", 0);
                self.pos = LogPos {
                    start: n("start", 0),
                    end,
                    durable: n("durable", end),
                    state: CopyState {
                        fence_generation: n("fence", 0),
                        commit: n("commit", 0),
                        epochs: epochs(f.get("epochs")),
                        log_start: n("log-start", 0),
                    },
                    idle: !f.contains_key("busy"),
                    complete_from: n("complete", 0),
                };
                return Vec::new();
            }
            _ => {}
        }
        let now = self.at(&f);
        let copy = self.copy.as_mut().expect("a `copy` line first");
        match word {
            "gen" => copy.set_generation(self.view.generation),
            "open" => copy.log_opened(),
            "pass" => {
                let rider = f.get("rider").map(|r| replicas(r));
                let rider = if f.get("rider").map(String::as_str) == Some("none") {
                    None
                } else {
                    rider
                };
                copy.advance(
                    now,
                    Pass {
                        here: &self.here,
                        view: &self.view,
                        pos: &self.pos,
                        opened_here: f.contains_key("opened"),
                        rider_counted: rider.as_deref(),
                    },
                );
            }
            "persisted" => {
                let state = self.last_persist.clone().expect("nothing persisted");
                self.pos.state = state.clone();
                copy.state_durable(&self.here, state, Some(&self.view), Some(&self.pos));
            }
            "refused" => copy.state_refused("refused by the log".into()),
            "recv" => {
                let from = NodeId::new(f["peer"].clone());
                let kind = rest.split_whitespace().nth(1).unwrap();
                let msg = self.message(kind, &f);
                let copy = self.copy.as_mut().unwrap();
                copy.handle_message(&self.here, &from, msg, Some(&self.pos));
            }
            "truncated" => {
                let result = if f.contains_key("error") {
                    Err("busy".to_string())
                } else {
                    let end = golden::num(&f, "end");
                    self.pos.end = end;
                    self.pos.durable = self.pos.durable.min(end);
                    Ok(end)
                };
                copy.truncated(result, Some(&self.pos));
            }
            "appended" => {
                let result = if f.contains_key("error") {
                    Err("refused".to_string())
                } else {
                    self.pos.end = golden::num(&f, "end");
                    Ok(self.pos.end)
                };
                copy.appended(result);
            }
            "written" => copy.written(golden::num(&f, "to")),
            "durable" => copy.local_durable(golden::num(&f, "to")),
            "log-durable" => {
                copy.log_durable(&self.here, golden::num(&f, "to"), golden::num(&f, "end"))
            }
            "owes" => copy.owes(now, golden::num(&f, "end")),
            "gate" => copy.gate_handed_over(),
            "timeout" => copy.handle_timeout(now),
            "refused-cut" => copy.truncation_refused(),
            "read" => {
                let to = NodeId::new(f["to"].clone());
                let from = golden::num(&f, "from");
                let result = if f.contains_key("error") {
                    Err("gone".to_string())
                } else {
                    Ok(Framed {
                        base: golden::num(&f, "base"),
                        end: golden::num(&f, "end"),
                        entries: Bytes::from(vec![0u8; golden::num(&f, "bytes") as usize]),
                    })
                };
                copy.framed(now, to, from, result, Some(&self.pos));
            }
            "role" => {
                let (name, commit) = copy.role_name();
                return vec![match commit {
                    Some(c) => format!("role {name} commit={c}"),
                    None => format!("role {name}"),
                }];
            }
            "caught-up" => {
                let up = copy.caught_up(self.view.generation, f.contains_key("down"));
                return vec![format!("caught-up {up}")];
            }
            "writable" => {
                return vec![format!(
                    "writable {}",
                    copy.writable_at(self.view.generation)
                )];
            }
            other => panic!("unknown input {other}"),
        }
        let copy = self.copy.as_mut().unwrap();
        let mut out = Vec::new();
        while let Some(o) = copy.poll_output() {
            if let CopyOutput::Io(CopyIo::Persist(s)) = &o {
                self.last_persist = Some(s.clone());
            }
            out.push(show(&o));
        }
        out
    }
}

fn run(block: &Block) -> String {
    let mut script = Script {
        base: Instant::now(),
        copy: None,
        here: Here {
            me: NodeId::new("a"),
            storage_id: String::new(),
        },
        view: ShardView::default(),
        pos: LogPos::default(),
        last_persist: None,
    };
    let mut out = Vec::new();
    for (i, line) in block.lines.iter().enumerate() {
        for o in script.line(line) {
            out.push(format!("{}: {o}", i + 1));
        }
    }
    out.join("\n")
}

#[test]
fn copy_golden_file() {
    golden::check("copy.txt", run);
}

#[test]
fn splicing_keeps_the_own_prefix_and_takes_the_other_copys_epochs_after_the_cut() {
    let own = [(1, 0), (2, 5)];
    let theirs = [(1, 0), (3, 4), (4, 9)];
    assert_eq!(splice(&own, &theirs, 4), [(1, 0), (3, 4), (4, 9)]);
    assert_eq!(splice(&own, &theirs, 6), [(1, 0), (2, 5), (3, 6), (4, 9)]);
    assert_eq!(splice(&own, &[], 3), [(1, 0)]);
    assert_eq!(last_generation(&[(1, 0), (3, 4)], 4), 1);
    assert_eq!(last_generation(&[(1, 0), (3, 4)], 5), 3);
    assert_eq!(last_generation(&[], 0), 0);
}
