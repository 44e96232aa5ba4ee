//! The cluster client's decisions as Sans-IO state: which brokers it knows ([`Cluster`]:
//! seeds and `topology`), which broker owns each shard (`shard_owners`, owner hints, losses),
//! where a redirected request goes next ([`Redirects`]), whether and when a failed call is
//! tried again ([`Attempts`], full-jitter backoff from a seed), and where a subscription
//! resumes ([`Cursor`]).
//!
//! Nothing here dials, sleeps or reads a clock: every input that depends on time carries
//! `now`, and the only randomness is the seed in [`ClusterConfig::seed`]. The front end asks
//! a question (`route`, `dial_order`, `next_attempt`), does the I/O the answer names, and
//! reports what happened (`handle_*`). The simulator's cluster clients drive the same state
//! (`sim/src/client.rs`).
//!
//! Method families (as in the rest of the core): `handle_*` feeds an outcome in, plain
//! verbs decide, `poll_timeout` says when the state next wants attention, getters take
//! `&self`.

use core::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_proto::message::{NotLeader, ShardKind, ShardOwnersView, TopologyView};
use felix_proto::routing::{shard_for_key, RoutingMapping};
use felix_proto::{ErrorCode, Frame, RetryClass};

use crate::error::ClientError;

/// Redirects followed before a call gives up on one attempt (the reference follows 3).
pub const DEFAULT_MAX_REDIRECT_HOPS: usize = 3;
/// Attempts a retried call makes in all (the first included).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 8;
/// The backoff ceiling before the second attempt; it doubles per attempt up to the cap.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(50);
/// The largest backoff ceiling.
pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_secs(2);
/// How often the known brokers are asked `topology` again while connected.
pub const DEFAULT_TOPOLOGY_INTERVAL: Duration = Duration::from_secs(30);
/// The shortest interval between `topology` refreshes, whatever `topology_interval` says
/// (zero would ask without pause).
pub const MIN_TOPOLOGY_INTERVAL: Duration = Duration::from_millis(100);
/// How long a `shard_owners` answer is used before it is asked again (the reference: ~5 s).
pub const DEFAULT_OWNERS_REFRESH: Duration = Duration::from_secs(5);
/// How long a broker whose connection failed is tried last when choosing where to dial, and
/// not routed to while `shard_owners` still names it.
pub const DEFAULT_SUSPECT_FOR: Duration = Duration::from_secs(5);
/// While a shard's owner is a lost broker (or nobody yet), how long a `shard_owners` answer
/// saying so is believed before the owners are asked again. Meanwhile the shard's calls are
/// refused here (not applied, so retried with backoff) rather than forwarded by another
/// broker into the dead one, where they would wait for its forward timeout.
pub const DEFAULT_LOST_OWNER_REASK: Duration = Duration::from_millis(100);
/// Brokers taken from one `topology` answer; the rest are ignored.
pub const MAX_TOPOLOGY_BROKERS: usize = 256;
/// Shards taken from one `shard_owners` answer; a longer answer is not used for routing.
pub const MAX_OWNED_SHARDS: usize = 4096;
/// Streams and caches whose owners are remembered at once; the oldest is forgotten past it.
pub const MAX_OWNER_TABLES: usize = 1024;

/// What the cluster state needs to know; the liveness bounds are here so one value carries
/// every limit the front end enforces for it.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Brokers to start from, in the order they are tried. Never dropped.
    pub seeds: Vec<SocketAddr>,
    /// The seed of the backoff's jitter.
    pub seed: u64,
    /// Retry bounds for calls that are retried.
    pub retry: RetryPolicy,
    /// See [`DEFAULT_MAX_REDIRECT_HOPS`].
    pub max_redirect_hops: usize,
    /// See [`DEFAULT_TOPOLOGY_INTERVAL`] (at least [`MIN_TOPOLOGY_INTERVAL`]).
    pub topology_interval: Duration,
    /// See [`DEFAULT_OWNERS_REFRESH`].
    pub owners_refresh: Duration,
    /// See [`DEFAULT_SUSPECT_FOR`].
    pub suspect_for: Duration,
    /// See [`DEFAULT_LOST_OWNER_REASK`].
    pub lost_owner_reask: Duration,
    /// How calls on a stream or cache are routed. See [`Routing`].
    pub routing: Routing,
}

/// Where [`Cluster::route`] sends a call on a stream or cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Routing {
    /// To the owner `shard_owners` names for the call's shard (the default).
    #[default]
    ByOwners,
    /// Always to the entry broker, which forwards a call on a shard it does not own (or
    /// redirects a subscription): `shard_owners` is never asked. For a client that must not
    /// learn owners (one behind a proxy that reaches a single broker), and for a driver that
    /// needs forwards to happen (the simulator's forwarded-ack check).
    EntryOnly,
}

impl ClusterConfig {
    /// Defaults for everything but the seeds.
    pub fn new(seeds: Vec<SocketAddr>) -> ClusterConfig {
        ClusterConfig {
            seeds,
            seed: 0,
            retry: RetryPolicy::default(),
            max_redirect_hops: DEFAULT_MAX_REDIRECT_HOPS,
            topology_interval: DEFAULT_TOPOLOGY_INTERVAL,
            owners_refresh: DEFAULT_OWNERS_REFRESH,
            suspect_for: DEFAULT_SUSPECT_FOR,
            lost_owner_reask: DEFAULT_LOST_OWNER_REASK,
            routing: Routing::ByOwners,
        }
    }
}

/// How a retried call is bounded: attempts, a full-jitter exponential backoff, and an
/// optional deadline across every attempt and sleep (off by default: one shorter than an
/// attempt's own timeout would forbid every retry, so only the caller can pick it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, at least 1.
    pub max_attempts: u32,
    /// See [`DEFAULT_BACKOFF_BASE`].
    pub base: Duration,
    /// See [`DEFAULT_BACKOFF_CAP`].
    pub cap: Duration,
    /// No attempt starts after `start + deadline`, and no sleep runs past it.
    pub deadline: Option<Duration>,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            base: DEFAULT_BACKOFF_BASE,
            cap: DEFAULT_BACKOFF_CAP,
            deadline: None,
        }
    }
}

impl RetryPolicy {
    /// The backoff ceiling before attempt `next` (2 = the first retry): `base * 2^(next-2)`,
    /// at most `cap`.
    pub fn ceiling(&self, next: u32) -> Duration {
        let doublings = next.saturating_sub(2).min(31);
        self.base
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.cap)
            .min(self.cap)
    }
}

/// What a failure says about the call that met it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// It cannot succeed on another attempt: a credential without the permission, an offset
    /// retention has passed, a request that can never be valid, a call the client refused.
    Terminal,
    /// Nothing was applied: the broker refused it with a class that says so, or it never
    /// left this client.
    NotApplied,
    /// It may have been applied: the broker said the outcome is unknown, refused it without
    /// a code, or the connection went away with the request sent and unanswered.
    Unknown,
}

/// Classifies an error met by a call whose request `sent` (written to a connection).
///
/// The terminal list is short on purpose (the spec's "Clients"): every fatal retry class
/// (unauthenticated, forbidden, invalid_request, limit_exceeded, revoked), a cursor past
/// retention, and the client's own refusals. Everything else is worth another attempt,
/// including `not_found` (a broker promoted a moment ago does not know its stream yet).
pub fn classify(error: &ClientError, sent: bool) -> Failure {
    match error {
        ClientError::Usage(_) | ClientError::Unsupported { .. } => Failure::Terminal,
        ClientError::Server { code, retry, .. } => {
            let class = retry.or_else(|| code.as_ref().map(ErrorCode::default_retry));
            match class {
                Some(RetryClass::Fatal) => Failure::Terminal,
                Some(RetryClass::OutcomeUnknown) => Failure::Unknown,
                Some(RetryClass::Retry | RetryClass::RetryAfter | RetryClass::Redirect) => {
                    Failure::NotApplied
                }
                // An uncoded refusal cannot be told apart from a failed write.
                None if sent => Failure::Unknown,
                None => Failure::NotApplied,
            }
        }
        ClientError::NotLeader { .. } => Failure::NotApplied,
        ClientError::Connection(_) | ClientError::Timeout(_) | ClientError::Protocol(_) => {
            if sent {
                Failure::Unknown
            } else {
                Failure::NotApplied
            }
        }
    }
}

/// Whether a call may be sent again after a failure whose outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    /// A publish: never re-sent once its outcome is unknown (it could be written twice).
    Never,
    /// `publish_at_least_once`, reads, cache writes the caller made idempotent: re-sent.
    Always,
}

/// Whether a consumer-group call is re-sent once its outcome is unknown (every group call
/// is retried when its refusal proves nothing was applied). Re-sent: the reads
/// (`group_describe`, `group_dead_letters`); `group_poll` (a lost answer's records stay
/// claimed until the claim lapses, then are owed to the group again: later, never lost);
/// `group_ack` (acknowledging a finished record again is a harmless duplicate,
/// docs/groups.md); `group_seek` and `group_extend` (a second copy sets the same cursor,
/// keeps the same claim standing). Not re-sent: the calls whose second copy could act on a
/// record someone else holds by then or list it twice (`group_nack`, `group_dead_letter`,
/// `group_discard`, `group_redrive`) or refuse what the first did (`group_delete`).
pub fn group_resend(call: crate::core::groups::GroupCall) -> Resend {
    use crate::core::groups::GroupCall as G;
    match call {
        G::Describe | G::DeadLetters | G::Poll | G::Ack | G::Seek | G::Extend => Resend::Always,
        G::Nack | G::DeadLetter | G::Discard | G::Redrive | G::Delete => Resend::Never,
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Sleep this long, then make attempt number `attempt`.
    RetryAfter { delay: Duration, attempt: u32 },
    /// Stop and report this error.
    GiveUp(ClientError),
}

/// One call's attempts so far. Made by [`Cluster::attempts`], consulted after each failure.
#[derive(Debug, Clone)]
pub struct Attempts {
    policy: RetryPolicy,
    resend: Resend,
    started: Instant,
    made: u32,
}

impl Attempts {
    /// Attempts made so far (the first counts once started).
    pub fn made(&self) -> u32 {
        self.made
    }

    /// When the call began.
    pub fn started(&self) -> Instant {
        self.started
    }
}

/// A subscription's position, so that a resubscription (after a redirect, a move or a lost
/// connection) neither skips nor repeats a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    start: crate::core::Start,
    last: Option<u64>,
    moved_to: Option<u64>,
}

impl Cursor {
    /// A subscription asked to start at `start`.
    pub fn new(start: crate::core::Start) -> Cursor {
        Cursor {
            start,
            last: None,
            moved_to: None,
        }
    }

    /// The broker confirmed the first offset it delivers: a `Latest` subscription pins it,
    /// so a resubscription before the first event starts there rather than at a later tail.
    pub fn handle_subscribed(&mut self, start_offset: Option<u64>) {
        if let (crate::core::Start::Latest, Some(at)) = (self.start, start_offset) {
            if self.last.is_none() {
                self.start = crate::core::Start::Offset(at);
            }
        }
    }

    /// An event at `offset` was delivered to the application.
    pub fn handle_delivered(&mut self, offset: u64) {
        self.last = Some(self.last.map_or(offset, |l| l.max(offset)));
    }

    /// The shard moved; the old owner offered everything before `resume_from`.
    pub fn handle_moved(&mut self, resume_from: Option<u64>) {
        self.moved_to = resume_from;
    }

    /// The last delivered offset.
    pub fn last(&self) -> Option<u64> {
        self.last
    }

    /// Where to subscribe again: after the last delivered record, or the move's resume
    /// point when that is later, or the original start when nothing was delivered.
    pub fn resume_start(&self) -> crate::core::Start {
        let after = self.last.map(|l| l + 1);
        match (after, self.moved_to) {
            (Some(a), Some(m)) => crate::core::Start::Offset(a.max(m)),
            (Some(a), None) => crate::core::Start::Offset(a),
            (None, Some(m)) => crate::core::Start::Offset(m),
            (None, None) => self.start,
        }
    }
}

/// The brokers one attempt of a redirected call asked, and the bound on how many more.
#[derive(Debug, Clone)]
pub struct Redirects {
    asked: Vec<SocketAddr>,
    max_hops: usize,
    /// The newest generation a followed redirect named in this attempt.
    newest: Option<u64>,
}

/// Why a `not_leader` was not followed ([`Redirects::follow_checked`]). Typed, so that a
/// driver that judges brokers (the simulator's `redirects_end`) can tell a broker's loop
/// from a stale view without reading prose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedirectRefused {
    /// The named owner's client address is not published.
    NoAddress,
    /// The address does not parse (a host name other than `localhost`, say).
    Unparseable,
    /// It names a generation older than one this attempt already followed: the answering
    /// broker's view is behind, not a loop.
    Stale { newest: u64 },
    /// Back to a broker this attempt already asked.
    Loop(SocketAddr),
    /// Past `max_hops`.
    Bound,
}

impl Redirects {
    /// An attempt that starts at `first`.
    pub fn new(first: SocketAddr, max_hops: usize) -> Redirects {
        Redirects {
            asked: vec![first],
            max_hops,
            newest: None,
        }
    }

    /// Brokers asked so far, in order.
    pub fn asked(&self) -> &[SocketAddr] {
        &self.asked
    }

    /// The broker to ask next after a `not_leader`, or why there is none, typed. Checked
    /// in this order: no address, an address that does not parse, a generation older than
    /// one already followed (stale), a broker already asked (a loop), the hop bound.
    pub fn follow_checked(
        &mut self,
        addr: Option<&str>,
        generation: u64,
    ) -> Result<SocketAddr, RedirectRefused> {
        let addr = addr.ok_or(RedirectRefused::NoAddress)?;
        let to = parse_addr(addr).ok_or(RedirectRefused::Unparseable)?;
        if let Some(newest) = self.newest.filter(|n| generation < *n) {
            return Err(RedirectRefused::Stale { newest });
        }
        if self.asked.contains(&to) {
            return Err(RedirectRefused::Loop(to));
        }
        if self.asked.len() > self.max_hops {
            return Err(RedirectRefused::Bound);
        }
        self.asked.push(to);
        self.newest = Some(self.newest.map_or(generation, |n| n.max(generation)));
        Ok(to)
    }

    /// [`Redirects::follow_checked`], a refusal as the error the attempt ends with: a
    /// `not_leader` of retry class `redirect` (nothing was applied; retried whole).
    pub fn follow(
        &mut self,
        node_id: &str,
        addr: Option<&str>,
        generation: u64,
    ) -> Result<SocketAddr, ClientError> {
        let why = match self.follow_checked(addr, generation) {
            Ok(to) => return Ok(to),
            Err(RedirectRefused::NoAddress) => format!(
                "{node_id} leads the shard (generation {generation}) but its client address \
                 is not published"
            ),
            Err(RedirectRefused::Unparseable) => format!(
                "{node_id}'s address {:?} does not parse",
                addr.unwrap_or_default()
            ),
            Err(RedirectRefused::Stale { newest }) => format!(
                "{node_id} named as owner at generation {generation}, older than generation \
                 {newest} this attempt already followed: a stale view"
            ),
            Err(RedirectRefused::Loop(to)) => {
                format!("redirected back to {node_id} at {to}, which this attempt already asked")
            }
            Err(RedirectRefused::Bound) => format!(
                "still redirected after {} hops; the cluster has not settled on an owner",
                self.max_hops
            ),
        };
        Err(ClientError::Server {
            code: Some(ErrorCode::NotLeader),
            retry: Some(RetryClass::Redirect),
            message: why,
        })
    }

    /// [`Redirects::follow`] for a decoded `not_leader`.
    pub fn follow_message(&mut self, m: &NotLeader) -> Result<SocketAddr, ClientError> {
        self.follow(&m.node_id, m.addr.as_deref(), m.generation)
    }
}

/// One request with one answer on a cluster (a commit, a state or stream read,
/// `producer_init`, `topology`, `stream_shards`): sent to the entry and, while answered
/// `not_leader`, sent again unchanged to the broker it names, within the hop bound. A
/// `not_leader` applied nothing, so the same bytes are safe to send on for every kind.
#[derive(Debug, Clone)]
pub struct OneShot {
    request: Bytes,
    redirects: Redirects,
}

/// What to do with a [`OneShot`]'s answer.
#[derive(Debug, Clone, PartialEq)]
pub enum OneShotStep {
    /// The answer (an acceptance or a refusal): read it with the request's reader.
    Answered(Frame),
    /// Send [`OneShot::request`] to this broker.
    SendTo(SocketAddr),
}

impl OneShot {
    /// `request` about to be sent to `entry`.
    pub fn new(request: Bytes, entry: SocketAddr, max_hops: usize) -> OneShot {
        OneShot {
            request,
            redirects: Redirects::new(entry, max_hops),
        }
    }

    /// A new attempt of the same call (after a failure [`Cluster::next_attempt`] said to
    /// retry, and its backoff), entering at `entry` (the entry may have changed after a lost
    /// connection) with a fresh hop bound. The bytes are unchanged.
    pub fn retry_at(&mut self, entry: SocketAddr) {
        self.redirects = Redirects::new(entry, self.redirects.max_hops);
    }

    /// The bytes to send, the same on every hop.
    pub fn request(&self) -> &Bytes {
        &self.request
    }

    /// The broker the request goes to now.
    pub fn target(&self) -> SocketAddr {
        *self
            .redirects
            .asked
            .last()
            .expect("a redirect starts somewhere")
    }

    /// An answer from [`OneShot::target`]: a `not_leader` message is followed (or, past the
    /// bound, in a loop or without an address, ends the call as not applied); anything else
    /// is the answer.
    pub fn handle_answer(&mut self, answer: Frame) -> Result<OneShotStep, ClientError> {
        match crate::core::stream_ops::read_not_leader(&answer) {
            Some(n) => self.redirects.follow_message(&n).map(OneShotStep::SendTo),
            None => Ok(OneShotStep::Answered(answer)),
        }
    }
}

/// Where a routed call goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// To the broker that owns the shard (`shard` is the one the key hashes to).
    Owner { addr: SocketAddr, shard: u32 },
    /// To the entry broker, which forwards: nobody is known to own the shard.
    Entry { addr: SocketAddr },
    /// The owners are not known (or too old): ask the entry broker `shard_owners`, hand the
    /// answer to [`Cluster::handle_shard_owners`] (or report the failure with
    /// [`Cluster::handle_owners_failed`]), then route again.
    AskOwners { entry: SocketAddr },
    /// No broker is connected: dial one from [`Cluster::dial_order`] first.
    NoEntry,
    /// The shard has no owner that can serve it now (a broker this client lost, or none
    /// while the cluster elects one): nothing is sent; the call fails as not applied and is
    /// retried.
    Unavailable {
        shard: u32,
        lost: Option<SocketAddr>,
    },
}

impl Route {
    /// The error a call meets on [`Route::Unavailable`] (retried: nothing was sent).
    pub fn unavailable_error(shard: u32, lost: Option<SocketAddr>) -> ClientError {
        let message = match lost {
            Some(lost) => {
                format!("shard {shard}'s owner {lost} was lost and the cluster names no other yet")
            }
            None => format!("shard {shard} has no owner yet"),
        };
        ClientError::Server {
            code: Some(ErrorCode::ShardUnavailable),
            retry: Some(RetryClass::Retry),
            message,
        }
    }
}

/// A stream or cache whose owners are tracked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Object {
    /// Stream or cache.
    pub kind: ShardKind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl Object {
    /// A stream.
    pub fn stream(namespace: &str, name: &str) -> Object {
        Object {
            kind: ShardKind::Stream,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    /// A cache.
    pub fn cache(namespace: &str, name: &str) -> Object {
        Object {
            kind: ShardKind::Cache,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

/// One shard's owner as known here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Owner(SocketAddr),
    /// Nobody is known to serve it: calls go through the entry, which forwards.
    Unowned,
    /// No owner can serve it now: its owner is a broker whose connection failed (`Some`),
    /// or the cluster said it has none while it elects one (`None`).
    Lost(Option<SocketAddr>),
}

#[derive(Debug, Clone)]
struct OwnerTable {
    /// One entry per shard, in shard order.
    shards: Vec<Slot>,
    /// When it was learned (a failed ask counts: it is not asked again before the refresh).
    at: Instant,
}

/// A known broker.
#[derive(Debug, Clone)]
struct Broker {
    addr: SocketAddr,
    /// Tried last until then, after its connection failed.
    suspect_until: Option<Instant>,
}

/// The cluster as this client knows it. See the module doc.
#[derive(Debug)]
pub struct Cluster {
    config: ClusterConfig,
    /// The last usable `topology` answer, in its order.
    discovered: Vec<SocketAddr>,
    suspects: HashMap<SocketAddr, Instant>,
    entry: Option<SocketAddr>,
    owners: HashMap<Object, OwnerTable>,
    next_topology: Option<Instant>,
    /// The broker the last `topology` ask went to (the rotation continues after it), and
    /// whether the next ask is the first since an entry was reached (it goes to the entry).
    /// See [`Cluster::topology_target`].
    topology_last: Option<SocketAddr>,
    topology_first: bool,
    rng: SplitMix64,
}

impl Cluster {
    /// State for a client about to dial `config.seeds`.
    pub fn new(config: ClusterConfig) -> Cluster {
        let rng = SplitMix64(config.seed);
        Cluster {
            config,
            discovered: Vec::new(),
            suspects: HashMap::new(),
            entry: None,
            owners: HashMap::new(),
            next_topology: None,
            topology_last: None,
            topology_first: true,
            rng,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// Every broker known: the last `topology` answer in its order, then every seed not in
    /// it. Seeds are never dropped, so a wrong answer cannot leave fewer ways in.
    pub fn endpoints(&self) -> Vec<SocketAddr> {
        let mut out = self.discovered.clone();
        for seed in &self.config.seeds {
            if !out.contains(seed) {
                out.push(*seed);
            }
        }
        out
    }

    /// The broker calls enter through, when one is connected.
    pub fn entry(&self) -> Option<SocketAddr> {
        self.entry
    }

    /// The order to dial brokers in: [`Cluster::endpoints`], those not suspected first;
    /// suspects last, soonest cleared first. Every endpoint appears once.
    pub fn dial_order(&self, now: Instant) -> Vec<SocketAddr> {
        let endpoints = self.endpoints();
        let (mut fine, mut suspect): (Vec<Broker>, Vec<Broker>) = endpoints
            .into_iter()
            .map(|addr| Broker {
                addr,
                suspect_until: self.suspects.get(&addr).copied().filter(|t| *t > now),
            })
            .partition(|b| b.suspect_until.is_none());
        suspect.sort_by_key(|b| b.suspect_until);
        fine.extend(suspect);
        fine.into_iter().map(|b| b.addr).collect()
    }

    /// A connection to `addr` completed its handshake; the first one becomes the entry.
    /// Asks for `topology` at once (see [`Cluster::topology_due`]).
    pub fn handle_connected(&mut self, addr: SocketAddr, now: Instant) {
        self.suspects.remove(&addr);
        if self.entry.is_none() {
            self.entry = Some(addr);
            self.next_topology = Some(now);
            self.topology_first = true;
        }
    }

    /// The connection to `addr` failed or could not be made: it is tried last for a while,
    /// no owner is routed to it, and if it was the entry there is none until the next dial.
    pub fn handle_connection_lost(&mut self, addr: SocketAddr, now: Instant) {
        self.suspects.insert(addr, now + self.config.suspect_for);
        if self.entry == Some(addr) {
            self.entry = None;
            self.next_topology = None;
        }
        for table in self.owners.values_mut() {
            for slot in &mut table.shards {
                if *slot == Slot::Owner(addr) {
                    *slot = Slot::Lost(Some(addr));
                }
            }
        }
    }

    /// Whether `topology` should be asked of the entry now.
    pub fn topology_due(&self, now: Instant) -> bool {
        self.entry.is_some() && self.next_topology.is_some_and(|t| t <= now)
    }

    /// Whether the `topology` due now is the first since an entry was reached (the broker
    /// just reached is asked at once; later refreshes can wait for a background turn).
    pub fn topology_due_after_connect(&self, now: Instant) -> bool {
        self.topology_first && self.topology_due(now)
    }

    /// `topology` is being asked now: it is not due again for an interval, so concurrent
    /// callers do not all ask (the answer, or its failure, restarts the interval).
    pub fn begin_topology(&mut self, now: Instant) {
        if self.entry.is_some() {
            self.next_topology = Some(now + self.topology_interval());
        }
    }

    /// `topology_interval`, at least [`MIN_TOPOLOGY_INTERVAL`].
    pub fn topology_interval(&self) -> Duration {
        self.config.topology_interval.max(MIN_TOPOLOGY_INTERVAL)
    }

    /// The broker a due `topology` ask goes to, noted as asked. The first ask after an
    /// entry is reached goes to the entry (the broker just reached). Every later one goes to
    /// the next live broker in [`Cluster::endpoints`] order after the one asked before, so one
    /// broker's stale or partitioned view is not the only one ever heard, and a broker the
    /// entry has stopped listing is still asked while it is known (a seed always is). A
    /// suspected broker (its connection failed within `suspect_for`) is skipped; with none
    /// live but the entry, the entry is asked. `None` without an entry (dial first).
    pub fn topology_target(&mut self, now: Instant) -> Option<SocketAddr> {
        let entry = self.entry?;
        if std::mem::take(&mut self.topology_first) {
            self.topology_last = Some(entry);
            return Some(entry);
        }
        let all = self.endpoints();
        let after = self
            .topology_last
            .and_then(|last| all.iter().position(|a| *a == last))
            .map_or(0, |i| i + 1);
        let next = (0..all.len())
            .map(|k| all[(after + k) % all.len()])
            .find(|a| *a == entry || !self.is_suspect(*a, now))
            .unwrap_or(entry);
        self.topology_last = Some(next);
        Some(next)
    }

    /// The answer to `topology` (or `None` when it failed or was refused, which keeps what
    /// was known). An answer with an entry that is not a string `node_id` and `addr` has
    /// already failed to decode; here an address that does not parse skips that entry, and
    /// an empty answer is valid (the seeds remain).
    pub fn handle_topology(&mut self, view: Option<&TopologyView>, now: Instant) {
        self.next_topology = Some(now + self.topology_interval());
        let Some(view) = view else { return };
        let mut discovered = Vec::new();
        for b in view.brokers.iter().take(MAX_TOPOLOGY_BROKERS) {
            if let Some(addr) = parse_addr(&b.addr) {
                if !discovered.contains(&addr) {
                    discovered.push(addr);
                }
            }
        }
        self.discovered = discovered;
    }

    /// Where a call on `object` with routing `key` goes. `key` is `None` for an unkeyed
    /// publish (shard 0, as the broker places it). Keys hash with the shared routing function
    /// over the shard count `shard_owners` reported.
    pub fn route(&self, object: &Object, key: Option<&[u8]>, now: Instant) -> Route {
        self.route_by(object, now, |count| {
            shard_for_key(key, count, RoutingMapping::Modulo)
        })
    }

    /// Where a call on one given `shard` of `object` goes (a subscription to that shard).
    pub fn route_shard(&self, object: &Object, shard: u32, now: Instant) -> Route {
        self.route_by(object, now, |_| shard)
    }

    fn route_by(&self, object: &Object, now: Instant, pick: impl FnOnce(u32) -> u32) -> Route {
        let Some(entry) = self.entry else {
            return Route::NoEntry;
        };
        if self.config.routing == Routing::EntryOnly {
            return Route::Entry { addr: entry };
        }
        let Some(table) = self.owners.get(object) else {
            return Route::AskOwners { entry };
        };
        let count = u32::try_from(table.shards.len()).unwrap_or(u32::MAX);
        let shard = pick(count);
        let slot = table.shards.get(shard as usize).copied();
        match slot {
            // A lost owner is asked about again sooner than the refresh.
            Some(Slot::Lost(lost)) if now < table.at + self.config.lost_owner_reask => {
                Route::Unavailable { shard, lost }
            }
            Some(Slot::Lost(_)) => Route::AskOwners { entry },
            _ if now >= table.at + self.config.owners_refresh => Route::AskOwners { entry },
            Some(Slot::Owner(addr)) => Route::Owner { addr, shard },
            // A shard with no owner yet (a stream placed a moment ago) is forwarded by the
            // entry meanwhile, and asked about again as soon as a lost owner would be.
            Some(Slot::Unowned) if now >= table.at + self.config.lost_owner_reask => {
                Route::AskOwners { entry }
            }
            Some(Slot::Unowned) | None => Route::Entry { addr: entry },
        }
    }

    /// How many shards `object` has, when a `shard_owners` answer said (and was not empty).
    pub fn shard_count(&self, object: &Object) -> Option<u32> {
        self.owners
            .get(object)
            .map(|t| t.shards.len())
            .filter(|n| *n > 0)
            .and_then(|n| u32::try_from(n).ok())
    }

    /// The owners of every shard of `object`, as last learned (`None` for a shard with no
    /// owner, or one whose owner was lost); `None` when not known at all.
    pub fn owners(&self, object: &Object) -> Option<Vec<Option<SocketAddr>>> {
        self.owners.get(object).map(|t| {
            t.shards
                .iter()
                .map(|s| match s {
                    Slot::Owner(a) => Some(*a),
                    Slot::Unowned | Slot::Lost(_) => None,
                })
                .collect()
        })
    }

    /// The answer to `shard_owners` for `object`. Shards with no owner, or an owner whose
    /// address does not parse, route through the entry. A longer answer than
    /// [`MAX_OWNED_SHARDS`] is not used.
    pub fn handle_shard_owners(&mut self, object: &Object, view: &ShardOwnersView, now: Instant) {
        let mut shards = Vec::new();
        if view.owners.len() <= MAX_OWNED_SHARDS {
            shards = vec![Slot::Unowned; view.owners.len()];
            for o in &view.owners {
                let Some(slot) = usize::try_from(o.shard)
                    .ok()
                    .and_then(|s| shards.get_mut(s))
                else {
                    continue;
                };
                *slot = match o.addr.as_deref().and_then(parse_addr) {
                    // Placed but leaderless (`unavailable` says why): a forward would wait
                    // in the entry for an owner, so the call waits here instead.
                    None if o.unavailable.is_some() => Slot::Lost(None),
                    None => Slot::Unowned,
                    // A broker that just failed is not routed to until it answers again.
                    Some(a) if self.is_suspect(a, now) => Slot::Lost(Some(a)),
                    Some(a) => Slot::Owner(a),
                };
            }
        }
        self.remember(object.clone(), OwnerTable { shards, at: now });
    }

    /// A redirect (a `not_leader` followed by [`Redirects`]) leads to `to`: whether to go.
    /// A broker whose connection this client lost within `suspect_for` is not dialled on a
    /// redirect, which comes from a broker whose view is older than this client's loss (the
    /// dial would cost a handshake timeout to learn the same): the attempt ends not applied
    /// (`shard_unavailable`, retried with backoff), by which time the cluster may name
    /// another owner.
    pub fn check_redirect(&self, to: SocketAddr, now: Instant) -> Result<SocketAddr, ClientError> {
        if self.is_suspect(to, now) {
            return Err(ClientError::Server {
                code: Some(ErrorCode::ShardUnavailable),
                retry: Some(RetryClass::Retry),
                message: format!(
                    "redirected to {to}, whose connection this client lost moments ago"
                ),
            });
        }
        Ok(to)
    }

    fn is_suspect(&self, addr: SocketAddr, now: Instant) -> bool {
        self.suspects.get(&addr).is_some_and(|until| *until > now)
    }

    /// `shard_owners` could not be asked: route through the entry until the next refresh.
    pub fn handle_owners_failed(&mut self, object: &Object, now: Instant) {
        self.remember(
            object.clone(),
            OwnerTable {
                shards: Vec::new(),
                at: now,
            },
        );
    }

    /// A forwarded publish with routing `key` was acknowledged with `addr` (`0x0080`) as
    /// the owner of its shard. A suspected broker is not believed (the entry's view may be
    /// older than this client's loss of it).
    pub fn handle_owner_hint(
        &mut self,
        object: &Object,
        key: Option<&[u8]>,
        addr: &str,
        now: Instant,
    ) {
        let Some(addr) = parse_addr(addr).filter(|a| !self.is_suspect(*a, now)) else {
            return;
        };
        let Some(table) = self.owners.get_mut(object) else {
            return;
        };
        let count = u32::try_from(table.shards.len()).unwrap_or(u32::MAX);
        let shard = shard_for_key(key, count, RoutingMapping::Modulo);
        if let Some(slot) = table.shards.get_mut(shard as usize) {
            *slot = Slot::Owner(addr);
        }
    }

    /// The owner of `object` at `addr` refused a call as not its own (`not_leader`,
    /// `shard_unavailable`) or moved it: forget every shard routed there, and ask again on
    /// the next call.
    pub fn handle_stale_owner(&mut self, object: &Object) {
        self.owners.remove(object);
    }

    fn remember(&mut self, object: Object, table: OwnerTable) {
        if !self.owners.contains_key(&object) && self.owners.len() >= MAX_OWNER_TABLES {
            if let Some(oldest) = self
                .owners
                .iter()
                .min_by_key(|(_, t)| t.at)
                .map(|(k, _)| k.clone())
            {
                self.owners.remove(&oldest);
            }
        }
        self.owners.insert(object, table);
    }

    /// A call that starts now, bounded by the configured retry policy.
    pub fn attempts(&self, resend: Resend, now: Instant) -> Attempts {
        self.attempts_with(self.config.retry, resend, now)
    }

    /// A call that starts now under its own policy.
    pub fn attempts_with(&self, policy: RetryPolicy, resend: Resend, now: Instant) -> Attempts {
        Attempts {
            policy,
            resend,
            started: now,
            made: 1,
        }
    }

    /// After attempt `attempts.made()` failed with `error` (`sent`: the request was written
    /// to a connection): whether to try again and after how long. Terminal errors, an
    /// unknown outcome under [`Resend::Never`], the attempt bound and the deadline all end
    /// the call with the error; otherwise the delay is uniform over `[0, ceiling]` (full
    /// jitter), clipped so that it ends by the deadline.
    pub fn next_attempt(
        &mut self,
        attempts: &mut Attempts,
        error: ClientError,
        sent: bool,
        now: Instant,
    ) -> Next {
        match classify(&error, sent) {
            Failure::Terminal => return Next::GiveUp(error),
            Failure::Unknown if attempts.resend == Resend::Never => return Next::GiveUp(error),
            Failure::Unknown | Failure::NotApplied => {}
        }
        let policy = attempts.policy;
        if attempts.made >= policy.max_attempts.max(1) {
            return Next::GiveUp(error);
        }
        let next = attempts.made + 1;
        let ceiling = policy.ceiling(next);
        let mut delay = self.jitter(ceiling);
        if let Some(deadline) = policy.deadline {
            let end = attempts.started + deadline;
            if now >= end {
                return Next::GiveUp(error);
            }
            delay = delay.min(end - now);
        }
        attempts.made = next;
        Next::RetryAfter {
            delay,
            attempt: next,
        }
    }

    /// Uniform over `[0, ceiling]`, to the nanosecond.
    fn jitter(&mut self, ceiling: Duration) -> Duration {
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        if nanos == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.rng.next() % nanos.saturating_add(1))
    }

    /// When the state next wants attention (a `topology` refresh), if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.entry.and(self.next_topology)
    }
}

/// A broker address as the wire gives it. `localhost` means the IPv4 loopback (the
/// reference resolves it so); other host names are not resolved here (no I/O) and skip the
/// entry, as an unparseable address does.
pub fn parse_addr(s: &str) -> Option<SocketAddr> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Some(addr);
    }
    let (host, port) = s.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    host.eq_ignore_ascii_case("localhost")
        .then_some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port))
}

/// splitmix64: small, seedable, and good enough for jitter.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests;
