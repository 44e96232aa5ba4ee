//! `felix-conformance verify`: a client's results document judged against the scenario
//! catalogue and, with `--evidence`, against what the fixture's brokers recorded.
//!
//! Pure: the three documents come in as text, a [`Verdict`] goes out. The rules
//! (docs/conformance.md, "The verdict"):
//!
//! - every required scenario has an outcome, and it is `pass`;
//! - an optional scenario may be absent or `skip` (with a reason), never `fail`;
//! - every outcome names a catalogue id, once;
//! - with evidence: every `pass` was announced to the fixture and the brokers saw what the
//!   scenario cannot pass without (a subscribe, a redirect answered, a fault applied, or, for a
//!   scenario refused on the client, no commit at all) — see [`needs`].

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

/// The catalogue file (`scenarios.toml`).
#[derive(Debug, Deserialize)]
pub struct Catalogue {
    pub version: u32,
    #[serde(rename = "scenario")]
    pub scenarios: Vec<Scenario>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Scenario {
    pub id: String,
    pub required: bool,
    pub title: String,
    #[serde(default)]
    pub step: Option<Step>,
}

/// A `fault.*` scenario's step: what the suite does and which link fault it asks for.
#[derive(Debug, Clone, Deserialize)]
pub struct Step {
    pub during: String,
    pub fault: String,
    pub after_records: u32,
    pub records: u32,
    pub hold_ms: u64,
}

impl Scenario {
    /// The group a scenario is tabled under: its id up to the first dot.
    pub fn group(&self) -> &str {
        self.id.split('.').next().unwrap_or(&self.id)
    }
}

impl Catalogue {
    pub fn parse(text: &str) -> Result<Catalogue, String> {
        let c: Catalogue = toml::from_str(text).map_err(|e| format!("the catalogue: {e}"))?;
        let mut seen = BTreeSet::new();
        for s in &c.scenarios {
            if !seen.insert(s.id.as_str()) {
                return Err(format!("the catalogue lists {} twice", s.id));
            }
        }
        Ok(c)
    }

    pub fn get(&self, id: &str) -> Option<&Scenario> {
        self.scenarios.iter().find(|s| s.id == id)
    }
}

/// A client's results document.
#[derive(Debug, Deserialize)]
pub struct Results {
    pub client: String,
    pub version: String,
    pub outcomes: Vec<Outcome>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    Skip,
}

#[derive(Debug, Deserialize)]
pub struct Outcome {
    pub id: String,
    pub status: Status,
    #[serde(default)]
    pub detail: String,
}

impl Results {
    pub fn parse(text: &str) -> Result<Results, String> {
        serde_json::from_str(text).map_err(|e| format!("the results document: {e}"))
    }
}

/// What the fixture recorded (its `evidence` file).
#[derive(Debug, Default, Deserialize)]
pub struct Evidence {
    /// Written once the fixture has stopped every node; a file without it was cut short.
    pub complete: bool,
    pub scenarios: Vec<ScenarioEvidence>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ScenarioEvidence {
    pub id: String,
    /// Per node: what it received and answered while the scenario ran.
    #[serde(default)]
    pub nodes: BTreeMap<String, NodeFrames>,
    #[serde(default)]
    pub faults: Vec<AppliedFault>,
    /// Datagrams through `link_addr` while the scenario ran.
    #[serde(default)]
    pub link: LinkCounts,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
pub struct LinkCounts {
    #[serde(default)]
    pub passed: u64,
    #[serde(default)]
    pub dropped: u64,
    #[serde(default)]
    pub held: u64,
}

#[derive(Debug, Default, Deserialize)]
pub struct NodeFrames {
    /// Requests by type (`subscribe`, `publish`, `binary_publish`, ...).
    #[serde(default)]
    pub received: BTreeMap<String, u64>,
    /// Answers worth telling apart: error codes (`not_leader`, `quorum_timeout`, ...) and
    /// `redirect` (a `not_leader` message naming the owner).
    #[serde(default)]
    pub answered: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct AppliedFault {
    /// `fence`, `partition`, `heal` or `link`.
    pub kind: String,
    /// For `link`: `drop`, `reset` or `stall`.
    #[serde(default)]
    pub fault: Option<String>,
    pub at_ms: u64,
}

impl Evidence {
    pub fn parse(text: &str) -> Result<Evidence, String> {
        serde_json::from_str(text).map_err(|e| format!("the evidence file: {e}"))
    }

    fn merged(&self, id: &str) -> Option<(NodeFrames, Vec<AppliedFault>, LinkCounts)> {
        let mut found = false;
        let mut all = NodeFrames::default();
        let mut faults = Vec::new();
        let mut link = LinkCounts::default();
        for s in self.scenarios.iter().filter(|s| s.id == id) {
            found = true;
            for n in s.nodes.values() {
                for (k, v) in &n.received {
                    *all.received.entry(k.clone()).or_default() += v;
                }
                for (k, v) in &n.answered {
                    *all.answered.entry(k.clone()).or_default() += v;
                }
            }
            faults.extend(s.faults.iter().cloned());
            link.passed += s.link.passed;
            link.dropped += s.link.dropped;
            link.held += s.link.held;
        }
        found.then_some((all, faults, link))
    }
}

/// What the brokers must have seen for a `pass` of a scenario to be believed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Need {
    /// At least one of these request types reached some node (empty: any request).
    pub received: &'static [&'static str],
    /// At least one of these answers was sent (empty: no condition).
    pub answered: &'static [&'static str],
    /// A fault of this kind (`fence`, `partition`, or a link fault by name) was applied.
    pub fault: Option<&'static str>,
    /// None of these request types reached any node.
    pub absent: &'static [&'static str],
    /// The link relay dropped (`"dropped"`) or held (`"held"`) some of the scenario's
    /// datagrams: its fault met the client's traffic.
    pub link: Option<&'static str>,
}

const PUBLISH: &[&str] = &[
    "publish",
    "publish_batch",
    "binary_publish",
    "publish_idempotent",
];
const SUBSCRIBE: &[&str] = &["subscribe"];
const CACHE: &[&str] = &["cache_put", "cache_get", "cache_delete"];
const COUNTER: &[&str] = &["counter_add", "counter_get"];
const GROUP: &[&str] = &["group_poll"];
const WATCH: &[&str] = &["cache_watch"];
const COMMIT: &[&str] = &["commit"];
const REFUSED_AS_UNAUTHORIZED: &[&str] = &["forbidden", "unauthenticated"];

/// The evidence rule of each scenario id. An id not listed here needs any request at all.
pub fn needs(scenario: &Scenario) -> Need {
    let need = |received, answered, fault| Need {
        received,
        answered,
        fault,
        absent: &[],
        link: None,
    };
    if let Some(step) = &scenario.step {
        let received = if step.during == "subscribe" {
            SUBSCRIBE
        } else {
            PUBLISH
        };
        let fault: &'static str = match step.fault.as_str() {
            "drop" => "drop",
            "reset" => "reset",
            "stall" => "stall",
            _ => "link",
        };
        // A subscription's datagrams go through the relay it was opened on; a publishing
        // client may send its publishes to the owner's own address instead (it learns it from
        // the cluster), so only the subscription scenarios can be held to what the link did.
        let link = match (step.during.as_str(), fault) {
            ("subscribe", "stall") => Some("held"),
            ("subscribe", _) => Some("dropped"),
            _ => None,
        };
        return Need {
            link,
            ..need(received, &[], Some(fault))
        };
    }
    let id = scenario.id.as_str();
    match id {
        "commit.another_stream_is_refused" | "commit.exactly_one_event" => Need {
            absent: COMMIT,
            ..Need::default()
        },
        "commit.returns_the_offset" | "commit.negotiated" => need(COMMIT, &[], None),
        "commit.state_get_returns_the_version" => need(&["state_get"], &[], None),
        "reconnect.survives_broker_loss"
        | "retry.transport_failures_are_retried_against_another_broker"
        | "sharded.a_lost_shard_is_surfaced" => need(&[], &[], Some("fence")),
        "reconnect.discovers_brokers_from_one_seed" => need(&["topology"], &[], Some("fence")),
        "redirect.follows_to_the_shard_owner"
        | "redirect.carries_the_start_offset_through_every_hop" => {
            need(SUBSCRIBE, &["redirect"], None)
        }
        "redirect.is_not_reported_as_a_failure" => need(&[], &["redirect"], None),
        "retry.terminal_failures_are_not_retried" | "error.unauthorized_is_typed" => {
            need(&[], REFUSED_AS_UNAUTHORIZED, None)
        }
        "retry.ambiguous_outcomes_are_not_silently_retried"
        | "error.quorum_timeout_is_outcome_unknown" => {
            need(PUBLISH, &["quorum_timeout"], Some("partition"))
        }
        "retry.idempotent_producers_re_send_ambiguous_outcomes" => {
            need(&["publish_idempotent"], &[], None)
        }
        "error.unknown_stream_is_typed" => need(PUBLISH, &["not_found"], None),
        "error.shard_unavailable_is_retryable" => {
            need(&[], &["shard_unavailable", "not_leader"], Some("fence"))
        }
        "sharded.reports_the_shard_count" => need(&["stream_shards"], &[], None),
        _ => {
            let received = match scenario.group() {
                "pubsub" | "sharded" | "client" if id != "client.concurrent_calls" => SUBSCRIBE,
                "reconnect" => SUBSCRIBE,
                "cache" => CACHE,
                "counter" => COUNTER,
                "queue" => GROUP,
                "watch" => WATCH,
                "ack" | "client" | "retry" => PUBLISH,
                _ => &[],
            };
            need(received, &[], None)
        }
    }
}

fn unmet(
    need: &Need,
    frames: &NodeFrames,
    faults: &[AppliedFault],
    link: LinkCounts,
) -> Option<String> {
    let count = |map: &BTreeMap<String, u64>, k: &str| map.get(k).copied().unwrap_or(0);
    let total: u64 = frames.received.values().sum();
    if need.received.is_empty() && need.absent.is_empty() && total == 0 {
        return Some("no request reached any node".into());
    }
    if !need.received.is_empty()
        && need
            .received
            .iter()
            .all(|k| count(&frames.received, k) == 0)
    {
        return Some(format!("no node received {}", need.received.join(" or ")));
    }
    if !need.answered.is_empty()
        && need
            .answered
            .iter()
            .all(|k| count(&frames.answered, k) == 0)
    {
        return Some(format!("no node answered {}", need.answered.join(" or ")));
    }
    if let Some(kind) = need.fault {
        if !faults
            .iter()
            .any(|f| f.kind == kind || f.fault.as_deref() == Some(kind))
        {
            return Some(format!("no {kind} fault was applied"));
        }
    }
    match need.link {
        Some("held") if link.held == 0 => {
            return Some("the link held none of the client's datagrams".into())
        }
        Some("dropped") if link.dropped == 0 => {
            return Some("the link dropped none of the client's datagrams".into())
        }
        _ => {}
    }
    if let Some(k) = need.absent.iter().find(|k| count(&frames.received, k) > 0) {
        return Some(format!(
            "a node received {k}, which the client must not send"
        ));
    }
    None
}

/// One row of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub id: String,
    pub required: bool,
    /// `pass`, `fail`, `skip` or `missing`.
    pub status: &'static str,
    /// Empty when the row is acceptable; otherwise why it makes the client not conformant.
    pub problem: String,
    pub detail: String,
}

#[derive(Debug)]
pub struct Verdict {
    pub client: String,
    pub version: String,
    pub rows: Vec<Row>,
    /// Problems not tied to a catalogue row (unknown or repeated ids, a cut-short evidence file).
    pub general: Vec<String>,
}

impl Verdict {
    pub fn conformant(&self) -> bool {
        self.general.is_empty() && self.rows.iter().all(|r| r.problem.is_empty())
    }

    pub fn count(&self, status: &str) -> usize {
        self.rows.iter().filter(|r| r.status == status).count()
    }

    /// A table per group, then the problems and the verdict.
    pub fn render(&self) -> String {
        let mut out = format!("client {} {}\n", self.client, self.version);
        let mut group = "";
        let width = self.rows.iter().map(|r| r.id.len()).max().unwrap_or(0);
        for r in &self.rows {
            let g = r.id.split('.').next().unwrap_or("");
            if g != group {
                group = g;
                out.push_str(&format!("\n{group}\n"));
            }
            let mark = if r.problem.is_empty() { " " } else { "!" };
            let kind = if r.required { "required" } else { "optional" };
            let note = if !r.problem.is_empty() {
                r.problem.as_str()
            } else {
                r.detail.as_str()
            };
            out.push_str(&format!(
                "{mark} {:<width$}  {kind}  {:<7}  {note}\n",
                r.id, r.status
            ));
        }
        for g in &self.general {
            out.push_str(&format!("\n! {g}"));
        }
        out.push_str(&format!(
            "\n\n{} pass, {} fail, {} skip, {} missing\n{}\n",
            self.count("pass"),
            self.count("fail"),
            self.count("skip"),
            self.count("missing"),
            if self.conformant() {
                "CONFORMANT"
            } else {
                "NOT CONFORMANT"
            }
        ));
        out
    }
}

/// Judges `results` against `catalogue`, and against `evidence` when given.
pub fn verify(catalogue: &Catalogue, results: &Results, evidence: Option<&Evidence>) -> Verdict {
    let mut general = Vec::new();
    let mut by_id: BTreeMap<&str, &Outcome> = BTreeMap::new();
    for o in &results.outcomes {
        if catalogue.get(&o.id).is_none() {
            general.push(format!("{}: not a scenario of the catalogue", o.id));
        } else if by_id.insert(o.id.as_str(), o).is_some() {
            general.push(format!("{}: reported more than once", o.id));
        }
    }
    if let Some(e) = evidence {
        if !e.complete {
            general
                .push("the evidence file is incomplete (the fixture did not stop cleanly)".into());
        }
    }
    let rows = catalogue
        .scenarios
        .iter()
        .map(|s| {
            let Some(o) = by_id.get(s.id.as_str()) else {
                return Row {
                    id: s.id.clone(),
                    required: s.required,
                    status: "missing",
                    problem: if s.required {
                        "required and not reported".into()
                    } else {
                        String::new()
                    },
                    detail: String::new(),
                };
            };
            let (status, problem) = match o.status {
                Status::Fail => ("fail", "failed".to_owned()),
                Status::Skip if s.required => ("skip", "required and skipped".to_owned()),
                Status::Skip if o.detail.trim().is_empty() => {
                    ("skip", "skipped without a reason".to_owned())
                }
                Status::Skip => ("skip", String::new()),
                Status::Pass => {
                    let problem = match evidence {
                        None => String::new(),
                        Some(e) => match e.merged(&s.id) {
                            None => "passed, but the fixture was never told it ran".into(),
                            Some((frames, faults, link)) => {
                                unmet(&needs(s), &frames, &faults, link)
                                    .map(|why| format!("passed, but the evidence shows {why}"))
                                    .unwrap_or_default()
                            }
                        },
                    };
                    ("pass", problem)
                }
            };
            Row {
                id: s.id.clone(),
                required: s.required,
                status,
                problem,
                detail: o.detail.clone(),
            }
        })
        .collect();
    Verdict {
        client: results.client.clone(),
        version: results.version.clone(),
        rows,
        general,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CATALOGUE: &str = r#"
version = 1
[[scenario]]
id = "pubsub.roundtrip"
required = true
title = "t"
detail = "d"
[[scenario]]
id = "redirect.follows_to_the_shard_owner"
required = true
title = "t"
[[scenario]]
id = "fault.subscription_through_a_dropped_link"
required = true
title = "t"
step = { during = "subscribe", fault = "drop", after_records = 3, records = 10, hold_ms = 8000 }
[[scenario]]
id = "commit.exactly_one_event"
required = true
title = "t"
[[scenario]]
id = "error.bad_offset_is_typed"
required = false
title = "t"
"#;

    fn catalogue() -> Catalogue {
        Catalogue::parse(CATALOGUE).unwrap()
    }

    /// An outcome: id, status, detail.
    type Line = (&'static str, &'static str, &'static str);

    fn results(outcomes: &[Line]) -> Results {
        let outcomes: Vec<String> = outcomes
            .iter()
            .map(|(id, st, d)| format!(r#"{{"id":"{id}","status":"{st}","detail":"{d}"}}"#))
            .collect();
        Results::parse(&format!(
            r#"{{"client":"c","version":"1","outcomes":[{}]}}"#,
            outcomes.join(",")
        ))
        .unwrap()
    }

    const ALL_PASS: [(&str, &str, &str); 4] = [
        ("pubsub.roundtrip", "pass", ""),
        ("redirect.follows_to_the_shard_owner", "pass", ""),
        ("fault.subscription_through_a_dropped_link", "pass", ""),
        ("commit.exactly_one_event", "pass", ""),
    ];

    fn problems(v: &Verdict) -> Vec<String> {
        let mut p: Vec<String> = v
            .rows
            .iter()
            .filter(|r| !r.problem.is_empty())
            .map(|r| format!("{}: {}", r.id, r.problem))
            .collect();
        p.extend(v.general.iter().cloned());
        p
    }

    #[test]
    fn every_required_pass_and_an_optional_absent_is_conformant() {
        let v = verify(&catalogue(), &results(&ALL_PASS), None);
        assert!(v.conformant(), "{:?}", problems(&v));
        assert!(v.render().ends_with("CONFORMANT\n"));
        assert!(!v.render().contains("NOT CONFORMANT"));
        let mut with_skip = ALL_PASS.to_vec();
        with_skip.push(("error.bad_offset_is_typed", "skip", "no retention knob"));
        assert!(verify(&catalogue(), &results(&with_skip), None).conformant());
    }

    #[test]
    fn each_catalogue_rule_turns_the_verdict() {
        let v = verify(&catalogue(), &results(&ALL_PASS[1..]), None);
        assert_eq!(
            problems(&v),
            ["pubsub.roundtrip: required and not reported"]
        );
        let cases: [(&[Line], &str); 5] = [
            (
                &[("pubsub.roundtrip", "skip", "later")],
                "pubsub.roundtrip: required and skipped",
            ),
            (
                &[("pubsub.roundtrip", "fail", "")],
                "pubsub.roundtrip: failed",
            ),
            (
                &[("error.bad_offset_is_typed", "fail", "")],
                "error.bad_offset_is_typed: failed",
            ),
            (
                &[("error.bad_offset_is_typed", "skip", " ")],
                "error.bad_offset_is_typed: skipped without a reason",
            ),
            (
                &[("pubsub.nope", "pass", "")],
                "pubsub.nope: not a scenario of the catalogue",
            ),
        ];
        for (changed, want) in cases {
            let mut outcomes: Vec<_> = ALL_PASS
                .iter()
                .filter(|(id, _, _)| !changed.iter().any(|c| c.0 == *id))
                .copied()
                .collect();
            outcomes.extend(changed.iter().copied());
            let v = verify(&catalogue(), &results(&outcomes), None);
            assert!(!v.conformant(), "{want}");
            assert!(
                problems(&v).contains(&want.to_owned()),
                "{want}: {:?}",
                problems(&v)
            );
            assert!(v.render().ends_with("NOT CONFORMANT\n"));
        }
        let mut twice = ALL_PASS.to_vec();
        twice.push(ALL_PASS[0]);
        let v = verify(&catalogue(), &results(&twice), None);
        assert_eq!(problems(&v), ["pubsub.roundtrip: reported more than once"]);
    }

    /// The evidence of an honest run of [`ALL_PASS`].
    fn honest() -> String {
        r#"{"complete": true, "scenarios": [
          {"id": "pubsub.roundtrip", "nodes": {"n1": {"received": {"subscribe": 1, "binary_publish": 1}}}},
          {"id": "redirect.follows_to_the_shard_owner", "nodes": {
             "n1": {"received": {"subscribe": 1}, "answered": {"redirect": 1}},
             "n2": {"received": {"subscribe": 1}}}},
          {"id": "fault.subscription_through_a_dropped_link", "nodes": {"n3": {"received": {"subscribe": 1}}},
           "faults": [{"kind": "link", "fault": "drop", "at_ms": 10}, {"kind": "heal", "at_ms": 9000}],
           "link": {"passed": 40, "dropped": 12, "held": 0}},
          {"id": "commit.exactly_one_event", "nodes": {"n1": {"received": {}}}}
        ]}"#
        .to_owned()
    }

    #[test]
    fn an_honest_run_passes_with_its_evidence() {
        let e = Evidence::parse(&honest()).unwrap();
        let v = verify(&catalogue(), &results(&ALL_PASS), Some(&e));
        assert!(v.conformant(), "{:?}", problems(&v));
    }

    #[test]
    fn a_pass_the_evidence_contradicts_is_not_conformant() {
        let cases = [
            // Redirects served locally: the records arrive, no node answered not_leader.
            (
                r#""answered": {"redirect": 1}"#,
                r#""answered": {}"#,
                "redirect.follows_to_the_shard_owner: passed, but the evidence shows no node answered redirect",
            ),
            (
                r#"{"kind": "link", "fault": "drop", "at_ms": 10}, "#,
                "",
                "fault.subscription_through_a_dropped_link: passed, but the evidence shows no drop fault was applied",
            ),
            (
                r#""dropped": 12"#,
                r#""dropped": 0"#,
                "fault.subscription_through_a_dropped_link: passed, but the evidence shows the link dropped none of the client's datagrams",
            ),
            (
                r#""received": {"subscribe": 1, "binary_publish": 1}"#,
                r#""received": {"binary_publish": 1}"#,
                "pubsub.roundtrip: passed, but the evidence shows no node received subscribe",
            ),
            (
                r#"{"id": "commit.exactly_one_event", "nodes": {"n1": {"received": {}}}}"#,
                r#"{"id": "commit.exactly_one_event", "nodes": {"n1": {"received": {"commit": 1}}}}"#,
                "commit.exactly_one_event: passed, but the evidence shows a node received commit, which the client must not send",
            ),
            (
                r#"{"id": "pubsub.roundtrip", "#,
                r#"{"id": "pubsub.other", "#,
                "pubsub.roundtrip: passed, but the fixture was never told it ran",
            ),
            (
                r#""complete": true"#,
                r#""complete": false"#,
                "the evidence file is incomplete (the fixture did not stop cleanly)",
            ),
        ];
        for (from, to, want) in cases {
            let text = honest();
            assert!(text.contains(from), "{from}");
            let e = Evidence::parse(&text.replacen(from, to, 1)).unwrap();
            let v = verify(&catalogue(), &results(&ALL_PASS), Some(&e));
            assert_eq!(problems(&v), [want.to_owned()]);
        }
    }

    #[test]
    fn the_real_catalogue_parses_and_every_fault_scenario_needs_its_fault() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/reference/felix/conformance/scenarios.toml"
        );
        let Ok(text) = std::fs::read_to_string(path) else {
            // The reference checkout sits beside the repository on the project's machines.
            eprintln!("{path} not present: skipped");
            return;
        };
        let c = Catalogue::parse(&text).unwrap();
        assert_eq!(c.scenarios.len(), 56);
        assert_eq!(c.scenarios.iter().filter(|s| s.required).count(), 48);
        for s in c.scenarios.iter().filter(|s| s.step.is_some()) {
            let step = s.step.as_ref().unwrap();
            assert_eq!(needs(s).fault, Some(step.fault.as_str()), "{}", s.id);
        }
        // No rule left pointing at an id the catalogue does not have.
        assert!(c.get("commit.exactly_one_event").is_some());
        assert!(c.get("watch.lag_is_reported_rather_than_silent").is_some());
    }
}
