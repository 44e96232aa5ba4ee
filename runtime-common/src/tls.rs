//! The broker's certificate: PEM files when configured, otherwise a development CA and a leaf
//! it signs, generated at start.
//!
//! The real client checks the leaf with webpki against the `ca_file` it is given, and webpki
//! refuses a self-signed leaf presented as its own CA in some setups; a separate CA that
//! signs the leaf is accepted everywhere, so that is what is generated.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use felix_engine::TlsIdentity;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A generated identity and the PEM of the CA that signed it (what clients should trust).
pub(crate) struct Generated {
    pub(crate) identity: TlsIdentity,
    pub(crate) ca_pem: String,
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
}

/// A fresh CA and a leaf for `localhost`, 127.0.0.1, ::1 and any `extra_ips`.
pub(crate) fn generate(extra_ips: &[IpAddr]) -> io::Result<Generated> {
    let ca_key = KeyPair::generate().map_err(invalid)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(invalid)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "Felix development CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).map_err(invalid)?;
    let issuer = Issuer::new(ca, ca_key);

    let leaf_key = KeyPair::generate().map_err(invalid)?;
    let mut leaf = CertificateParams::new(vec!["localhost".to_owned()]).map_err(invalid)?;
    leaf.distinguished_name
        .push(DnType::CommonName, "felix-broker");
    let mut ips = vec![
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ];
    for ip in extra_ips {
        if !ip.is_unspecified() && !ips.contains(ip) {
            ips.push(*ip);
        }
    }
    leaf.subject_alt_names
        .extend(ips.into_iter().map(SanType::IpAddress));
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).map_err(invalid)?;

    let key = PrivateKeyDer::try_from(leaf_key.serialize_der()).map_err(invalid)?;
    Ok(Generated {
        identity: TlsIdentity {
            cert_chain: vec![leaf_cert.der().clone(), ca_cert.der().clone()],
            key,
        },
        ca_pem: ca_cert.pem(),
    })
}

/// Reads a PEM certificate chain (leaf first) and a PEM private key.
pub(crate) fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> io::Result<TlsIdentity> {
    let cert_chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("certificate PEM: {e}")))?;
    if cert_chain.is_empty() {
        return Err(invalid("certificate PEM holds no certificate"));
    }
    let key =
        PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| invalid(format!("key PEM: {e}")))?;
    Ok(TlsIdentity { cert_chain, key })
}

/// Reads a PEM bundle of CA certificates (at least one).
pub(crate) fn ca_from_pem(pem: &[u8]) -> io::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("CA PEM: {e}")))?;
    if certs.is_empty() {
        return Err(invalid("holds no certificate"));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_pem_round_trips_and_chains_to_the_ca() {
        let g = generate(&["10.1.2.3".parse().unwrap()]).unwrap();
        assert_eq!(g.identity.cert_chain.len(), 2);
        let ca = CertificateDer::from_pem_slice(g.ca_pem.as_bytes()).unwrap();
        assert_eq!(ca, g.identity.cert_chain[1]);
        // The leaf is not the CA.
        assert_ne!(g.identity.cert_chain[0], g.identity.cert_chain[1]);
    }

    #[test]
    fn bad_pem_is_refused() {
        assert!(from_pem(b"nothing here", b"nor here").is_err());
        let e = ca_from_pem(b"nothing here").unwrap_err();
        assert!(e.to_string().contains("no certificate"), "{e}");
        let g = generate(&[]).unwrap();
        assert_eq!(ca_from_pem(g.ca_pem.as_bytes()).unwrap().len(), 1);
    }
}
