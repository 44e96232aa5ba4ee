//! An in-process network for engine tests: the [`Engine`] on one side, real quinn-proto
//! *client* connections on the other, datagrams shuttled between the two state machines by
//! hand and time moved by a fake clock. No sockets, no threads, no sleeping.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use felix_engine::{AuthConfig, DurableConfig, Engine, EngineConfig, FileOp, FileOpKind, Output};
use felix_proto::{Frame, FrameDecoder};
use felix_storage::memfs::MemFs;
use quinn_proto::{
    Connection, ConnectionError, ConnectionHandle, Dir, Endpoint, Event, StreamEvent, StreamId,
    VarInt,
};
use rustls_pki_types::CertificateDer;

use crate::frames::real_client_auth;
use crate::quic::{
    client_config, client_endpoint, client_tls, poll_connection, quic_crypto, read_stream,
    to_client, to_engine, ClientTransport, Trust,
};
use crate::tls::tls;

/// Steps of datagram shuttling before a test is declared stuck.
const MAX_STEPS: usize = 100_000;

/// One client connection and what it has seen.
pub struct Peer {
    pub ch: ConnectionHandle,
    pub conn: Connection,
    pub connected: bool,
    pub lost: Option<ConnectionError>,
    /// Uni streams the broker opened, in order, not yet taken by a test.
    pub incoming_uni: Vec<StreamId>,
    decoders: HashMap<StreamId, FrameDecoder>,
    /// Streams whose FIN was read.
    pub finished: Vec<StreamId>,
    /// Streams the broker reset, with the code.
    pub reset: Vec<(StreamId, VarInt)>,
    /// Streams the broker asked us to stop sending on.
    pub stopped: Vec<(StreamId, VarInt)>,
}

/// One engine, the client connections to it ([`Net::connect`]), the disk its file ops run
/// on, and the virtual clock: [`Net::run`] moves datagrams and file ops until nothing moves,
/// [`Net::advance`] lets time pass, firing every timer on both sides at its instant.
pub struct Net {
    pub now: Instant,
    pub engine: Engine,
    pub server_addr: SocketAddr,
    client: Endpoint,
    client_addr: SocketAddr,
    ca: CertificateDer<'static>,
    pub peers: Vec<Peer>,
    /// Receive window the client grants per stream (small ones make slow subscribers).
    pub client_stream_window: u32,
    /// The client's keep-alive (the real one sends one about every 2 s).
    pub client_keep_alive: Option<Duration>,
    buf: Vec<u8>,
    /// Datagrams the engine sent, for tests that look at GSO batches.
    pub engine_transmits: Vec<felix_engine::Transmit>,
    /// The peer (index in `peers`) each of `engine_transmits` reached, if any.
    pub engine_transmit_peers: Vec<Option<usize>>,
    /// Where the engine's file ops run.
    pub disk: MemFs,
    /// File ops handed out and not yet performed (held ones wait here).
    pub pending_ops: Vec<FileOp>,
    /// Ops of these kinds wait until [`Net::release_held_ops`].
    pub hold: fn(&FileOpKind) -> bool,
    /// Datagrams the engine sent from its internal (peer) socket, for [`crate::ClusterNet`]
    /// to carry; a lone engine never sends any.
    pub(crate) peer_out: Vec<(felix_engine::Transmit, Vec<u8>)>,
}

impl Net {
    /// An engine with every default but `tweak`, in dev mode with a fixed seed.
    pub fn new(tweak: impl FnOnce(&mut EngineConfig)) -> Net {
        // 2026-01-01T00:00:00Z, far from any token's edges.
        Net::new_at(1_767_225_600_000_000, tweak)
    }

    /// Like [`Net::new`], with the engine started at this Unix time (µs).
    pub fn new_at(unix_micros: u64, tweak: impl FnOnce(&mut EngineConfig)) -> Net {
        Net::on_clock(
            Instant::now(),
            unix_micros,
            "127.0.0.1:5000".parse().unwrap(),
            tweak,
        )
    }

    /// An engine started at `now` (so several can share one clock), reached by its clients
    /// at `server_addr`.
    pub(crate) fn on_clock(
        now: Instant,
        unix_micros: u64,
        server_addr: SocketAddr,
        tweak: impl FnOnce(&mut EngineConfig),
    ) -> Net {
        let tls = tls();
        let mut config =
            EngineConfig::new(tls.identity, AuthConfig::Dev { seed: [7; 32] }, [9; 32]);
        tweak(&mut config);
        let engine = Engine::new(config, now, unix_micros).expect("engine");
        Net {
            now,
            engine,
            server_addr,
            client: client_endpoint(None),
            client_addr: "127.0.0.1:40000".parse().unwrap(),
            ca: tls.ca,
            peers: Vec::new(),
            client_stream_window: 1024 * 1024,
            client_keep_alive: None,
            buf: Vec::new(),
            engine_transmits: Vec::new(),
            engine_transmit_peers: Vec::new(),
            disk: MemFs::new(),
            pending_ops: Vec::new(),
            hold: |_| false,
            peer_out: Vec::new(),
        }
    }

    /// An engine with durable storage on an in-memory disk, recovered and ready.
    pub fn durable(durable: DurableConfig, tweak: impl FnOnce(&mut EngineConfig)) -> Net {
        Net::durable_on(MemFs::new(), durable, tweak)
    }

    /// Like [`Net::durable`], over a disk with files already on it (a restart).
    pub fn durable_on(
        disk: MemFs,
        durable: DurableConfig,
        tweak: impl FnOnce(&mut EngineConfig),
    ) -> Net {
        Net::durable_on_at(1_767_225_600_000_000, disk, durable, tweak)
    }

    /// Like [`Net::durable_on`], started at this Unix time (µs).
    pub fn durable_on_at(
        unix_micros: u64,
        disk: MemFs,
        durable: DurableConfig,
        tweak: impl FnOnce(&mut EngineConfig),
    ) -> Net {
        let mut net = Net::new_at(unix_micros, |c| {
            c.durable = Some(durable);
            tweak(c);
        });
        net.disk = disk;
        net.run();
        assert!(
            net.engine.is_ready(),
            "recovery did not finish: {:?}",
            net.engine.storage_error()
        );
        net
    }

    /// Stops holding file ops: performs the held ones and whatever follows, then settles.
    pub fn release_held_ops(&mut self) {
        self.hold = |_| false;
        self.run();
    }

    /// Performs pending file ops that are not held. True if any ran.
    fn perform_file_ops(&mut self) -> bool {
        let mut ran = false;
        let mut i = 0;
        while i < self.pending_ops.len() {
            if (self.hold)(&self.pending_ops[i].kind) {
                i += 1;
                continue;
            }
            let op = self.pending_ops.remove(i);
            let c = self.disk.execute(op).expect("the disk never crashes here");
            self.engine.handle_file_completion(self.now, c);
            ran = true;
        }
        ran
    }

    pub fn token(&self) -> String {
        self.engine.dev_token().expect("dev mode").to_owned()
    }

    /// Starts a connection; `alpn` lists the protocols the client offers.
    pub fn start_connect(&mut self, alpn: &[&[u8]]) -> usize {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = client_tls(provider, Trust::Ca(self.ca.clone()), alpn);
        let transport = ClientTransport {
            stream_window: self.client_stream_window,
            max_uni_streams: 1024,
            keep_alive: self.client_keep_alive,
            idle_timeout: None,
        };
        let config = client_config(quic_crypto(tls), &transport);
        let (ch, conn) = self
            .client
            .connect(self.now, config, self.server_addr, "localhost")
            .expect("connect");
        self.peers.push(Peer {
            ch,
            conn,
            connected: false,
            lost: None,
            incoming_uni: Vec::new(),
            decoders: HashMap::new(),
            finished: Vec::new(),
            reset: Vec::new(),
            stopped: Vec::new(),
        });
        self.peers.len() - 1
    }

    /// Connects and runs the handshake to completion.
    pub fn connect(&mut self, alpn: &[&[u8]]) -> usize {
        let p = self.start_connect(alpn);
        self.run();
        assert!(
            self.peers[p].connected,
            "handshake did not complete: {:?}",
            self.peers[p].lost
        );
        p
    }

    /// Moves every pending datagram once in each direction. True if anything moved.
    pub fn step(&mut self) -> bool {
        let mut moved = false;
        // Client → engine.
        for peer in &mut self.peers {
            let (engine, buf) = (&mut self.engine, &mut self.buf);
            moved |= to_engine(&mut peer.conn, engine, self.now, self.client_addr, buf);
        }
        // Engine → client (and → disk).
        let mut out = Vec::new();
        while let Some(output) = self.engine.poll_output(self.now, &mut out) {
            moved = true;
            let t = match output {
                Output::Transmit(t) => t,
                Output::FileOp(op) => {
                    self.pending_ops.push(op);
                    continue;
                }
                Output::PeerTransmit(t) => {
                    self.peer_out.push((t, out[..t.size].to_vec()));
                    continue;
                }
                other => panic!("an engine output this harness does not handle: {other:?}"),
            };
            self.engine_transmits.push(t);
            assert_eq!(t.destination, self.client_addr);
            let mut reached = None;
            for (ch, ev) in to_client(&mut self.client, self.now, self.server_addr, &t, &out) {
                let i = self.peers.iter().position(|p| p.ch == ch).expect("peer");
                reached.get_or_insert(i);
                self.peers[i].conn.handle_event(ev);
            }
            self.engine_transmit_peers.push(reached);
        }
        self.process_client_events();
        if self.perform_file_ops() {
            moved = true;
        }
        moved
    }

    fn process_client_events(&mut self) {
        for peer in &mut self.peers {
            let Peer {
                ch,
                conn,
                connected,
                lost,
                incoming_uni,
                stopped,
                ..
            } = peer;
            let mut on_event = |conn: &mut Connection, ev| match ev {
                Event::Connected => *connected = true,
                Event::ConnectionLost { reason } => *lost = Some(reason),
                Event::Stream(StreamEvent::Opened { dir: Dir::Uni }) => {
                    while let Some(id) = conn.streams().accept(Dir::Uni) {
                        incoming_uni.push(id);
                    }
                }
                Event::Stream(StreamEvent::Stopped { id, error_code }) => {
                    stopped.push((id, error_code))
                }
                _ => {}
            };
            while poll_connection(&mut self.client, *ch, conn, &mut on_event) {}
        }
    }

    /// Shuttles datagrams until nothing moves (no time passes).
    pub fn run(&mut self) {
        for _ in 0..MAX_STEPS {
            if !self.step() {
                return;
            }
        }
        panic!("network did not settle in {MAX_STEPS} steps");
    }

    pub(crate) fn next_timer(&mut self) -> Option<Instant> {
        let mut next = self.engine.poll_timeout();
        for p in &mut self.peers {
            if let Some(t) = p.conn.poll_timeout() {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        next
    }

    /// Lets `d` pass, firing every timer on both sides at its time and settling in between.
    pub fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        self.run();
        for _ in 0..MAX_STEPS {
            let next = self.next_timer().filter(|t| *t <= end);
            let Some(at) = next else { break };
            self.now = self.now.max(at);
            self.fire_timers();
            self.run();
        }
        self.now = end;
        self.fire_timers();
        self.run();
    }

    pub(crate) fn fire_timers(&mut self) {
        if self.engine.poll_timeout().is_some_and(|t| t <= self.now) {
            self.engine.handle_timeout(self.now);
        }
        for p in &mut self.peers {
            if p.conn.poll_timeout().is_some_and(|t| t <= self.now) {
                p.conn.handle_timeout(self.now);
            }
        }
        self.process_client_events();
    }

    pub fn open_bi(&mut self, p: usize) -> StreamId {
        self.peers[p]
            .conn
            .streams()
            .open(Dir::Bi)
            .expect("stream credit")
    }

    pub fn send(&mut self, p: usize, id: StreamId, bytes: &[u8]) {
        let mut s = self.peers[p].conn.send_stream(id);
        let n = s.write(bytes).expect("write");
        assert_eq!(n, bytes.len(), "test writes must fit the stream window");
    }

    /// Writes as much of `bytes` as the stream's flow control allows; returns how much.
    pub fn send_some(&mut self, p: usize, id: StreamId, bytes: &[u8]) -> usize {
        match self.peers[p].conn.send_stream(id).write(bytes) {
            Ok(n) => n,
            Err(quinn_proto::WriteError::Blocked) => 0,
            Err(e) => panic!("write failed: {e}"),
        }
    }

    pub fn finish(&mut self, p: usize, id: StreamId) {
        self.peers[p].conn.send_stream(id).finish().unwrap();
    }

    /// STOP_SENDING on the stream (nothing happens if its receive side is already done).
    pub fn stop(&mut self, p: usize, id: StreamId) {
        let _ = self.peers[p].conn.recv_stream(id).stop(VarInt::from_u32(0));
    }

    /// Every whole frame readable on the stream now.
    pub fn read_frames(&mut self, p: usize, id: StreamId) -> Vec<Frame> {
        let peer = &mut self.peers[p];
        let decoder = peer
            .decoders
            .entry(id)
            .or_insert_with(|| FrameDecoder::new(64 << 20));
        let r = read_stream(&mut peer.conn, id, decoder);
        if r.finished {
            peer.finished.push(id);
        }
        if let Some(code) = r.reset {
            peer.reset.push((id, code));
        }
        let mut frames = Vec::new();
        while let Some(f) = decoder.next_frame().expect("broker frames decode") {
            frames.push(f);
        }
        frames
    }

    /// Sends `bytes` on the stream, settles, and returns what came back.
    pub fn exchange(&mut self, p: usize, id: StreamId, bytes: &[u8]) -> Vec<Frame> {
        self.send(p, id, bytes);
        self.run();
        self.read_frames(p, id)
    }

    /// Opens a stream and authenticates it with the real client's offer; returns the stream
    /// and the answer.
    pub fn auth_stream(&mut self, p: usize) -> (StreamId, Frame) {
        let token = self.token();
        let id = self.open_bi(p);
        let frames = self.exchange(p, id, &real_client_auth("t1", &token));
        assert_eq!(frames.len(), 1, "one answer to auth");
        (id, frames.into_iter().next().unwrap())
    }

    /// Lets clients connected from now on accept datagrams up to `bytes` (quinn's default is
    /// 1472), so the engine's path-MTU discovery can go past it. Before the first connect.
    pub fn set_client_max_udp_payload(&mut self, bytes: u16) {
        assert!(self.peers.is_empty(), "set before connecting");
        let mut config = quinn_proto::EndpointConfig::default();
        config
            .max_udp_payload_size(bytes)
            .expect("1200 to 65527 bytes");
        self.client = Endpoint::new(Arc::new(config), None, true, None);
    }

    pub fn take_uni(&mut self, p: usize) -> StreamId {
        assert!(
            !self.peers[p].incoming_uni.is_empty(),
            "the broker opened no event stream"
        );
        self.peers[p].incoming_uni.remove(0)
    }
}
