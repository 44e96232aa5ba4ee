//! The client side of a connection to the engine, as pieces: crypto and transport
//! configuration, an endpoint, and the plumbing that moves datagrams and reads streams.
//! [`crate::Net`] is built from them; harnesses with their own network (the engine fuzz
//! target, the simulator) take the ones they need.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use felix_engine::{Datagram, Engine, Transmit};
use felix_proto::FrameDecoder;
use quinn_proto::crypto::rustls::QuicClientConfig;
use quinn_proto::{
    ClientConfig, Connection, ConnectionEvent, ConnectionHandle, DatagramEvent, Endpoint,
    EndpointConfig, Event, StreamId, TransportConfig, VarInt,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

/// What a client accepts as the broker's certificate.
pub enum Trust {
    /// A chain to this CA (as from [`crate::tls`]).
    Ca(CertificateDer<'static>),
    /// Any certificate, its handshake signature still checked with the provider's
    /// algorithms (for [`crate::ed25519_identity`], whose clients know whom they talk to).
    AnyCertificate,
}

/// A TLS 1.3 client configuration over `provider`, offering `alpn` (none if empty).
pub fn client_tls(
    provider: Arc<CryptoProvider>,
    trust: Trust,
    alpn: &[&[u8]],
) -> rustls::ClientConfig {
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3");
    let mut tls = match trust {
        Trust::Ca(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca).expect("root");
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        Trust::AnyCertificate => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth(),
    };
    tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tls
}

/// The QUIC crypto of a client configuration.
pub fn quic_crypto(tls: rustls::ClientConfig) -> Arc<QuicClientConfig> {
    Arc::new(QuicClientConfig::try_from(tls).expect("QUIC client config"))
}

/// The transport limits a client grants the broker.
#[derive(Debug, Clone)]
pub struct ClientTransport {
    /// Receive window per stream (small ones make slow subscribers).
    pub stream_window: u32,
    /// Event streams the broker may have open at once.
    pub max_uni_streams: u32,
    pub keep_alive: Option<Duration>,
    /// Idle timeout the client asks for; `None` leaves quinn's default.
    pub idle_timeout: Option<Duration>,
}

/// A connection configuration: `crypto`, and `transport` (the broker opens no bidi streams).
pub fn client_config(crypto: Arc<QuicClientConfig>, transport: &ClientTransport) -> ClientConfig {
    let mut config = ClientConfig::new(crypto);
    config.transport_config(client_transport(transport));
    config
}

/// The transport settings of [`client_config`], for a caller that builds the rest of its
/// `ClientConfig` itself (the simulator seeds its connection ids).
pub fn client_transport(transport: &ClientTransport) -> Arc<TransportConfig> {
    let mut t = TransportConfig::default();
    t.stream_receive_window(VarInt::from_u32(transport.stream_window))
        .max_concurrent_uni_streams(VarInt::from_u32(transport.max_uni_streams))
        .max_concurrent_bidi_streams(VarInt::from_u32(0))
        .keep_alive_interval(transport.keep_alive);
    if let Some(idle) = transport.idle_timeout {
        t.max_idle_timeout(Some(
            idle.try_into().expect("an idle timeout QUIC can carry"),
        ));
    }
    Arc::new(t)
}

/// A client endpoint with quinn's defaults, its endpoint randomness fixed by `rng_seed` if
/// given.
pub fn client_endpoint(rng_seed: Option<[u8; 32]>) -> Endpoint {
    let mut config = EndpointConfig::default();
    config.rng_seed(rng_seed);
    Endpoint::new(Arc::new(config), None, true, None)
}

/// Hands every datagram `conn` has to send now to the engine, as from `remote`. True if
/// there was any. `buf` is scratch.
pub fn to_engine(
    conn: &mut Connection,
    engine: &mut Engine,
    now: Instant,
    remote: SocketAddr,
    buf: &mut Vec<u8>,
) -> bool {
    let mut any = false;
    loop {
        buf.clear();
        let Some(t) = conn.poll_transmit(now, 10, buf) else {
            return any;
        };
        any = true;
        engine.handle_datagram(
            now,
            Datagram {
                remote,
                local_ip: None,
                ecn: None,
                data: BytesMut::from(&buf[..t.size]),
                segment_size: t.segment_size,
            },
        );
    }
}

/// Splits one engine transmit (its bytes in `out`) into datagrams for the client endpoint,
/// as from `server`; returns the events for the connections they belong to.
pub fn to_client(
    endpoint: &mut Endpoint,
    now: Instant,
    server: SocketAddr,
    t: &Transmit,
    out: &[u8],
) -> Vec<(ConnectionHandle, ConnectionEvent)> {
    let mut events = Vec::new();
    let segment = t.segment_size.unwrap_or(t.size).max(1);
    for datagram in out[..t.size].chunks(segment) {
        let mut resp = Vec::new();
        if let Some(DatagramEvent::ConnectionEvent(ch, ev)) =
            endpoint.handle(now, server, None, None, BytesMut::from(datagram), &mut resp)
        {
            events.push((ch, ev));
        }
    }
    events
}

/// One pass over a connection: its endpoint events go to `endpoint` (and the replies back),
/// then its application events to `on_event`. True if there was any event.
pub fn poll_connection(
    endpoint: &mut Endpoint,
    ch: ConnectionHandle,
    conn: &mut Connection,
    mut on_event: impl FnMut(&mut Connection, Event),
) -> bool {
    let mut any = false;
    while let Some(ev) = conn.poll_endpoint_events() {
        any = true;
        if let Some(reply) = endpoint.handle_event(ch, ev) {
            conn.handle_event(reply);
        }
    }
    while let Some(ev) = conn.poll() {
        any = true;
        on_event(conn, ev);
    }
    any
}

/// What one [`read_stream`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamRead {
    /// Bytes were read.
    pub read: bool,
    /// The FIN was read.
    pub finished: bool,
    /// The broker reset the stream, with this code.
    pub reset: Option<VarInt>,
    /// The stream is not readable (closed, or never opened).
    pub gone: bool,
}

impl StreamRead {
    /// Nothing more will come on the stream.
    pub fn ended(&self) -> bool {
        self.finished || self.reset.is_some() || self.gone
    }
}

/// Feeds what the stream holds now into `decoder`.
pub fn read_stream(conn: &mut Connection, id: StreamId, decoder: &mut FrameDecoder) -> StreamRead {
    let mut r = StreamRead::default();
    let mut recv = conn.recv_stream(id);
    let Ok(mut chunks) = recv.read(true) else {
        r.gone = true;
        return r;
    };
    loop {
        match chunks.next(usize::MAX) {
            Ok(Some(chunk)) => {
                r.read = true;
                decoder.feed_bytes(chunk.bytes);
            }
            Ok(None) => {
                r.finished = true;
                break;
            }
            Err(quinn_proto::ReadError::Blocked) => break,
            Err(quinn_proto::ReadError::Reset(code)) => {
                r.reset = Some(code);
                break;
            }
        }
    }
    let _ = chunks.finalize();
    r
}

/// [`Trust::AnyCertificate`]: no chain, but a checked handshake signature.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
