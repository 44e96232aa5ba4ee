//! `felix admin streams create|alter|get|list|delete`: streams through the admin API on a node's ops
//! endpoint (`/v1/streams`, docs/operations.md). Human tables by default, the API's JSON with
//! `--json`. Exit codes: 0 done, 2 usage, 3 the broker refused (a 4xx: bad spec, token,
//! permission, no such stream, a conflicting spec), 4 no answer or a 5xx (retryable: no
//! control-plane majority, not placed in time).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Value};

use crate::failure::Failure;

/// How long the CLI waits for an answer: past the server's create timeout (15 s).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Args)]
pub(crate) struct StreamsArgs {
    #[command(subcommand)]
    command: StreamsCommand,
}

#[derive(Args, Clone)]
struct Common {
    /// Ops endpoints (FELIX_METRICS_BIND) to ask, HOST:PORT, comma-separated; the first that
    /// answers does (any node will) [env: FELIX_ADDRS]
    #[arg(long, env = "FELIX_ADDRS", value_delimiter = ',', required = true)]
    broker: Vec<String>,
    /// The cluster's CA. The ops endpoint is plain HTTP on the operators' network, so it is
    /// only checked to exist [env: FELIX_CA]
    #[arg(long, env = "FELIX_CA")]
    ca: Option<PathBuf>,
    /// A Felix token for the stream's tenant: `stream.manage` to create, `stream.view` (or
    /// `stream.manage`) to read [env: FELIX_TOKEN]
    #[arg(long, env = "FELIX_TOKEN", hide_env_values = true)]
    token: String,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct CachesArgs {
    #[command(subcommand)]
    command: CachesCommand,
}

#[derive(Subcommand)]
enum CachesCommand {
    /// Create a cache (`--shards`, default 1: its keys hash over them), answered once every
    /// shard has a live leader.
    Create(CacheCreateArgs),
    /// Show one cache: its spec, and each shard's leader, replicas and generation.
    Get(NameArgs),
    /// List the token's tenant's caches.
    List(ListArgs),
    /// Delete a cache on every node (its values, counters and watches).
    Delete(NameArgs),
}

#[derive(Args)]
struct CacheCreateArgs {
    #[command(flatten)]
    common: Common,
    tenant: String,
    namespace: String,
    cache: String,
    #[arg(long, default_value_t = 1)]
    shards: u32,
    #[arg(long, visible_alias = "rf")]
    replication_factor: u8,
}

/// `felix admin caches …`.
pub(crate) fn run_caches(args: CachesArgs) -> Result<(), Failure> {
    let (common, method, path, body, verb) = match args.command {
        CachesCommand::Create(a) => {
            let body = json!({
                "tenant": a.tenant,
                "namespace": a.namespace,
                "cache": a.cache,
                "shards": a.shards,
                "replication_factor": a.replication_factor,
            });
            (a.common, "POST", "/v1/caches".to_owned(), Some(body), true)
        }
        CachesCommand::Get(a) => {
            let path = format!("/v1/caches/{}/{}/{}", a.tenant, a.namespace, a.stream);
            (a.common, "GET", path, None, false)
        }
        CachesCommand::List(a) => (a.common, "GET", "/v1/caches".to_owned(), None, false),
        CachesCommand::Delete(a) => {
            let path = format!("/v1/caches/{}/{}/{}", a.tenant, a.namespace, a.stream);
            call(&a.common, "DELETE", &path, None)?;
            if a.common.json {
                let v = json!({"tenant": a.tenant, "namespace": a.namespace,
                    "cache": a.stream, "deleted": true});
                println!("{v}");
            } else {
                println!("deleted: {}/{}/{}", a.tenant, a.namespace, a.stream);
            }
            return Ok(());
        }
    };
    let (status, v) = call(&common, method, &path, body.as_ref())?;
    if common.json {
        println!("{v}");
        return Ok(());
    }
    let one = |v: &Value| {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("?").to_owned();
        let mut out = format!(
            "cache               {}/{}/{}\nshards              {}\nreplication_factor  {}\n\n",
            s("tenant"),
            s("namespace"),
            s("cache"),
            opt(v["spec"].get("shards")),
            opt(v["spec"].get("replication_factor")),
        );
        out.push_str(&shard_lines(v));
        out
    };
    match v.get("caches").and_then(Value::as_array) {
        Some(caches) => {
            for c in caches {
                print!("{}", one(c));
            }
        }
        None => {
            if verb {
                println!("{}", if status == 201 { "created" } else { "exists" });
            }
            print!("{}", one(&v));
        }
    }
    Ok(())
}

#[derive(Subcommand)]
enum StreamsCommand {
    /// Create a stream (answered once every shard has a live leader); repeating the same
    /// create is safe, one with another spec is refused naming the field.
    Create(CreateArgs),
    /// Change a stream's retention (shards, consistency and durable are fixed for its life;
    /// the replication factor cannot change yet).
    Alter(AlterArgs),
    /// Show one stream: its spec, and each shard's leader, replicas and generation.
    Get(NameArgs),
    /// List the token's tenant's streams.
    List(ListArgs),
    /// Delete a stream on every node (its records, copies and subscriptions); answered once
    /// the cluster recorded it and the asked node removed its copies. Safe to repeat: a
    /// stream already gone is refused as unknown (exit 3).
    Delete(NameArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum ConsistencyArg {
    Leader,
    Quorum,
}

#[derive(Args)]
struct CreateArgs {
    #[command(flatten)]
    common: Common,
    tenant: String,
    namespace: String,
    stream: String,
    #[arg(long)]
    shards: u32,
    #[arg(long, visible_alias = "rf")]
    replication_factor: u8,
    #[arg(long, value_enum, default_value = "leader")]
    consistency: ConsistencyArg,
    /// Keep records this long (default: the broker-wide setting).
    #[arg(long)]
    max_age_seconds: Option<u64>,
    /// Keep at most this many bytes per shard (default: the broker-wide setting).
    #[arg(long)]
    max_bytes: Option<u64>,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    durable: bool,
}

#[derive(Args)]
struct AlterArgs {
    #[command(flatten)]
    common: Common,
    tenant: String,
    namespace: String,
    stream: String,
    /// Keep records this long; `none` for the broker-wide setting.
    #[arg(long)]
    max_age_seconds: Option<String>,
    /// Keep at most this many bytes per shard; `none` for the broker-wide setting.
    #[arg(long)]
    max_bytes: Option<String>,
    /// Asks for another replication factor (refused until replica sets change online).
    #[arg(long, visible_alias = "rf")]
    replication_factor: Option<u8>,
}

/// `N` or `none` (JSON `null`: the broker-wide setting).
fn limit(flag: &str, v: &str) -> Result<Value, Failure> {
    if v == "none" {
        return Ok(Value::Null);
    }
    v.parse::<u64>()
        .map(Value::from)
        .map_err(|_| Failure::usage(format!("{flag} {v}: a number of bytes or seconds, or none")))
}

#[derive(Args)]
struct NameArgs {
    #[command(flatten)]
    common: Common,
    tenant: String,
    namespace: String,
    /// The stream's (or cache's) name.
    #[arg(value_name = "NAME")]
    stream: String,
}

#[derive(Args)]
struct ListArgs {
    #[command(flatten)]
    common: Common,
}

pub(crate) fn run(args: StreamsArgs) -> Result<(), Failure> {
    match args.command {
        StreamsCommand::Create(a) => {
            let body = json!({
                "tenant": a.tenant,
                "namespace": a.namespace,
                "stream": a.stream,
                "shards": a.shards,
                "replication_factor": a.replication_factor,
                "consistency": match a.consistency {
                    ConsistencyArg::Leader => "leader",
                    ConsistencyArg::Quorum => "quorum",
                },
                "retention": { "max_age_seconds": a.max_age_seconds, "max_bytes": a.max_bytes },
                "durable": a.durable,
            });
            let (status, v) = call(&a.common, "POST", "/v1/streams", Some(&body))?;
            if a.common.json {
                println!("{v}");
            } else {
                let verb = if status == 201 { "created" } else { "exists" };
                println!("{verb}: {}", name_of(&v));
                print!("{}", stream_table(&v));
            }
            Ok(())
        }
        StreamsCommand::Alter(a) => {
            let mut retention = serde_json::Map::new();
            if let Some(v) = &a.max_age_seconds {
                retention.insert("max_age_seconds".into(), limit("--max-age-seconds", v)?);
            }
            if let Some(v) = &a.max_bytes {
                retention.insert("max_bytes".into(), limit("--max-bytes", v)?);
            }
            let mut body = serde_json::Map::new();
            if !retention.is_empty() {
                body.insert("retention".into(), Value::Object(retention));
            }
            if let Some(rf) = a.replication_factor {
                body.insert("replication_factor".into(), rf.into());
            }
            if body.is_empty() {
                return Err(Failure::usage(
                    "nothing to change: --max-age-seconds, --max-bytes or --replication-factor",
                ));
            }
            let path = format!("/v1/streams/{}/{}/{}", a.tenant, a.namespace, a.stream);
            let (_, v) = call(&a.common, "PATCH", &path, Some(&Value::Object(body)))?;
            if a.common.json {
                println!("{v}");
            } else {
                println!("altered: {}", name_of(&v));
                print!("{}", stream_table(&v));
            }
            Ok(())
        }
        StreamsCommand::Get(a) => {
            let path = format!("/v1/streams/{}/{}/{}", a.tenant, a.namespace, a.stream);
            let (_, v) = call(&a.common, "GET", &path, None)?;
            if a.common.json {
                println!("{v}");
            } else {
                print!("{}", stream_table(&v));
            }
            Ok(())
        }
        StreamsCommand::Delete(a) => {
            let path = format!("/v1/streams/{}/{}/{}", a.tenant, a.namespace, a.stream);
            call(&a.common, "DELETE", &path, None)?;
            let name = format!("{}/{}/{}", a.tenant, a.namespace, a.stream);
            if a.common.json {
                let v = json!({"tenant": a.tenant, "namespace": a.namespace,
                    "stream": a.stream, "deleted": true});
                println!("{v}");
            } else {
                println!("deleted: {name}");
            }
            Ok(())
        }
        StreamsCommand::List(a) => {
            let (_, v) = call(&a.common, "GET", "/v1/streams", None)?;
            if a.common.json {
                println!("{v}");
            } else {
                print!("{}", list_table(&v));
            }
            Ok(())
        }
    }
}

/// Asks each endpoint in turn until one answers; a 2xx is the answer's JSON, a 4xx exit 3,
/// anything else exit 4.
fn call(
    c: &Common,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), Failure> {
    if let Some(ca) = &c.ca {
        std::fs::metadata(ca).map_err(|e| Failure::usage(format!("--ca {}: {e}", ca.display())))?;
    }
    let mut last = Failure::usage("--broker names no endpoint");
    for addr in c.broker.iter().filter(|a| !a.is_empty()) {
        match request(addr, method, path, &c.token, body) {
            Ok((status, text)) => {
                let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
                return match status {
                    200..=299 => Ok((status, v)),
                    400..=499 => Err(Failure::Refused(format!("{status}: {}", error_of(&v)))),
                    _ => Err(Failure::Connection(format!("{status}: {}", error_of(&v)))),
                };
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn error_of(v: &Value) -> String {
    match (v.get("error").and_then(Value::as_str), v.get("field")) {
        (Some(e), Some(Value::String(f))) if !e.starts_with(f.as_str()) => format!("{f}: {e}"),
        (Some(e), _) => e.to_owned(),
        _ => v.to_string(),
    }
}

/// One HTTP/1.1 request; the status and the body of the answer.
fn request(
    addr: &str,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&Value>,
) -> Result<(u16, String), Failure> {
    let sock = addr
        .to_socket_addrs()
        .map_err(|e| Failure::usage(format!("--broker {addr}: {e}")))?
        .next()
        .ok_or_else(|| Failure::usage(format!("--broker {addr}: no address")))?;
    let mut conn = TcpStream::connect_timeout(&sock, Duration::from_secs(5))
        .map_err(|e| Failure::io(addr, e))?;
    conn.set_read_timeout(Some(ANSWER_TIMEOUT))
        .map_err(|e| Failure::io(addr, e))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
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

fn name_of(v: &Value) -> String {
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("?").to_owned();
    format!("{}/{}/{}", s("tenant"), s("namespace"), s("stream"))
}

fn opt(v: Option<&Value>) -> String {
    match v {
        Some(Value::Null) | None => "-".into(),
        Some(x) => x.to_string(),
    }
}

/// One stream: its spec, then a line per shard.
pub(crate) fn stream_table(v: &Value) -> String {
    let spec = &v["spec"];
    let mut out = format!(
        "stream              {}\nshards              {}\nreplication_factor  {}\nconsistency         {}\n\
         retention           max_age_seconds={} max_bytes={}\ndurable             {}\n\n",
        name_of(v),
        opt(spec.get("shards")),
        opt(spec.get("replication_factor")),
        spec["consistency"].as_str().unwrap_or("?"),
        opt(spec["retention"].get("max_age_seconds")),
        opt(spec["retention"].get("max_bytes")),
        opt(spec.get("durable")),
    );
    out.push_str(&shard_lines(v));
    out
}

/// A line per shard: leader, generation, writable, replicas.
fn shard_lines(v: &Value) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<6} {:<12} {:<10} {:<8} {}\n",
        "SHARD", "LEADER", "GENERATION", "WRITABLE", "REPLICAS"
    ));
    for s in v["shards"].as_array().into_iter().flatten() {
        let replicas: Vec<&str> = s["replicas"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        out.push_str(&format!(
            "{:<6} {:<12} {:<10} {:<8} {}\n",
            opt(s.get("shard")),
            s["leader"].as_str().unwrap_or("-"),
            opt(s.get("generation")),
            if s["writable"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            },
            replicas.join(",")
        ));
    }
    out
}

/// Every stream, a line each.
pub(crate) fn list_table(v: &Value) -> String {
    let mut out = format!(
        "{:<40} {:<6} {:<3} {:<11} {}\n",
        "STREAM", "SHARDS", "RF", "CONSISTENCY", "WRITABLE"
    );
    for s in v["streams"].as_array().into_iter().flatten() {
        let shards = s["shards"].as_array().map_or(0, Vec::len);
        let writable = s["shards"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|x| x["writable"].as_bool() == Some(true))
            .count();
        out.push_str(&format!(
            "{:<40} {:<6} {:<3} {:<11} {writable}/{shards}\n",
            name_of(s),
            opt(s["spec"].get("shards")),
            opt(s["spec"].get("replication_factor")),
            s["spec"]["consistency"].as_str().unwrap_or("?"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_show_the_spec_and_each_shard() {
        let v = json!({"tenant":"t1","namespace":"ops","stream":"orders",
            "spec":{"shards":2,"replication_factor":3,"consistency":"quorum",
                "retention":{"max_age_seconds":60,"max_bytes":null},"durable":true},
            "shards":[{"shard":0,"leader":"n1","writable":true,"replicas":["n1","n2","n3"],"generation":1},
                      {"shard":1,"leader":null,"writable":false,"replicas":["n2","n3","n1"],"generation":4}]});
        let t = stream_table(&v);
        assert!(t.starts_with("stream              t1/ops/orders\n"), "{t}");
        assert!(
            t.contains("retention           max_age_seconds=60 max_bytes=-\n"),
            "{t}"
        );
        assert!(
            t.contains("\n0      n1           1          yes      n1,n2,n3\n"),
            "{t}"
        );
        assert!(
            t.contains("\n1      -            4          no       n2,n3,n1\n"),
            "{t}"
        );
        let l = list_table(&json!({ "streams": [v] }));
        assert!(
            l.lines().nth(1).unwrap().starts_with("t1/ops/orders"),
            "{l}"
        );
        assert!(
            l.lines().nth(1).unwrap().ends_with(" quorum      1/2"),
            "{l}"
        );
        assert_eq!(
            error_of(&json!({"error":"0 would keep nothing","field":"retention.max_bytes"})),
            "retention.max_bytes: 0 would keep nothing"
        );
    }
}
