//! The files a local cluster's nodes need, shared by `felix cluster up` and the chaos test
//! (`chaos/`): one CA and a leaf per node (its client-facing certificate and its peer mTLS
//! certificate at once), and a node's `nodeN.toml` in the form docs/cluster.md describes.
//! Pure text and key generation: the callers write the files and choose the ports.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// The cluster's CA, which signs every node's leaf.
pub struct Certificates {
    /// The CA certificate, PEM: what clients and peers trust.
    pub ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Certificates {
    /// A fresh CA (new key from the OS's randomness).
    pub fn new() -> Result<Certificates, rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params
            .distinguished_name
            .push(DnType::CommonName, "Felix local cluster CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key)?;
        Ok(Certificates {
            ca_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A leaf for node `id`: the node id and `localhost` as DNS names and 127.0.0.1, for
    /// serving clients and for both ends of peer mTLS. PEM chain (leaf, CA) and PEM key.
    pub fn leaf(&self, id: &str) -> Result<(String, String), rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![id.to_owned(), "localhost".to_owned()])?;
        params.distinguished_name.push(DnType::CommonName, id);
        params
            .subject_alt_names
            .push(SanType::IpAddress(Ipv4Addr::LOCALHOST.into()));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((
            format!("{}{}", cert.pem(), self.ca_pem),
            key.serialize_pem(),
        ))
    }
}

/// What one node's config file says.
pub struct NodeConfig<'a> {
    pub id: &'a str,
    /// Client listener, also advertised to clients.
    pub client: SocketAddr,
    /// Broker-to-broker listener.
    pub internal: SocketAddr,
    /// `/metrics`, `/livez`, `/readyz`.
    pub ops: SocketAddr,
    /// `id=host:port,…`: the address this node dials for each node (a relay's, if links go
    /// through one).
    pub peers: &'a str,
    pub runtime: Option<&'a str>,
    pub cert: &'a Path,
    pub key: &'a Path,
    pub ca: &'a Path,
    pub jwks: &'a Path,
    pub data: &'a Path,
    /// `durable.fsync_mode`; `None` leaves the default.
    pub fsync_mode: Option<&'a str>,
    /// `cluster.lease_ms`; `None` leaves the default.
    pub lease_ms: Option<u64>,
}

impl NodeConfig<'_> {
    /// The node's `nodeN.toml` (docs/cluster.md lists every key). It ends inside
    /// `[cluster]`; `[[streams]]` and `[[caches]]` tables may follow.
    pub fn render(&self) -> String {
        let q = |p: &Path| toml_string(&p.display().to_string());
        let runtime = self
            .runtime
            .map_or(String::new(), |r| format!("runtime = {}\n", toml_string(r)));
        let fsync = self.fsync_mode.map_or(String::new(), |m| {
            format!("fsync_mode = {}\n", toml_string(m))
        });
        let lease = self
            .lease_ms
            .map_or(String::new(), |ms| format!("lease_ms = {ms}\n"));
        format!(
            "# node {id}\n\
             quic_bind = \"{client}\"\n\
             metrics_bind = \"{ops}\"\n\
             {runtime}\n\
             [tls]\ncert = {cert}\nkey = {key}\n\n\
             [auth]\njwks_file = {jwks}\n\n\
             [durable]\nstorage_dir = {data}\n{fsync}\n\
             [cluster]\nnode_id = {id_q}\ninternal_bind = \"{internal}\"\npeers = {peers}\n\
             client_advertise_addr = \"{client}\"\n\
             internal_tls_cert = {cert}\ninternal_tls_key = {key}\ninternal_tls_ca = {ca}\n\
             {lease}",
            id = self.id,
            id_q = toml_string(self.id),
            client = self.client,
            ops = self.ops,
            internal = self.internal,
            peers = toml_string(self.peers),
            cert = q(self.cert),
            key = q(self.key),
            jwks = q(self.jwks),
            data = q(self.data),
            ca = q(self.ca),
        )
    }
}

/// A TOML basic string.
pub fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_quoted_for_toml() {
        assert_eq!(toml_string(r#"/a "b"\c"#), r#""/a \"b\"\\c""#);
        assert_eq!(toml_string("x\ny"), r#""x\u000Ay""#);
    }

    #[test]
    fn leaves_chain_to_the_ca() {
        let certs = Certificates::new().unwrap();
        let (chain, key) = certs.leaf("n1").unwrap();
        assert_eq!(chain.matches("BEGIN CERTIFICATE").count(), 2);
        assert!(chain.ends_with(&certs.ca_pem), "the chain ends with the CA");
        assert!(key.contains("PRIVATE KEY"));
    }

    #[test]
    fn optional_keys_appear_only_when_given() {
        let p = Path::new("/d");
        let mut c = NodeConfig {
            id: "n1",
            client: "127.0.0.1:1".parse().unwrap(),
            internal: "127.0.0.1:2".parse().unwrap(),
            ops: "127.0.0.1:3".parse().unwrap(),
            peers: "n1=127.0.0.1:2",
            runtime: None,
            cert: p,
            key: p,
            ca: p,
            jwks: p,
            data: p,
            fsync_mode: None,
            lease_ms: None,
        };
        let plain = c.render();
        assert!(
            !plain.contains("fsync_mode") && !plain.contains("lease_ms"),
            "{plain}"
        );
        c.fsync_mode = Some("on_commit");
        c.lease_ms = Some(1000);
        let text = c.render();
        assert!(
            text.contains("[durable]\nstorage_dir = \"/d\"\nfsync_mode = \"on_commit\"\n"),
            "{text}"
        );
        assert!(
            text.ends_with("internal_tls_ca = \"/d\"\nlease_ms = 1000\n"),
            "{text}"
        );
    }
}
