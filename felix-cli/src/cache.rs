//! `felix cache get|put|del`.

use std::io::{Read, Write};
use std::time::Duration;

use bytes::Bytes;
use clap::{Args, Subcommand};

use felix_proto::message::{self, Message};

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
    /// Ask the broker `cache_shards` and `shard_owners` for a cache: the count, then one line
    /// per shard (`shard S NODE ADDR generation G`, `-` where none), as a client routes by.
    Shards {
        /// Cache name.
        cache: String,
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
        CacheOp::Shards { conn, cache } => {
            let client = conn.connect().await?;
            let answers = shards(&client, &conn, &cache).await;
            client.close().await;
            let (count, owners) = answers?;
            println!("cache_shards {count}");
            for o in owners {
                println!(
                    "shard {} {} {} generation {}",
                    o.shard,
                    o.node_id.as_deref().unwrap_or("-"),
                    o.addr.as_deref().unwrap_or("-"),
                    o.generation.unwrap_or(0)
                );
            }
            Ok(())
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

/// `cache_shards` and `shard_owners` for `cache`, each on a stream of its own to the broker
/// the client entered by.
async fn shards(
    client: &felix_client::Client,
    conn: &ConnectArgs,
    cache: &str,
) -> Result<(u64, Vec<message::ShardOwner>), Failure> {
    let count = ask(
        client,
        conn.timeout,
        Message::CacheShards(message::CacheShards {
            tenant_id: conn.tenant.clone(),
            namespace: conn.namespace.clone(),
            cache: cache.to_owned(),
            request_id: 1,
        }),
    )
    .await?;
    let Message::CacheShardsView(count) = count else {
        return Err(Failure::Refused(format!("cache_shards answered {count:?}")));
    };
    let owners = ask(
        client,
        conn.timeout,
        Message::ShardOwners(message::ShardOwners {
            tenant_id: conn.tenant.clone(),
            namespace: conn.namespace.clone(),
            name: cache.to_owned(),
            kind: message::ShardKind::Cache,
            request_id: 2,
        }),
    )
    .await?;
    let Message::ShardOwnersView(owners) = owners else {
        return Err(Failure::Refused(format!(
            "shard_owners answered {owners:?}"
        )));
    };
    Ok((count.shards, owners.owners))
}

/// One request on a new authenticated stream, and its answer within `timeout`.
async fn ask(
    client: &felix_client::Client,
    timeout: Duration,
    request: Message,
) -> Result<Message, Failure> {
    let mut raw = client
        .open_raw_stream(true)
        .await
        .map_err(|e| Failure::client("opening a stream", e))?;
    raw.send(request.to_frame().to_bytes())
        .await
        .map_err(|e| Failure::client("sending", e))?;
    let frame = tokio::time::timeout(timeout, raw.recv_frame())
        .await
        .map_err(|_| Failure::Connection(format!("no answer within {timeout:?}")))?
        .map_err(|e| Failure::client("reading the answer", e))?
        .ok_or_else(|| Failure::Connection("the stream ended unanswered".into()))?;
    Message::decode(&frame.payload)
        .map_err(|e| Failure::Connection(format!("an answer that does not decode: {e}")))
}
