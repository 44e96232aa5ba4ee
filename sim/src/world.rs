//! One run: the broker (a real [`Engine`]), the simulated clients, the network and the disk,
//! driven by one event queue in virtual time. Everything random comes from the seed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use felix_engine::{
    AuthConfig, Datagram, DeclaredStream, DurableConfig, Engine, EngineConfig, FileOp, FileOpKind,
    FsyncPolicy, OpId, Output,
};

use crate::client::{Ctx, Role, Setup, SimClient, NAMESPACE, SCRATCH, STREAM, TENANT};
use crate::clock::VirtualClock;
use crate::disk::{CrashKind, MemFs};
use crate::invariants::{idempotent_once, no_acked_loss, requests_answered};
use crate::net::{NetConfig, Network, Node};
use crate::oracle::{Oracle, Promise, Violation};
use crate::queue::EventQueue;
use crate::rng::SimRng;
use crate::trace::{short_hash, Trace};
use crate::{Canary, Outcome, RunOptions};

/// 2026-01-01T00:00:00Z: the broker's Unix time at the start of every run.
const START_UNIX_MICROS: u64 = 1_767_225_600_000_000;
/// Faults happen during this phase...
const FAULT_PHASE: Duration = Duration::from_secs(12);
/// ...then the world heals and goes quiet for this long before the final checks.
const QUIET_PHASE: Duration = Duration::from_secs(30);
/// A request older than this at the end, on a live connection, was never answered. Long
/// enough for a connection whose RTT estimate a clock jump inflated to reach its idle
/// timeout (at least three PTOs, RFC 9000 §10.1).
const ANSWER_GRACE: Duration = Duration::from_secs(20);
/// Extra quiet time, granted while the broker's backlog of unanswered requests shrinks.
const EXTENSION: Duration = Duration::from_secs(5);
const MAX_EXTENSIONS: u32 = 12;
/// Steps (events, timer firings) one run may take before it is declared stuck.
const MAX_STEPS: u64 = 5_000_000;
/// Shards of the simulated stream.
const SHARDS: u32 = 2;

/// How the run's broker stores data, and what crashes it may suffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Streams and caches in memory; no broker crash.
    Memory,
    /// `on_commit`: every ack waits for the fsync; the broker loses power.
    OnCommitPowerLoss,
    /// `periodic` or `none` with the legacy `ack_on_commit` key set (acks after the write,
    /// as the default is now): the broker process dies (the page cache survives).
    AckAfterWriteProcessCrash,
    /// `periodic` with the default settings, so acks wait for the write: the broker process
    /// dies, and no acknowledged record may be lost (once `PeriodicNoCrash`, when the
    /// default acked on arrival and a process crash could lose acked records).
    PeriodicProcessCrash,
    /// `periodic` with `ack_before_write`, acked on arrival: no crash, since a process crash
    /// may lose what this mode acknowledges.
    AckBeforeWriteNoCrash,
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    Partition(usize),
    Heal(usize),
    LossBurst(Duration, f64),
    Stuck(usize, Duration),
    ClockJump(usize, Duration),
    Crash(CrashKind),
    Restart,
    /// The operator deletes the scratch stream (`client::SCRATCH`).
    DeleteScratch,
    EndOfFaults,
    StartAudit,
}

enum Ev {
    Datagram {
        to: Node,
        from: SocketAddr,
        data: Bytes,
    },
    FileDone {
        generation: u64,
        op: FileOp,
    },
    Fault(Fault),
}

struct Broker {
    engine: Engine,
    generation: u64,
    ready: bool,
}

pub(crate) struct World {
    seed: u64,
    mode: Mode,
    clock: VirtualClock,
    queue: EventQueue<Ev>,
    trace: Trace,
    net: Network,
    disk: MemFs,
    disk_rng: SimRng,
    disk_slowness: u32,
    crash_rng: SimRng,
    broker: Option<Broker>,
    generations: u64,
    broker_addr: SocketAddr,
    config: EngineConfig,
    in_flight: BTreeMap<OpId, FileOp>,
    clients: Vec<SimClient>,
    by_addr: BTreeMap<SocketAddr, usize>,
    oracle: Oracle,
    token: String,
    crypto: Arc<quinn_proto::crypto::rustls::QuicClientConfig>,
    client_rng: SimRng,
    drop_one_event_frame: bool,
    resend_as_new: bool,
    drop_one_watch_change: bool,
    /// Canaries: the stale read cache, and the record waiting to be misrouted.
    stale_cache: Option<BTreeMap<String, Bytes>>,
    misroute_claim: Option<Option<(usize, u32, u64)>>,
    withhold_answers: bool,
    quiet: bool,
    workers: usize,
    steps: u64,
    crashes: u64,
    /// Stream deletions the broker carried out.
    deletes: u64,
}

impl World {
    pub(crate) fn new(opts: &RunOptions) -> World {
        let root = SimRng::new(opts.seed);
        let mut plan = root.fork("plan");
        let mode = match opts.canary {
            // The canaries break promises only durable runs make.
            Some(Canary::LyingSync) => Mode::OnCommitPowerLoss,
            Some(
                Canary::DropEventFrame
                | Canary::ResendAsNew
                | Canary::DropWatchChange
                | Canary::StaleCacheRead
                | Canary::MisrouteClaim
                | Canary::WithholdAnswers,
            ) => *plan.pick(&[Mode::OnCommitPowerLoss, Mode::AckAfterWriteProcessCrash]),
            // The cluster canaries break nothing here.
            None
            | Some(
                Canary::MetadataDivergence
                | Canary::SplitLeader
                | Canary::WipeLeaderDisk
                | Canary::RedirectLoop
                | Canary::PromoteBehind
                | Canary::ServePastLease
                | Canary::AckBeforeDurable
                | Canary::AbandonOnSilence
                | Canary::SpecDivergence,
            ) => *plan.pick(&[
                Mode::Memory,
                Mode::Memory,
                Mode::OnCommitPowerLoss,
                Mode::OnCommitPowerLoss,
                Mode::OnCommitPowerLoss,
                Mode::AckAfterWriteProcessCrash,
                Mode::AckAfterWriteProcessCrash,
                Mode::PeriodicProcessCrash,
                Mode::AckBeforeWriteNoCrash,
            ]),
        };
        let mut tls_rng = root.fork("tls");
        let provider = crate::crypto::seeded_provider(tls_rng.fork("provider"));
        let identity = felix_testkit::ed25519_identity(tls_rng.seed32());
        let mut config =
            EngineConfig::new(identity, AuthConfig::Dev { seed: [7; 32] }, plan.seed32());
        config.crypto_provider = Some(provider.clone());
        config.declared_streams = vec![DeclaredStream::new(TENANT, NAMESPACE, STREAM, SHARDS)];
        config.subscriber_queue_capacity = *plan.pick(&[2, 8, 64, 512]);
        config.event_batch_max_records = *plan.pick(&[4, 64, 1024]);
        config.quic_idle_timeout = Duration::from_secs(10);
        let durable = |fsync| {
            let mut durable_config = DurableConfig::default();
            durable_config.fsync = fsync;
            durable_config
        };
        config.durable = match mode {
            Mode::Memory => None,
            Mode::OnCommitPowerLoss => Some(durable(FsyncPolicy::OnCommit)),
            Mode::AckAfterWriteProcessCrash => {
                let fsync = if plan.chance(0.5) {
                    FsyncPolicy::None
                } else {
                    FsyncPolicy::Periodic(
                        plan.duration(Duration::from_millis(20), Duration::from_millis(500)),
                    )
                };
                let mut d = durable(fsync);
                d.ack_on_commit = true;
                Some(d)
            }
            Mode::PeriodicProcessCrash => Some(durable(FsyncPolicy::Periodic(
                Duration::from_millis(plan.range(20..500)),
            ))),
            Mode::AckBeforeWriteNoCrash => {
                let mut d = durable(FsyncPolicy::Periodic(Duration::from_millis(
                    plan.range(20..500),
                )));
                d.ack_before_write = true;
                Some(d)
            }
        };
        if let Some(d) = &mut config.durable {
            d.segment_max_bytes = *plan.pick(&[2048, 16 * 1024, 64 << 20]);
            d.max_inflight_file_ops = *plan.pick(&[1, 4, 64]);
            d.tail_cache_bytes = *plan.pick(&[1024, 64 * 1024, 4 << 20]);
        }
        let promise = match mode {
            Mode::Memory => Promise::Memory,
            _ => Promise::Durable,
        };
        let mut net_rng = root.fork("net");
        let net = Network::new(NetConfig::draw(&mut net_rng), net_rng.fork("route"));
        let mut disk = MemFs::new();
        disk.sync_lies = opts.canary == Some(Canary::LyingSync);
        let workers = plan.range(2..7) as usize;
        let clock = VirtualClock::new();
        let mut world = World {
            seed: opts.seed,
            mode,
            clock,
            queue: EventQueue::new(),
            trace: Trace::new(opts.verbose),
            net,
            disk,
            disk_rng: root.fork("disk"),
            disk_slowness: *plan.pick(&[1, 1, 4, 20]),
            crash_rng: root.fork("crash"),
            broker: None,
            generations: 0,
            broker_addr: SocketAddr::from(([127, 0, 0, 1], 5000)),
            config,
            in_flight: BTreeMap::new(),
            clients: Vec::new(),
            by_addr: BTreeMap::new(),
            oracle: Oracle::new(promise, SHARDS),
            token: String::new(),
            crypto: crate::crypto::client_crypto(provider),
            client_rng: root.fork("clients"),
            drop_one_event_frame: opts.canary == Some(Canary::DropEventFrame),
            resend_as_new: opts.canary == Some(Canary::ResendAsNew),
            drop_one_watch_change: opts.canary == Some(Canary::DropWatchChange),
            stale_cache: (opts.canary == Some(Canary::StaleCacheRead)).then(BTreeMap::new),
            misroute_claim: (opts.canary == Some(Canary::MisrouteClaim)).then_some(None),
            withhold_answers: opts.canary == Some(Canary::WithholdAnswers),
            quiet: false,
            workers,
            steps: 0,
            crashes: 0,
            deletes: 0,
        };
        let header = format!(
            "seed {} mode {mode:?} workers {workers} net {:?} queue {} batch {} durable {:?} disk x{}",
            opts.seed,
            world.net.config,
            world.config.subscriber_queue_capacity,
            world.config.event_batch_max_records,
            world.config.durable,
            world.disk_slowness
        );
        world.log(format_args!("{header}"));
        world.schedule_faults(&mut plan);
        world
    }

    fn log(&mut self, what: std::fmt::Arguments<'_>) {
        self.trace.event(self.clock.elapsed(), what);
    }

    fn schedule_faults(&mut self, plan: &mut SimRng) {
        let n = plan.range(0..8);
        for _ in 0..n {
            let at = plan.duration(Duration::from_millis(500), FAULT_PHASE);
            let c = plan.below(self.workers as u64) as usize;
            let fault = match plan.below(5) {
                0 => {
                    let heal =
                        at + plan.duration(Duration::from_millis(100), Duration::from_secs(8));
                    self.queue.push(
                        self.clock.at(heal.min(FAULT_PHASE)),
                        Ev::Fault(Fault::Heal(c)),
                    );
                    Fault::Partition(c)
                }
                1 => Fault::LossBurst(
                    plan.duration(Duration::from_millis(50), Duration::from_secs(3)),
                    *plan.pick(&[0.3, 0.7, 1.0]),
                ),
                2 => Fault::Stuck(
                    c,
                    plan.duration(Duration::from_millis(100), Duration::from_secs(5)),
                ),
                3 => Fault::ClockJump(
                    c,
                    plan.duration(Duration::from_millis(10), Duration::from_secs(3)),
                ),
                _ => match self.mode {
                    Mode::OnCommitPowerLoss => Fault::Crash(CrashKind::Power),
                    Mode::AckAfterWriteProcessCrash | Mode::PeriodicProcessCrash => {
                        Fault::Crash(CrashKind::Process)
                    }
                    _ => Fault::LossBurst(Duration::from_millis(500), 0.5),
                },
            };
            self.queue.push(self.clock.at(at), Ev::Fault(fault));
        }
        // The operator deletes the scratch stream up to twice, at seeded moments, while
        // publishes to it may be waiting for their writes.
        for _ in 0..plan.range(0..3) {
            let at = plan.duration(Duration::from_millis(300), FAULT_PHASE);
            self.queue
                .push(self.clock.at(at), Ev::Fault(Fault::DeleteScratch));
        }
        self.queue
            .push(self.clock.at(FAULT_PHASE), Ev::Fault(Fault::EndOfFaults));
        if self.oracle.promise == Promise::Durable {
            self.queue.push(
                self.clock.at(FAULT_PHASE + Duration::from_secs(2)),
                Ev::Fault(Fault::StartAudit),
            );
        }
    }

    pub(crate) fn run(mut self) -> Outcome {
        let started = std::time::Instant::now();
        let result = self.simulate();
        let violation = result.err();
        if let Some(v) = &violation {
            self.log(format_args!("VIOLATION {v}"));
        }
        let summary = self.summary(started.elapsed());
        Outcome {
            seed: self.seed,
            hash: self.trace.hash(),
            events: self.trace.count(),
            violation,
            trace: self.trace.take_lines(),
            summary,
            group_claims_checked: self.oracle.groups.checked,
        }
    }

    fn summary(&self, wall: Duration) -> String {
        format!(
            "mode {:?}, {} workers, {} events, {} acked publishes, {} events seen, {} cache reads checked, {} group claims checked, {} watch changes, {} lagged, {} crashes, {} stream deletes, {} datagrams ({} dropped), {} file ops, {:.0} ms virtual in {:.0} ms",
            self.mode,
            self.workers,
            self.trace.count(),
            self.oracle.acked_count,
            self.oracle.events_seen,
            self.oracle.cache_reads_checked,
            self.oracle.groups.checked,
            self.clients.iter().map(SimClient::watch_changes).sum::<u64>(),
            self.oracle.lagged,
            self.crashes,
            self.deletes,
            self.net.stats.sent,
            self.net.stats.dropped,
            self.disk.ops(),
            self.clock.elapsed().as_secs_f64() * 1e3,
            wall.as_secs_f64() * 1e3,
        )
    }

    fn simulate(&mut self) -> Result<(), Violation> {
        self.start_broker()?;
        self.token = match &self.broker {
            Some(b) => b.engine.dev_token().expect("dev mode").to_owned(),
            None => unreachable!("just started"),
        };
        for i in 0..self.workers {
            self.add_client(Role::Worker, i);
        }
        let mut end = self.clock.at(FAULT_PHASE + QUIET_PHASE);
        // A broker still working off a backlog (a slow disk under load: unanswered requests,
        // or records accepted and not yet written) gets more time, in steps, for as long as
        // it makes progress; one that stopped does not.
        let mut extensions = 0;
        let mut backlog = (usize::MAX, 0);
        loop {
            self.run_until(end)?;
            let waiting = self.oracle.outstanding.len();
            let writing = self
                .broker
                .as_ref()
                .is_some_and(|b| !b.engine.storage_idle());
            let answering = waiting > 0 && waiting < backlog.0;
            let progressing = writing && self.disk.ops() > backlog.1;
            if !(answering || progressing) || extensions >= MAX_EXTENSIONS {
                break;
            }
            self.log(format_args!(
                "drain: {waiting} requests waiting, storage busy {writing}: extending"
            ));
            backlog = (waiting, self.disk.ops());
            extensions += 1;
            end += EXTENSION;
        }
        self.final_checks()
    }

    fn run_until(&mut self, end: Instant) -> Result<(), Violation> {
        while self.steps < MAX_STEPS {
            self.steps += 1;
            let Some(next) = self.next_time() else { break };
            if next > end {
                break;
            }
            self.clock.advance_to(next);
            let now = self.clock.now();
            while let Some(ev) = self.queue.pop_due(now) {
                self.handle(now, ev)?;
            }
            if let Some(b) = &mut self.broker {
                if b.engine.poll_timeout().is_some_and(|t| t <= now) {
                    b.engine.handle_timeout(now);
                    self.drain_engine(now)?;
                }
            }
            for i in 0..self.clients.len() {
                let due = self.clients[i]
                    .next_deadline(self.quiet)
                    .is_some_and(|t| t <= now);
                if due {
                    self.client_tick(now, i)?;
                }
            }
        }
        if self.steps >= MAX_STEPS {
            return Err(Violation {
                invariant: "bounded_run",
                detail: format!("no end after {MAX_STEPS} steps"),
            });
        }
        self.clock.advance_to(end);
        Ok(())
    }

    fn next_time(&mut self) -> Option<Instant> {
        let mut next = self.queue.peek_time();
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        if let Some(b) = &self.broker {
            consider(b.engine.poll_timeout());
        }
        for c in &mut self.clients {
            consider(c.next_deadline(self.quiet));
        }
        // Never step backwards: an overdue deadline runs now.
        next.map(|t| t.max(self.clock.now()))
    }

    fn add_client(&mut self, role: Role, id: usize) {
        let now = self.clock.now();
        let slow = role == Role::Worker && self.client_rng.chance(0.2);
        let client = SimClient::new(Setup {
            id,
            role,
            shards: SHARDS,
            durable: self.oracle.promise == Promise::Durable,
            slow,
            crypto: self.crypto.clone(),
            rng: self.client_rng.fork(&format!("client {id}")),
            now,
            cluster: None,
            routing: felix_client::core::cluster::Routing::ByOwners,
        });
        self.log(format_args!(
            "c{id} joins as {role:?}{}",
            if slow { " (slow reader)" } else { "" }
        ));
        self.by_addr.insert(client.addr, self.clients.len());
        self.clients.push(client);
    }

    fn start_broker(&mut self) -> Result<(), Violation> {
        let now = self.clock.now();
        self.generations += 1;
        let mut config = self.config.clone();
        config.rng_seed[0] ^= self.generations as u8;
        let unix = START_UNIX_MICROS + self.clock.elapsed().as_micros() as u64;
        let engine = Engine::new(config, now, unix).map_err(|e| Violation {
            invariant: "broker_starts",
            detail: e.to_string(),
        })?;
        let ready = engine.is_ready();
        // Group claims live in the broker's memory: a new generation starts without them.
        self.oracle.groups.broker_restarted(now);
        let generation = self.generations;
        self.log(format_args!(
            "broker generation {generation} starts (ready {ready})"
        ));
        self.broker = Some(Broker {
            engine,
            generation: self.generations,
            ready,
        });
        self.drain_engine(now)
    }

    fn handle(&mut self, now: Instant, ev: Ev) -> Result<(), Violation> {
        match ev {
            Ev::Datagram {
                to: Node::Broker,
                from,
                data,
            } => {
                let Some(b) = &mut self.broker else {
                    return Ok(());
                };
                if !b.ready {
                    return Ok(());
                }
                b.engine.handle_datagram(
                    now,
                    Datagram {
                        remote: from,
                        local_ip: None,
                        ecn: None,
                        data: BytesMut::from(&data[..]),
                        segment_size: None,
                    },
                );
                self.drain_engine(now)
            }
            Ev::Datagram {
                to: Node::Client(i),
                from,
                data,
            } => {
                let out = {
                    let (client, mut ctx) = self.client_ctx(i);
                    client.handle_datagram(now, from, data, &mut ctx)?
                };
                self.send_from_client(now, i, out);
                Ok(())
            }
            Ev::Datagram {
                to: Node::Server(_),
                ..
            } => unreachable!("the single-node world has no cluster nodes"),
            Ev::FileDone { generation, op } => {
                let Some(b) = &mut self.broker else {
                    return Ok(());
                };
                if b.generation != generation {
                    return Ok(());
                }
                self.in_flight.remove(&op.id);
                let completion = self
                    .disk
                    .execute(op.clone())
                    .expect("the simulated disk dies only through crash_drawn");
                let ok = completion.result.is_ok();
                self.trace.event(
                    self.clock.elapsed(),
                    format_args!("disk done {} {} ok={ok}", op.id.0, describe(&op.kind)),
                );
                b.engine.handle_file_completion(now, completion);
                self.drain_engine(now)
            }
            Ev::Fault(f) => self.fault(now, f),
        }
    }

    fn fault(&mut self, now: Instant, f: Fault) -> Result<(), Violation> {
        self.log(format_args!("FAULT {f:?}"));
        match f {
            Fault::Partition(c) => self.net.partition(c),
            Fault::Heal(c) => self.net.heal(c),
            Fault::LossBurst(d, loss) => self.net.loss_burst(now + d, loss),
            Fault::Stuck(c, d) => self.clients[c].freeze(now + d),
            Fault::ClockJump(c, d) => self.clients[c].jump_clock(d),
            Fault::Crash(kind) => {
                if self.broker.take().is_some() {
                    self.crashes += 1;
                    let in_flight: Vec<FileOp> =
                        std::mem::take(&mut self.in_flight).into_values().collect();
                    let what = self.disk.crash_drawn(kind, &in_flight, &mut self.crash_rng);
                    self.log(format_args!("broker crashed: {what}"));
                    let down = self
                        .crash_rng
                        .duration(Duration::from_millis(50), Duration::from_secs(3));
                    self.queue.push(now + down, Ev::Fault(Fault::Restart));
                }
            }
            Fault::Restart => {
                if self.broker.is_none() {
                    self.start_broker()?;
                }
            }
            Fault::DeleteScratch => {
                let Some(b) = &mut self.broker else {
                    return Ok(());
                };
                let result = b.engine.delete_stream(now, TENANT, NAMESPACE, SCRATCH);
                self.deletes += u64::from(result.is_ok());
                self.log(format_args!("operator deletes {SCRATCH}: {result:?}"));
                return self.drain_engine(now);
            }
            Fault::EndOfFaults => {
                self.quiet = true;
                self.net.heal_all();
                if self.broker.is_none() {
                    self.start_broker()?;
                }
            }
            Fault::StartAudit => {
                let id = self.clients.len();
                self.add_client(Role::Auditor, id);
            }
        }
        Ok(())
    }

    fn client_ctx(&mut self, i: usize) -> (&mut SimClient, Ctx<'_>) {
        let ctx = Ctx {
            start: self.clock.at(Duration::ZERO),
            oracle: &mut self.oracle,
            trace: &mut self.trace,
            token: &self.token,
            broker_addr: self.broker_addr,
            client_count: self.workers,
            drop_one_event_frame: &mut self.drop_one_event_frame,
            resend_as_new: self.resend_as_new,
            drop_one_watch_change: &mut self.drop_one_watch_change,
            stale_cache: self.stale_cache.as_mut(),
            misroute_claim: self.misroute_claim.as_mut(),
            withhold_answers: self.withhold_answers,
            quiet: self.quiet,
            leaders: None,
            redirect_loop: false,
        };
        (&mut self.clients[i], ctx)
    }

    fn client_tick(&mut self, now: Instant, i: usize) -> Result<(), Violation> {
        let out = {
            let (client, mut ctx) = self.client_ctx(i);
            client.tick(now, &mut ctx)?
        };
        self.send_from_client(now, i, out);
        Ok(())
    }

    fn send_from_client(&mut self, now: Instant, i: usize, out: Vec<(SocketAddr, Bytes)>) {
        let from = self.clients[i].addr;
        for (dest, data) in out {
            if dest != self.broker_addr {
                continue;
            }
            let delays = self.net.route(now, Node::Client(i), Node::Broker);
            self.trace.event(
                self.clock.elapsed(),
                format_args!(
                    "net c{i}>b {}B #{:08x} {}",
                    data.len(),
                    short_hash(&data),
                    fate(&delays)
                ),
            );
            for d in delays {
                self.queue.push(
                    now + d,
                    Ev::Datagram {
                        to: Node::Broker,
                        from,
                        data: data.clone(),
                    },
                );
            }
        }
    }

    fn drain_engine(&mut self, now: Instant) -> Result<(), Violation> {
        let mut buf = Vec::new();
        let Some(b) = &mut self.broker else {
            return Ok(());
        };
        let generation = b.generation;
        for _ in 0..1_000_000 {
            let Some(out) = b.engine.poll_output(now, &mut buf) else {
                break;
            };
            match out {
                Output::Transmit(t) => {
                    let Some(&c) = self.by_addr.get(&t.destination) else {
                        continue;
                    };
                    let seg = t.segment_size.unwrap_or(t.size).max(1);
                    for dg in buf[..t.size].chunks(seg) {
                        let delays = self.net.route(now, Node::Broker, Node::Client(c));
                        self.trace.event(
                            self.clock.elapsed(),
                            format_args!(
                                "net b>c{c} {}B #{:08x} {}",
                                dg.len(),
                                short_hash(dg),
                                fate(&delays)
                            ),
                        );
                        let data = Bytes::copy_from_slice(dg);
                        for d in delays {
                            self.queue.push(
                                now + d,
                                Ev::Datagram {
                                    to: Node::Client(c),
                                    from: self.broker_addr,
                                    data: data.clone(),
                                },
                            );
                        }
                    }
                }
                Output::FileOp(op) => {
                    let base = match op.kind {
                        FileOpKind::Sync { .. } | FileOpKind::SyncDir { .. } => self
                            .disk_rng
                            .duration(Duration::from_micros(300), Duration::from_millis(6)),
                        _ => self
                            .disk_rng
                            .duration(Duration::from_micros(10), Duration::from_micros(500)),
                    };
                    let latency = base * self.disk_slowness;
                    self.trace.event(
                        self.clock.elapsed(),
                        format_args!(
                            "disk op {} {} +{}us",
                            op.id.0,
                            describe(&op.kind),
                            latency.as_micros()
                        ),
                    );
                    self.in_flight.insert(op.id, op.clone());
                    self.queue
                        .push(now + latency, Ev::FileDone { generation, op });
                }
                other => unreachable!("an engine output the simulator does not model: {other:?}"),
            }
        }
        if !b.ready && b.engine.is_ready() {
            b.ready = true;
            self.trace.event(
                self.clock.elapsed(),
                format_args!("broker generation {generation} ready"),
            );
        }
        if let Some(e) = b.engine.storage_error() {
            return Err(Violation {
                invariant: "recovery",
                detail: format!("broker generation {generation} refuses to start: {e}"),
            });
        }
        Ok(())
    }

    fn final_checks(&mut self) -> Result<(), Violation> {
        let now = self.clock.now();
        for c in &self.clients {
            self.trace
                .event(self.clock.elapsed(), format_args!("end {}", c.describe()));
        }
        let heard = self
            .clients
            .iter()
            .flat_map(|c| {
                c.last_heard()
                    .into_iter()
                    .map(|(gen, at)| ((c.id, gen), at))
            })
            .collect();
        requests_answered::check(
            &self.oracle,
            now,
            ANSWER_GRACE,
            self.clock.at(Duration::ZERO),
            &heard,
        )?;
        if self.oracle.promise != Promise::Durable {
            return Ok(());
        }
        self.oracle
            .groups
            .check_drained(SHARDS, |shard| self.oracle.known_tail(shard))?;
        let start = self.clock.at(Duration::ZERO);
        for c in &self.clients {
            c.check_watch(&self.oracle, start)?;
        }
        let Some(auditor) = self.clients.iter().find(|c| c.role == Role::Auditor) else {
            return Ok(());
        };
        let mut start = BTreeMap::new();
        let mut read = BTreeMap::new();
        for shard in 0..SHARDS {
            let (first, records) = auditor
                .audit
                .get(&shard)
                .map(|(s, r)| {
                    (
                        *s,
                        r.iter().map(|(o, p)| (*o, p.clone())).collect::<Vec<_>>(),
                    )
                })
                .unwrap_or((0, Vec::new()));
            let tail = self.oracle.known_tail(shard);
            let reached = records.last().map_or(first, |(o, _)| o + 1);
            if reached < tail {
                return Err(Violation {
                    invariant: no_acked_loss::NAME,
                    detail: format!(
                        "the audit of shard {shard} read up to offset {reached} from {first}, but offsets up to {tail} were acknowledged or delivered (connected: {})",
                        auditor.is_connected()
                    ),
                });
            }
            start.insert(shard, first);
            read.insert(shard, records);
        }
        no_acked_loss::check(&self.oracle, &start, &read)?;
        idempotent_once::check_audit(&read)
    }
}

fn fate(delays: &[Duration]) -> String {
    match delays {
        [] => "lost".to_owned(),
        ds => ds
            .iter()
            .map(|d| format!("+{}us", d.as_micros()))
            .collect::<Vec<_>>()
            .join(","),
    }
}

fn describe(kind: &FileOpKind) -> String {
    match kind {
        FileOpKind::Append { path, bytes } => format!("append {path} {}B", bytes.len()),
        FileOpKind::Read { path, pos, len } => format!("read {path} @{pos}+{len}"),
        FileOpKind::Truncate { path, len } => format!("truncate {path} {len}"),
        FileOpKind::Rename { from, to } => format!("rename {from} {to}"),
        FileOpKind::CreateDir { path } => format!("create_dir {path}"),
        FileOpKind::ListDir { path } => format!("list_dir {path}"),
        FileOpKind::Create { path } => format!("create {path}"),
        FileOpKind::Sync { path } => format!("sync {path}"),
        FileOpKind::SyncDir { path } => format!("sync_dir {path}"),
        FileOpKind::Remove { path } => format!("remove {path}"),
        FileOpKind::RemoveDir { path } => format!("remove_dir {path}"),
        other => format!("{} {}", other.name(), other.path()),
    }
}
