//! The network model: decides, for each UDP datagram one node sends, whether it arrives,
//! when, and how many times. QUIC and TLS run for real on both ends; only the journey is
//! simulated (after TigerBeetle's `packet_simulator.zig`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::rng::SimRng;

/// One end of a link: the broker, a client by index, or a cluster node by index (the
/// cluster world's brokers; their client and peer listeners are one end each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Node {
    Broker,
    Client(usize),
    Server(usize),
}

/// The link's behaviour when no fault is active. Drawn per seed.
#[derive(Debug, Clone)]
pub(crate) struct NetConfig {
    pub(crate) delay: Duration,
    pub(crate) jitter: Duration,
    pub(crate) loss: f64,
    pub(crate) duplicate: f64,
    /// Chance a datagram is held back by up to `reorder_delay` more, so later ones overtake.
    pub(crate) reorder: f64,
    pub(crate) reorder_delay: Duration,
}

impl NetConfig {
    pub(crate) fn draw(rng: &mut SimRng) -> NetConfig {
        NetConfig {
            delay: rng.duration(Duration::from_micros(100), Duration::from_millis(20)),
            jitter: rng.duration(Duration::ZERO, Duration::from_millis(10)),
            loss: *rng.pick(&[0.0, 0.001, 0.01, 0.05]),
            duplicate: *rng.pick(&[0.0, 0.001, 0.01]),
            reorder: *rng.pick(&[0.0, 0.01, 0.05]),
            reorder_delay: rng.duration(Duration::from_millis(1), Duration::from_millis(50)),
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NetStats {
    pub(crate) sent: u64,
    pub(crate) dropped: u64,
    pub(crate) duplicated: u64,
}

pub(crate) struct Network {
    pub(crate) config: NetConfig,
    /// Clients cut off from the broker, both ways.
    partitioned: BTreeSet<usize>,
    /// Links cut one way: nothing from `.0` reaches `.1`.
    cut: BTreeSet<(Node, Node)>,
    /// A loss burst: this loss rate until the instant.
    burst: Option<(Instant, f64)>,
    rng: SimRng,
    pub(crate) stats: NetStats,
}

impl Network {
    pub(crate) fn new(config: NetConfig, rng: SimRng) -> Network {
        Network {
            config,
            partitioned: BTreeSet::new(),
            cut: BTreeSet::new(),
            burst: None,
            rng,
            stats: NetStats::default(),
        }
    }

    pub(crate) fn partition(&mut self, client: usize) {
        self.partitioned.insert(client);
    }

    pub(crate) fn heal(&mut self, client: usize) {
        self.partitioned.remove(&client);
    }

    /// Cuts the link from `from` to `to` (one way).
    pub(crate) fn cut(&mut self, from: Node, to: Node) {
        self.cut.insert((from, to));
    }

    /// Heals every cut to or from `node`.
    pub(crate) fn heal_node(&mut self, node: Node) {
        self.cut.retain(|(a, b)| *a != node && *b != node);
    }

    pub(crate) fn heal_all(&mut self) {
        self.partitioned.clear();
        self.cut.clear();
        self.burst = None;
    }

    pub(crate) fn loss_burst(&mut self, until: Instant, loss: f64) {
        self.burst = Some((until, loss));
    }

    /// The delays after which copies of a datagram from `from` to `to` sent at `now` arrive:
    /// none when it is lost, two when it is duplicated.
    pub(crate) fn route(&mut self, now: Instant, from: Node, to: Node) -> Vec<Duration> {
        self.stats.sent += 1;
        let client = match (from, to) {
            (Node::Client(c), _) | (_, Node::Client(c)) => Some(c),
            _ => None,
        };
        // No draw before these checks: a run without cuts routes exactly as before.
        let cut = self.cut.contains(&(from, to));
        if cut || client.is_some_and(|c| self.partitioned.contains(&c)) {
            self.stats.dropped += 1;
            return Vec::new();
        }
        let loss = match self.burst {
            Some((until, loss)) if now < until => loss,
            _ => self.config.loss,
        };
        if self.rng.chance(loss) {
            self.stats.dropped += 1;
            return Vec::new();
        }
        let copies = if self.rng.chance(self.config.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        (0..copies)
            .map(|_| {
                let mut d =
                    self.config.delay + self.rng.duration(Duration::ZERO, self.config.jitter);
                if self.rng.chance(self.config.reorder) {
                    d += self.rng.duration(Duration::ZERO, self.config.reorder_delay);
                }
                d
            })
            .collect()
    }
}
