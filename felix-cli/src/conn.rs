//! The connection flags every broker command shares, and turning them into a client.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use felix_client::{Client, ClientConfig};

use crate::failure::Failure;

/// Where the broker is and who we are. Each flag falls back to an environment variable.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Connection")]
pub(crate) struct ConnectArgs {
    /// Broker address, host:port. Repeat it or separate addresses with commas to reach a
    /// cluster through several seeds (tried in order; the others are learned from the
    /// brokers) [env: FELIX_ADDRS, comma-separated, or FELIX_ADDR] [default: 127.0.0.1:5000]
    #[arg(
        long = "addr",
        value_name = "HOST:PORT[,HOST:PORT...]",
        value_delimiter = ','
    )]
    pub(crate) addr: Vec<String>,
    /// PEM file of the CA to trust (a dev broker writes it to FELIX_TLS_CERT_EXPORT).
    #[arg(long, env = "FELIX_CA_FILE", value_name = "PEM")]
    pub(crate) ca: Option<PathBuf>,
    /// TLS server name checked against the broker's certificate.
    #[arg(long, default_value = "localhost")]
    pub(crate) server_name: String,
    /// Tenant to authenticate as.
    #[arg(long, env = "FELIX_TENANT", default_value = "t1")]
    pub(crate) tenant: String,
    /// Bearer token [env: FELIX_TOKEN]. Wins over --token-file.
    #[arg(long)]
    pub(crate) token: Option<String>,
    /// File holding the token [env: FELIX_TOKEN_FILE] (a dev broker writes one to
    /// FELIX_DEV_TOKEN_EXPORT).
    #[arg(long, value_name = "PATH")]
    pub(crate) token_file: Option<PathBuf>,
    /// Namespace of the stream or cache.
    #[arg(long, default_value = "default")]
    pub(crate) namespace: String,
    /// Offer ALPN felix/1 in the TLS handshake.
    #[arg(long)]
    pub(crate) alpn: bool,
    /// Bound on connecting and on each answer.
    #[arg(long, default_value = "10s", value_parser = crate::duration::parse)]
    pub(crate) timeout: Duration,
}

impl ConnectArgs {
    /// The client configuration these flags describe (reads the CA and token files).
    pub(crate) fn client_config(&self) -> Result<ClientConfig, Failure> {
        let seeds = self
            .addresses(|name| std::env::var(name).ok())
            .iter()
            .map(|a| resolve(a))
            .collect::<Result<Vec<SocketAddr>, Failure>>()?;
        let ca_path = self.ca.as_ref().ok_or_else(|| {
            Failure::usage(
                "no CA: pass --ca or set FELIX_CA_FILE (a dev broker writes its CA to \
                 FELIX_TLS_CERT_EXPORT)",
            )
        })?;
        let ca_pem = std::fs::read(ca_path).map_err(|e| {
            Failure::usage(format!("cannot read the CA {}: {e}", ca_path.display()))
        })?;
        let token = self.resolve_token(|name| std::env::var_os(name))?;
        // One address: the client of that broker (which forwards what it does not own).
        // Several: the cluster client, routing to owners and riding through failovers.
        let mut config = if let [one] = seeds[..] {
            ClientConfig::new(one, ca_pem, &self.tenant, &token)
        } else {
            ClientConfig::with_seeds(seeds, ca_pem, &self.tenant, &token)
        };
        config.server_name = self.server_name.clone();
        config.offer_alpn = self.alpn;
        config.connect_timeout = self.timeout;
        config.request_timeout = self.timeout;
        Ok(config)
    }

    /// The addresses to dial: --addr (repeated or comma-separated), else FELIX_ADDRS
    /// (comma-separated), else FELIX_ADDR, else the local default. Blanks are skipped.
    pub(crate) fn addresses(&self, env: impl Fn(&str) -> Option<String>) -> Vec<String> {
        let split = |s: &str| -> Vec<String> {
            s.split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_owned)
                .collect()
        };
        let flags: Vec<String> = self.addr.iter().flat_map(|a| split(a)).collect();
        if !flags.is_empty() {
            return flags;
        }
        for name in ["FELIX_ADDRS", "FELIX_ADDR"] {
            let from_env = env(name).map(|v| split(&v)).unwrap_or_default();
            if !from_env.is_empty() {
                return from_env;
            }
        }
        vec![DEFAULT_ADDR.to_owned()]
    }

    /// Flags first, then the environment: --token, --token-file, FELIX_TOKEN,
    /// FELIX_TOKEN_FILE. Read by hand (not clap's `env`) so an explicit --token-file beats
    /// a FELIX_TOKEN left in the environment.
    fn resolve_token(
        &self,
        env: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<String, Failure> {
        if let Some(token) = &self.token {
            return Ok(token.trim().to_owned());
        }
        if let Some(path) = &self.token_file {
            return read_token_file(path);
        }
        if let Some(token) = env("FELIX_TOKEN").filter(|t| !t.is_empty()) {
            return Ok(token.to_string_lossy().trim().to_owned());
        }
        if let Some(path) = env("FELIX_TOKEN_FILE").filter(|t| !t.is_empty()) {
            return read_token_file(Path::new(&path));
        }
        Err(Failure::usage(
            "no token: pass --token or --token-file, or set FELIX_TOKEN or FELIX_TOKEN_FILE \
             (a dev broker writes one to FELIX_DEV_TOKEN_EXPORT; `felix token` mints one)",
        ))
    }

    /// Connects, mapping failures to exit codes.
    pub(crate) async fn connect(&self) -> Result<Client, Failure> {
        let config = self.client_config()?;
        Client::connect(config).await.map_err(|e| {
            let to = self.addresses(|name| std::env::var(name).ok()).join(",");
            Failure::client(&format!("cannot connect to {to}"), e)
        })
    }
}

/// Where a broker is when nothing says otherwise.
const DEFAULT_ADDR: &str = "127.0.0.1:5000";

fn read_token_file(path: &Path) -> Result<String, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::usage(format!("cannot read the token {}: {e}", path.display())))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(Failure::usage(format!("{} is empty", path.display())));
    }
    Ok(token.to_owned())
}

/// `host:port` to the first address it names (IPv4 preferred, like the broker's default).
fn resolve(addr: &str) -> Result<SocketAddr, Failure> {
    if let Ok(parsed) = addr.parse() {
        return Ok(parsed);
    }
    let candidates: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| Failure::usage(format!("cannot resolve --addr {addr:?}: {e}")))?
        .collect();
    candidates
        .iter()
        .find(|a| a.is_ipv4())
        .or(candidates.first())
        .copied()
        .ok_or_else(|| Failure::usage(format!("--addr {addr:?} names no address")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn args() -> ConnectArgs {
        ConnectArgs {
            addr: vec!["127.0.0.1:5000".into()],
            ca: None,
            server_name: "localhost".into(),
            tenant: "t1".into(),
            token: None,
            token_file: None,
            namespace: "default".into(),
            alpn: false,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn token_precedence_flags_then_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "from-file\n").unwrap();
        let env_token = |name: &str| (name == "FELIX_TOKEN").then(|| OsString::from("from-env"));

        let mut a = args();
        a.token_file = Some(file.clone());
        assert_eq!(a.resolve_token(env_token).unwrap(), "from-file");
        a.token = Some("from-flag".into());
        assert_eq!(a.resolve_token(env_token).unwrap(), "from-flag");

        let a = args();
        assert_eq!(a.resolve_token(env_token).unwrap(), "from-env");
        let env_file = |name: &str| (name == "FELIX_TOKEN_FILE").then(|| file.clone().into());
        assert_eq!(a.resolve_token(env_file).unwrap(), "from-file");
        assert_eq!(a.resolve_token(|_| None).unwrap_err().exit_code(), 2);
    }

    #[test]
    fn addresses_come_from_flags_then_felix_addrs_then_felix_addr() {
        let env = |name: &str| match name {
            "FELIX_ADDRS" => Some("127.0.0.1:1, 127.0.0.1:2".to_owned()),
            "FELIX_ADDR" => Some("127.0.0.1:3".to_owned()),
            _ => None,
        };
        let mut a = args();
        a.addr = vec!["127.0.0.1:7,127.0.0.1:8".into(), "127.0.0.1:9".into()];
        assert_eq!(
            a.addresses(env),
            ["127.0.0.1:7", "127.0.0.1:8", "127.0.0.1:9"],
            "comma-separated and repeated, in order"
        );
        a.addr = Vec::new();
        assert_eq!(a.addresses(env), ["127.0.0.1:1", "127.0.0.1:2"]);
        let only_addr = |name: &str| (name == "FELIX_ADDR").then(|| "127.0.0.1:3".to_owned());
        assert_eq!(a.addresses(only_addr), ["127.0.0.1:3"]);
        assert_eq!(a.addresses(|_| None), [DEFAULT_ADDR]);
        let blank = |name: &str| (name == "FELIX_ADDRS").then(|| " , ".to_owned());
        assert_eq!(a.addresses(blank), [DEFAULT_ADDR], "blanks are skipped");
    }

    #[test]
    fn several_addresses_make_the_cluster_client() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "pem").unwrap();
        let mut a = args();
        a.ca = Some(ca);
        a.token = Some("t".into());
        let one = a.client_config().unwrap();
        assert!(one.seeds.is_empty(), "one address: the one-broker client");
        a.addr = vec!["127.0.0.1:7,127.0.0.1:8".into()];
        let many = a.client_config().unwrap();
        assert_eq!(
            many.seeds,
            vec![
                "127.0.0.1:7".parse::<SocketAddr>().unwrap(),
                "127.0.0.1:8".parse().unwrap()
            ]
        );
    }

    #[test]
    fn addresses_resolve_with_or_without_a_name() {
        assert_eq!(
            resolve("127.0.0.1:7").unwrap(),
            "127.0.0.1:7".parse().unwrap()
        );
        assert_eq!(resolve("localhost:7").unwrap().port(), 7);
        assert!(resolve("no port").is_err());
    }
}
