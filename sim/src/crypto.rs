//! Deterministic TLS, for the simulator only.
//!
//! rustls draws its randoms and key shares from its crypto provider, so two runs of one seed
//! would differ in every handshake byte. Here ring's provider keeps its ciphers and
//! signatures but gets `secure_random` from the run's seeded RNG and one key-exchange group,
//! X25519 implemented with `x25519-dalek` on secrets drawn from that RNG. The certificate is
//! felix-testkit's Ed25519 one with a key derived from the seed (Ed25519 signatures are
//! deterministic), and the clients' configuration is the kit's. None of this is secure, and
//! none of it is used outside the simulator.

use std::sync::{Arc, Mutex};

use quinn_proto::{ConnectionId, ConnectionIdGenerator};
use rustls::crypto::{
    ActiveKeyExchange, CryptoProvider, GetRandomFailed, SecureRandom, SharedSecret,
    SupportedKxGroup,
};
use rustls::NamedGroup;

use crate::rng::SimRng;

/// The run's TLS randomness. Shared by every endpoint of one run (the simulation is one
/// thread, so the draw order is the event order); leaked because rustls wants `&'static`.
#[derive(Debug)]
struct SeededRandom(Mutex<SimRng>);

impl SecureRandom for SeededRandom {
    fn fill(&self, buf: &mut [u8]) -> Result<(), GetRandomFailed> {
        self.0.lock().map_err(|_| GetRandomFailed)?.fill(buf);
        Ok(())
    }
}

#[derive(Debug)]
struct SeededX25519(&'static SeededRandom);

impl SupportedKxGroup for SeededX25519 {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, rustls::Error> {
        let mut secret = [0u8; 32];
        self.0
            .fill(&mut secret)
            .map_err(|_| rustls::Error::FailedToGetRandomBytes)?;
        let secret = x25519_dalek::StaticSecret::from(secret);
        let public = x25519_dalek::PublicKey::from(&secret).to_bytes();
        Ok(Box::new(X25519Exchange { secret, public }))
    }

    fn name(&self) -> NamedGroup {
        NamedGroup::X25519
    }
}

struct X25519Exchange {
    secret: x25519_dalek::StaticSecret,
    public: [u8; 32],
}

impl ActiveKeyExchange for X25519Exchange {
    fn complete(self: Box<Self>, peer: &[u8]) -> Result<SharedSecret, rustls::Error> {
        let peer: [u8; 32] = peer
            .try_into()
            .map_err(|_| rustls::Error::from(rustls::PeerMisbehaved::InvalidKeyShare))?;
        let shared = self
            .secret
            .diffie_hellman(&x25519_dalek::PublicKey::from(peer));
        if !shared.was_contributory() {
            return Err(rustls::PeerMisbehaved::InvalidKeyShare.into());
        }
        Ok(SharedSecret::from(&shared.as_bytes()[..]))
    }

    fn pub_key(&self) -> &[u8] {
        &self.public
    }

    fn group(&self) -> NamedGroup {
        NamedGroup::X25519
    }
}

/// ring's provider with the seeded randomness and key exchange.
pub(crate) fn seeded_provider(rng: SimRng) -> Arc<CryptoProvider> {
    let random: &'static SeededRandom = Box::leak(Box::new(SeededRandom(Mutex::new(rng))));
    let group: &'static SeededX25519 = Box::leak(Box::new(SeededX25519(random)));
    let mut provider = rustls::crypto::ring::default_provider();
    provider.secure_random = random;
    provider.kx_groups = vec![group];
    Arc::new(provider)
}

/// The clients' QUIC crypto: TLS 1.3 on the seeded provider, trusting the broker's seeded
/// certificate ([`felix_testkit::ed25519_identity`]) without a chain, no resumption (a
/// resumed handshake would put real ticket ages on the wire).
pub(crate) fn client_crypto(
    provider: Arc<CryptoProvider>,
) -> Arc<quinn_proto::crypto::rustls::QuicClientConfig> {
    let mut tls = felix_testkit::client_tls(provider, felix_testkit::Trust::AnyCertificate, &[]);
    tls.resumption = rustls::client::Resumption::disabled();
    tls.enable_early_data = false;
    felix_testkit::quic_crypto(tls)
}

/// Connection ids drawn from a seeded RNG (quinn's default draws from the OS).
pub(crate) struct SeededCids(pub(crate) SimRng);

impl ConnectionIdGenerator for SeededCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut b = [0u8; 8];
        self.0.fill(&mut b);
        ConnectionId::new(&b)
    }

    fn cid_len(&self) -> usize {
        8
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

/// A quinn endpoint for one simulated client whose every random choice comes from `rng`.
pub(crate) fn client_endpoint(mut rng: SimRng) -> quinn_proto::Endpoint {
    let reset = rng.seed32();
    let seed = rng.seed32();
    let cids = rng.fork("cids");
    let mut config = quinn_proto::EndpointConfig::new(Arc::new(ring::hmac::Key::new(
        ring::hmac::HMAC_SHA256,
        &reset,
    )));
    let cids = Mutex::new(cids);
    config.cid_generator(move || {
        let next = cids.lock().expect("cid rng").fork("generator");
        Box::new(SeededCids(next))
    });
    quinn_proto::Endpoint::new(Arc::new(config), None, false, Some(seed))
}

/// The first destination connection id a client picks, from a seeded RNG.
pub(crate) fn initial_cid_provider(rng: SimRng) -> Arc<dyn Fn() -> ConnectionId + Send + Sync> {
    let rng = Mutex::new(rng);
    Arc::new(move || {
        let mut b = [0u8; 16];
        rng.lock().expect("cid rng").fill(&mut b);
        ConnectionId::new(&b)
    })
}
