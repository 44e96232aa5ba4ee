//! QUIC and TLS configuration for the front ends: TLS 1.3 only, rustls with the `ring`
//! provider, trust anchored in a CA PEM the caller gives, optional ALPN `felix/1`.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::error::ClientError;

/// The ALPN id of the client listener.
pub const CLIENT_ALPN: &[u8] = b"felix/1";

/// The datagram size path-MTU discovery probes up to, by default (see
/// `ClientConfig::mtu_upper_bound`).
pub const DEFAULT_MTU_UPPER_BOUND: u16 = 8952;
/// The datagram size a connection starts with (QUIC's safe minimum).
pub const DEFAULT_INITIAL_MTU: u16 = 1200;
/// The smallest and largest MTU settings: QUIC's minimum datagram, and IPv6's largest UDP
/// payload.
pub const MTU_RANGE: std::ops::RangeInclusive<u16> = 1200..=65_527;
/// The largest UDP payload one send may carry: Linux refuses a GSO batch over it whole.
const MAX_GSO_BATCH_BYTES: usize = 65_507;
/// The ack-eliciting packets the broker may take before acknowledging, asked of it with an
/// ACK_FREQUENCY frame; 1 (QUIC's usual, every second packet) sends none.
pub const DEFAULT_ACK_ELICITING_THRESHOLD: u32 = 1;
/// The longest the broker may hold an acknowledgement, with the threshold above.
pub const DEFAULT_MAX_ACK_DELAY: Duration = Duration::from_millis(2);

/// What [`quic_client_config`] takes from the client's configuration.
pub(crate) struct QuicSettings<'a> {
    pub ca_pem: &'a [u8],
    pub offer_alpn: bool,
    pub idle_timeout: Duration,
    pub stream_receive_window: u32,
    pub mtu_upper_bound: u16,
    pub initial_mtu: u16,
    pub ack_eliciting_threshold: u32,
    pub max_ack_delay: Duration,
}

/// The endpoint configuration: the largest datagram accepted (advertised as
/// `max_udp_payload_size`) is the one we would send, at least Ethernet's.
pub(crate) fn endpoint_config(mtu_upper_bound: u16) -> quinn::EndpointConfig {
    let mut config = quinn::EndpointConfig::default();
    config
        .max_udp_payload_size(mtu_upper_bound.clamp(1472, *MTU_RANGE.end()))
        .expect("within the range quinn accepts");
    config
}

/// Builds the quinn client configuration.
///
/// Transport parameters follow the reference client (peer-client-wire.md §1): an idle
/// timeout of `ClientConfig::idle_timeout` (2 s; the reference waits 6) with a keep-alive at a quarter of it, 64 MiB stream windows (configurable), 256 MiB connection window, and room
/// for 1024 broker-opened uni streams (one per subscription).
pub(crate) fn quic_client_config(s: &QuicSettings<'_>) -> Result<quinn::ClientConfig, ClientError> {
    let QuicSettings {
        ca_pem,
        offer_alpn,
        idle_timeout,
        stream_receive_window,
        ..
    } = *s;
    for (name, v) in [
        ("mtu_upper_bound", s.mtu_upper_bound),
        ("initial_mtu", s.initial_mtu),
    ] {
        if !MTU_RANGE.contains(&v) {
            return Err(ClientError::Usage(format!(
                "{name} must be {} to {}, not {v}",
                MTU_RANGE.start(),
                MTU_RANGE.end()
            )));
        }
    }
    if s.initial_mtu > s.mtu_upper_bound {
        return Err(ClientError::Usage(format!(
            "initial_mtu ({}) is above mtu_upper_bound ({})",
            s.initial_mtu, s.mtu_upper_bound
        )));
    }
    let mut roots = rustls::RootCertStore::empty();
    let mut found = 0usize;
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| ClientError::Usage(format!("CA PEM does not parse: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| ClientError::Usage(format!("CA certificate refused: {e}")))?;
        found += 1;
    }
    if found == 0 {
        return Err(ClientError::Usage("CA PEM holds no certificate".into()));
    }

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| ClientError::Usage(format!("TLS configuration: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    if offer_alpn {
        tls.alpn_protocols = vec![CLIENT_ALPN.to_vec()];
    }

    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(Arc::new(tls))
        .map_err(|e| ClientError::Usage(format!("QUIC TLS configuration: {e}")))?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));

    let mut transport = quinn::TransportConfig::default();
    let idle = quinn::IdleTimeout::try_from(idle_timeout)
        .map_err(|e| ClientError::Usage(format!("idle timeout: {e}")))?;
    transport
        .max_idle_timeout(Some(idle))
        .keep_alive_interval(Some(idle_timeout / 4))
        .stream_receive_window(quinn::VarInt::from_u32(stream_receive_window))
        .receive_window(quinn::VarInt::from_u32(256 << 20))
        .send_window(256 << 20)
        .max_concurrent_uni_streams(quinn::VarInt::from_u32(1024))
        // The broker never opens a bidi stream towards a client.
        .max_concurrent_bidi_streams(quinn::VarInt::from_u32(0));
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(s.mtu_upper_bound);
    transport
        .initial_mtu(s.initial_mtu)
        .mtu_discovery_config(Some(mtu));
    if s.ack_eliciting_threshold != 1 {
        let mut ack = quinn::AckFrequencyConfig::default();
        ack.ack_eliciting_threshold(quinn::VarInt::from_u32(s.ack_eliciting_threshold))
            .max_ack_delay(Some(s.max_ack_delay));
        transport.ack_frequency_config(Some(ack));
    }
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// A UDP socket whose GSO batches stay within what one send may carry. quinn asks for up to
/// ten datagrams of the discovered size in one send; past 6.5 KB datagrams that is more than
/// Linux takes, and the refused batch would be lost whole, so this reports fewer segments.
pub(crate) struct GsoBounded {
    inner: Arc<dyn AsyncUdpSocket>,
    max_segments: usize,
}

impl GsoBounded {
    /// `inner`, sending at most as many datagrams of `mtu_upper_bound` bytes at once as fit.
    pub(crate) fn new(inner: Arc<dyn AsyncUdpSocket>, mtu_upper_bound: u16) -> GsoBounded {
        let max_segments = (MAX_GSO_BATCH_BYTES / usize::from(mtu_upper_bound.max(1))).max(1);
        GsoBounded {
            inner,
            max_segments,
        }
    }
}

impl fmt::Debug for GsoBounded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GsoBounded")
            .field("max_segments", &self.max_segments)
            .finish_non_exhaustive()
    }
}

impl AsyncUdpSocket for GsoBounded {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments().min(self.max_segments)
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}
