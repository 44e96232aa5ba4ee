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
}

impl Rule {
    fn passes(self, len: usize) -> bool {
        match self {
            Rule::Pass => true,
            Rule::DropAll => false,
            Rule::DropAbove(n) => len <= n,
        }
    }
}

/// Datagrams a direction has passed and dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub dropped: u64,
}

struct Shared {
    rules: [Mutex<Rule>; 2],
    counts: Mutex<[Counts; 2]>,
    /// Signalled on every count change.
    counted: Condvar,
    stop: AtomicBool,
    /// Where the backward direction delivers: the last source seen on the listen socket.
    client: Mutex<Option<SocketAddr>>,
}

impl Shared {
    /// Counts the datagram and says whether it goes on.
    fn admit(&self, dir: Direction, len: usize) -> bool {
        let rule = *self.rules[dir.index()].lock().expect("relay rule lock");
        let pass = rule.passes(len);
        let mut counts = self.counts.lock().expect("relay counts lock");
        let c = &mut counts[dir.index()];
        if pass {
            c.passed += 1;
        } else {
            c.dropped += 1;
        }
        self.counted.notify_all();
        pass
    }
}

/// A running relay; dropping it stops its threads.
pub struct Relay {
    shared: Arc<Shared>,
    listen: SocketAddr,
    target: SocketAddr,
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
            rules: [Mutex::new(Rule::Pass), Mutex::new(Rule::Pass)],
            counts: Mutex::new([Counts::default(); 2]),
            counted: Condvar::new(),
            stop: AtomicBool::new(false),
            client: Mutex::new(None),
        });
        let (down2, up2) = (down.try_clone()?, up.try_clone()?);
        let s = Arc::clone(&shared);
        let forward = std::thread::Builder::new()
            .name(format!("relay-fwd-{}", listen.port()))
            .spawn(move || {
                pump(&s, &down, |from, datagram| {
                    *s.client.lock().expect("relay client lock") = Some(from);
                    if s.admit(Direction::Forward, datagram.len()) {
                        // A target that is down drops it, as the network would.
                        let _ = up2.send_to(datagram, target);
                    }
                })
            })?;
        let s = Arc::clone(&shared);
        let backward = std::thread::Builder::new()
            .name(format!("relay-back-{}", listen.port()))
            .spawn(move || {
                pump(&s, &up, |from, datagram| {
                    if from != target {
                        return;
                    }
                    let client = *s.client.lock().expect("relay client lock");
                    if let Some(client) = client {
                        if s.admit(Direction::Backward, datagram.len()) {
                            let _ = down2.send_to(datagram, client);
                        }
                    }
                })
            })?;
        Ok(Relay {
            shared,
            listen,
            target,
            threads: vec![forward, backward],
        })
    }

    /// Where to send datagrams meant for the target.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }

    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Sets one direction's rule; it holds from the next datagram on.
    pub fn set(&self, dir: Direction, rule: Rule) {
        *self.shared.rules[dir.index()]
            .lock()
            .expect("relay rule lock") = rule;
    }

    pub fn rule(&self, dir: Direction) -> Rule {
        *self.shared.rules[dir.index()]
            .lock()
            .expect("relay rule lock")
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
                dropped: 1
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
                dropped: 1
            }
        );
    }
}
