//! Links to the other nodes: a QUIC endpoint of its own on the internal listener, ALPN
//! `felix-peer/1`, one link dialed to each peer.
//!
//! A link carries one bidirectional stream, opened by the dialer, which starts with `hello`
//! and its answer. A peer is known by that handshake (its node id, and under mTLS the
//! certificate that must name it), never by a datagram's source address: a relay between two
//! nodes rewrites it. Each node sends on the link it dialed and answers on the link it
//! accepted, so every message has one path and a lost link is redialed by the side that owns it.

use core::net::SocketAddr;
use std::any::Any;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use felix_peer_proto::{
    encode_frame, Hello, HelloRefusal, HelloRefused, PeerFrameDecoder, PeerMessage, ALPN,
    PEER_PROTOCOL_VERSION,
};
use quinn_proto::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn_proto::{
    ClientConfig, ConnectionHandle, DatagramEvent, Dir, Endpoint, EndpointConfig, Event,
    IdleTimeout, MtuDiscoveryConfig, ServerConfig, StreamEvent, StreamId, TransportConfig, VarInt,
};
use rustls_pki_types::{CertificateDer, ServerName};
use tracing::{debug, warn};

use crate::net::{Datagram, Transmit};
use crate::tls::TlsIdentity;

/// A lost link is dialed again after this, doubling up to [`MAX_REDIAL`].
const FIRST_REDIAL: Duration = Duration::from_millis(100);
const MAX_REDIAL: Duration = Duration::from_secs(2);

/// The links' limits (`ClusterConfig`'s `max_peer_backlog_bytes`, `peer_idle_timeout`,
/// `peer_max_streams`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerLimits {
    /// The most bytes queued for a peer that is not reachable; beyond it messages are
    /// dropped (raft resends what matters).
    pub(crate) backlog_bytes: usize,
    /// Peers detect a dead link from its idle timeout; keep-alives at a third of it keep a
    /// live one busy.
    pub(crate) idle_timeout: Duration,
    /// Bidirectional streams the other side may open.
    pub(crate) max_streams: u32,
    /// `limits.mtu_upper_bound`, `initial_mtu`, `max_udp_payload_size` and
    /// `max_gso_segments`, as for client links.
    pub(crate) mtu_upper_bound: u16,
    pub(crate) initial_mtu: u16,
    pub(crate) max_udp_payload_size: u16,
    pub(crate) max_gso_segments: usize,
}

/// What the links report.
#[derive(Debug)]
pub(crate) enum PeerEvent {
    Message {
        from: String,
        message: Box<PeerMessage>,
    },
    /// A peer dialed in and named itself (after a restart, or a lost link).
    Connected { from: String },
}

/// Links decode forwards with every generation current: whether this node still leads the
/// shard is the engine's question, answered with a `forward_refused` that names the forward
/// (a refusal at decode could not say which request it refused).
struct AnyGeneration;

impl felix_peer_proto::GenerationView for AnyGeneration {
    fn current(&self, _: &felix_peer_proto::ShardId) -> Option<u64> {
        Some(0)
    }
}

/// Who this node is on the wire.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) cluster_id: String,
    pub(crate) node_id: String,
    pub(crate) storage_id: [u8; 16],
    pub(crate) incarnation: u64,
}

/// The TLS a link runs.
pub(crate) struct PeerCrypto {
    pub(crate) identity: TlsIdentity,
    /// `Some`: mutual TLS with certificates from this CA naming their node. `None`: peers do
    /// not authenticate each other (an explicit operator choice).
    pub(crate) ca: Option<Vec<CertificateDer<'static>>>,
    pub(crate) provider: Arc<rustls::crypto::CryptoProvider>,
}

struct Link {
    quic: quinn_proto::Connection,
    /// The peer we dialed, or `None` on an accepted link until its hello names it.
    dialed: Option<String>,
    peer: Option<String>,
    stream: Option<StreamId>,
    decoder: PeerFrameDecoder,
    /// Frames not yet taken by the stream, each handed to quinn as it is (no copy).
    outbox: VecDeque<Bytes>,
    /// The dialer has its hello answered; the acceptor has answered one.
    ready: bool,
    /// Until `ready`: when the link is given up (`PeerLimits::idle_timeout` after it began).
    hello_by: Option<Instant>,
    /// The peer's process as its hello named it: a hello from a newer one means this link
    /// ends at a process that is gone.
    incarnation: Option<u64>,
    /// Datagrams received on the link as last counted, and when that count last moved.
    heard: (u64, Instant),
}

enum Dialing {
    Link(ConnectionHandle),
    After(Instant, Duration),
}

pub(crate) struct PeerNet {
    me: Identity,
    voters: Vec<String>,
    dial: BTreeMap<String, SocketAddr>,
    verify_names: bool,
    endpoint: Endpoint,
    client_config: ClientConfig,
    links: BTreeMap<ConnectionHandle, Link>,
    dialing: BTreeMap<String, Dialing>,
    /// Frames for a peer whose link is not up yet.
    backlog: BTreeMap<String, BytesMut>,
    /// [`PeerLimits::backlog_bytes`].
    backlog_limit: usize,
    /// Datagrams one transmit may carry (a GSO batch).
    max_gso_segments: usize,
    /// Messages dropped because their peer's backlog was full.
    pub(crate) backlog_dropped: u64,
    /// [`PeerLimits::idle_timeout`]: also how long a link may take to exchange its hellos.
    hello_timeout: Duration,
    endpoint_transmits: VecDeque<(Transmit, Vec<u8>)>,
    send_order: VecDeque<ConnectionHandle>,
    events: VecDeque<PeerEvent>,
    scratch: Vec<u8>,
    /// The latest input's time, for closes decided while reading.
    now: Instant,
    /// The earliest link deadline, as of the last pump (quinn's needs `&mut`).
    link_deadline: Option<Instant>,
}

fn hello_of(me: &Identity) -> Hello {
    Hello {
        cluster_id: me.cluster_id.clone(),
        node_id: me.node_id.clone(),
        protocol_version: PEER_PROTOCOL_VERSION,
        storage_id: me.storage_id,
        incarnation: me.incarnation,
    }
}

fn transport(limits: &PeerLimits) -> Result<TransportConfig, String> {
    let idle = IdleTimeout::try_from(limits.idle_timeout)
        .map_err(|_| format!("peer idle timeout {:?} is too long", limits.idle_timeout))?;
    let mut t = TransportConfig::default();
    let mut mtu = MtuDiscoveryConfig::default();
    mtu.upper_bound(limits.mtu_upper_bound);
    t.max_concurrent_bidi_streams(VarInt::from_u32(limits.max_streams))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .max_idle_timeout(Some(idle))
        .keep_alive_interval(Some(limits.idle_timeout / 3))
        .initial_mtu(limits.initial_mtu)
        .mtu_discovery_config(Some(mtu));
    Ok(t)
}

fn server_config(
    c: &PeerCrypto,
    limits: &PeerLimits,
    token_key: Arc<ring::hkdf::Prk>,
) -> Result<ServerConfig, String> {
    let builder = rustls::ServerConfig::builder_with_provider(c.provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?;
    let builder = match &c.ca {
        None => builder.with_no_client_auth(),
        Some(cas) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in cas {
                roots
                    .add(ca.clone())
                    .map_err(|e| format!("internal CA: {e}"))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots.into(),
                c.provider.clone(),
            )
            .build()
            .map_err(|e| format!("internal CA: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut tls = builder
        .with_single_cert(c.identity.cert_chain.clone(), c.identity.key.clone_key())
        .map_err(|e| format!("internal certificate: {e}"))?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    tls.max_early_data_size = 0;
    let quic = QuicServerConfig::try_from(Arc::new(tls)).map_err(|e| e.to_string())?;
    let mut server = ServerConfig::new(Arc::new(quic), token_key);
    server.transport_config(Arc::new(transport(limits)?));
    server.validation_token.sent(0);
    Ok(server)
}

/// Accepts any server certificate: only for `FELIX_INTERNAL_ALLOW_UNAUTHENTICATED`.
#[derive(Debug)]
struct TrustAnyPeer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for TrustAnyPeer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn client_config(c: &PeerCrypto, limits: &PeerLimits) -> Result<ClientConfig, String> {
    let builder = rustls::ClientConfig::builder_with_provider(c.provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?;
    let mut tls = match &c.ca {
        Some(cas) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in cas {
                roots
                    .add(ca.clone())
                    .map_err(|e| format!("internal CA: {e}"))?;
            }
            builder
                .with_root_certificates(roots)
                .with_client_auth_cert(c.identity.cert_chain.clone(), c.identity.key.clone_key())
                .map_err(|e| format!("internal certificate: {e}"))?
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(TrustAnyPeer(c.provider.clone())))
            .with_no_client_auth(),
    };
    tls.alpn_protocols = vec![ALPN.to_vec()];
    // A resumed handshake carries a ticket age read from the wall clock: off, so a redial is
    // a function of the seed like everything else (and links are few and long-lived).
    tls.resumption = rustls::client::Resumption::disabled();
    let quic = QuicClientConfig::try_from(tls).map_err(|e| e.to_string())?;
    let mut config = ClientConfig::new(Arc::new(quic));
    config.transport_config(Arc::new(transport(limits)?));
    Ok(config)
}

/// Whether the peer's leaf certificate names `node_id` (as a DNS name).
fn certificate_names(identity: Option<Box<dyn Any>>, node_id: &str) -> bool {
    let Some(chain) = identity.and_then(|i| i.downcast::<Vec<CertificateDer<'static>>>().ok())
    else {
        return false;
    };
    let Some(leaf) = chain.first() else {
        return false;
    };
    let Ok(name) = ServerName::try_from(node_id) else {
        return false;
    };
    webpki::EndEntityCert::try_from(leaf)
        .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
}

impl PeerNet {
    pub(crate) fn new(
        me: Identity,
        voters: Vec<String>,
        dial: BTreeMap<String, SocketAddr>,
        crypto: &PeerCrypto,
        limits: PeerLimits,
        seed: &[u8; 32],
        now: Instant,
    ) -> Result<PeerNet, String> {
        let peer_seed = crate::seed::derive(seed, b"felix peer endpoint");
        let server = server_config(crypto, &limits, crate::seed::token_key(&peer_seed))?;
        let mut endpoint_config = EndpointConfig::new(crate::seed::reset_key(&peer_seed));
        endpoint_config
            .cid_generator(move || Box::new(crate::seed::SeededCidGenerator::new(&peer_seed)))
            .rng_seed(Some(crate::seed::endpoint_rng_seed(&peer_seed)))
            .max_udp_payload_size(limits.max_udp_payload_size)
            .map_err(|_| "max_udp_payload_size is out of range".to_owned())?;
        let endpoint = Endpoint::new(
            Arc::new(endpoint_config),
            Some(Arc::new(server)),
            true,
            None,
        );
        let mut client_config = client_config(crypto, &limits)?;
        client_config.initial_dst_cid_provider(crate::seed::initial_dst_cids(&peer_seed));
        let mut net = PeerNet {
            link_deadline: None,
            now,
            me,
            voters,
            dial,
            verify_names: crypto.ca.is_some(),
            endpoint,
            client_config,
            backlog_limit: limits.backlog_bytes,
            max_gso_segments: limits.max_gso_segments,
            backlog_dropped: 0,
            hello_timeout: limits.idle_timeout,
            links: BTreeMap::new(),
            dialing: BTreeMap::new(),
            backlog: BTreeMap::new(),
            endpoint_transmits: VecDeque::new(),
            send_order: VecDeque::new(),
            events: VecDeque::new(),
            scratch: Vec::new(),
        };
        net.dial_due(now);
        Ok(net)
    }

    /// Dials every peer not dialed yet, and those whose redial time has come.
    fn dial_due(&mut self, now: Instant) {
        let peers: Vec<(String, SocketAddr)> = self
            .dial
            .iter()
            .filter(|(n, _)| **n != self.me.node_id)
            .map(|(n, a)| (n.clone(), *a))
            .collect();
        for (peer, addr) in peers {
            let backoff = match self.dialing.get(&peer) {
                Some(Dialing::Link(_)) => continue,
                Some(Dialing::After(at, _)) if *at > now => continue,
                Some(Dialing::After(_, backoff)) => *backoff,
                None => FIRST_REDIAL,
            };
            // Under mTLS the server's certificate must name the peer, as its hello will.
            let name = if self.verify_names {
                peer.as_str()
            } else {
                "felix-peer"
            };
            match self
                .endpoint
                .connect(now, self.client_config.clone(), addr, name)
            {
                Ok((ch, quic)) => {
                    self.links.insert(
                        ch,
                        Link {
                            quic,
                            dialed: Some(peer.clone()),
                            peer: Some(peer.clone()),
                            stream: None,
                            decoder: PeerFrameDecoder::new(
                                felix_peer_proto::limits::MAX_FRAME_BODY_BYTES,
                            ),
                            outbox: VecDeque::new(),
                            ready: false,
                            hello_by: Some(now + self.hello_timeout),
                            incarnation: None,
                            heard: (0, now),
                        },
                    );
                    self.dialing.insert(peer, Dialing::Link(ch));
                    self.send_order.push_back(ch);
                }
                Err(e) => {
                    warn!(%peer, %addr, error = %e, "cannot dial peer");
                    let next = (backoff * 2).min(MAX_REDIAL);
                    self.dialing
                        .insert(peer, Dialing::After(now + backoff, next));
                }
            }
        }
    }

    /// Queues `message` for `to`, over its link once that is up.
    pub(crate) fn send(&mut self, to: &str, message: &PeerMessage) {
        let link = match self.dialing.get(to) {
            Some(Dialing::Link(ch)) => self.links.get_mut(ch).filter(|l| l.ready),
            _ => None,
        };
        if link.is_none() && matches!(message, PeerMessage::Replicate(_)) {
            // A shipment is not kept for a link that is down: the leader ships again when
            // the follower reports or asks (`resend_after`), and megabytes of stale copies
            // queued on the link's one stream would hold raft's heartbeats behind them once
            // it is back (sim replicated seed 1304).
            self.backlog_dropped += 1;
            return;
        }
        let mut frame = Vec::new();
        if let Err(e) = encode_frame(message, &mut frame) {
            warn!(%to, error = %e, "peer message not sent");
            return;
        }
        match link {
            Some(link) => link.outbox.push_back(Bytes::from(frame)),
            None => {
                let backlog = self.backlog.entry(to.to_owned()).or_default();
                if backlog.len() + frame.len() > self.backlog_limit {
                    debug!(%to, "peer backlog full; dropping a message");
                    self.backlog_dropped += 1;
                    return;
                }
                backlog.extend_from_slice(&frame);
            }
        }
    }

    /// Answers on the link `to` dialed to us (the one its requests came in on).
    pub(crate) fn reply(&mut self, to: &str, message: &PeerMessage) {
        let mut frame = Vec::new();
        if let Err(e) = encode_frame(message, &mut frame) {
            warn!(%to, error = %e, "peer answer not sent");
            return;
        }
        if let Some(link) = self
            .links
            .values_mut()
            .find(|l| l.dialed.is_none() && l.ready && l.peer.as_deref() == Some(to))
        {
            link.outbox.push_back(Bytes::from(frame));
        }
    }

    /// Links that have exchanged their hellos.
    pub(crate) fn ready_links(&self) -> usize {
        self.links.values().filter(|l| l.ready).count()
    }

    pub(crate) fn poll_event(&mut self) -> Option<PeerEvent> {
        self.events.pop_front()
    }

    pub(crate) fn handle_datagram(&mut self, now: Instant, datagram: Datagram) {
        self.now = now;
        let Datagram {
            remote,
            local_ip,
            ecn,
            mut data,
            segment_size,
        } = datagram;
        let segment = segment_size.unwrap_or(data.len()).max(1);
        while !data.is_empty() {
            let one = data.split_to(segment.min(data.len()));
            self.scratch.clear();
            match self
                .endpoint
                .handle(now, remote, local_ip, ecn, one, &mut self.scratch)
            {
                Some(DatagramEvent::ConnectionEvent(ch, event)) => {
                    if let Some(link) = self.links.get_mut(&ch) {
                        link.quic.handle_event(event);
                    }
                }
                Some(DatagramEvent::NewConnection(incoming)) => {
                    self.scratch.clear();
                    match self.endpoint.accept(incoming, now, &mut self.scratch, None) {
                        Ok((ch, quic)) => {
                            self.links.insert(
                                ch,
                                Link {
                                    quic,
                                    dialed: None,
                                    peer: None,
                                    stream: None,
                                    decoder: PeerFrameDecoder::new(
                                        felix_peer_proto::limits::MAX_FRAME_BODY_BYTES,
                                    ),
                                    outbox: VecDeque::new(),
                                    ready: false,
                                    hello_by: Some(now + self.hello_timeout),
                                    incarnation: None,
                                    heard: (0, now),
                                },
                            );
                            self.send_order.push_back(ch);
                        }
                        Err(e) => {
                            if let Some(t) = e.response {
                                self.queue_endpoint_transmit(t);
                            }
                        }
                    }
                }
                Some(DatagramEvent::Response(t)) => self.queue_endpoint_transmit(t),
                None => {}
            }
        }
        self.pump(now);
    }

    fn queue_endpoint_transmit(&mut self, t: quinn_proto::Transmit) {
        if self.endpoint_transmits.len() >= 256 {
            return;
        }
        let bytes = self.scratch[..t.size].to_vec();
        self.endpoint_transmits.push_back((Transmit::of(&t), bytes));
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        for link in self.links.values_mut() {
            if link.quic.poll_timeout().is_some_and(|at| at <= now) {
                link.quic.handle_timeout(now);
            }
        }
        self.expire_hellos(now);
        self.dial_due(now);
        self.pump(now);
    }

    /// Gives up the links whose hellos were not exchanged within the idle timeout; a dialed
    /// one is dialed again at once. QUIC alone would wait far longer: its idle timer is at
    /// least three probe timeouts, and a handshake answered after a stall (a frozen process,
    /// a restart's first packets lost) measures the stall as its round trip, so a dialer
    /// whose acceptor already forgot the handshake retried it for a minute while every
    /// message for that peer waited (the simulator's replicated cluster seed 661).
    fn expire_hellos(&mut self, now: Instant) {
        let late: Vec<ConnectionHandle> = self
            .links
            .iter()
            .filter(|(_, l)| !l.ready && l.hello_by.is_some_and(|at| at <= now))
            .map(|(ch, _)| *ch)
            .collect();
        for ch in late {
            let link = self.links.get_mut(&ch).expect("listed");
            link.hello_by = None;
            let peer = link.dialed.clone();
            self.close(ch, "no hello exchanged within the idle timeout");
            if let Some(peer) = peer {
                self.link_ended(&peer, ch, now);
            }
        }
    }

    /// `ch`, a link dialed to `peer`, is closed or lost: if it is still the one for `peer`,
    /// the next dial is due at `at` (a link given up earlier is not redialed twice).
    fn link_ended(&mut self, peer: &str, ch: ConnectionHandle, at: Instant) {
        if matches!(self.dialing.get(peer), Some(Dialing::Link(c)) if *c == ch) {
            self.dialing
                .insert(peer.to_owned(), Dialing::After(at, FIRST_REDIAL * 2));
        }
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let links = self.link_deadline.into_iter();
        let redials = self.dialing.values().filter_map(|d| match d {
            Dialing::After(at, _) => Some(*at),
            Dialing::Link(_) => None,
        });
        let hellos = self
            .links
            .values()
            .filter(|l| !l.ready)
            .filter_map(|l| l.hello_by);
        links.chain(redials).chain(hellos).min()
    }

    pub(crate) fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        if let Some((t, bytes)) = self.endpoint_transmits.pop_front() {
            buf.extend_from_slice(&bytes);
            return Some(t);
        }
        for _ in 0..self.send_order.len() {
            let ch = self.send_order.pop_front()?;
            let Some(link) = self.links.get_mut(&ch) else {
                continue;
            };
            self.send_order.push_back(ch);
            // A batch over MAX_GSO_BATCH_BYTES would be refused whole by the kernel.
            let segments = (crate::config::MAX_GSO_BATCH_BYTES
                / usize::from(link.quic.current_mtu()))
            .clamp(1, self.max_gso_segments);
            if let Some(t) = link.quic.poll_transmit(now, segments, buf) {
                return Some(Transmit::of(&t));
            }
        }
        self.pump(now);
        None
    }

    /// Handles every link's events, reads and writes; removes dead links.
    pub(crate) fn pump(&mut self, now: Instant) {
        self.now = now;
        let handles: Vec<ConnectionHandle> = self.links.keys().copied().collect();
        for ch in handles {
            self.pump_link(now, ch);
        }
        self.link_deadline = self
            .links
            .values_mut()
            .filter_map(|l| l.quic.poll_timeout())
            .min();
    }

    fn pump_link(&mut self, now: Instant, ch: ConnectionHandle) {
        let Some(link) = self.links.get_mut(&ch) else {
            return;
        };
        while let Some(event) = link.quic.poll_endpoint_events() {
            if let Some(reply) = self.endpoint.handle_event(ch, event) {
                link.quic.handle_event(reply);
            }
        }
        let mut lost = false;
        while let Some(event) = link.quic.poll() {
            match event {
                Event::Connected if link.dialed.is_some() => {
                    if let Some(id) = link.quic.streams().open(Dir::Bi) {
                        link.stream = Some(id);
                        // Built here, not per pump: pumps are frequent, connects rare.
                        let hello = PeerMessage::Hello(hello_of(&self.me));
                        let mut frame = Vec::new();
                        if encode_frame(&hello, &mut frame).is_ok() {
                            link.outbox.push_back(Bytes::from(frame));
                        }
                    }
                }
                Event::Stream(StreamEvent::Opened { dir: Dir::Bi }) => {
                    if let Some(id) = link.quic.streams().accept(Dir::Bi) {
                        if link.dialed.is_none() && link.stream.is_none() {
                            link.stream = Some(id);
                        }
                    }
                }
                Event::ConnectionLost { reason } => {
                    debug!(peer = ?link.peer, %reason, "peer link lost");
                    lost = true;
                }
                _ => {}
            }
        }
        // A link that hears nothing for the idle timeout is given up here, though QUIC would
        // keep it: QUIC waits at least three probe timeouts, and a peer frozen past the idle
        // timeout inflates the round-trip estimate to seconds first, so a link its far end
        // dropped meanwhile stayed open for half a minute, everything sent on it lost (sim
        // replicated seed 4122: raft's answers from a thawed node never reached the leader,
        // and its metadata stayed behind). Keep-alives (a third of the idle timeout) make a
        // live link hear something well within it.
        if link.ready && !lost && !link.quic.is_closed() {
            let received = link.quic.stats().udp_rx.datagrams;
            if received != link.heard.0 {
                link.heard = (received, now);
            } else if now.saturating_duration_since(link.heard.1) >= self.hello_timeout {
                debug!(peer = ?link.peer, "nothing heard from the peer within the idle timeout");
                lost = true;
            }
        }
        // Closed here (a bad frame, a refusal, no hello in time) and drained: gone too.
        if lost || link.quic.is_drained() {
            let link = self.links.remove(&ch).expect("present");
            if let Some(peer) = link.dialed {
                self.link_ended(&peer, ch, now + FIRST_REDIAL);
            }
            return;
        }
        self.read_link(ch);
        self.write_link(ch);
        let Some(link) = self.links.get_mut(&ch) else {
            return;
        };
        while let Some(event) = link.quic.poll_endpoint_events() {
            if let Some(reply) = self.endpoint.handle_event(ch, event) {
                link.quic.handle_event(reply);
            }
        }
    }

    fn me_hello(&self) -> Hello {
        hello_of(&self.me)
    }

    fn read_link(&mut self, ch: ConnectionHandle) {
        let mut frames = Vec::new();
        let mut broken = None;
        {
            let Some(link) = self.links.get_mut(&ch) else {
                return;
            };
            let Some(id) = link.stream else {
                return;
            };
            let mut stream = link.quic.recv_stream(id);
            if let Ok(mut chunks) = stream.read(true) {
                while let Ok(Some(chunk)) = chunks.next(usize::MAX) {
                    link.decoder.feed_bytes(chunk.bytes);
                }
                let _ = chunks.finalize();
            }
            loop {
                match link.decoder.next_frame() {
                    Ok(Some(frame)) => match frame.decode(&AnyGeneration) {
                        Ok(m) => frames.push(m),
                        Err(e) => {
                            broken = Some(e.to_string());
                            break;
                        }
                    },
                    Ok(None) => break,
                    Err(e) => {
                        broken = Some(e.to_string());
                        break;
                    }
                }
            }
        }
        for message in frames {
            self.on_message(ch, message);
        }
        if let Some(why) = broken {
            self.close(ch, &format!("unreadable peer frame: {why}"));
        }
    }

    fn on_message(&mut self, ch: ConnectionHandle, message: PeerMessage) {
        let Some(link) = self.links.get_mut(&ch) else {
            return;
        };
        if !link.ready {
            match (link.dialed.is_some(), message) {
                // The acceptor: the first frame must be a hello from a member it can trust.
                (false, PeerMessage::Hello(h)) => {
                    let refusal = if h.cluster_id != self.me.cluster_id {
                        Some(HelloRefusal::WrongCluster)
                    } else if h.node_id == self.me.node_id || !self.voters.contains(&h.node_id) {
                        Some(HelloRefusal::UnknownNode)
                    } else if h.protocol_version != PEER_PROTOCOL_VERSION {
                        Some(HelloRefusal::UnsupportedVersion)
                    } else if self.verify_names
                        && !certificate_names(
                            link.quic.crypto_session().peer_identity(),
                            &h.node_id,
                        )
                    {
                        Some(HelloRefusal::IdentityMismatch)
                    } else {
                        None
                    };
                    let answer = match refusal {
                        Some(reason) => PeerMessage::HelloRefused(HelloRefused {
                            reason,
                            cluster_id: self.me.cluster_id.clone(),
                            node_id: self.me.node_id.clone(),
                            protocol_version: PEER_PROTOCOL_VERSION,
                        }),
                        None => PeerMessage::HelloAck(self.me_hello()),
                    };
                    let mut frame = Vec::new();
                    let _ = encode_frame(&answer, &mut frame);
                    let link = self.links.get_mut(&ch).expect("present");
                    link.outbox.push_back(Bytes::from(frame));
                    if let Some(reason) = refusal {
                        warn!(node = %h.node_id, ?reason, "refused a peer's hello");
                        link.ready = false;
                        return;
                    }
                    self.events.push_back(PeerEvent::Connected {
                        from: h.node_id.clone(),
                    });
                    link.peer = Some(h.node_id.clone());
                    link.ready = true;
                    link.incarnation = Some(h.incarnation);
                    self.drop_dialed_to_a_former_process(&h.node_id, h.incarnation);
                    // The peer dials one link at a time: one it accepted earlier is one the
                    // peer gave up (or lost in a restart), and answers sent there are lost.
                    let older: Vec<ConnectionHandle> = self
                        .links
                        .iter()
                        .filter(|(c, l)| {
                            **c != ch && l.dialed.is_none() && l.peer.as_deref() == Some(&h.node_id)
                        })
                        .map(|(c, _)| *c)
                        .collect();
                    for c in older {
                        if let Some(l) = self.links.get_mut(&c) {
                            l.ready = false;
                            l.hello_by = None;
                        }
                        self.close(c, "the peer dialed a new link");
                    }
                }
                (true, PeerMessage::HelloAck(h)) if link.peer.as_deref() == Some(&h.node_id) => {
                    link.ready = true;
                    link.incarnation = Some(h.incarnation);
                    let peer = h.node_id;
                    if let Some(backlog) = self.backlog.remove(&peer) {
                        link.outbox.push_back(backlog.freeze());
                    }
                }
                (_, other) => {
                    let why = format!("{:?} before the hello was answered", other.kind());
                    self.close(ch, &why);
                }
            }
            return;
        }
        let from = link.peer.clone().expect("a ready link knows its peer");
        self.events.push_back(PeerEvent::Message {
            from,
            message: Box::new(message),
        });
    }

    /// `peer` dialed in as process `incarnation`: a link this node dialed to an earlier
    /// process of it is closed and dialed again now. Left to QUIC, it would wait for its idle
    /// timer, at least three probe timeouts, which a stall (this node frozen) stretches to
    /// tens of seconds, every message sent meanwhile lost (sim replicated seed 8965: raft on
    /// one node cut off from the leader's answers for the whole quiet phase).
    fn drop_dialed_to_a_former_process(&mut self, peer: &str, incarnation: u64) {
        let Some(Dialing::Link(ch)) = self.dialing.get(peer) else {
            return;
        };
        let ch = *ch;
        let stale = self
            .links
            .get(&ch)
            .is_some_and(|l| l.ready && l.incarnation.is_some_and(|i| i != incarnation));
        if stale {
            self.close(ch, "the peer restarted");
            let now = self.now;
            if let Some(link) = self.links.get_mut(&ch) {
                link.ready = false;
            }
            self.link_ended(peer, ch, now);
            self.dial_due(now);
        }
    }

    fn write_link(&mut self, ch: ConnectionHandle) {
        let Some(link) = self.links.get_mut(&ch) else {
            return;
        };
        let Some(id) = link.stream else {
            return;
        };
        while !link.outbox.is_empty() {
            let (front, _) = link.outbox.as_mut_slices();
            match link.quic.send_stream(id).write_chunks(front) {
                // Whole chunks written are emptied in place; a partly written one is
                // advanced past what went.
                Ok(w) if w.bytes > 0 => {
                    link.outbox.drain(..w.chunks);
                }
                _ => break,
            }
        }
    }

    fn close(&mut self, ch: ConnectionHandle, why: &str) {
        if let Some(link) = self.links.get_mut(&ch) {
            warn!(peer = ?link.peer, why, "closing a peer link");
            link.quic.close(
                self.now,
                VarInt::from_u32(1),
                Bytes::copy_from_slice(why.as_bytes()),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> TlsIdentity {
        let key = rcgen::KeyPair::generate().expect("key");
        let params = rcgen::CertificateParams::new(vec!["felix-peer".to_owned()]).expect("params");
        let cert = params.self_signed(&key).expect("certificate");
        TlsIdentity {
            cert_chain: vec![cert.der().clone()],
            key: rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key"),
        }
    }

    /// A certificate too large for one datagram, as real ones are: a handshake's answer
    /// then comes in several, and a part of it can be lost.
    fn large_identity() -> TlsIdentity {
        let key = rcgen::KeyPair::generate().expect("key");
        let names = (0..40).map(|i| format!("felix-peer-{i:02}.nodes.example.internal"));
        let params = rcgen::CertificateParams::new(names.collect::<Vec<_>>()).expect("params");
        let cert = params.self_signed(&key).expect("certificate");
        TlsIdentity {
            cert_chain: vec![cert.der().clone()],
            key: rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key"),
        }
    }

    /// One stream per link and the engine's default datagram sizes.
    fn limits(backlog_bytes: usize, idle_timeout: Duration) -> PeerLimits {
        PeerLimits {
            backlog_bytes,
            idle_timeout,
            max_streams: 1,
            mtu_upper_bound: crate::config::DEFAULT_MTU_UPPER_BOUND,
            initial_mtu: crate::config::DEFAULT_INITIAL_MTU,
            max_udp_payload_size: crate::config::DEFAULT_MAX_UDP_PAYLOAD_SIZE,
            max_gso_segments: crate::config::DEFAULT_MAX_GSO_SEGMENTS,
        }
    }

    fn hello(node: &str) -> PeerMessage {
        PeerMessage::Hello(Hello {
            cluster_id: "c".into(),
            node_id: node.into(),
            protocol_version: PEER_PROTOCOL_VERSION,
            storage_id: [0; 16],
            incarnation: 0,
        })
    }

    /// A node whose peer `n2` is dialed but never answers: everything for it is backlog.
    fn lonely(backlog_bytes: usize) -> PeerNet {
        let me = Identity {
            cluster_id: "c".into(),
            node_id: "n1".into(),
            storage_id: [1; 16],
            incarnation: 1,
        };
        let dial = [("n1", 7101), ("n2", 7102)]
            .map(|(n, port)| (n.to_owned(), SocketAddr::from(([127, 0, 0, 1], port))))
            .into_iter()
            .collect();
        let crypto = PeerCrypto {
            identity: identity(),
            ca: None,
            provider: Arc::new(rustls::crypto::ring::default_provider()),
        };
        let limits = limits(backlog_bytes, Duration::from_secs(5));
        let voters = vec!["n1".into(), "n2".into()];
        PeerNet::new(me, voters, dial, &crypto, limits, &[3; 32], Instant::now()).expect("net")
    }

    const IDLE: Duration = Duration::from_secs(5);

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// `me` in a cluster of n1 (port 7101) and n2 (7102), dialing only `dials`.
    fn node(me: &str, dials: &[(&str, u16)], seed: u8, now: Instant) -> PeerNet {
        node_as(me, dials, seed, 1, now)
    }

    /// [`node`], started as process `incarnation`.
    fn node_as(
        me: &str,
        dials: &[(&str, u16)],
        seed: u8,
        incarnation: u64,
        now: Instant,
    ) -> PeerNet {
        let identity_of = Identity {
            cluster_id: "c".into(),
            node_id: me.into(),
            storage_id: [seed; 16],
            incarnation,
        };
        let dial = dials
            .iter()
            .map(|(n, p)| ((*n).to_owned(), addr(*p)))
            .collect();
        let crypto = PeerCrypto {
            identity: large_identity(),
            ca: None,
            provider: Arc::new(rustls::crypto::ring::default_provider()),
        };
        let limits = limits(1 << 20, IDLE);
        let voters = vec!["n1".into(), "n2".into()];
        PeerNet::new(identity_of, voters, dial, &crypto, limits, &[seed; 32], now).expect("net")
    }

    /// Everything `net` has to send now.
    fn sent(net: &mut PeerNet, now: Instant) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            let mut buf = Vec::new();
            let Some(t) = net.poll_transmit(now, &mut buf) else {
                return out;
            };
            let seg = t.segment_size.unwrap_or(t.size).max(1);
            for d in buf[..t.size].chunks(seg) {
                out.push((t.destination, d.to_vec()));
            }
        }
    }

    fn deliver(net: &mut PeerNet, now: Instant, from: SocketAddr, datagrams: Vec<Vec<u8>>) {
        for d in datagrams {
            net.handle_datagram(
                now,
                Datagram {
                    remote: from,
                    local_ip: None,
                    ecn: None,
                    data: BytesMut::from(&d[..]),
                    segment_size: None,
                },
            );
        }
    }

    /// n1 (index 0, port 7101) and n2 (index 1, port 7102) on a lossless wire with no delay.
    struct Wire {
        nets: [PeerNet; 2],
        now: Instant,
    }

    impl Wire {
        /// Carries datagrams both ways until neither side sends.
        fn carry(&mut self) {
            for _ in 0..10_000 {
                let mut moved = false;
                for i in 0..2 {
                    let out = sent(&mut self.nets[i], self.now);
                    moved |= !out.is_empty();
                    let from = addr(7101 + i as u16);
                    let datagrams = out.into_iter().map(|(_, d)| d).collect();
                    deliver(&mut self.nets[1 - i], self.now, from, datagrams);
                }
                if !moved {
                    return;
                }
            }
            panic!("the links never went quiet");
        }

        /// Lets time pass to `end`, firing both sides' timers at their instants.
        fn advance_to(&mut self, end: Instant) {
            self.carry();
            loop {
                let next = self.nets.iter().filter_map(|n| n.poll_timeout()).min();
                let Some(at) = next.filter(|at| *at <= end) else {
                    break;
                };
                self.now = self.now.max(at);
                for n in &mut self.nets {
                    if n.poll_timeout().is_some_and(|t| t <= self.now) {
                        n.handle_timeout(self.now);
                    }
                }
                self.carry();
            }
            self.now = end;
        }
    }

    fn connected_from(net: &mut PeerNet, peer: &str) -> bool {
        let mut seen = false;
        while let Some(e) = net.poll_event() {
            seen |= matches!(e, PeerEvent::Connected { from } if from == peer);
        }
        seen
    }

    /// The replicated cluster's seed 661 in the simulator: n1 restarts and dials n2, n2's
    /// answers reach it only after a stall of more than the idle timeout (the process was
    /// frozen), by which time n2 has forgotten the handshake, and n1's next packets are lost.
    /// The late answers make QUIC measure the stall as the round trip and stretch its own
    /// idle timer (three probe timeouts) to about a minute, its retries going to a peer that
    /// drops them; the link is redialed by the hello deadline instead.
    #[test]
    fn a_handshake_answered_after_the_acceptor_forgot_it_is_redialed() {
        let t0 = Instant::now();
        let mut n1 = node("n1", &[("n1", 7101), ("n2", 7102)], 1, t0);
        let mut n2 = node("n2", &[("n2", 7102)], 2, t0);
        let first = sent(&mut n1, t0).into_iter().map(|(_, d)| d).collect();
        deliver(&mut n2, t0, addr(7101), first);
        let held: Vec<Vec<u8>> = sent(&mut n2, t0).into_iter().map(|(_, d)| d).collect();
        assert!(held.len() > 1, "n2 answered in several datagrams");
        // n1 is stopped: n2 alone lives through the idle timeout and more, its retries lost.
        let thaw = t0 + IDLE + Duration::from_millis(1500);
        let mut now = t0;
        while let Some(at) = n2.poll_timeout().filter(|at| *at <= thaw) {
            now = now.max(at);
            n2.handle_timeout(now);
            let _ = sent(&mut n2, now);
        }
        assert!(n2.links.is_empty(), "n2 gave the handshake up");
        // n1 resumes: what waited in its socket first (only the start of n2's answer), then
        // its late timers; what n1 sends then is lost too.
        deliver(&mut n1, thaw, addr(7102), held[..1].to_vec());
        n1.handle_timeout(thaw);
        assert!(
            !sent(&mut n1, thaw).is_empty(),
            "n1 went on with the handshake"
        );
        let mut wire = Wire {
            nets: [n1, n2],
            now: thaw,
        };
        wire.advance_to(thaw + IDLE);
        assert_eq!(
            wire.nets[0].ready_links(),
            1,
            "n1's link to n2 is up within the idle timeout of its resuming"
        );
        assert!(
            connected_from(&mut wire.nets[1], "n1"),
            "n2 heard n1's hello"
        );
    }

    /// The hello deadline's edge: a dialed link nobody answers is kept until the idle timeout
    /// since its dial, and replaced by a new dial at it.
    #[test]
    fn an_unanswered_dial_is_replaced_at_the_idle_timeout() {
        let t0 = Instant::now();
        let mut n1 = node("n1", &[("n1", 7101), ("n2", 7102)], 1, t0);
        let link = |n: &PeerNet| match n.dialing.get("n2") {
            Some(Dialing::Link(ch)) => Some(*ch),
            _ => None,
        };
        let first = link(&n1).expect("dialed at start");
        let _ = sent(&mut n1, t0);
        let mut now = t0;
        let edge = t0 + IDLE;
        // Just before the deadline (every timer run, every datagram lost): the same link.
        while let Some(at) = n1
            .poll_timeout()
            .filter(|at| *at < edge - Duration::from_millis(1))
        {
            now = now.max(at);
            n1.handle_timeout(now);
            let _ = sent(&mut n1, now);
        }
        n1.handle_timeout(edge - Duration::from_millis(1));
        assert_eq!(link(&n1), Some(first), "kept before the deadline");
        n1.handle_timeout(edge);
        let second = link(&n1).expect("redialed at the deadline, not later");
        assert_ne!(second, first);
    }

    #[test]
    fn the_backlog_holds_messages_up_to_its_limit_and_drops_past_it() {
        let mut frame = Vec::new();
        encode_frame(&hello("x"), &mut frame).unwrap();
        let one = frame.len();
        // Exactly two frames fit.
        let mut net = lonely(2 * one);
        for _ in 0..3 {
            net.send("n2", &hello("x"));
        }
        assert_eq!(net.backlog["n2"].len(), 2 * one);
        assert_eq!(net.backlog_dropped, 1);
        // One byte less: the second no longer fits.
        let mut net = lonely(2 * one - 1);
        net.send("n2", &hello("x"));
        net.send("n2", &hello("x"));
        assert_eq!(net.backlog["n2"].len(), one);
        assert_eq!(net.backlog_dropped, 1);
        // No backlog at all.
        let mut net = lonely(0);
        net.send("n2", &hello("x"));
        assert!(net.backlog.get("n2").is_none_or(|b| b.is_empty()));
        assert_eq!(net.backlog_dropped, 1);
    }

    #[test]
    fn a_shipment_for_a_link_that_is_down_is_dropped_not_queued() {
        let ship = PeerMessage::Replicate(felix_peer_proto::Replicate {
            scope: felix_peer_proto::ShardScope {
                shard: felix_peer_proto::ShardId {
                    cluster_id: "c".into(),
                    kind: felix_peer_proto::ShardKind::Stream,
                    tenant: "t".into(),
                    namespace: "ns".into(),
                    name: "s".into(),
                    shard: 0,
                },
                generation: 1,
            },
            base_offset: 0,
            record_count: 1,
            commit: 0,
            entries: Bytes::from_static(b"entry"),
        });
        let mut net = lonely(1 << 20);
        net.send("n2", &ship);
        assert!(net.backlog.get("n2").is_none_or(|b| b.is_empty()));
        assert_eq!(net.backlog_dropped, 1);
        // What raft and leases send is kept for the link.
        net.send("n2", &hello("x"));
        assert!(!net.backlog["n2"].is_empty());
        assert_eq!(net.backlog_dropped, 1);
    }

    /// The link a node dialed to a peer's earlier process is dropped as soon as the peer's
    /// new process dials in, not at QUIC's idle timer (sim replicated seed 8965).
    #[test]
    fn a_link_to_a_restarted_peers_former_process_is_redialed_when_the_new_one_dials_in() {
        let t0 = Instant::now();
        let both = [("n1", 7101), ("n2", 7102)];
        let mut wire = Wire {
            nets: [node("n1", &both, 1, t0), node("n2", &both, 2, t0)],
            now: t0,
        };
        wire.carry();
        let dialed = |n: &PeerNet| match n.dialing.get("n2") {
            Some(Dialing::Link(ch)) => Some((*ch, n.links[ch].ready)),
            _ => None,
        };
        let (before, ready) = dialed(&wire.nets[0]).expect("n1 dialed n2");
        assert!(ready, "n1's link to n2 is up");
        // n2's process is replaced (no close reaches n1); the new one dials n1 at once.
        wire.nets[1] = node_as("n2", &both, 3, 2, wire.now);
        wire.carry();
        assert!(
            connected_from(&mut wire.nets[0], "n2"),
            "n2 dialed in again"
        );
        let (after, ready) = dialed(&wire.nets[0]).expect("n1 dialed n2 again");
        assert_ne!(
            after, before,
            "n1 still sends on the link to n2's former process"
        );
        assert!(ready, "n1's new link to n2 is up");
    }
}
