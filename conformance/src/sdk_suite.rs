//! `felix-conformance sdk-suite`: our Rust client (felix-client) held to the scenario catalogue,
//! one function per scenario id, against the three-node fixture of `client-fixture`
//! (docs/conformance.md, "The Rust SDK").
//!
//! It starts a fixture (this binary's `client-fixture`) unless given one, announces each
//! scenario to the control endpoint, runs it, undoes its faults (`/heal`), and writes
//! `results.json` for `felix-conformance verify`; a fixture it started is stopped at the end,
//! which completes `evidence.json`. Every wait is for an answer or an event, bounded by a
//! deadline; nothing sleeps to synchronise. A scenario the SDK or the fixture cannot express
//! is a `skip` with its reason.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_client::{
    Ack, CacheWatch, CacheWatchItem, Client, ClientConfig, ClientError, CommitOp, CommitPlan,
    CommitRefused, ErrorCode, Event, GroupRecord, Guarded, Offer, PollOptions, RetryClass,
    ShardedSubscription, Start, StateChange, Subscription, SubscriptionEnd, SubscriptionItem,
    WatchFilter, WatchStart,
};
use felix_proto::Features;
use serde_json::{json, Value};

/// How long the fixture may take to say it is ready.
const START_LIMIT: Duration = Duration::from_secs(120);
/// How long the fixture may take to stop (and complete its evidence).
const STOP_LIMIT: Duration = Duration::from_secs(60);
/// Bound on one control request.
const CONTROL_LIMIT: Duration = Duration::from_secs(30);
/// Bound on one scenario, whatever it waits for.
const SCENARIO_LIMIT: Duration = Duration::from_secs(150);
/// Bound on waiting for one event or change.
const EVENT_LIMIT: Duration = Duration::from_secs(15);
/// Bound on one call through a faulted link: it must return, with an answer or an error.
const CALL_LIMIT: Duration = Duration::from_secs(40);

/// The idle timeout of the client in the `fault.*` scenarios. The catalogue sizes its steps
/// for 6 s (the reference client's): the 8 s drop outlasts it, the 2 s stall stays under it.
/// Our cluster client's default, `DEFAULT_IDLE_TIMEOUT` (2 s, for fast failover), is no
/// longer than that stall, which then ends the connection (docs/conformance.md).
const LINK_IDLE_TIMEOUT: Duration = Duration::from_secs(6);

/// What `sdk-suite` was asked.
pub struct Options {
    /// Where `results.json` goes (and the started fixture's files).
    pub out: PathBuf,
    /// A fixture already started (`fixture.json`); `None` starts one.
    pub fixture: Option<PathBuf>,
    /// Only scenarios whose id contains one of these (all when empty).
    pub only: Vec<String>,
    /// A canary for the started fixture (`--canary` of `client-fixture`).
    pub canary: Option<String>,
    /// Run a deliberately broken client instead of the real one (the kit's self-check).
    pub broken_client: Option<BrokenClient>,
}

/// A deliberately broken client the kit ships, so that anyone can see the verdict reject it
/// (`sdk-suite --broken-client NAME`; docs/conformance.md, "The kit's self-check").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokenClient {
    /// Reports a `not_leader` redirect as the call's failure instead of following it (the
    /// real client, allowed no redirect hop).
    RedirectAsFailure,
}

impl BrokenClient {
    /// The broken client `--broken-client` names.
    pub fn parse(name: &str) -> Option<BrokenClient> {
        match name {
            "redirect-as-failure" => Some(BrokenClient::RedirectAsFailure),
            _ => None,
        }
    }

    fn breaks(self, config: &mut ClientConfig) {
        match self {
            BrokenClient::RedirectAsFailure => config.max_redirect_hops = 0,
        }
    }
}

/// Runs the suite and writes `results.json`; `Ok(true)` when nothing failed.
pub fn run(opts: &Options) -> Result<bool, String> {
    std::fs::create_dir_all(&opts.out)
        .map_err(|e| format!("creating {}: {e}", opts.out.display()))?;
    let mut started = None;
    let fixture_path = match &opts.fixture {
        Some(p) => p.clone(),
        None => {
            let (child, lines) = start_fixture(&opts.out, opts.canary.as_deref())?;
            started = Some((child, lines));
            opts.out.join("fixture.json")
        }
    };
    let outcome = (|| {
        let mut fx = Fx::load(&fixture_path)?;
        fx.broken = opts.broken_client;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("a runtime: {e}"))?;
        let mut outcomes = Vec::new();
        let mut failed = 0;
        let suite_start = Instant::now();
        for (id, scenario) in SCENARIOS {
            if !opts.only.is_empty() && !opts.only.iter().any(|o| id.contains(o.as_str())) {
                continue;
            }
            let t = Instant::now();
            let result = rt.block_on(async {
                fx.control("/scenario", json!({ "id": id })).await?;
                let r = match tokio::time::timeout(SCENARIO_LIMIT, scenario(&fx)).await {
                    Ok(r) => r,
                    Err(_) => Err(format!("did not finish within {SCENARIO_LIMIT:?}")),
                };
                let healed = fx.control("/heal", json!({})).await;
                let closed = fx.control("/scenario", json!({ "id": null })).await;
                let v = r?;
                healed?;
                closed?;
                Ok::<_, String>(v)
            });
            let (status, detail) = match result {
                Ok(Verdict::Pass) => ("pass", String::new()),
                Ok(Verdict::Skip(why)) => ("skip", why),
                Err(why) => {
                    failed += 1;
                    ("fail", why)
                }
            };
            println!(
                "{id:<64} {status:<4} {:>6.1}s {detail}",
                t.elapsed().as_secs_f64()
            );
            outcomes.push(json!({"id": id, "status": status, "detail": detail}));
        }
        // Client connections close with their runtime, before the fixture stops.
        drop(rt);
        let doc = json!({
            "client": "felix-client (Rust)",
            "version": client_version(),
            "outcomes": outcomes,
        });
        let path = opts.out.join("results.json");
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&doc).expect("plain JSON"),
        )
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
        println!(
            "sdk-suite: {} scenarios, {failed} failed, {:.0}s; results: {}",
            outcomes.len(),
            suite_start.elapsed().as_secs_f64(),
            path.display()
        );
        Ok(failed == 0)
    })();
    if let Some((child, lines)) = started {
        let stopped = stop_fixture(&fixture_path, child, lines);
        let ok = outcome?;
        stopped?;
        return Ok(ok);
    }
    outcome
}

/// felix-client's version, from its manifest (the crate we hold to the catalogue).
fn client_version() -> String {
    include_str!("../../felix-client/Cargo.toml")
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or("unknown")
        .to_owned()
}

type Lines = mpsc::Receiver<String>;

/// Starts `client-fixture` (this binary) writing into `out`, and waits for its ready line.
fn start_fixture(out: &Path, canary: Option<&str>) -> Result<(Child, Lines), String> {
    let exe = std::env::current_exe().map_err(|e| format!("this binary: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("client-fixture")
        .arg("--out")
        .arg(out.join("fixture.json"))
        .arg("--ca-file")
        .arg(out.join("brokers.pem"));
    if let Some(c) = canary {
        cmd.args(["--canary", c]);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting the fixture: {e}"))?;
    let stdout = child.stdout.take().expect("piped");
    let (tx, lines) = mpsc::channel();
    // Reads the fixture's output for as long as it runs, so its pipe never fills.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("fixture: {line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + START_LIMIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains("fixture ready") => return Ok((child, lines)),
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("the fixture did not become ready: {e}"));
            }
        }
    }
}

/// Stops the fixture (`POST /stop`), waits for it to exit (bounded) and checks it stopped
/// cleanly: only then is its evidence file complete.
fn stop_fixture(fixture: &Path, mut child: Child, lines: Lines) -> Result<(), String> {
    let control = std::fs::read_to_string(fixture)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|d| d["control_url"].as_str().map(str::to_owned))
        .and_then(|u| u.strip_prefix("http://").and_then(|a| a.parse().ok()));
    match control {
        Some(addr) => {
            if let Err(e) = http_post(addr, "/stop", &json!({})) {
                let _ = child.kill();
                return Err(format!("POST /stop: {e}"));
            }
        }
        None => {
            let _ = child.kill();
            return Err("the fixture wrote no control_url".into());
        }
    }
    // Its output ends when it exits.
    let deadline = Instant::now() + STOP_LIMIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(_) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("the fixture did not stop within {STOP_LIMIT:?}"));
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for the fixture: {e}"))?;
    if !status.success() {
        return Err(format!("the fixture exited {status}"));
    }
    Ok(())
}

/// One POST to the control endpoint: its JSON answer, or the error it gave.
fn http_post(addr: SocketAddr, path: &str, body: &Value) -> Result<Value, String> {
    let body = body.to_string();
    let mut s = TcpStream::connect_timeout(&addr, CONTROL_LIMIT).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(CONTROL_LIMIT))
        .and_then(|()| s.set_write_timeout(Some(CONTROL_LIMIT)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    let (head, rest) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP answer: {answer:?}"))?;
    let status = head.split_whitespace().nth(1).unwrap_or_default();
    if status != "200" {
        return Err(format!("POST {path} {body}: {status} {rest}"));
    }
    serde_json::from_str(rest).map_err(|e| format!("POST {path}: {e}: {rest:?}"))
}

/// `fixture.json`, and the control endpoint's calls.
struct Fx {
    addrs: Vec<SocketAddr>,
    nodes: Vec<(String, SocketAddr)>,
    tenant: String,
    ns: String,
    token: String,
    unauthorized: String,
    ca_pem: Vec<u8>,
    server_name: String,
    control: SocketAddr,
    link_addr: SocketAddr,
    link_stream: String,
    /// Every client this run makes is broken so (`--broken-client`).
    broken: Option<BrokenClient>,
}

impl Fx {
    fn load(path: &Path) -> Result<Fx, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let d: Value = serde_json::from_str(&text).map_err(|e| format!("fixture.json: {e}"))?;
        let s = |k: &str| {
            d[k].as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("fixture.json: no {k}"))
        };
        let addr = |v: &Value| {
            v.as_str()
                .and_then(|a| a.parse::<SocketAddr>().ok())
                .ok_or_else(|| format!("fixture.json: bad address {v}"))
        };
        let addrs = d["addrs"]
            .as_array()
            .ok_or("fixture.json: no addrs")?
            .iter()
            .map(addr)
            .collect::<Result<Vec<_>, _>>()?;
        let nodes = d["nodes"]
            .as_array()
            .ok_or("fixture.json: no nodes")?
            .iter()
            .map(|n| {
                Ok((
                    n["id"].as_str().unwrap_or_default().to_owned(),
                    addr(&n["addr"])?,
                ))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let ca_file = s("ca_file")?;
        let ca_pem = std::fs::read(&ca_file).map_err(|e| format!("reading {ca_file}: {e}"))?;
        let control = s("control_url")?;
        Ok(Fx {
            addrs,
            nodes,
            tenant: s("tenant_id")?,
            ns: s("namespace")?,
            token: s("token")?,
            unauthorized: s("unauthorized_token")?,
            ca_pem,
            server_name: s("server_name")?,
            control: addr(&json!(control.trim_start_matches("http://")))?,
            link_addr: addr(&d["link_addr"])?,
            link_stream: s("link_stream")?,
            broken: None,
        })
    }

    fn config(&self, seeds: Vec<SocketAddr>, token: &str) -> ClientConfig {
        let mut c = ClientConfig::with_seeds(seeds, self.ca_pem.clone(), &self.tenant, token);
        c.server_name = self.server_name.clone();
        c
    }

    async fn connect(&self, mut config: ClientConfig) -> Result<Client, String> {
        if let Some(b) = self.broken {
            b.breaks(&mut config);
        }
        let seeds = config.seed_list();
        Client::connect(config)
            .await
            .map_err(|e| format!("connecting to {seeds:?}: {e}"))
    }

    /// The cluster client seeded with every broker.
    async fn client(&self) -> Result<Client, String> {
        self.connect(self.config(self.addrs.clone(), &self.token))
            .await
    }

    async fn client_at(&self, seeds: Vec<SocketAddr>) -> Result<Client, String> {
        self.connect(self.config(seeds, &self.token)).await
    }

    async fn unauthorized_client(&self) -> Result<Client, String> {
        self.connect(self.config(self.addrs.clone(), &self.unauthorized))
            .await
    }

    /// A cluster client that reaches the cluster only through `seed`: offered without
    /// `FEATURE_TOPOLOGY` and `FEATURE_SHARD_OWNERS`, it learns no other broker and routes
    /// every call to its entry (which forwards it, or redirects a subscription).
    fn entry_only_config(&self, seed: SocketAddr) -> ClientConfig {
        let mut c = self.config(vec![seed], &self.token);
        let cluster = Offer::cluster();
        c.offer = Offer {
            flags: cluster.flags,
            features: Features(
                cluster.features.0 & !(Features::TOPOLOGY.0 | Features::SHARD_OWNERS.0),
            ),
        };
        c
    }

    /// The client for the `fault.*` scenarios: every datagram through `link_addr`, and the
    /// idle timeout the catalogue's steps are sized for ([`LINK_IDLE_TIMEOUT`]).
    async fn link_client(&self) -> Result<Client, String> {
        let mut config = self.entry_only_config(self.link_addr);
        config.idle_timeout = LINK_IDLE_TIMEOUT;
        self.connect(config).await
    }

    async fn control(&self, path: &str, body: Value) -> Result<Value, String> {
        let (addr, path) = (self.control, path.to_owned());
        tokio::task::spawn_blocking(move || http_post(addr, &path, &body))
            .await
            .map_err(|e| format!("control call: {e}"))?
    }

    /// The node leading `stream`'s shard 0 now: its id and client address.
    async fn leader(&self, stream: &str) -> Result<(String, SocketAddr), String> {
        let v = self.control("/leader", json!({ "stream": stream })).await?;
        let id = v["node"].as_str().ok_or("no leader named")?.to_owned();
        let addr = self.node_addr(&id)?;
        Ok((id, addr))
    }

    fn node_addr(&self, id: &str) -> Result<SocketAddr, String> {
        self.nodes
            .iter()
            .find(|(n, _)| n == id)
            .map(|(_, a)| *a)
            .ok_or_else(|| format!("no node {id}"))
    }
}

enum Verdict {
    Pass,
    Skip(String),
}

type R = Result<Verdict, String>;
type Fut<'a> = Pin<Box<dyn Future<Output = R> + 'a>>;

fn pass() -> R {
    Ok(Verdict::Pass)
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// The catalogue's scenarios, in its order, each with the function that shows it.
macro_rules! scenarios {
    ($($id:literal => $f:ident),* $(,)?) => {
        const SCENARIOS: &[(&str, for<'a> fn(&'a Fx) -> Fut<'a>)] = &[
            $(($id, { fn run(fx: &Fx) -> Fut<'_> { Box::pin($f(fx)) } run })),*
        ];
    };
}

scenarios! {
    "pubsub.roundtrip" => pubsub_roundtrip,
    "pubsub.order" => pubsub_order,
    "pubsub.offsets_are_contiguous" => pubsub_offsets_contiguous,
    "pubsub.resume_from_offset" => pubsub_resume_from_offset,
    "pubsub.start_earliest" => pubsub_start_earliest,
    "cache.put_get" => cache_put_get,
    "cache.miss_is_absent" => cache_miss_is_absent,
    "cache.delete_returns_previous" => cache_delete_returns_previous,
    "cache.ttl_expires" => cache_ttl_expires,
    "counter.add_returns_sum" => counter_add_returns_sum,
    "counter.get_absent_is_none" => counter_get_absent_is_none,
    "reconnect.survives_broker_loss" => reconnect_survives_broker_loss,
    "reconnect.discovers_brokers_from_one_seed" => reconnect_discovers_from_one_seed,
    "reconnect.subscription_resumes_at_the_next_offset" => reconnect_subscription_resumes_next,
    "redirect.follows_to_the_shard_owner" => redirect_follows_to_the_owner,
    "redirect.carries_the_start_offset_through_every_hop" => redirect_carries_the_start,
    "redirect.is_not_reported_as_a_failure" => redirect_is_not_a_failure,
    "retry.terminal_failures_are_not_retried" => retry_terminal_not_retried,
    "retry.ambiguous_outcomes_are_not_silently_retried" => retry_ambiguous_not_resent,
    "retry.idempotent_producers_re_send_ambiguous_outcomes" => retry_idempotent_producer,
    "retry.transport_failures_are_retried_against_another_broker" => retry_transport_elsewhere,
    "ack.none_does_not_wait_for_the_broker" => ack_none,
    "ack.per_message_means_the_broker_accepted_it" => ack_per_message,
    "ack.at_least_once_may_duplicate_and_says_so" => ack_at_least_once,
    "error.unknown_stream_is_typed" => error_unknown_stream,
    "error.unauthorized_is_typed" => error_unauthorized,
    "error.bad_offset_is_typed" => error_bad_offset,
    "error.shard_unavailable_is_retryable" => error_shard_unavailable,
    "error.quorum_timeout_is_outcome_unknown" => error_quorum_timeout,
    "client.concurrent_calls" => client_concurrent_calls,
    "client.close_is_idempotent" => client_close_is_idempotent,
    "client.subscription_ends_cleanly" => client_subscription_ends_cleanly,
    "fault.publish_through_a_dropped_link" => fault_publish_dropped,
    "fault.publish_through_a_reset_link" => fault_publish_reset,
    "fault.publish_through_a_stalled_link" => fault_publish_stalled,
    "fault.subscription_through_a_dropped_link" => fault_subscription_dropped,
    "fault.subscription_through_a_reset_link" => fault_subscription_reset,
    "fault.subscription_through_a_stalled_link" => fault_subscription_stalled,
    "queue.poll_returns_claimed_records" => queue_poll,
    "queue.acknowledged_records_are_not_redelivered" => queue_ack,
    "queue.unacknowledged_records_are_redelivered" => queue_nack,
    "queue.dead_letters_are_listable_and_redrivable" => queue_dead_letters,
    "watch.delivers_changes_for_the_filter" => watch_filter,
    "watch.deletes_arrive_as_changes_without_values" => watch_delete,
    "watch.resumes_from_an_offset" => watch_resume,
    "watch.lag_is_reported_rather_than_silent" => watch_lag,
    "watch.retained_delivers_state_before_changes" => watch_retained,
    "sharded.delivers_every_shard" => sharded_every_shard,
    "sharded.reports_the_shard_count" => sharded_shard_count,
    "sharded.resumes_per_shard" => sharded_resumes_per_shard,
    "sharded.a_lost_shard_is_surfaced" => sharded_lost_shard,
    "commit.returns_the_offset" => commit_returns_the_offset,
    "commit.state_get_returns_the_version" => commit_state_get,
    "commit.another_stream_is_refused" => commit_another_stream,
    "commit.exactly_one_event" => commit_exactly_one_event,
    "commit.negotiated" => commit_negotiated,
}

// ---------------------------------------------------------------- helpers

/// A name no earlier run or scenario used.
fn uniq(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn failed(what: &str) -> impl FnOnce(ClientError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// One acknowledged publish: its offset.
async fn publish(
    c: &Client,
    fx: &Fx,
    stream: &str,
    payload: impl Into<Bytes>,
) -> Result<u64, String> {
    c.publish(&fx.ns, stream, vec![payload.into()], None, Ack::PerMessage)
        .await
        .map_err(failed(&format!("publish to {stream}")))?
        .ok_or_else(|| format!("an acknowledged publish to {stream} without an offset"))
}

async fn published(
    c: &Client,
    fx: &Fx,
    stream: &str,
    n: usize,
    tag: &str,
) -> Result<(Vec<Bytes>, Vec<u64>), String> {
    let mut payloads = Vec::new();
    let mut offsets = Vec::new();
    for i in 0..n {
        let p = Bytes::from(format!("{tag}-{i}"));
        offsets.push(publish(c, fx, stream, p.clone()).await?);
        payloads.push(p);
    }
    Ok((payloads, offsets))
}

async fn subscribe(
    c: &Client,
    fx: &Fx,
    stream: &str,
    start: Start,
) -> Result<Subscription, String> {
    c.subscribe(&fx.ns, stream, start)
        .await
        .map_err(failed(&format!("subscribe to {stream}")))
}

/// The next event, within [`EVENT_LIMIT`]; an end or an error is a failure.
async fn next_event(sub: &mut Subscription) -> Result<Event, String> {
    match tokio::time::timeout(EVENT_LIMIT, sub.next()).await {
        Err(_) => Err(format!("no event within {EVENT_LIMIT:?}")),
        Ok(Err(e)) => Err(format!("the subscription failed: {e}")),
        Ok(Ok(SubscriptionItem::End(end))) => Err(format!("the subscription ended: {end:?}")),
        Ok(Ok(SubscriptionItem::Event(e))) => Ok(e),
    }
}

async fn read(sub: &mut Subscription, n: usize) -> Result<Vec<Event>, String> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        out.push(
            next_event(sub)
                .await
                .map_err(|e| format!("{} of {n} events: {e}", out.len()))?,
        );
    }
    Ok(out)
}

fn offset(e: &Event) -> Result<u64, String> {
    e.offset
        .ok_or_else(|| "an event on a durable stream without an offset".into())
}

fn offsets(events: &[Event]) -> Result<Vec<u64>, String> {
    events.iter().map(offset).collect()
}

/// `f()` until it returns `Some`, each call a broker round trip (the client's own retries and
/// backoff pace it), bounded by `limit`.
async fn until<T, F, Fut2>(limit: Duration, what: &str, mut f: F) -> Result<T, String>
where
    F: FnMut() -> Fut2,
    Fut2: Future<Output = Result<Option<T>, ClientError>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    let mut last = None;
    for _ in 0..100_000 {
        match tokio::time::timeout_at(deadline, f()).await {
            Err(_) => break,
            Ok(Ok(Some(v))) => return Ok(v),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => last = Some(e.to_string()),
        }
        if tokio::time::Instant::now() >= deadline {
            break;
        }
    }
    Err(format!(
        "{what}: not within {limit:?} (last error: {last:?})"
    ))
}

/// A call bounded by [`CALL_LIMIT`]: a hang is a failure.
async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> Result<T, String> {
    tokio::time::timeout(CALL_LIMIT, f)
        .await
        .map_err(|_| format!("{what} hung past {CALL_LIMIT:?}"))
}

// ---------------------------------------------------------------- publish and subscribe

async fn pubsub_roundtrip(fx: &Fx) -> R {
    let c = fx.client().await?;
    let payload: Vec<u8> = (0..=255u8).chain([0xff, 0xfe, 0x00]).collect();
    let off = publish(&c, fx, "events", payload.clone()).await?;
    let mut sub = subscribe(&c, fx, "events", Start::Offset(off)).await?;
    let ev = next_event(&mut sub).await?;
    ensure!(
        ev.payload[..] == payload[..],
        "the payload changed on the way"
    );
    ensure!(
        ev.offset == Some(off),
        "delivered at {:?}, published at {off}",
        ev.offset
    );
    pass()
}

async fn pubsub_order(fx: &Fx) -> R {
    let c = fx.client().await?;
    let (payloads, offs) = published(&c, fx, "events", 20, &uniq("order")).await?;
    let mut sub = subscribe(&c, fx, "events", Start::Offset(offs[0])).await?;
    let got: Vec<Bytes> = read(&mut sub, 20)
        .await?
        .into_iter()
        .map(|e| e.payload)
        .collect();
    ensure!(got == payloads, "out of order: {got:?}");
    pass()
}

async fn pubsub_offsets_contiguous(fx: &Fx) -> R {
    let c = fx.client().await?;
    let (_, offs) = published(&c, fx, "events", 10, &uniq("contig")).await?;
    let mut sub = subscribe(&c, fx, "events", Start::Offset(offs[0])).await?;
    let got = offsets(&read(&mut sub, 10).await?)?;
    let want: Vec<u64> = (offs[0]..offs[0] + 10).collect();
    ensure!(
        got == want && offs == want,
        "delivered {got:?}, acknowledged {offs:?}"
    );
    pass()
}

async fn pubsub_resume_from_offset(fx: &Fx) -> R {
    let c = fx.client().await?;
    let (payloads, offs) = published(&c, fx, "events", 6, &uniq("resume")).await?;
    let mut sub = subscribe(&c, fx, "events", Start::Offset(offs[0])).await?;
    let first = read(&mut sub, 3).await?;
    let last = offset(&first[2])?;
    drop(sub);
    c.close().await;
    let again = fx.client().await?;
    let mut sub = subscribe(&again, fx, "events", Start::Offset(last + 1)).await?;
    let rest = read(&mut sub, 3).await?;
    ensure!(
        offsets(&rest)? == offs[3..],
        "resumed at {:?}, want {:?}",
        offsets(&rest)?,
        &offs[3..]
    );
    let all: Vec<Bytes> = first
        .iter()
        .chain(&rest)
        .map(|e| e.payload.clone())
        .collect();
    ensure!(
        all == payloads,
        "a gap or a duplicate across the resumption"
    );
    pass()
}

async fn pubsub_start_earliest(fx: &Fx) -> R {
    let c = fx.client().await?;
    publish(&c, fx, "events", "earliest").await?;
    let mut sub = subscribe(&c, fx, "events", Start::Earliest).await?;
    let first = next_event(&mut sub).await?;
    // Nothing is trimmed on the fixture: the oldest retained record is offset 0.
    ensure!(
        first.offset == Some(0),
        "earliest delivered {:?} first",
        first.offset
    );
    pass()
}

// ---------------------------------------------------------------- cache and counters

async fn cache_put_get(fx: &Fx) -> R {
    let c = fx.client().await?;
    let (k, v) = (uniq("k"), Bytes::from_static(b"\x00value\xff"));
    c.cache_put(&fx.ns, "cache", &k, v.clone(), None)
        .await
        .map_err(failed("put"))?;
    let got = c
        .cache_get(&fx.ns, "cache", &k)
        .await
        .map_err(failed("get"))?;
    ensure!(got == Some(v), "read back {got:?}");
    pass()
}

async fn cache_miss_is_absent(fx: &Fx) -> R {
    let c = fx.client().await?;
    let got = c
        .cache_get(&fx.ns, "cache", &uniq("never"))
        .await
        .map_err(failed("get"))?;
    ensure!(got.is_none(), "a key never written read {got:?}");
    pass()
}

async fn cache_delete_returns_previous(fx: &Fx) -> R {
    let c = fx.client().await?;
    let k = uniq("del");
    c.cache_put(&fx.ns, "cache", &k, Bytes::from_static(b"held"), None)
        .await
        .map_err(failed("put"))?;
    let first = c
        .cache_delete(&fx.ns, "cache", &k)
        .await
        .map_err(failed("delete"))?;
    ensure!(
        first.as_deref() == Some(&b"held"[..]),
        "delete returned {first:?}"
    );
    let second = c
        .cache_delete(&fx.ns, "cache", &k)
        .await
        .map_err(failed("second delete"))?;
    ensure!(
        second.is_none(),
        "deleting an absent key returned {second:?}"
    );
    pass()
}

async fn cache_ttl_expires(fx: &Fx) -> R {
    let c = fx.client().await?;
    let k = uniq("ttl");
    let start = Instant::now();
    c.cache_put(
        &fx.ns,
        "cache",
        &k,
        Bytes::from_static(b"brief"),
        Some(Duration::from_millis(500)),
    )
    .await
    .map_err(failed("put"))?;
    let got = c
        .cache_get(&fx.ns, "cache", &k)
        .await
        .map_err(failed("get"))?;
    ensure!(
        got.as_deref() == Some(&b"brief"[..]),
        "read {got:?} before the TTL"
    );
    until(Duration::from_secs(10), "expiry", || async {
        Ok(c.cache_get(&fx.ns, "cache", &k)
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    // Not before the TTL (less clock granularity: the broker counts from the put's arrival).
    ensure!(
        start.elapsed() >= Duration::from_millis(450),
        "absent after {:?}",
        start.elapsed()
    );
    pass()
}

async fn counter_add_returns_sum(fx: &Fx) -> R {
    let c = fx.client().await?;
    let k = uniq("n");
    let a = c
        .counter_add(&fx.ns, "cache", &k, 5)
        .await
        .map_err(failed("add"))?;
    let b = c
        .counter_add(&fx.ns, "cache", &k, -2)
        .await
        .map_err(failed("add"))?;
    ensure!((a, b) == (5, 3), "sums {a}, {b}");
    pass()
}

async fn counter_get_absent_is_none(fx: &Fx) -> R {
    let c = fx.client().await?;
    let k = uniq("n");
    let never = c
        .counter_get(&fx.ns, "cache", &k)
        .await
        .map_err(failed("get"))?;
    ensure!(never.is_none(), "an unwritten counter read {never:?}");
    c.counter_add(&fx.ns, "cache", &k, 1)
        .await
        .map_err(failed("add"))?;
    c.counter_add(&fx.ns, "cache", &k, -1)
        .await
        .map_err(failed("add"))?;
    let zero = c
        .counter_get(&fx.ns, "cache", &k)
        .await
        .map_err(failed("get"))?;
    ensure!(zero == Some(0), "a counter back at zero read {zero:?}");
    pass()
}

// ---------------------------------------------------------------- reconnection

async fn put_until(
    c: &Client,
    fx: &Fx,
    key: &str,
    value: &'static [u8],
    what: &str,
) -> Result<(), String> {
    until(Duration::from_secs(60), what, || async {
        c.cache_put(&fx.ns, "cache", key, Bytes::from_static(value), None)
            .await
            .map(Some)
    })
    .await
}

async fn reconnect_survives_broker_loss(fx: &Fx) -> R {
    let (first_id, first) = fx.nodes[0].clone();
    let mut seeds = vec![first];
    seeds.extend(fx.addrs.iter().filter(|a| **a != first));
    let c = fx.client_at(seeds).await?;
    c.cache_put(
        &fx.ns,
        "cache",
        &uniq("before"),
        Bytes::from_static(b"x"),
        None,
    )
    .await
    .map_err(failed("put before"))?;
    fx.control("/fence", json!({"node": first_id, "how": "freeze"}))
        .await?;
    let k = uniq("after");
    put_until(&c, fx, &k, b"y", "a put after the broker was lost").await?;
    let got = c
        .cache_get(&fx.ns, "cache", &k)
        .await
        .map_err(failed("get"))?;
    ensure!(got.as_deref() == Some(&b"y"[..]), "read back {got:?}");
    pass()
}

async fn reconnect_discovers_from_one_seed(fx: &Fx) -> R {
    let (seed_id, seed) = fx.nodes[1].clone();
    let want: BTreeSet<SocketAddr> = fx.addrs.iter().copied().collect();
    // A fresh client each time: a node thawed by an earlier scenario's heal is listed again
    // once the cluster has heard from it.
    let c = until(
        Duration::from_secs(30),
        "the seed naming every broker",
        || async {
            let c = Client::connect(fx.config(vec![seed], &fx.token)).await?;
            let known: BTreeSet<SocketAddr> = c.endpoints().into_iter().collect();
            Ok((known == want).then_some(c))
        },
    )
    .await?;
    fx.control("/fence", json!({"node": seed_id, "how": "freeze"}))
        .await?;
    let k = uniq("seedless");
    put_until(&c, fx, &k, b"z", "a put once the only seed is gone").await?;
    let got = c
        .cache_get(&fx.ns, "cache", &k)
        .await
        .map_err(failed("get"))?;
    ensure!(got.as_deref() == Some(&b"z"[..]), "read back {got:?}");
    ensure!(
        !c.connected_brokers().contains(&seed),
        "still connected to the frozen seed"
    );
    pass()
}

async fn reconnect_subscription_resumes_next(fx: &Fx) -> R {
    let c = fx.client().await?;
    let (payloads, offs) = published(&c, fx, "events", 6, &uniq("next")).await?;
    let mut sub = subscribe(&c, fx, "events", Start::Offset(offs[0])).await?;
    let handled = read(&mut sub, 3).await?;
    // The client's own position: the last offset it handed over.
    let position = sub
        .position()
        .ok_or("the subscription reports no position")?;
    ensure!(
        position == offset(&handled[2])?,
        "position {position}, last handled {:?}",
        handled[2].offset
    );
    drop(sub);
    c.close().await;
    let again = fx.client().await?;
    let mut sub = subscribe(&again, fx, "events", Start::Offset(position + 1)).await?;
    let rest = read(&mut sub, 3).await?;
    let all: Vec<&Event> = handled.iter().chain(&rest).collect();
    let got: Vec<u64> = all.iter().map(|e| offset(e)).collect::<Result<_, _>>()?;
    ensure!(got == offs, "offsets {got:?}, want {offs:?}");
    ensure!(
        all.iter().map(|e| &e.payload).eq(payloads.iter()),
        "payloads differ"
    );
    pass()
}

// ---------------------------------------------------------------- redirects

/// A client whose only way in is a broker that does not lead `events`. Our client normally
/// asks `shard_owners` and subscribes at the owner, never meeting a redirect; offered without
/// that feature it sends the subscribe to its entry, as a client with a stale owner table does.
async fn through_non_owner(fx: &Fx) -> Result<Client, String> {
    let (leader, _) = fx.leader("events").await?;
    let entry = fx
        .nodes
        .iter()
        .find(|(id, _)| *id != leader)
        .map(|(_, a)| *a)
        .ok_or("no node other than the leader")?;
    let mut config = fx.entry_only_config(entry);
    // A redirect is routing within one attempt: one attempt must be enough.
    config.retry.max_attempts = 1;
    fx.connect(config).await
}

async fn redirect_follows_to_the_owner(fx: &Fx) -> R {
    let c = through_non_owner(fx).await?;
    let off = publish(&fx.client().await?, fx, "events", "via-owner").await?;
    let mut sub = subscribe(&c, fx, "events", Start::Offset(off)).await?;
    let ev = next_event(&mut sub).await?;
    ensure!(
        ev.payload[..] == b"via-owner"[..] && ev.offset == Some(off),
        "got {ev:?}"
    );
    pass()
}

async fn redirect_carries_the_start(fx: &Fx) -> R {
    let c = through_non_owner(fx).await?;
    let writer = fx.client().await?;
    let (_, offs) = published(&writer, fx, "events", 5, &uniq("hop")).await?;
    let mut sub = subscribe(&c, fx, "events", Start::Offset(offs[1])).await?;
    ensure!(
        sub.start_offset() == Some(offs[1]),
        "started at {:?}, asked {}",
        sub.start_offset(),
        offs[1]
    );
    let got = offsets(&read(&mut sub, 4).await?)?;
    ensure!(got == offs[1..], "delivered {got:?}, want {:?}", &offs[1..]);
    pass()
}

async fn redirect_is_not_a_failure(fx: &Fx) -> R {
    // One attempt per call (`through_non_owner`): a redirect spent as a failed attempt fails.
    let c = through_non_owner(fx).await?;
    let writer = fx.client().await?;
    for i in 0..3 {
        let off = publish(&writer, fx, "events", format!("r{i}")).await?;
        let mut sub = subscribe(&c, fx, "events", Start::Offset(off)).await?;
        let ev = next_event(&mut sub).await?;
        ensure!(
            ev.offset == Some(off),
            "call {i}: delivered {:?}",
            ev.offset
        );
    }
    pass()
}

// ---------------------------------------------------------------- retry classification

async fn retry_terminal_not_retried(fx: &Fx) -> R {
    let c = fx.unauthorized_client().await?;
    let start = Instant::now();
    let r = c
        .publish(
            &fx.ns,
            "events",
            vec![Bytes::from_static(b"refused")],
            None,
            Ack::PerMessage,
        )
        .await;
    let elapsed = start.elapsed();
    let e = match r {
        Ok(v) => return Err(format!("a forbidden publish was acknowledged: {v:?}")),
        Err(e) => e,
    };
    ensure!(
        !matches!(e, ClientError::Connection(_) | ClientError::Timeout(_)),
        "reported as transport: {e}"
    );
    ensure!(
        e.code() == Some(&ErrorCode::Forbidden) && e.retry() == Some(RetryClass::Fatal),
        "{e}"
    );
    // At once, not after a retry budget (the backoff alone takes seconds).
    ensure!(
        elapsed < Duration::from_secs(3),
        "reported after {elapsed:?}"
    );
    pass()
}

async fn retry_ambiguous_not_resent(fx: &Fx) -> R {
    let (_, leader) = fx.leader("quorum").await?;
    let c = fx.client_at(vec![leader]).await?;
    let before = publish(&c, fx, "quorum", "before").await?;
    let tag = Bytes::from(uniq("ambiguous"));
    fx.control("/partition", json!({"stream": "quorum"}))
        .await?;
    let r = c
        .publish(&fx.ns, "quorum", vec![tag.clone()], None, Ack::PerMessage)
        .await;
    match r {
        Ok(v) => {
            return Err(format!(
                "a publish no majority confirmed was acknowledged: {v:?}"
            ))
        }
        Err(e) => ensure!(
            e.retry() == Some(RetryClass::OutcomeUnknown),
            "not reported as outcome unknown: {e}"
        ),
    }
    fx.control("/heal", json!({})).await?;
    let after = until(
        Duration::from_secs(60),
        "a publish after the heal",
        || async {
            c.publish(
                &fx.ns,
                "quorum",
                vec![Bytes::from_static(b"after")],
                None,
                Ack::PerMessage,
            )
            .await
        },
    )
    .await?;
    let reader = fx.client().await?;
    let mut sub = subscribe(&reader, fx, "quorum", Start::Offset(before)).await?;
    let mut copies = 0;
    loop {
        let ev = next_event(&mut sub).await?;
        copies += usize::from(ev.payload == tag);
        if offset(&ev)? >= after {
            break;
        }
    }
    ensure!(copies <= 1, "the ambiguous publish landed {copies} times");
    pass()
}

async fn retry_idempotent_producer(_fx: &Fx) -> R {
    Ok(Verdict::Skip(
        "felix-client has producer_init and publish_idempotent but no producer that re-sends \
         by itself: publish_idempotent is not retried (docs/client.md), the caller re-sends \
         under the same sequence"
            .into(),
    ))
}

async fn retry_transport_elsewhere(fx: &Fx) -> R {
    let (dead_id, dead) = fx.nodes[2].clone();
    fx.control("/fence", json!({"node": dead_id, "how": "freeze"}))
        .await?;
    // Seeded with the frozen broker first: the call goes on to another one.
    let mut seeds = vec![dead];
    seeds.extend(fx.addrs.iter().filter(|a| **a != dead));
    let c = fx.client_at(seeds).await?;
    let k = uniq("elsewhere");
    put_until(&c, fx, &k, b"v", "a put with the first seed down").await?;
    let got = c
        .cache_get(&fx.ns, "cache", &k)
        .await
        .map_err(failed("get"))?;
    ensure!(got.as_deref() == Some(&b"v"[..]), "read back {got:?}");
    ensure!(
        !c.connected_brokers().contains(&dead),
        "connected to the frozen broker"
    );
    pass()
}

// ---------------------------------------------------------------- acknowledgement modes

async fn ack_none(fx: &Fx) -> R {
    let c = fx.link_client().await?;
    publish(&c, fx, &fx.link_stream, "warm").await?;
    // Every datagram is held for 3 s: a call that waited for the broker would take that long.
    fx.control("/link", json!({"fault": "stall", "hold_ms": 3000}))
        .await?;
    let start = Instant::now();
    let r = bounded(
        "an ack-none publish",
        c.publish(
            &fx.ns,
            &fx.link_stream,
            vec![Bytes::from_static(b"unacked")],
            None,
            Ack::None,
        ),
    )
    .await?;
    let elapsed = start.elapsed();
    ensure!(matches!(r, Ok(None)), "answered {r:?}");
    ensure!(
        elapsed < Duration::from_millis(1500),
        "returned after {elapsed:?}"
    );
    pass()
}

async fn ack_per_message(fx: &Fx) -> R {
    let c = fx.client().await?;
    let off = publish(&c, fx, "events", "acked").await?;
    let mut sub = subscribe(&c, fx, "events", Start::Offset(off)).await?;
    let ev = next_event(&mut sub).await?;
    ensure!(
        ev.payload[..] == b"acked"[..],
        "read {ev:?} at the acknowledged offset"
    );
    // A record the broker refused is never reported as published.
    let refused = fx
        .unauthorized_client()
        .await?
        .publish(
            &fx.ns,
            "events",
            vec![Bytes::from_static(b"no")],
            None,
            Ack::PerMessage,
        )
        .await;
    ensure!(refused.is_err(), "a refused publish returned {refused:?}");
    pass()
}

async fn ack_at_least_once(fx: &Fx) -> R {
    // The call site says it (its name) and so does its documentation.
    let source = include_str!("../../felix-client/src/client/mod.rs");
    let at = source
        .find("pub async fn publish_at_least_once")
        .ok_or("no publish_at_least_once")?;
    let doc: String = source[..at]
        .lines()
        .rev()
        .skip(1)
        .take_while(|l| l.trim_start().starts_with("///"))
        .collect();
    ensure!(
        doc.contains("at least once") && doc.contains("twice"),
        "its documentation does not say it may duplicate: {doc}"
    );
    let c = fx.client().await?;
    let off = c
        .publish_at_least_once(&fx.ns, "events", vec![Bytes::from_static(b"alo")], None)
        .await
        .map_err(failed("publish_at_least_once"))?;
    ensure!(off.is_some(), "no offset");
    pass()
}

// ---------------------------------------------------------------- errors

async fn error_unknown_stream(fx: &Fx) -> R {
    let c = fx.client().await?;
    let r = c
        .publish(
            &fx.ns,
            &uniq("undeclared"),
            vec![Bytes::from_static(b"x")],
            None,
            Ack::PerMessage,
        )
        .await;
    match r {
        Ok(v) => Err(format!("a publish to an undeclared stream answered {v:?}")),
        Err(e) => {
            ensure!(
                e.code() == Some(&ErrorCode::NotFound),
                "not typed not_found: {e}"
            );
            pass()
        }
    }
}

async fn error_unauthorized(fx: &Fx) -> R {
    let c = fx.unauthorized_client().await?;
    let r = c
        .publish(
            &fx.ns,
            "events",
            vec![Bytes::from_static(b"x")],
            None,
            Ack::PerMessage,
        )
        .await;
    match r {
        Ok(v) => Err(format!("a forbidden publish answered {v:?}")),
        Err(e) => {
            ensure!(
                matches!(e, ClientError::Server { .. }),
                "not a broker refusal: {e}"
            );
            ensure!(
                e.code() == Some(&ErrorCode::Forbidden) && e.retry() == Some(RetryClass::Fatal),
                "{e}"
            );
            pass()
        }
    }
}

async fn error_bad_offset(_fx: &Fx) -> R {
    Ok(Verdict::Skip(
        "the fixture trims no log (no retention short enough to discard history within the \
         run), so no offset has been discarded"
            .into(),
    ))
}

async fn error_shard_unavailable(fx: &Fx) -> R {
    let (_, leader) = fx.leader("fenced").await?;
    // Two attempts a call: the fenced leader holds each refused publish for the fixture's
    // forward timeout (3 s), and the error's type, not the client's patience, is the point.
    let mut config = fx.config(vec![leader], &fx.token);
    config.retry.max_attempts = 2;
    let c = fx.connect(config).await?;
    publish(&c, fx, "fenced", "before").await?;
    fx.control("/fence", json!({"stream": "fenced"})).await?;
    // Taken until the leader's lease runs out (seconds), then refused; each publish is a
    // round trip (and the client's own bounded retries), bounded in count and time.
    let deadline = Instant::now() + Duration::from_secs(60);
    let e = loop {
        ensure!(Instant::now() < deadline, "the fenced leader never refused");
        match bounded(
            "a publish to a fenced shard",
            c.publish(
                &fx.ns,
                "fenced",
                vec![Bytes::from_static(b"during")],
                None,
                Ack::PerMessage,
            ),
        )
        .await?
        {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    ensure!(
        matches!(
            e.code(),
            Some(ErrorCode::ShardUnavailable | ErrorCode::NotLeader)
        ),
        "not typed as an unavailable shard: {e}"
    );
    ensure!(
        matches!(
            e.retry(),
            Some(RetryClass::Retry | RetryClass::RetryAfter | RetryClass::Redirect)
        ),
        "not retryable: {e}"
    );
    pass()
}

async fn error_quorum_timeout(fx: &Fx) -> R {
    let (_, leader) = fx.leader("quorum").await?;
    let c = fx.client_at(vec![leader]).await?;
    publish(&c, fx, "quorum", "before").await?;
    fx.control("/partition", json!({"stream": "quorum"}))
        .await?;
    let r = c
        .publish(
            &fx.ns,
            "quorum",
            vec![Bytes::from_static(b"unconfirmed")],
            None,
            Ack::PerMessage,
        )
        .await;
    match r {
        Ok(v) => Err(format!(
            "an unconfirmed quorum write was acknowledged: {v:?}"
        )),
        Err(e) => {
            ensure!(
                e.code() == Some(&ErrorCode::QuorumTimeout)
                    && e.retry() == Some(RetryClass::OutcomeUnknown),
                "not quorum_timeout / outcome_unknown: {e}"
            );
            pass()
        }
    }
}

// ---------------------------------------------------------------- concurrency and lifecycle

async fn client_concurrent_calls(fx: &Fx) -> R {
    let c = fx.client().await?;
    let tag = uniq("conc");
    let mut tasks = Vec::new();
    for n in 0..8 {
        let (c, tag, ns) = (c.clone(), tag.clone(), fx.ns.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..10 {
                let payload = Bytes::from(format!("{tag}-{n}-{i}"));
                let off = c
                    .publish(&ns, "events", vec![payload.clone()], None, Ack::PerMessage)
                    .await
                    .map_err(|e| format!("task {n} publish {i}: {e}"))?
                    .ok_or("no offset")?;
                out.push((off, payload));
            }
            Ok::<_, String>(out)
        }));
    }
    let mut want = HashMap::new();
    for t in tasks {
        for (off, p) in t.await.map_err(|e| format!("a task: {e}"))?? {
            ensure!(
                want.insert(off, p).is_none(),
                "two publishes acknowledged at offset {off}"
            );
        }
    }
    ensure!(want.len() == 80, "{} of 80 acknowledged", want.len());
    let first = *want.keys().min().expect("80");
    let mut sub = subscribe(&c, fx, "events", Start::Offset(first)).await?;
    let mut got = HashMap::new();
    while got.len() < 80 {
        let ev = next_event(&mut sub).await?;
        let o = offset(&ev)?;
        if want.contains_key(&o) {
            got.insert(o, ev.payload);
        }
    }
    ensure!(
        got == want,
        "a record is not what was acknowledged at its offset"
    );
    pass()
}

async fn client_close_is_idempotent(fx: &Fx) -> R {
    let c = fx.client().await?;
    let sub = subscribe(&c, fx, "events", Start::Latest).await?;
    // A subscription is closed by dropping it (once, by ownership); the client by `close`,
    // which consumes one handle: closing every clone closes the same connections again.
    drop(sub);
    let (a, b) = (c.clone(), c.clone());
    bounded("the first close", c.close()).await?;
    bounded("a second close", a.close()).await?;
    bounded("a third close", b.close()).await?;
    pass()
}

async fn client_subscription_ends_cleanly(fx: &Fx) -> R {
    let c = fx.client().await?;
    let off = publish(&c, fx, "doomed", "last").await?;
    let mut sub = subscribe(&c, fx, "doomed", Start::Offset(off)).await?;
    read(&mut sub, 1).await?;
    fx.control("/delete", json!({"stream": "doomed"})).await?;
    // The broker ends the event stream: the subscription reports the end rather than hanging.
    let end = tokio::time::timeout(EVENT_LIMIT, sub.next())
        .await
        .map_err(|_| format!("no end within {EVENT_LIMIT:?} of the stream's deletion"))?;
    ensure!(
        matches!(
            end,
            Ok(SubscriptionItem::End(SubscriptionEnd::StreamDeleted))
        ),
        "answered {end:?}"
    );
    let again = bounded("next after the end", sub.next()).await?;
    ensure!(
        matches!(again, Ok(SubscriptionItem::End(_))),
        "after the end: {again:?}"
    );
    pass()
}

// ---------------------------------------------------------------- connection faults

/// The catalogue's steps: (during, fault, after_records, records, hold_ms).
fn step(id: &str) -> (&'static str, &'static str, usize, usize, u64) {
    match id {
        "fault.publish_through_a_dropped_link" => ("publish", "drop", 3, 10, 8000),
        "fault.publish_through_a_reset_link" => ("publish", "reset", 3, 10, 0),
        "fault.publish_through_a_stalled_link" => ("publish", "stall", 3, 10, 2000),
        "fault.subscription_through_a_dropped_link" => ("subscribe", "drop", 3, 10, 8000),
        "fault.subscription_through_a_reset_link" => ("subscribe", "reset", 3, 10, 0),
        _ => ("subscribe", "stall", 3, 10, 2000),
    }
}

async fn publish_through_fault(fx: &Fx, id: &str) -> R {
    let (_, fault, after, records, hold_ms) = step(id);
    let c = fx.link_client().await?;
    let tag = uniq(fault);
    let mut acked = HashMap::new();
    let mut errors = Vec::new();
    for i in 0..records {
        if i == after {
            fx.control("/link", json!({"fault": fault, "hold_ms": hold_ms}))
                .await?;
        }
        let payload = Bytes::from(format!("{tag}-{i}"));
        let r = bounded(
            &format!("publish {i}"),
            c.publish(
                &fx.ns,
                &fx.link_stream,
                vec![payload.clone()],
                None,
                Ack::PerMessage,
            ),
        )
        .await?;
        match r {
            Ok(Some(off)) => {
                acked.insert(off, payload);
            }
            Ok(None) => return Err("an acknowledged publish without an offset".into()),
            Err(e) => errors.push(e.to_string()),
        }
    }
    if fault == "stall" {
        ensure!(
            errors.is_empty(),
            "a stall shorter than the idle timeout failed calls: {errors:?}"
        );
    }
    // Once the fault is over a publish succeeds again (retrying until then is fine).
    let end = until(
        Duration::from_secs(60),
        "a publish after the fault",
        || async {
            c.publish(
                &fx.ns,
                &fx.link_stream,
                vec![Bytes::from_static(b"end")],
                None,
                Ack::PerMessage,
            )
            .await
        },
    )
    .await?;
    let reader = fx.client().await?;
    let from = acked.keys().copied().min().unwrap_or(end).min(end);
    let mut sub = subscribe(&reader, fx, &fx.link_stream, Start::Offset(from)).await?;
    let mut seen = HashMap::new();
    loop {
        let ev = next_event(&mut sub).await?;
        let o = offset(&ev)?;
        seen.insert(o, ev.payload);
        if o >= end {
            break;
        }
    }
    let lost: Vec<u64> = acked
        .iter()
        .filter(|(o, p)| seen.get(o) != Some(p))
        .map(|(o, _)| *o)
        .collect();
    ensure!(
        lost.is_empty(),
        "acknowledged records not readable at their offsets: {lost:?}"
    );
    pass()
}

async fn subscribe_through_fault(fx: &Fx, id: &str) -> R {
    let (_, fault, after, records, hold_ms) = step(id);
    let writer = fx.client().await?;
    let start = publish(&writer, fx, &fx.link_stream, "start").await? + 1;
    let c = fx.link_client().await?;
    let mut sub = subscribe(&c, fx, &fx.link_stream, Start::Offset(start)).await?;
    let tag = uniq(fault);
    let payloads: Vec<Bytes> = (0..records)
        .map(|i| Bytes::from(format!("{tag}-{i}")))
        .collect();
    for p in &payloads[..after] {
        publish(&writer, fx, &fx.link_stream, p.clone()).await?;
    }
    let mut got = read(&mut sub, after).await?;
    fx.control("/link", json!({"fault": fault, "hold_ms": hold_ms}))
        .await?;
    for p in &payloads[after..] {
        publish(&writer, fx, &fx.link_stream, p.clone()).await?;
    }
    let mut raised = None;
    while got.len() < records {
        match bounded("the subscription's next event", sub.next()).await? {
            Ok(SubscriptionItem::Event(ev)) => got.push(ev),
            Ok(SubscriptionItem::End(end)) => {
                return Err(format!(
                    "the subscription ended quietly on a faulted link: {end:?}"
                ))
            }
            Err(e) => {
                raised = Some(e);
                break;
            }
        }
    }
    let offs = offsets(&got)?;
    let want: Vec<u64> = (start..start + got.len() as u64).collect();
    ensure!(offs == want, "not contiguous: {offs:?}");
    ensure!(
        got.iter()
            .map(|e| &e.payload)
            .eq(payloads[..got.len()].iter()),
        "payloads differ"
    );
    if fault == "stall" {
        ensure!(
            raised.is_none(),
            "a stall failed the subscription: {raised:?}"
        );
    }
    pass()
}

async fn fault_publish_dropped(fx: &Fx) -> R {
    publish_through_fault(fx, "fault.publish_through_a_dropped_link").await
}

async fn fault_publish_reset(fx: &Fx) -> R {
    publish_through_fault(fx, "fault.publish_through_a_reset_link").await
}

async fn fault_publish_stalled(fx: &Fx) -> R {
    publish_through_fault(fx, "fault.publish_through_a_stalled_link").await
}

async fn fault_subscription_dropped(fx: &Fx) -> R {
    subscribe_through_fault(fx, "fault.subscription_through_a_dropped_link").await
}

async fn fault_subscription_reset(fx: &Fx) -> R {
    subscribe_through_fault(fx, "fault.subscription_through_a_reset_link").await
}

async fn fault_subscription_stalled(fx: &Fx) -> R {
    subscribe_through_fault(fx, "fault.subscription_through_a_stalled_link").await
}

// ---------------------------------------------------------------- queues

fn poll_opts(wait_ms: u64, reclaim: bool) -> PollOptions {
    PollOptions {
        max_records: 32,
        wait: Duration::from_millis(wait_ms),
        reclaim,
        ..PollOptions::default()
    }
}

/// Polls `group` until every payload in `want` has been handed out (acknowledging others).
async fn queue_records(
    g: &felix_client::Group,
    want: &HashSet<Bytes>,
) -> Result<HashMap<Bytes, GroupRecord>, String> {
    let mut got = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !want.iter().all(|p| got.contains_key(p)) {
        ensure!(
            Instant::now() < deadline,
            "polled {} of {}",
            got.len(),
            want.len()
        );
        for r in g
            .poll(&poll_opts(1000, false))
            .await
            .map_err(failed("poll"))?
        {
            if want.contains(&r.payload) {
                got.insert(r.payload.clone(), r);
            } else {
                g.ack(r.offset).await.map_err(failed("ack"))?;
            }
        }
    }
    Ok(got)
}

async fn queue_poll(fx: &Fx) -> R {
    let c = fx.client().await?;
    let g = c.group(&fx.ns, "queue", 0, &uniq("g"));
    let want: HashSet<Bytes> = published(&c, fx, "queue", 3, &uniq("q"))
        .await?
        .0
        .into_iter()
        .collect();
    let got = queue_records(&g, &want).await?;
    ensure!(
        got.values().all(|r| r.attempts == Some(1)),
        "first deliveries with attempts {:?}",
        got.values().map(|r| r.attempts).collect::<Vec<_>>()
    );
    for r in got.values() {
        g.ack(r.offset).await.map_err(failed("ack"))?;
    }
    // Nothing unclaimed left: an empty list, not an error.
    let empty = g
        .poll(&poll_opts(200, false))
        .await
        .map_err(failed("an empty poll"))?;
    ensure!(empty.is_empty(), "handed out {} more", empty.len());
    pass()
}

async fn queue_ack(fx: &Fx) -> R {
    let c = fx.client().await?;
    let g = c.group(&fx.ns, "queue", 0, &uniq("g"));
    let want: HashSet<Bytes> = published(&c, fx, "queue", 3, &uniq("q"))
        .await?
        .0
        .into_iter()
        .collect();
    let got = queue_records(&g, &want).await?;
    for r in got.values() {
        g.ack(r.offset).await.map_err(failed("ack"))?;
    }
    let again = g
        .poll(&poll_opts(500, true))
        .await
        .map_err(failed("poll"))?;
    ensure!(
        !again.iter().any(|r| want.contains(&r.payload)),
        "an acknowledged record came back"
    );
    pass()
}

async fn queue_nack(fx: &Fx) -> R {
    let c = fx.client().await?;
    let g = c.group(&fx.ns, "queue", 0, &uniq("g"));
    let want: HashSet<Bytes> = published(&c, fx, "queue", 1, &uniq("q"))
        .await?
        .0
        .into_iter()
        .collect();
    let first = queue_records(&g, &want)
        .await?
        .into_values()
        .next()
        .expect("one");
    g.nack(first.offset, None, first.attempts)
        .await
        .map_err(failed("nack"))?;
    let again = queue_records(&g, &want)
        .await?
        .into_values()
        .next()
        .expect("one");
    ensure!(
        again.offset == first.offset,
        "redelivered at {}, first at {}",
        again.offset,
        first.offset
    );
    ensure!(
        again.attempts > first.attempts,
        "attempts {:?} then {:?}",
        first.attempts,
        again.attempts
    );
    pass()
}

async fn queue_dead_letters(fx: &Fx) -> R {
    let c = fx.client().await?;
    let g = c.group(&fx.ns, "queue", 0, &uniq("g"));
    let want: HashSet<Bytes> = published(&c, fx, "queue", 2, &uniq("dl"))
        .await?
        .0
        .into_iter()
        .collect();
    let mut offs: HashMap<Bytes, u64> = HashMap::new();
    let mut listed: Vec<u64> = Vec::new();
    // Handed back until the broker sets both aside (its attempt bound, applied when the
    // record would be handed out again); each round is a poll and a listing, bounded.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(offs.len() == 2 && offs.values().all(|o| listed.contains(o))) {
        ensure!(
            Instant::now() < deadline,
            "never dead-lettered: {offs:?} {listed:?}"
        );
        for r in g
            .poll(&poll_opts(500, false))
            .await
            .map_err(failed("poll"))?
        {
            if want.contains(&r.payload) {
                offs.insert(r.payload.clone(), r.offset);
                g.nack(r.offset, None, r.attempts)
                    .await
                    .map_err(failed("nack"))?;
            } else {
                g.ack(r.offset).await.map_err(failed("ack"))?;
            }
        }
        listed = g.dead_letters().await.map_err(failed("dead_letters"))?;
    }
    let mut both: Vec<u64> = offs.values().copied().collect();
    both.sort();
    let (keep, drop_) = (both[0], both[1]);
    g.redrive(keep).await.map_err(failed("redrive"))?;
    g.discard(drop_).await.map_err(failed("discard"))?;
    let left = g.dead_letters().await.map_err(failed("dead_letters"))?;
    ensure!(
        !left.contains(&keep) && !left.contains(&drop_),
        "still listed: {left:?}"
    );
    let back = until(Duration::from_secs(30), "the redriven record", || async {
        let rs = g.poll(&poll_opts(500, false)).await?;
        Ok(rs.into_iter().find(|r| r.offset == keep))
    })
    .await?;
    ensure!(
        back.attempts == Some(1),
        "redriven with attempts {:?}",
        back.attempts
    );
    pass()
}

// ---------------------------------------------------------------- cache watches

async fn watch(
    c: &Client,
    fx: &Fx,
    filter: WatchFilter,
    start: WatchStart,
) -> Result<CacheWatch, String> {
    c.watch_cache(&fx.ns, "watch", filter, start)
        .await
        .map_err(failed("watch"))
}

async fn changes(w: &mut CacheWatch, n: usize) -> Result<Vec<felix_client::CacheChange>, String> {
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(EVENT_LIMIT, w.next()).await {
            Err(_) => {
                return Err(format!(
                    "{} of {n} changes within {EVENT_LIMIT:?}",
                    out.len()
                ))
            }
            Ok(Ok(CacheWatchItem::Change(ch))) => out.push(ch),
            Ok(other) => return Err(format!("{} of {n} changes, then {other:?}", out.len())),
        }
    }
    Ok(out)
}

async fn put(
    c: &Client,
    fx: &Fx,
    cache: &str,
    key: &str,
    value: impl Into<Bytes>,
) -> Result<(), String> {
    c.cache_put(&fx.ns, cache, key, value.into(), None)
        .await
        .map_err(failed(&format!("put {key}")))
}

async fn watch_filter(fx: &Fx) -> R {
    let c = fx.client().await?;
    let p = uniq("p");
    let mut w = watch(
        &c,
        fx,
        WatchFilter::Prefix(format!("{p}/")),
        WatchStart::Live,
    )
    .await?;
    let mut kw = watch(&c, fx, WatchFilter::Key(format!("{p}/b")), WatchStart::Live).await?;
    for k in ["/a", "-other", "/b"] {
        put(&c, fx, "watch", &format!("{p}{k}"), k.to_owned()).await?;
    }
    // A last write each filter matches: whatever else either delivers arrives before it.
    put(&c, fx, "watch", &format!("{p}/b"), "last").await?;
    let keys: Vec<String> = changes(&mut w, 3)
        .await?
        .into_iter()
        .map(|c| c.key)
        .collect();
    ensure!(
        keys == [format!("{p}/a"), format!("{p}/b"), format!("{p}/b")],
        "the prefix watch saw {keys:?}"
    );
    let keyed = changes(&mut kw, 2).await?;
    ensure!(
        keyed.iter().all(|c| c.key == format!("{p}/b"))
            && keyed[1].value.as_deref() == Some(&b"last"[..]),
        "the key watch saw {keyed:?}"
    );
    pass()
}

async fn watch_delete(fx: &Fx) -> R {
    let c = fx.client().await?;
    let k = uniq("gone");
    let mut w = watch(&c, fx, WatchFilter::Key(k.clone()), WatchStart::Live).await?;
    put(&c, fx, "watch", &k, Bytes::new()).await?;
    c.cache_delete(&fx.ns, "watch", &k)
        .await
        .map_err(failed("delete"))?;
    let got = changes(&mut w, 2).await?;
    ensure!(
        got[0].value.as_deref() == Some(&b""[..]),
        "the empty put arrived as {:?}",
        got[0]
    );
    ensure!(got[1].value.is_none(), "the delete arrived as {:?}", got[1]);
    ensure!(
        got[1].offset > got[0].offset,
        "offsets {} then {}",
        got[0].offset,
        got[1].offset
    );
    pass()
}

async fn watch_resume(fx: &Fx) -> R {
    let c = fx.client().await?;
    let p = uniq("r");
    let mut w = watch(&c, fx, WatchFilter::Prefix(p.clone()), WatchStart::Live).await?;
    for k in ["a", "b", "c"] {
        put(&c, fx, "watch", &format!("{p}{k}"), k.to_owned()).await?;
    }
    let first = changes(&mut w, 1).await?.remove(0);
    drop(w);
    let mut w = watch(
        &c,
        fx,
        WatchFilter::Prefix(p.clone()),
        WatchStart::From(first.offset + 1),
    )
    .await?;
    let keys: Vec<String> = changes(&mut w, 2)
        .await?
        .into_iter()
        .map(|c| c.key)
        .collect();
    ensure!(
        keys == [format!("{p}b"), format!("{p}c")],
        "resumed with {keys:?}"
    );
    pass()
}

async fn watch_lag(fx: &Fx) -> R {
    let c = fx.client().await?;
    let p = uniq("busy");
    let mut w = watch(&c, fx, WatchFilter::Prefix(p.clone()), WatchStart::Live).await?;
    let (writers, each) = (8, 40);
    let mut tasks = Vec::new();
    for n in 0..writers {
        let wc = fx.client().await?;
        let (ns, key) = (fx.ns.clone(), format!("{p}{n}"));
        tasks.push(tokio::spawn(async move {
            for i in 0..each {
                wc.cache_put(&ns, "watch", &key, Bytes::from(i.to_string()), None)
                    .await
                    .map_err(|e| format!("writer {n}: {e}"))?;
            }
            Ok::<_, String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| format!("a writer: {e}"))??;
    }
    let mut last_seen = None;
    let mut seen = 0;
    let lagged = loop {
        ensure!(
            seen < writers * each,
            "every change delivered: the queue never overflowed"
        );
        match tokio::time::timeout(EVENT_LIMIT, w.next()).await {
            Err(_) => return Err(format!("silent after {seen} changes")),
            Ok(Ok(CacheWatchItem::Change(ch))) => {
                seen += 1;
                last_seen = Some(ch.offset);
            }
            Ok(Ok(CacheWatchItem::Lagged { resume_from })) => break resume_from,
            Ok(other) => return Err(format!("ended without a lag signal: {other:?}")),
        }
    };
    // The fixture's watch queue holds one change: concurrent writers overflow it.
    if let Some(last) = last_seen {
        ensure!(
            lagged > last,
            "resume from {lagged}, but {last} was delivered"
        );
    }
    pass()
}

async fn watch_retained(fx: &Fx) -> R {
    let c = fx.client().await?;
    let p = uniq("roster");
    let empty = watch(&c, fx, WatchFilter::Prefix(p.clone()), WatchStart::Retained).await?;
    ensure!(
        empty.retained_count() == Some(0),
        "an empty prefix announced {:?}",
        empty.retained_count()
    );
    drop(empty);
    for k in ["x", "y"] {
        put(&c, fx, "watch", &format!("{p}{k}"), k.to_owned()).await?;
    }
    let mut w = watch(&c, fx, WatchFilter::Prefix(p.clone()), WatchStart::Retained).await?;
    ensure!(
        w.retained_count() == Some(2),
        "announced {:?}",
        w.retained_count()
    );
    let mut state: Vec<String> = changes(&mut w, 2)
        .await?
        .into_iter()
        .map(|c| c.key)
        .collect();
    state.sort();
    ensure!(
        state == [format!("{p}x"), format!("{p}y")],
        "retained {state:?}"
    );
    put(&c, fx, "watch", &format!("{p}z"), "z").await?;
    let live = changes(&mut w, 1).await?.remove(0);
    ensure!(live.key == format!("{p}z"), "then {live:?}");
    pass()
}

// ---------------------------------------------------------------- multi-shard streams

async fn sharded_records(
    sub: &mut ShardedSubscription,
    want: &HashSet<Bytes>,
) -> Result<HashMap<Bytes, (u32, u64)>, String> {
    let mut got = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !want.iter().all(|p| got.contains_key(p)) {
        ensure!(
            Instant::now() < deadline,
            "{} of {} records",
            got.len(),
            want.len()
        );
        let ev = tokio::time::timeout(EVENT_LIMIT, sub.next())
            .await
            .map_err(|_| format!("no record within {EVENT_LIMIT:?}"))?
            .map_err(failed("the sharded subscription"))?;
        match ev.item {
            SubscriptionItem::Event(e) if want.contains(&e.payload) => {
                got.insert(e.payload.clone(), (ev.shard, offset(&e)?));
            }
            SubscriptionItem::Event(_) => {}
            SubscriptionItem::End(end) => return Err(format!("shard {} ended: {end:?}", ev.shard)),
        }
    }
    Ok(got)
}

async fn publish_keyed(c: &Client, fx: &Fx, records: &[(Bytes, Bytes)]) -> Result<(), String> {
    for (payload, key) in records {
        c.publish(
            &fx.ns,
            "sharded",
            vec![payload.clone()],
            Some(key.clone()),
            Ack::PerMessage,
        )
        .await
        .map_err(failed("a keyed publish"))?;
    }
    Ok(())
}

fn keyed(tag: &str, n: usize) -> Vec<(Bytes, Bytes)> {
    (0..n)
        .map(|i| {
            (
                Bytes::from(format!("{tag}-{i}")),
                Bytes::from(format!("key-{i}")),
            )
        })
        .collect()
}

async fn sharded_every_shard(fx: &Fx) -> R {
    let c = fx.client().await?;
    let records = keyed(&uniq("sh"), 30);
    publish_keyed(&c, fx, &records).await?;
    let mut sub = c
        .subscribe_sharded(&fx.ns, "sharded", Start::Earliest, &HashMap::new())
        .await
        .map_err(failed("subscribe_sharded"))?;
    ensure!(sub.shards() == 3, "{} shards", sub.shards());
    let want: HashSet<Bytes> = records.into_iter().map(|(p, _)| p).collect();
    let got = sharded_records(&mut sub, &want).await?;
    let shards: BTreeSet<u32> = got.values().map(|(s, _)| *s).collect();
    ensure!(
        shards == BTreeSet::from([0, 1, 2]),
        "records from shards {shards:?}"
    );
    pass()
}

async fn sharded_shard_count(fx: &Fx) -> R {
    let c = fx.client().await?;
    let count = |s: String| {
        let c = c.clone();
        async move {
            c.stream_shards(&fx.ns, &s)
                .await
                .map_err(failed("stream_shards"))
        }
    };
    let (sharded, events, none) = (
        count("sharded".into()).await?,
        count("events".into()).await?,
        count(uniq("nonexistent")).await?,
    );
    ensure!(
        (sharded, events, none) == (3, 1, 0),
        "sharded {sharded}, events {events}, an unknown stream {none}"
    );
    pass()
}

async fn sharded_resumes_per_shard(fx: &Fx) -> R {
    let c = fx.client().await?;
    let tag = uniq("rs");
    let first = keyed(&format!("{tag}-a"), 12);
    publish_keyed(&c, fx, &first).await?;
    let first_set: HashSet<Bytes> = first.iter().map(|(p, _)| p.clone()).collect();
    let mut sub = c
        .subscribe_sharded(&fx.ns, "sharded", Start::Earliest, &HashMap::new())
        .await
        .map_err(failed("subscribe_sharded"))?;
    sharded_records(&mut sub, &first_set).await?;
    let positions = sub.positions();
    drop(sub);
    ensure!(
        positions.len() == 3,
        "positions for {} shards",
        positions.len()
    );
    let second = keyed(&format!("{tag}-b"), 12);
    publish_keyed(&c, fx, &second).await?;
    let second_set: HashSet<Bytes> = second.iter().map(|(p, _)| p.clone()).collect();
    let mut sub = c
        .subscribe_sharded(&fx.ns, "sharded", Start::Earliest, &positions)
        .await
        .map_err(failed("subscribe_sharded from positions"))?;
    // Everything from the second round, and nothing at or before a shard's own position
    // (the first round's records on that shard included).
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while got < second_set.len() {
        ensure!(
            Instant::now() < deadline,
            "{got} of {} records",
            second_set.len()
        );
        let ev = tokio::time::timeout(EVENT_LIMIT, sub.next())
            .await
            .map_err(|_| format!("no record within {EVENT_LIMIT:?}"))?
            .map_err(failed("the resumed subscription"))?;
        let SubscriptionItem::Event(e) = ev.item else {
            return Err(format!("shard {} ended", ev.shard));
        };
        let o = offset(&e)?;
        ensure!(
            o > positions[&ev.shard],
            "shard {} resumed at {o}, its position was {}",
            ev.shard,
            positions[&ev.shard]
        );
        ensure!(
            !first_set.contains(&e.payload),
            "a first-round record again"
        );
        got += usize::from(second_set.contains(&e.payload));
    }
    pass()
}

async fn sharded_lost_shard(_fx: &Fx) -> R {
    Ok(Verdict::Skip(
        "every shard of the fixture's sharded stream has three copies, so fencing one node \
         moves its shards rather than losing one"
            .into(),
    ))
}

// ---------------------------------------------------------------- atomic commits

/// A commit, asked again while refused `shard_unavailable` (class `retry`: nothing was
/// applied), bounded (docs/conformance.md, "What the kit found").
async fn commit(
    c: &Client,
    fx: &Fx,
    entity: &Bytes,
    event: Bytes,
    changes: Vec<StateChange>,
) -> Result<u64, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match c
            .commit(
                &fx.ns,
                "ledger",
                entity.clone(),
                event.clone(),
                changes.clone(),
                None,
            )
            .await
        {
            Ok(Guarded::Written(Some(off))) => return Ok(off),
            Ok(other) => return Err(format!("the commit answered {other:?}")),
            Err(e)
                if e.code() == Some(&ErrorCode::ShardUnavailable) && Instant::now() < deadline => {}
            Err(e) => return Err(format!("commit: {e}")),
        }
    }
}

async fn commit_returns_the_offset(fx: &Fx) -> R {
    let c = fx.client().await?;
    let entity = Bytes::from(uniq("e"));
    let payload = Bytes::from(uniq("event"));
    let off = commit(
        &c,
        fx,
        &entity,
        payload.clone(),
        vec![StateChange::Put {
            key: "k".into(),
            value: Bytes::from_static(b"v"),
        }],
    )
    .await?;
    // Read by a consumer group on each shard in turn (the entity's shard holds it).
    let group = uniq("g");
    let mut found = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while found.is_empty() {
        ensure!(
            Instant::now() < deadline,
            "the committed event was never handed out"
        );
        for shard in 0..2 {
            let g = c.group(&fx.ns, "ledger", shard, &group);
            let opts = PollOptions {
                max_records: 64,
                wait: Duration::from_millis(200),
                ..PollOptions::default()
            };
            for r in g.poll(&opts).await.map_err(failed("poll"))? {
                g.ack(r.offset).await.map_err(failed("ack"))?;
                if r.payload == payload {
                    found.push(r.offset);
                }
            }
        }
    }
    ensure!(
        found == [off],
        "the event was read at {found:?}, committed at {off}"
    );
    pass()
}

async fn commit_state_get(fx: &Fx) -> R {
    let c = fx.client().await?;
    let entity = Bytes::from(uniq("e"));
    let off = commit(
        &c,
        fx,
        &entity,
        Bytes::from_static(b"ev"),
        vec![StateChange::Put {
            key: "balance".into(),
            value: Bytes::from_static(b"10"),
        }],
    )
    .await?;
    let v = c
        .state_get(&fx.ns, "ledger", entity.clone(), "balance")
        .await
        .map_err(failed("state_get"))?;
    ensure!(
        v.value.as_deref() == Some(&b"10"[..]),
        "value {:?}",
        v.value
    );
    ensure!(
        v.version == Some(off),
        "version {:?}, commit at {off}",
        v.version
    );
    ensure!(v.as_of.is_some_and(|a| a >= off), "as_of {:?}", v.as_of);
    let never = c
        .state_get(&fx.ns, "ledger", entity, "never")
        .await
        .map_err(failed("state_get"))?;
    ensure!(
        never.value.is_none(),
        "a key never written read {:?}",
        never.value
    );
    pass()
}

fn op_publish(stream: &str, payload: &'static [u8]) -> CommitOp {
    CommitOp::Publish {
        stream: stream.into(),
        payload: Bytes::from_static(payload),
    }
}

fn op_put(stream: &str) -> CommitOp {
    CommitOp::Put {
        stream: stream.into(),
        key: "k".into(),
        value: Bytes::from_static(b"v"),
    }
}

// A commit given as operations is checked by `CommitPlan::from_ops` before any call: nothing
// reaches a broker (the evidence shows no commit received).
async fn commit_another_stream(_fx: &Fx) -> R {
    let r = CommitPlan::from_ops(vec![op_publish("ledger", b"x"), op_put("events")]);
    ensure!(
        r == Err(CommitRefused::NotOnOwningShard {
            index: 1,
            stream: "events".into()
        }),
        "a commit over two streams: {r:?}"
    );
    pass()
}

async fn commit_exactly_one_event(_fx: &Fx) -> R {
    let none = CommitPlan::from_ops(vec![op_put("ledger")]);
    ensure!(
        none == Err(CommitRefused::EventCount { count: 0 }),
        "no event: {none:?}"
    );
    let two = CommitPlan::from_ops(vec![op_publish("ledger", b"1"), op_publish("ledger", b"2")]);
    ensure!(
        two == Err(CommitRefused::EventCount { count: 2 }),
        "two events: {two:?}"
    );
    pass()
}

async fn commit_negotiated(fx: &Fx) -> R {
    let c = fx.client().await?;
    ensure!(
        c.capabilities().broker_has(Features::ATOMIC_COMMIT),
        "the broker did not advertise FEATURE_ATOMIC_COMMIT"
    );
    commit(
        &c,
        fx,
        &Bytes::from(uniq("e")),
        Bytes::from_static(b"n"),
        Vec::new(),
    )
    .await?;
    pass()
}
