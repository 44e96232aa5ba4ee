//! An in-process network for engine tests: the [`Engine`] on one side, a real quinn-proto
//! *client* endpoint on the other, datagrams shuttled between the two state machines by hand
//! and time moved by a fake clock. No sockets, no threads, no sleeping.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use felix_engine::{
    AuthConfig, Datagram, DurableConfig, Engine, EngineConfig, FileOp, FileOpKind, Output,
    TlsIdentity,
};
use felix_proto::{Frame, FrameDecoder};
pub use felix_storage::memfs::MemFs;
use quinn_proto::crypto::rustls::QuicClientConfig;
use quinn_proto::{
    ClientConfig, Connection, ConnectionError, ConnectionHandle, DatagramEvent, Dir, Endpoint,
    EndpointConfig, Event, StreamEvent, StreamId, TransportConfig, VarInt,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The offer felix-client 0.6.2 sends on every stream (peer-client-wire.md §3), minus the token.
pub const REAL_CLIENT_FLAGS: u64 = 8191;
pub const REAL_CLIENT_FEATURES: u64 = 4_218_945_535;
pub const REAL_CLIENT_FEATURES_HI: u64 = 15;

/// Steps of datagram shuttling before a test is declared stuck.
const MAX_STEPS: usize = 100_000;

pub struct Tls {
    pub identity: TlsIdentity,
    pub ca: CertificateDer<'static>,
}

/// A CA and a leaf for `localhost` signed by it.
pub fn tls() -> Tls {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();
    Tls {
        identity: TlsIdentity {
            cert_chain: vec![leaf_cert.der().clone()],
            key: PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap(),
        },
        ca: ca_cert.der().clone(),
    }
}

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
    /// Where the engine's file ops run.
    pub disk: MemFs,
    /// File ops handed out and not yet performed (held ones wait here).
    pub pending_ops: Vec<FileOp>,
    /// Ops of these kinds wait until [`Net::release_held_ops`].
    pub hold: fn(&FileOpKind) -> bool,
}

impl Net {
    /// An engine with every default but `tweak`, in dev mode with a fixed seed.
    pub fn new(tweak: impl FnOnce(&mut EngineConfig)) -> Net {
        // 2026-01-01T00:00:00Z, far from any token's edges.
        Net::new_at(1_767_225_600_000_000, tweak)
    }

    /// Like [`Net::new`], with the engine started at this Unix time (µs).
    pub fn new_at(unix_micros: u64, tweak: impl FnOnce(&mut EngineConfig)) -> Net {
        let tls = tls();
        let mut config =
            EngineConfig::new(tls.identity, AuthConfig::Dev { seed: [7; 32] }, [9; 32]);
        tweak(&mut config);
        let now = Instant::now();
        let engine = Engine::new(config, now, unix_micros).expect("engine");
        Net {
            now,
            engine,
            server_addr: "127.0.0.1:5000".parse().unwrap(),
            client: Endpoint::new(Arc::new(EndpointConfig::default()), None, true, None),
            client_addr: "127.0.0.1:40000".parse().unwrap(),
            ca: tls.ca,
            peers: Vec::new(),
            client_stream_window: 1024 * 1024,
            client_keep_alive: None,
            buf: Vec::new(),
            engine_transmits: Vec::new(),
            disk: MemFs::new(),
            pending_ops: Vec::new(),
            hold: |_| false,
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
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.clone()).unwrap();
        let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let mut config = ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).unwrap()));
        let mut transport = TransportConfig::default();
        transport
            .stream_receive_window(VarInt::from_u32(self.client_stream_window))
            .max_concurrent_uni_streams(VarInt::from_u32(1024))
            .max_concurrent_bidi_streams(VarInt::from_u32(0))
            .keep_alive_interval(self.client_keep_alive);
        config.transport_config(Arc::new(transport));
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
        for i in 0..self.peers.len() {
            loop {
                self.buf.clear();
                let Some(t) = self.peers[i]
                    .conn
                    .poll_transmit(self.now, 10, &mut self.buf)
                else {
                    break;
                };
                moved = true;
                let data = BytesMut::from(&self.buf[..t.size]);
                self.engine.handle_datagram(
                    self.now,
                    Datagram {
                        remote: self.client_addr,
                        local_ip: None,
                        ecn: None,
                        data,
                        segment_size: t.segment_size,
                    },
                );
            }
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
            };
            self.engine_transmits.push(t);
            assert_eq!(t.destination, self.client_addr);
            let segment = t.segment_size.unwrap_or(t.size);
            for datagram in out[..t.size].chunks(segment) {
                let mut resp = Vec::new();
                match self.client.handle(
                    self.now,
                    self.server_addr,
                    None,
                    None,
                    BytesMut::from(datagram),
                    &mut resp,
                ) {
                    Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                        let peer = self.peers.iter_mut().find(|p| p.ch == ch).expect("peer");
                        peer.conn.handle_event(ev);
                    }
                    Some(DatagramEvent::Response(_))
                    | Some(DatagramEvent::NewConnection(_))
                    | None => {}
                }
            }
        }
        self.process_client_events();
        if self.perform_file_ops() {
            moved = true;
        }
        moved
    }

    fn process_client_events(&mut self) {
        for peer in &mut self.peers {
            loop {
                let mut any = false;
                while let Some(ev) = peer.conn.poll_endpoint_events() {
                    any = true;
                    if let Some(reply) = self.client.handle_event(peer.ch, ev) {
                        peer.conn.handle_event(reply);
                    }
                }
                while let Some(ev) = peer.conn.poll() {
                    any = true;
                    match ev {
                        Event::Connected => peer.connected = true,
                        Event::ConnectionLost { reason } => peer.lost = Some(reason),
                        Event::Stream(StreamEvent::Opened { dir: Dir::Uni }) => {
                            while let Some(id) = peer.conn.streams().accept(Dir::Uni) {
                                peer.incoming_uni.push(id);
                            }
                        }
                        Event::Stream(StreamEvent::Stopped { id, error_code }) => {
                            peer.stopped.push((id, error_code))
                        }
                        _ => {}
                    }
                }
                if !any {
                    break;
                }
            }
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

    fn next_timer(&mut self) -> Option<Instant> {
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

    fn fire_timers(&mut self) {
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
        if let Ok(mut chunks) = peer.conn.recv_stream(id).read(true) {
            loop {
                match chunks.next(usize::MAX) {
                    Ok(Some(chunk)) => decoder.feed_bytes(chunk.bytes),
                    Ok(None) => {
                        peer.finished.push(id);
                        break;
                    }
                    Err(quinn_proto::ReadError::Blocked) => break,
                    Err(quinn_proto::ReadError::Reset(code)) => {
                        peer.reset.push((id, code));
                        break;
                    }
                }
            }
            let _ = chunks.finalize();
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

    pub fn take_uni(&mut self, p: usize) -> StreamId {
        assert!(
            !self.peers[p].incoming_uni.is_empty(),
            "the broker opened no event stream"
        );
        self.peers[p].incoming_uni.remove(0)
    }
}

/// A JSON frame.
pub fn json_frame(json: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(12 + json.len());
    v.extend_from_slice(b"FLX1");
    v.extend_from_slice(&1u16.to_be_bytes());
    v.extend_from_slice(&0u16.to_be_bytes());
    v.extend_from_slice(&(json.len() as u32).to_be_bytes());
    v.extend_from_slice(json.as_bytes());
    v
}

/// A binary frame with the given flags.
pub fn binary_frame(flags: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(12 + payload.len());
    v.extend_from_slice(b"FLX1");
    v.extend_from_slice(&1u16.to_be_bytes());
    v.extend_from_slice(&flags.to_be_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// The `auth` felix-client 0.6.2 sends, byte for byte.
pub fn real_client_auth(tenant: &str, token: &str) -> Vec<u8> {
    json_frame(&format!(
        r#"{{"type":"auth","tenant_id":"{tenant}","token":"{token}","client_flags":{REAL_CLIENT_FLAGS},"client_features":{REAL_CLIENT_FEATURES},"client_features_hi":{REAL_CLIENT_FEATURES_HI}}}"#
    ))
}

/// A binary publish as the real client encodes it: acked (0x0009) when `request_id` is set,
/// keyed (0x0040) when `key` is.
pub fn binary_publish(
    request_id: Option<u64>,
    key: Option<&[u8]>,
    stream: &str,
    payloads: &[&[u8]],
) -> Vec<u8> {
    let mut flags = 0x0001u16;
    let mut p = Vec::new();
    if let Some(id) = request_id {
        flags |= 0x0008;
        p.extend_from_slice(&id.to_be_bytes());
        p.push(1);
    }
    if let Some(k) = key {
        flags |= 0x0040;
        p.extend_from_slice(&(k.len() as u16).to_be_bytes());
        p.extend_from_slice(k);
    }
    for s in ["t1", "default", stream] {
        p.extend_from_slice(&(s.len() as u16).to_be_bytes());
        p.extend_from_slice(s.as_bytes());
    }
    p.extend_from_slice(&(payloads.len() as u32).to_be_bytes());
    for payload in payloads {
        p.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        p.extend_from_slice(payload);
    }
    binary_frame(flags, &p)
}

/// The frame's payload as text (for JSON frames).
pub fn text(frame: &Frame) -> &str {
    assert_eq!(
        frame.flags.bits(),
        0,
        "expected a JSON frame, got flags {:#06x}",
        frame.flags.bits()
    );
    std::str::from_utf8(&frame.payload).unwrap()
}

/// A whole frame as bytes.
pub fn bytes_of(frame: &Frame) -> Bytes {
    frame.to_bytes()
}
