//! A UDP relay on loopback, for tests that cut links between real processes (QUIC peer links
//! are UDP): datagrams sent to the relay's listen address go to its target, and the target's
//! answers go back to whoever sent last, each direction under its own [`Rule`]. Two threads
//! per relay, blocking sockets; nothing here is on the product path.
//!
//! The target sees datagrams from the relay's own upstream socket, so a peer must know its
//! peers by something other than the source address (Felix nodes know each other by their
//! `hello`). The listen socket is held for the relay's life, so its port stays taken while
//! what sits behind it restarts.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a relay thread blocked on its socket looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);
/// The largest UDP payload.
const MAX_DATAGRAM: usize = 65_535;

/// One way through a relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the listen side to the target.
    Forward,
    /// From the target back to the listen side.
    Backward,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Direction::Forward => 0,
            Direction::Backward => 1,
        }
    }
}

/// What a direction does with a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    Pass,
    DropAll,
    /// Drop datagrams longer than this many bytes; pass the rest.
    DropAbove(usize),
    /// Keep every datagram; they go on, in order, once the direction's rule changes (a stall).
    Hold,
    /// Drop every datagram until a QUIC Initial packet comes the forward way (a new
    /// connection); then both directions pass. Connections open before it die for good.
    UntilNewConnection,
}

/// What a direction does with one datagram.
enum Fate {
    Pass,
    Drop,
    Hold,
}

impl Rule {
    fn fate(self, datagram: &[u8]) -> Fate {
        match self {
            Rule::Pass => Fate::Pass,
            Rule::DropAll => Fate::Drop,
            Rule::DropAbove(n) if datagram.len() <= n => Fate::Pass,
            Rule::DropAbove(_) => Fate::Drop,
            Rule::Hold => Fate::Hold,
            Rule::UntilNewConnection if is_quic_initial(datagram) => Fate::Pass,
            Rule::UntilNewConnection => Fate::Drop,
        }
    }
}

/// A QUIC version 1 Initial packet: long header (top two bits set), packet type 0 (RFC 9000
/// 17.2.2), a nonzero version. Only a client opening a connection sends one.
fn is_quic_initial(datagram: &[u8]) -> bool {
    datagram.len() > 5 && datagram[0] & 0xF0 == 0xC0 && datagram[1..5] != [0, 0, 0, 0]
}

/// Datagrams a direction has passed and dropped (held ones count as passed once released).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub dropped: u64,
    /// Kept by a [`Rule::Hold`] (each also counts as passed once released).
    pub held: u64,
}

/// A direction's rule and the datagrams it holds (with where each was going), under one
/// lock: a datagram is sent with the lock held, so released ones keep their place.
struct Gate {
    rule: Rule,
    held: Vec<(Vec<u8>, SocketAddr)>,
}

struct Shared {
    rules: [Mutex<Gate>; 2],
    counts: Mutex<[Counts; 2]>,
    /// Signalled on every count change.
    counted: Condvar,
    stop: AtomicBool,
    /// Where the backward direction delivers: the last source seen on the listen socket.
    client: Mutex<Option<SocketAddr>>,
    /// Where the forward direction delivers ([`Relay::retarget`] moves it).
    target: Mutex<SocketAddr>,
}

impl Shared {
    /// Counts the datagram and sends it on through `socket` to `to`, holds it, or drops it.
    fn admit(&self, dir: Direction, datagram: &[u8], socket: &UdpSocket, to: SocketAddr) {
        let mut gate = self.rules[dir.index()].lock().expect("relay rule lock");
        let fate = match (gate.rule, dir) {
            // Only the client opens a connection; one lock order (forward, then backward).
            (Rule::UntilNewConnection, Direction::Backward) => Fate::Drop,
            (rule, _) => rule.fate(datagram),
        };
        if matches!(gate.rule, Rule::UntilNewConnection) && matches!(fate, Fate::Pass) {
            // The new connection: both ways pass from here on.
            gate.rule = Rule::Pass;
            let other = 1 - dir.index();
            let mut back = self.rules[other].lock().expect("relay rule lock");
            if matches!(back.rule, Rule::UntilNewConnection) {
                back.rule = Rule::Pass;
            }
        }
        // Counted before it goes on: whoever receives it sees the count already.
        {
            let mut counts = self.counts.lock().expect("relay counts lock");
            let c = &mut counts[dir.index()];
            match fate {
                Fate::Pass => c.passed += 1,
                Fate::Drop => c.dropped += 1,
                Fate::Hold => c.held += 1,
            }
            self.counted.notify_all();
        }
        match fate {
            Fate::Hold => gate.held.push((datagram.to_vec(), to)),
            // A target that is down drops it, as the network would.
            Fate::Pass => {
                let _ = socket.send_to(datagram, to);
            }
            Fate::Drop => {}
        }
    }
}

/// A running relay; dropping it stops its threads.
pub struct Relay {
    shared: Arc<Shared>,
    listen: SocketAddr,
    /// What each direction sends through: held datagrams are released by [`Relay::set`].
    senders: [UdpSocket; 2],
    threads: Vec<JoinHandle<()>>,
}

impl Relay {
    /// Binds `listen` (port 0 picks one) and relays to `target`, both directions passing.
    pub fn start(listen: SocketAddr, target: SocketAddr) -> io::Result<Relay> {
        let down = UdpSocket::bind(listen)?;
        let up = UdpSocket::bind(SocketAddr::new(listen.ip(), 0))?;
        down.set_read_timeout(Some(STOP_POLL))?;
        up.set_read_timeout(Some(STOP_POLL))?;
        let listen = down.local_addr()?;
        let shared = Arc::new(Shared {
            rules: [Rule::Pass, Rule::Pass].map(|rule| {
                Mutex::new(Gate {
                    rule,
                    held: Vec::new(),
                })
            }),
            counts: Mutex::new([Counts::default(); 2]),
            counted: Condvar::new(),
            stop: AtomicBool::new(false),
            client: Mutex::new(None),
            target: Mutex::new(target),
        });
        let (down2, up2) = (down.try_clone()?, up.try_clone()?);
        let senders = [up.try_clone()?, down.try_clone()?];
        let s = Arc::clone(&shared);
        let forward = std::thread::Builder::new()
            .name(format!("relay-fwd-{}", listen.port()))
            .spawn(move || {
                pump(&s, &down, |from, datagram| {
                    *s.client.lock().expect("relay client lock") = Some(from);
                    let to = *s.target.lock().expect("relay target lock");
                    s.admit(Direction::Forward, datagram, &up2, to);
                })
            })?;
        let s = Arc::clone(&shared);
        let backward = std::thread::Builder::new()
            .name(format!("relay-back-{}", listen.port()))
            .spawn(move || {
                pump(&s, &up, |from, datagram| {
                    if from != *s.target.lock().expect("relay target lock") {
                        return;
                    }
                    let client = *s.client.lock().expect("relay client lock");
                    if let Some(client) = client {
                        s.admit(Direction::Backward, datagram, &down2, client);
                    }
                })
            })?;
        Ok(Relay {
            shared,
            listen,
            senders,
            threads: vec![forward, backward],
        })
    }

    /// Where to send datagrams meant for the target.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }

    pub fn target(&self) -> SocketAddr {
        *self.shared.target.lock().expect("relay target lock")
    }

    /// Relays to `target` from the next datagram on (what the old one answers is dropped).
    pub fn retarget(&self, target: SocketAddr) {
        *self.shared.target.lock().expect("relay target lock") = target;
    }

    /// Sets one direction's rule; it holds from the next datagram on. Datagrams a
    /// [`Rule::Hold`] kept go on first, in the order they came.
    pub fn set(&self, dir: Direction, rule: Rule) {
        let mut gate = self.shared.rules[dir.index()]
            .lock()
            .expect("relay rule lock");
        gate.rule = rule;
        if rule != Rule::Hold && !gate.held.is_empty() {
            let released = std::mem::take(&mut gate.held);
            {
                let mut counts = self.shared.counts.lock().expect("relay counts lock");
                counts[dir.index()].passed += released.len() as u64;
                self.shared.counted.notify_all();
            }
            for (datagram, to) in &released {
                let _ = self.senders[dir.index()].send_to(datagram, *to);
            }
        }
    }

    pub fn rule(&self, dir: Direction) -> Rule {
        self.shared.rules[dir.index()]
            .lock()
            .expect("relay rule lock")
            .rule
    }

    /// Datagrams a direction holds now.
    pub fn held(&self, dir: Direction) -> usize {
        self.shared.rules[dir.index()]
            .lock()
            .expect("relay rule lock")
            .held
            .len()
    }

    /// Both directions pass again.
    pub fn heal(&self) {
        self.set(Direction::Forward, Rule::Pass);
        self.set(Direction::Backward, Rule::Pass);
    }

    pub fn counts(&self, dir: Direction) -> Counts {
        self.shared.counts.lock().expect("relay counts lock")[dir.index()]
    }

    /// Waits until `dir`'s counts satisfy `until`, at most `limit`; says whether they did.
    pub fn wait_counts(
        &self,
        dir: Direction,
        limit: Duration,
        until: impl Fn(Counts) -> bool,
    ) -> bool {
        let deadline = Instant::now() + limit;
        let mut counts = self.shared.counts.lock().expect("relay counts lock");
        loop {
            if until(counts[dir.index()]) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            counts = self
                .shared
                .counted
                .wait_timeout(counts, left)
                .expect("relay counts lock")
                .0;
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Receives on `socket` until the stop flag, handing each datagram to `each`.
fn pump(shared: &Shared, socket: &UdpSocket, mut each: impl FnMut(SocketAddr, &[u8])) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    while !shared.stop.load(Ordering::SeqCst) {
        match socket.recv_from(&mut buf) {
            Ok((len, from)) => each(from, &buf[..len]),
            // Timeouts (to look at the flag) and ICMP errors from a target that is down.
            Err(_) => continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(10);

    fn socket() -> UdpSocket {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(LIMIT)).unwrap();
        s
    }

    fn recv(s: &UdpSocket) -> (Vec<u8>, SocketAddr) {
        let mut buf = [0u8; 2048];
        let (n, from) = s.recv_from(&mut buf).expect("a datagram within the limit");
        (buf[..n].to_vec(), from)
    }

    /// Nothing queued right now (what was dropped was handled before a later datagram that
    /// arrived: one thread per direction, in order).
    fn nothing_queued(s: &UdpSocket) -> bool {
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 2048];
        let empty = s.recv_from(&mut buf).is_err();
        s.set_nonblocking(false).unwrap();
        empty
    }

    fn setup() -> (Relay, UdpSocket, UdpSocket) {
        let target = socket();
        let relay =
            Relay::start("127.0.0.1:0".parse().unwrap(), target.local_addr().unwrap()).unwrap();
        let client = socket();
        (relay, client, target)
    }

    #[test]
    fn datagrams_pass_both_ways() {
        let (relay, client, target) = setup();
        client.send_to(b"ping", relay.listen_addr()).unwrap();
        let (got, upstream) = recv(&target);
        assert_eq!(got, b"ping");
        assert_ne!(
            upstream,
            client.local_addr().unwrap(),
            "it comes from the relay"
        );
        target.send_to(b"pong", upstream).unwrap();
        let (got, from) = recv(&client);
        assert_eq!(got, b"pong");
        assert_eq!(from, relay.listen_addr());
        assert_eq!(relay.counts(Direction::Forward).passed, 1);
        assert_eq!(relay.counts(Direction::Backward).passed, 1);
    }

    #[test]
    fn a_cut_direction_drops_only_that_direction() {
        let (relay, client, target) = setup();
        client.send_to(b"hello", relay.listen_addr()).unwrap();
        let (_, upstream) = recv(&target);

        relay.set(Direction::Forward, Rule::DropAll);
        client.send_to(b"lost", relay.listen_addr()).unwrap();
        assert!(relay.wait_counts(Direction::Forward, LIMIT, |c| c.dropped == 1));
        // The other way still passes.
        target.send_to(b"back", upstream).unwrap();
        assert_eq!(recv(&client).0, b"back");
        relay.heal();
        client.send_to(b"after", relay.listen_addr()).unwrap();
        assert_eq!(recv(&target).0, b"after", "the cut one never arrived");
        assert!(nothing_queued(&target));
        assert_eq!(
            relay.counts(Direction::Forward),
            Counts {
                passed: 2,
                dropped: 1,
                held: 0
            }
        );

        relay.set(Direction::Backward, Rule::DropAll);
        target.send_to(b"lost", upstream).unwrap();
        assert!(relay.wait_counts(Direction::Backward, LIMIT, |c| c.dropped == 1));
        client.send_to(b"fwd", relay.listen_addr()).unwrap();
        assert_eq!(recv(&target).0, b"fwd");
        relay.set(Direction::Backward, Rule::Pass);
        target.send_to(b"healed", upstream).unwrap();
        assert_eq!(recv(&client).0, b"healed");
        assert!(nothing_queued(&client));
        assert_eq!(relay.counts(Direction::Backward).dropped, 1);
    }

    #[test]
    fn a_hold_keeps_datagrams_and_releases_them_in_order() {
        let (relay, client, target) = setup();
        client.send_to(b"first", relay.listen_addr()).unwrap();
        let (_, upstream) = recv(&target);
        relay.set(Direction::Forward, Rule::Hold);
        relay.set(Direction::Backward, Rule::Hold);
        for d in [&b"a"[..], b"b", b"c"] {
            client.send_to(d, relay.listen_addr()).unwrap();
        }
        target.send_to(b"back", upstream).unwrap();
        // Held, not dropped: counted once released.
        let deadline = Instant::now() + LIMIT;
        while relay.held(Direction::Forward) < 3 || relay.held(Direction::Backward) < 1 {
            assert!(Instant::now() < deadline, "the relay never held them");
            std::thread::yield_now();
        }
        assert!(nothing_queued(&target) && nothing_queued(&client));
        relay.heal();
        assert_eq!(recv(&target).0, b"a");
        assert_eq!(recv(&target).0, b"b");
        assert_eq!(recv(&target).0, b"c");
        assert_eq!(recv(&client).0, b"back");
        assert_eq!(relay.counts(Direction::Forward).passed, 4);
        assert_eq!(relay.counts(Direction::Forward).dropped, 0);
        assert_eq!(relay.counts(Direction::Forward).held, 3);
        assert_eq!(relay.held(Direction::Forward), 0);
    }

    #[test]
    fn until_a_new_connection_drops_the_old_one_and_passes_an_initial() {
        let (relay, client, target) = setup();
        client.send_to(b"hello", relay.listen_addr()).unwrap();
        let (_, upstream) = recv(&target);
        relay.set(Direction::Forward, Rule::UntilNewConnection);
        relay.set(Direction::Backward, Rule::UntilNewConnection);
        // A short-header packet of the old connection, and an answer to it: both dropped.
        client
            .send_to(&[0x41, 1, 2, 3, 4, 5, 6], relay.listen_addr())
            .unwrap();
        target.send_to(&[0x41, 9, 9, 9, 9, 9, 9], upstream).unwrap();
        assert!(relay.wait_counts(Direction::Forward, LIMIT, |c| c.dropped == 1));
        assert!(relay.wait_counts(Direction::Backward, LIMIT, |c| c.dropped == 1));
        // A v1 Initial (long header, type 0): it opens the way both ways.
        let initial = [0xC3, 0, 0, 0, 1, 8, 1, 2, 3, 4, 5, 6, 7, 8];
        client.send_to(&initial, relay.listen_addr()).unwrap();
        assert_eq!(recv(&target).0, initial);
        assert_eq!(relay.rule(Direction::Forward), Rule::Pass);
        assert_eq!(relay.rule(Direction::Backward), Rule::Pass);
        target.send_to(b"welcome", upstream).unwrap();
        assert_eq!(recv(&client).0, b"welcome");
        // A Handshake packet (type 2) or a version negotiation (version 0) is no Initial.
        assert!(!is_quic_initial(&[0xE3, 0, 0, 0, 1, 8, 1]));
        assert!(!is_quic_initial(&[0xC3, 0, 0, 0, 0, 8, 1]));
    }

    #[test]
    fn a_retargeted_relay_delivers_to_the_new_target_and_hears_only_it() {
        let (relay, client, old) = setup();
        client.send_to(b"one", relay.listen_addr()).unwrap();
        let (_, upstream) = recv(&old);
        let new = socket();
        relay.retarget(new.local_addr().unwrap());
        assert_eq!(relay.target(), new.local_addr().unwrap());
        client.send_to(b"two", relay.listen_addr()).unwrap();
        assert_eq!(recv(&new).0, b"two");
        old.send_to(b"stale", upstream).unwrap();
        new.send_to(b"fresh", upstream).unwrap();
        assert_eq!(recv(&client).0, b"fresh", "the old target is not heard");
        assert!(nothing_queued(&old) && nothing_queued(&client));
    }

    #[test]
    fn drop_above_passes_up_to_the_size_and_drops_longer() {
        let (relay, client, target) = setup();
        relay.set(Direction::Forward, Rule::DropAbove(4));
        assert_eq!(relay.rule(Direction::Forward), Rule::DropAbove(4));
        client.send_to(b"12345", relay.listen_addr()).unwrap();
        client.send_to(b"1234", relay.listen_addr()).unwrap();
        assert_eq!(recv(&target).0, b"1234", "at the size: passes");
        assert!(nothing_queued(&target), "one byte over: dropped");
        assert_eq!(
            relay.counts(Direction::Forward),
            Counts {
                passed: 1,
                dropped: 1,
                held: 0
            }
        );
    }
}
