//! QUIC and TLS configuration for the front ends: TLS 1.3 only, rustls with the `ring`
//! provider, trust anchored in a CA PEM the caller gives, optional ALPN `felix/1`.

use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::error::ClientError;

/// The ALPN id of the client listener.
pub const CLIENT_ALPN: &[u8] = b"felix/1";

/// Builds the quinn client configuration.
///
/// Transport parameters follow the reference client (peer-client-wire.md §1): 6 s idle
/// timeout with a 2 s keep-alive, 64 MiB stream windows (configurable), 256 MiB connection window, and room
/// for 1024 broker-opened uni streams (one per subscription).
pub(crate) fn quic_client_config(
    ca_pem: &[u8],
    offer_alpn: bool,
    idle_timeout: Duration,
    stream_receive_window: u32,
) -> Result<quinn::ClientConfig, ClientError> {
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
        .keep_alive_interval(Some(idle_timeout / 3))
        .stream_receive_window(quinn::VarInt::from_u32(stream_receive_window))
        .receive_window(quinn::VarInt::from_u32(256 << 20))
        .send_window(256 << 20)
        .max_concurrent_uni_streams(quinn::VarInt::from_u32(1024))
        // The broker never opens a bidi stream towards a client.
        .max_concurrent_bidi_streams(quinn::VarInt::from_u32(0));
    config.transport_config(Arc::new(transport));
    Ok(config)
}
