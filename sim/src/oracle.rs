//! The oracle: what the simulated clients were promised. Every acknowledged publish with its
//! shard and offset, every record seen at an offset, every cache write with its outcome, and
//! every request still waiting for its answer. The invariants read it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// A failed invariant: which one, and what was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The invariant's name (its file under `src/invariants/`).
    pub invariant: &'static str,
    /// What broke it.
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.invariant, self.detail)
    }
}

/// What the run's storage promises about acknowledged records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Promise {
    /// In memory: nothing survives a broker crash (the run has none); records have no
    /// offsets on the wire.
    Memory,
    /// Durable, and every acknowledged record (and every record a subscriber saw) survives
    /// every crash the run injects.
    Durable,
}

/// How a cache write ended, as far as its client knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteOutcome {
    Pending,
    Acked(Instant),
    Refused,
    /// The connection went away first: it may have been applied, now or later.
    Unknown,
}

#[derive(Debug, Clone)]
pub(crate) struct CacheWrite {
    /// `None` for a delete.
    pub(crate) value: Option<Bytes>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) sent: Instant,
    pub(crate) outcome: WriteOutcome,
}

/// Identifies one request: client, connection generation, stream index, request id.
pub(crate) type RequestKey = (usize, u64, u64, u64);

#[derive(Debug, Clone)]
pub(crate) struct Outstanding {
    pub(crate) sent: Instant,
    pub(crate) what: String,
}

pub(crate) struct Oracle {
    pub(crate) promise: Promise,
    pub(crate) shards: u32,
    /// Per shard, the record known at each offset (from acks and events).
    pub(crate) at_offset: BTreeMap<u32, BTreeMap<u64, Bytes>>,
    /// Per shard, offsets whose records were acknowledged to their publisher.
    pub(crate) acked: BTreeMap<u32, BTreeMap<u64, Bytes>>,
    /// Acknowledged publishes, all of them.
    pub(crate) acked_count: u64,
    /// Durable records acknowledged without an offset (acked before the write): the audit
    /// must find each payload somewhere on its shard.
    pub(crate) acked_unplaced: Vec<(u32, Bytes)>,
    /// Cluster runs: acks a node that does not lead the shard answered (shard, offset,
    /// payload, the node the client was on), read back from the leader at the end
    /// (`invariants/forwarded_acks.rs`).
    pub(crate) forwarded_acks: Vec<(u32, u64, Bytes, std::net::SocketAddr)>,
    pub(crate) cache: BTreeMap<String, Vec<CacheWrite>>,
    pub(crate) outstanding: BTreeMap<RequestKey, Outstanding>,
    /// Events seen by subscribers, for the summary.
    pub(crate) events_seen: u64,
    pub(crate) cache_reads_checked: u64,
    /// `--wipe-disks`: a cache shard has one copy, so a replaced drive loses its values by
    /// design; reads are not checked against the writes.
    pub(crate) cache_values_may_be_lost: bool,
    pub(crate) lagged: u64,
    /// Consumer-group handouts (`invariants/group_claims.rs`).
    pub(crate) groups: crate::invariants::group_claims::GroupClaims,
}

impl Oracle {
    pub(crate) fn new(promise: Promise, shards: u32) -> Oracle {
        Oracle {
            promise,
            shards,
            at_offset: BTreeMap::new(),
            acked: BTreeMap::new(),
            acked_count: 0,
            acked_unplaced: Vec::new(),
            forwarded_acks: Vec::new(),
            cache: BTreeMap::new(),
            outstanding: BTreeMap::new(),
            events_seen: 0,
            cache_reads_checked: 0,
            cache_values_may_be_lost: false,
            lagged: 0,
            groups: Default::default(),
        }
    }

    /// The highest offset known on `shard`, plus one (0 when nothing is known).
    pub(crate) fn known_tail(&self, shard: u32) -> u64 {
        self.at_offset
            .get(&shard)
            .and_then(|m| m.keys().next_back())
            .map_or(0, |o| o + 1)
    }

    pub(crate) fn request_sent(&mut self, key: RequestKey, now: Instant, what: String) {
        self.outstanding
            .insert(key, Outstanding { sent: now, what });
    }

    pub(crate) fn request_answered(&mut self, key: RequestKey) {
        self.outstanding.remove(&key);
    }

    /// The connection `(client, gen)` is gone: its requests will never be answered, and that
    /// is allowed.
    pub(crate) fn connection_closed(&mut self, client: usize, gen: u64) {
        self.outstanding
            .retain(|(c, g, _, _), _| !(*c == client && *g == gen));
    }

    pub(crate) fn cache_write_sent(
        &mut self,
        key: &str,
        value: Option<Bytes>,
        ttl: Option<Duration>,
        now: Instant,
    ) -> usize {
        let writes = self.cache.entry(key.to_owned()).or_default();
        writes.push(CacheWrite {
            value,
            ttl,
            sent: now,
            outcome: WriteOutcome::Pending,
        });
        writes.len() - 1
    }

    pub(crate) fn cache_write_done(&mut self, key: &str, index: usize, outcome: WriteOutcome) {
        if let Some(w) = self.cache.get_mut(key).and_then(|w| w.get_mut(index)) {
            w.outcome = outcome;
        }
    }
}

/// The publisher and sequence number written at the start of every payload:
/// `<publisher>:<seq>|...`.
pub(crate) fn parse_payload(payload: &[u8]) -> Option<(&str, u64)> {
    let text = std::str::from_utf8(payload).ok()?;
    let head = text.split('|').next()?;
    let (publisher, seq) = head.rsplit_once(':')?;
    Some((publisher, seq.parse().ok()?))
}

pub(crate) fn show(payload: &[u8]) -> String {
    let s = String::from_utf8_lossy(payload);
    s.split('|').next().unwrap_or_default().to_owned()
}
