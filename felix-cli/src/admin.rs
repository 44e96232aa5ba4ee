//! `felix admin`: cluster operations over a node's ops endpoint (`FELIX_METRICS_BIND`).
//!
//! `felix admin abandon` gives up what a shard's gone leader acknowledged and no live copy
//! holds (docs/replication.md, "Giving records up"): the only way a durable shard comes to
//! be led by a node that may lack acknowledged records. It prints what is given up.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::failure::Failure;

#[derive(Args)]
pub(crate) struct AdminArgs {
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Hand a shard whose leader is gone to a live node, giving up what only the leader held.
    Abandon(AbandonArgs),
    /// Create, show and list streams through the control plane (`/v1/streams`).
    Streams(crate::admin_streams::StreamsArgs),
}

#[derive(Args)]
struct AbandonArgs {
    /// A node's ops endpoint (its FELIX_METRICS_BIND), HOST:PORT; any node will do.
    #[arg(long)]
    broker: String,
    /// The cluster's CA, for the admin commands' common flags. The ops endpoint is plain
    /// HTTP on the operators' network, so it is read only to check it exists.
    #[arg(long)]
    ca: Option<PathBuf>,
    /// A Felix token for TENANT granting `node.manage:cluster:*`.
    #[arg(long)]
    token: String,
    /// The shard is a cache's, not a stream's.
    #[arg(long)]
    cache: bool,
    /// The node to lead it (default: the first live replica holding a copy; for a shard of
    /// one replica, the first live node).
    #[arg(long)]
    to: Option<String>,
    tenant: String,
    namespace: String,
    /// The stream (or, with --cache, the cache).
    name: String,
    shard: u32,
}

pub(crate) fn run(args: AdminArgs) -> Result<(), Failure> {
    match args.command {
        AdminCommand::Abandon(a) => abandon(a),
        AdminCommand::Streams(a) => crate::admin_streams::run(a),
    }
}

fn abandon(a: AbandonArgs) -> Result<(), Failure> {
    if let Some(ca) = &a.ca {
        std::fs::metadata(ca).map_err(|e| Failure::usage(format!("--ca {}: {e}", ca.display())))?;
    }
    let kind = if a.cache { "cache" } else { "stream" };
    let mut path = format!(
        "/v1/shards/{kind}/{}/{}/{}/{}/abandon",
        a.tenant, a.namespace, a.name, a.shard
    );
    if let Some(to) = &a.to {
        path.push_str(&format!("?to={to}"));
    }
    let (status, body) = post(&a.broker, &path, &a.token)?;
    match status {
        202 => {
            print!("{body}");
            Ok(())
        }
        400 | 401 | 403 | 404 | 409 => Err(Failure::Refused(format!("{status}: {}", body.trim()))),
        _ => Err(Failure::Connection(format!("{status}: {}", body.trim()))),
    }
}

/// One HTTP/1.1 POST with no body; the status and the body of the answer.
fn post(addr: &str, path: &str, token: &str) -> Result<(u16, String), Failure> {
    let sock = addr
        .to_socket_addrs()
        .map_err(|e| Failure::usage(format!("--broker {addr}: {e}")))?
        .next()
        .ok_or_else(|| Failure::usage(format!("--broker {addr}: no address")))?;
    let timeout = Duration::from_secs(10);
    let mut conn = TcpStream::connect_timeout(&sock, timeout).map_err(|e| Failure::io(addr, e))?;
    conn.set_read_timeout(Some(timeout))
        .map_err(|e| Failure::io(addr, e))?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    conn.write_all(request.as_bytes())
        .map_err(|e| Failure::io(addr, e))?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)
        .map_err(|e| Failure::io(addr, e))?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Failure::Connection(format!("{addr}: not an HTTP answer")))?;
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok((status, body))
}
