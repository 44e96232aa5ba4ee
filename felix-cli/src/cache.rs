//! `felix cache get|put|del`.

use std::io::{Read, Write};
use std::time::Duration;

use bytes::Bytes;
use clap::{Args, Subcommand};

use crate::conn::ConnectArgs;
use crate::failure::Failure;

#[derive(Args, Debug)]
pub(crate) struct CacheArgs {
    #[command(subcommand)]
    op: CacheOp,
}

#[derive(Subcommand, Debug)]
enum CacheOp {
    /// Print the value of a key (exit 1 when absent or expired).
    Get {
        /// Cache name.
        cache: String,
        /// Key.
        key: String,
        /// Print the value as hex.
        #[arg(long)]
        hex: bool,
        #[command(flatten)]
        conn: ConnectArgs,
    },
    /// Store a value (the argument, or all of stdin without it).
    Put {
        /// Cache name.
        cache: String,
        /// Key.
        key: String,
        /// Value (default: all of stdin, byte for byte).
        value: Option<String>,
        /// Expire the entry after this long (e.g. 1.5s, 10m).
        #[arg(long, value_parser = crate::duration::parse)]
        ttl: Option<Duration>,
        #[command(flatten)]
        conn: ConnectArgs,
    },
    /// Delete a key (exit 1 when it was absent).
    Del {
        /// Cache name.
        cache: String,
        /// Key.
        key: String,
        #[command(flatten)]
        conn: ConnectArgs,
    },
}

pub(crate) async fn run(args: CacheArgs) -> Result<(), Failure> {
    match args.op {
        CacheOp::Get {
            conn,
            cache,
            key,
            hex,
        } => {
            let client = conn.connect().await?;
            let value = client.cache_get(&conn.namespace, &cache, &key).await;
            client.close().await;
            let value = value.map_err(|e| Failure::client(&format!("get {cache}/{key}"), e))?;
            let value = value.ok_or(Failure::Miss)?;
            print_value(&value, hex).map_err(|e| Failure::io("writing stdout", e))
        }
        CacheOp::Put {
            conn,
            cache,
            key,
            value,
            ttl,
        } => {
            let value = match value {
                Some(v) => Bytes::from(v),
                None => {
                    let mut all = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut all)
                        .map_err(|e| Failure::io("reading stdin", e))?;
                    Bytes::from(all)
                }
            };
            let client = conn.connect().await?;
            let stored = client
                .cache_put(&conn.namespace, &cache, &key, value, ttl)
                .await;
            client.close().await;
            stored.map_err(|e| Failure::client(&format!("put {cache}/{key}"), e))
        }
        CacheOp::Del { conn, cache, key } => {
            let client = conn.connect().await?;
            let removed = client.cache_delete(&conn.namespace, &cache, &key).await;
            client.close().await;
            match removed.map_err(|e| Failure::client(&format!("del {cache}/{key}"), e))? {
                Some(_) => Ok(()),
                None => Err(Failure::Miss),
            }
        }
    }
}

/// The value and a newline; as text it is written byte for byte (not re-encoded).
fn print_value(value: &[u8], hex: bool) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    if hex {
        writeln!(out, "{}", hex::encode(value))
    } else {
        out.write_all(value)?;
        writeln!(out)
    }
}
