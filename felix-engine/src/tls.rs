//! TLS for the QUIC endpoint: rustls (ring provider, TLS 1.3 only), with ALPN chosen per
//! connection.
//!
//! The real client offers no ALPN by default and exactly `felix/1` when asked to. rustls in QUIC
//! mode refuses a hello without ALPN when the server lists protocols, and refuses a hello with
//! ALPN when it lists none, so one `rustls::ServerConfig` cannot serve both. [`AlpnSelector`] is
//! a `quinn_proto::crypto::ServerConfig` whose session buffers the ClientHello's CRYPTO bytes,
//! reads its ALPN extension, and only then starts the real rustls session with the config that
//! matches: `felix/1` selected when offered, no ALPN when none is offered. A client offering
//! only other protocols gets the `felix/1` config and is refused with `no_application_protocol`,
//! as RFC 9001 asks.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use quinn_proto::crypto::{
    self, rustls::QuicServerConfig, ExportKeyingMaterialError, HeaderKey, KeyPair, Keys, PacketKey,
    UnsupportedVersion,
};
use quinn_proto::transport_parameters::TransportParameters;
use quinn_proto::{ConnectionId, Side, TransportError, TransportErrorCode};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The ALPN protocol id Felix selects when a client offers it.
pub const ALPN_FELIX_V1: &[u8] = b"felix/1";

/// Largest ClientHello buffered while waiting for it to complete. A real one is under 2 KiB
/// (about 1.5 KiB with an ML-KEM key share); anything far larger is not a client we serve.
pub(crate) const MAX_CLIENT_HELLO_BYTES: usize = 16 * 1024;

/// The broker's certificate chain (leaf first) and private key, DER-encoded.
pub struct TlsIdentity {
    /// Leaf first, then intermediates.
    pub cert_chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key.
    pub key: PrivateKeyDer<'static>,
}

impl Clone for TlsIdentity {
    fn clone(&self) -> Self {
        TlsIdentity {
            cert_chain: self.cert_chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsIdentity")
            .field("certificates", &self.cert_chain.len())
            .finish_non_exhaustive()
    }
}

/// Why the TLS configuration could not be built.
#[derive(Debug)]
pub struct TlsConfigError(String);

impl fmt::Display for TlsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TLS configuration: {}", self.0)
    }
}

impl std::error::Error for TlsConfigError {}

/// How the endpoint runs TLS: who it is, and what it asks of clients.
#[derive(Clone, Debug)]
pub(crate) struct TlsSettings {
    pub(crate) identity: TlsIdentity,
    /// CA certificates client certificates must chain to; `None` asks for none.
    pub(crate) client_ca: Option<Vec<CertificateDer<'static>>>,
    /// Refuse a ClientHello that offers no ALPN.
    pub(crate) require_alpn: bool,
    pub(crate) provider: Option<Arc<rustls::crypto::CryptoProvider>>,
}

fn rustls_config(
    settings: &TlsSettings,
    alpn: Option<&[u8]>,
) -> Result<Arc<QuicServerConfig>, TlsConfigError> {
    let provider = settings
        .provider
        .clone()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsConfigError(e.to_string()))?;
    let builder = match &settings.client_ca {
        None => builder.with_no_client_auth(),
        Some(cas) => {
            // Mutual TLS: a client without a certificate chaining to one of these CAs fails
            // the handshake (TLS alert certificate_required / unknown_ca).
            let mut roots = rustls::RootCertStore::empty();
            for ca in cas {
                roots
                    .add(ca.clone())
                    .map_err(|e| TlsConfigError(format!("client CA: {e}")))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| TlsConfigError(format!("client CA: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let identity = &settings.identity;
    let mut config = builder
        .with_single_cert(identity.cert_chain.clone(), identity.key.clone_key())
        .map_err(|e| TlsConfigError(e.to_string()))?;
    config.alpn_protocols = alpn.map(|p| vec![p.to_vec()]).unwrap_or_default();
    // No 0-RTT: early data is replayable, and a replayed publish is a duplicate record.
    config.max_early_data_size = 0;
    let quic =
        QuicServerConfig::try_from(Arc::new(config)).map_err(|e| TlsConfigError(e.to_string()))?;
    Ok(Arc::new(quic))
}

/// A `quinn_proto` server crypto config that picks one of two rustls configs per connection
/// from the ALPN the ClientHello offers.
pub(crate) struct AlpnSelector {
    with_alpn: Arc<QuicServerConfig>,
    without_alpn: Arc<QuicServerConfig>,
    /// A hello without ALPN gets the `felix/1` config, which refuses it.
    require_alpn: bool,
}

impl AlpnSelector {
    pub(crate) fn new(settings: &TlsSettings) -> Result<AlpnSelector, TlsConfigError> {
        Ok(AlpnSelector {
            with_alpn: rustls_config(settings, Some(ALPN_FELIX_V1))?,
            without_alpn: rustls_config(settings, None)?,
            require_alpn: settings.require_alpn,
        })
    }
}

impl crypto::ServerConfig for AlpnSelector {
    fn initial_keys(
        &self,
        version: u32,
        dst_cid: &ConnectionId,
    ) -> Result<Keys, UnsupportedVersion> {
        // Initial keys depend only on the version and the CID, not on ALPN.
        crypto::ServerConfig::initial_keys(self.with_alpn.as_ref(), version, dst_cid)
    }

    fn retry_tag(&self, version: u32, orig_dst_cid: &ConnectionId, packet: &[u8]) -> [u8; 16] {
        crypto::ServerConfig::retry_tag(self.with_alpn.as_ref(), version, orig_dst_cid, packet)
    }

    fn start_session(
        self: Arc<Self>,
        version: u32,
        params: &TransportParameters,
    ) -> Box<dyn crypto::Session> {
        Box::new(SelectingSession {
            state: SessionState::AwaitingHello {
                selector: self,
                version,
                params: Box::new(*params),
                hello: Vec::new(),
            },
        })
    }
}

/// A server session that becomes a rustls session once the ClientHello is complete.
struct SelectingSession {
    state: SessionState,
}

enum SessionState {
    AwaitingHello {
        selector: Arc<AlpnSelector>,
        version: u32,
        params: Box<TransportParameters>,
        hello: Vec<u8>,
    },
    Started(Box<dyn crypto::Session>),
}

/// What a complete ClientHello offers for ALPN.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AlpnOffer {
    /// No ALPN extension.
    None,
    /// The extension lists `felix/1`.
    Felix,
    /// The extension lists only other protocols.
    Other,
}

/// Parses the ALPN offer of a ClientHello handshake message (`msg_type` 1). Returns
/// `Ok(None)` while more bytes are needed, `Err` when the bytes are not a ClientHello.
pub(crate) fn client_hello_alpn(buf: &[u8]) -> Result<Option<AlpnOffer>, &'static str> {
    if buf.len() < 4 {
        return Ok(None);
    }
    if buf[0] != 1 {
        return Err("first handshake message is not a ClientHello");
    }
    let len = usize::from(buf[1]) << 16 | usize::from(buf[2]) << 8 | usize::from(buf[3]);
    if len > MAX_CLIENT_HELLO_BYTES {
        return Err("ClientHello too large");
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    let mut r = Reader(&buf[4..4 + len]);
    r.skip(2 + 32)?; // legacy_version, random
    let n = r.u8()? as usize;
    r.skip(n)?; // legacy_session_id
    let n = r.u16()? as usize;
    r.skip(n)?; // cipher_suites
    let n = r.u8()? as usize;
    r.skip(n)?; // legacy_compression_methods
    if r.0.is_empty() {
        return Ok(Some(AlpnOffer::None));
    }
    let n = r.u16()? as usize;
    let mut exts = Reader(r.take(n)?);
    while !exts.0.is_empty() {
        let ty = exts.u16()?;
        let n = exts.u16()? as usize;
        let body = exts.take(n)?;
        if ty != 16 {
            continue;
        }
        let mut list = Reader(body);
        let n = list.u16()? as usize;
        let mut names = Reader(list.take(n)?);
        while !names.0.is_empty() {
            let n = names.u8()? as usize;
            if names.take(n)? == ALPN_FELIX_V1 {
                return Ok(Some(AlpnOffer::Felix));
            }
        }
        return Ok(Some(AlpnOffer::Other));
    }
    Ok(Some(AlpnOffer::None))
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.0.len() < n {
            return Err("truncated ClientHello");
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn skip(&mut self, n: usize) -> Result<(), &'static str> {
        self.take(n).map(|_| ())
    }
    fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, &'static str> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
}

fn hello_error(reason: &str) -> TransportError {
    TransportError {
        // TLS alert decode_error (50) as a QUIC crypto error.
        code: TransportErrorCode::crypto(50),
        frame: None,
        reason: reason.into(),
    }
}

impl crypto::Session for SelectingSession {
    fn initial_keys(&self, dst_cid: &ConnectionId, side: Side) -> Keys {
        match &self.state {
            SessionState::Started(s) => s.initial_keys(dst_cid, side),
            SessionState::AwaitingHello {
                selector, version, ..
            } => {
                debug_assert_eq!(side, Side::Server);
                crypto::ServerConfig::initial_keys(selector.with_alpn.as_ref(), *version, dst_cid)
                    .expect("version was accepted when the session started")
            }
        }
    }

    fn handshake_data(&self) -> Option<Box<dyn Any>> {
        match &self.state {
            SessionState::Started(s) => s.handshake_data(),
            SessionState::AwaitingHello { .. } => None,
        }
    }

    fn peer_identity(&self) -> Option<Box<dyn Any>> {
        match &self.state {
            SessionState::Started(s) => s.peer_identity(),
            SessionState::AwaitingHello { .. } => None,
        }
    }

    fn early_crypto(&self) -> Option<(Box<dyn HeaderKey>, Box<dyn PacketKey>)> {
        match &self.state {
            SessionState::Started(s) => s.early_crypto(),
            SessionState::AwaitingHello { .. } => None,
        }
    }

    fn early_data_accepted(&self) -> Option<bool> {
        match &self.state {
            SessionState::Started(s) => s.early_data_accepted(),
            SessionState::AwaitingHello { .. } => None,
        }
    }

    fn is_handshaking(&self) -> bool {
        match &self.state {
            SessionState::Started(s) => s.is_handshaking(),
            SessionState::AwaitingHello { .. } => true,
        }
    }

    fn read_handshake(&mut self, buf: &[u8]) -> Result<bool, TransportError> {
        let SessionState::AwaitingHello {
            selector,
            version,
            params,
            hello,
        } = &mut self.state
        else {
            let SessionState::Started(s) = &mut self.state else {
                unreachable!()
            };
            return s.read_handshake(buf);
        };
        hello.extend_from_slice(buf);
        let offer = match client_hello_alpn(hello) {
            Ok(None) => return Ok(false),
            Ok(Some(offer)) => offer,
            Err(reason) => return Err(hello_error(reason)),
        };
        let config = match offer {
            AlpnOffer::None if !selector.require_alpn => selector.without_alpn.clone(),
            // rustls refuses these unless they offer felix/1 (no_application_protocol).
            AlpnOffer::None | AlpnOffer::Felix | AlpnOffer::Other => selector.with_alpn.clone(),
        };
        let mut session = crypto::ServerConfig::start_session(config, *version, params);
        let hello = std::mem::take(hello);
        let result = session.read_handshake(&hello);
        self.state = SessionState::Started(session);
        result
    }

    fn transport_parameters(&self) -> Result<Option<TransportParameters>, TransportError> {
        match &self.state {
            SessionState::Started(s) => s.transport_parameters(),
            SessionState::AwaitingHello { .. } => Ok(None),
        }
    }

    fn write_handshake(&mut self, buf: &mut Vec<u8>) -> Option<Keys> {
        match &mut self.state {
            SessionState::Started(s) => s.write_handshake(buf),
            SessionState::AwaitingHello { .. } => None,
        }
    }

    fn next_1rtt_keys(&mut self) -> Option<KeyPair<Box<dyn PacketKey>>> {
        match &mut self.state {
            SessionState::Started(s) => s.next_1rtt_keys(),
            SessionState::AwaitingHello { .. } => None,
        }
    }

    fn is_valid_retry(&self, orig_dst_cid: &ConnectionId, header: &[u8], payload: &[u8]) -> bool {
        match &self.state {
            SessionState::Started(s) => s.is_valid_retry(orig_dst_cid, header, payload),
            // Only clients validate retries.
            SessionState::AwaitingHello { .. } => false,
        }
    }

    fn export_keying_material(
        &self,
        output: &mut [u8],
        label: &[u8],
        context: &[u8],
    ) -> Result<(), ExportKeyingMaterialError> {
        match &self.state {
            SessionState::Started(s) => s.export_keying_material(output, label, context),
            SessionState::AwaitingHello { .. } => Err(ExportKeyingMaterialError),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello with the given extensions block.
    fn hello(extensions: Option<Vec<u8>>) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([0u8; 32]);
        body.push(0); // session id
        body.extend([0, 2, 0x13, 0x01]); // one cipher suite
        body.extend([1, 0]); // null compression
        if let Some(ext) = extensions {
            body.extend((ext.len() as u16).to_be_bytes());
            body.extend(ext);
        }
        let mut msg = vec![1];
        msg.extend(&(body.len() as u32).to_be_bytes()[1..]);
        msg.extend(body);
        msg
    }

    fn alpn_ext(names: &[&[u8]]) -> Vec<u8> {
        let mut list = Vec::new();
        for n in names {
            list.push(n.len() as u8);
            list.extend(*n);
        }
        let mut ext = vec![0, 16];
        ext.extend(((list.len() + 2) as u16).to_be_bytes());
        ext.extend((list.len() as u16).to_be_bytes());
        ext.extend(list);
        ext
    }

    #[test]
    fn reads_the_alpn_offer() {
        let sni = vec![0, 0, 0, 0]; // server_name extension, empty
        assert_eq!(client_hello_alpn(&hello(None)), Ok(Some(AlpnOffer::None)));
        assert_eq!(
            client_hello_alpn(&hello(Some(sni.clone()))),
            Ok(Some(AlpnOffer::None))
        );
        let mut ext = sni.clone();
        ext.extend(alpn_ext(&[b"h3", b"felix/1"]));
        assert_eq!(
            client_hello_alpn(&hello(Some(ext))),
            Ok(Some(AlpnOffer::Felix))
        );
        assert_eq!(
            client_hello_alpn(&hello(Some(alpn_ext(&[b"h3"])))),
            Ok(Some(AlpnOffer::Other))
        );
    }

    #[test]
    fn waits_for_the_whole_hello_and_refuses_garbage() {
        let full = hello(Some(alpn_ext(&[b"felix/1"])));
        for cut in 0..full.len() {
            assert_eq!(client_hello_alpn(&full[..cut]), Ok(None), "cut at {cut}");
        }
        assert!(client_hello_alpn(&[2, 0, 0, 1, 0]).is_err());
        assert!(client_hello_alpn(&[1, 0xff, 0xff, 0xff]).is_err());
        // A length that lies about the extensions inside.
        let mut bad = hello(Some(alpn_ext(&[b"felix/1"])));
        let n = bad.len();
        bad[n - 9] = 0xff;
        assert!(client_hello_alpn(&bad).is_err());
    }
}
