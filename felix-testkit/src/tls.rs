//! TLS fixtures: the broker's identity, and what a client trusts to check it.

use std::sync::OnceLock;

use felix_engine::TlsIdentity;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A broker identity and the CA that signed it.
pub struct Tls {
    pub identity: TlsIdentity,
    pub ca: CertificateDer<'static>,
}

/// A CA and a leaf for `localhost` signed by it (fresh keys each call).
pub fn tls() -> Tls {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("ca");
    let issuer = Issuer::new(ca, ca_key);
    let leaf_key = KeyPair::generate().expect("leaf key");
    let leaf = CertificateParams::new(vec!["localhost".to_owned()]).expect("leaf params");
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).expect("leaf");
    Tls {
        identity: TlsIdentity {
            cert_chain: vec![leaf_cert.der().clone()],
            key: PrivateKeyDer::try_from(leaf_key.serialize_der()).expect("key"),
        },
        ca: ca_cert.der().clone(),
    }
}

/// Like [`tls`], made once per process (key generation is the slow part of a fuzz input).
pub fn shared_tls() -> &'static Tls {
    static TLS: OnceLock<Tls> = OnceLock::new();
    TLS.get_or_init(tls)
}

/// A self-signed Ed25519 certificate for `localhost` with the key derived from `seed`: the
/// same bytes for the same seed (Ed25519 signatures need no randomness), so a seeded run
/// repeats. Clients check it with [`crate::Trust::AnyCertificate`].
pub fn ed25519_identity(seed: [u8; 32]) -> TlsIdentity {
    let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed).expect("ed25519 seed");
    let public = ring::signature::KeyPair::public_key(&pair)
        .as_ref()
        .to_vec();
    // PKCS#8 v2 (RFC 5958) with the public key, the form ring and rcgen both read.
    let mut der = vec![
        0x30, 0x53, 0x02, 0x01, 0x01, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    der.extend_from_slice(&seed);
    der.extend_from_slice(&[0xa1, 0x23, 0x03, 0x21, 0x00]);
    der.extend_from_slice(&public);
    let pkcs8 = PrivatePkcs8KeyDer::from(der);
    let key = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8, &rcgen::PKCS_ED25519)
        .expect("rcgen reads the key");
    let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    let cert = params.self_signed(&key).expect("self-signed certificate");
    TlsIdentity {
        cert_chain: vec![cert.der().clone()],
        key: PrivateKeyDer::Pkcs8(pkcs8),
    }
}
