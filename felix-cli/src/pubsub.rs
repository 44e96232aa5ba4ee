//! `felix pub` and `felix sub`.

use std::io::Write;
use std::time::Duration;

use bytes::Bytes;
use clap::{Args, ValueEnum};
use felix_client::{Ack, Client, Event, Start, SubscriptionEnd, SubscriptionItem};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

use crate::conn::ConnectArgs;
use crate::failure::Failure;

#[derive(Args, Debug)]
pub(crate) struct PubArgs {
    /// Stream to publish to.
    stream: String,
    /// Messages to publish, as one batch. Without any, each line of stdin is one message.
    #[arg(value_name = "MESSAGE")]
    messages: Vec<String>,
    /// Routing key (picks the shard).
    #[arg(long)]
    key: Option<String>,
    /// Acknowledgement asked of the broker.
    #[arg(long, value_enum, default_value_t = AckArg::PerMessage)]
    ack: AckArg,
    /// Most stdin lines sent in one publish (lines already waiting are batched; a slow
    /// writer gets one publish per line).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// After the acknowledgement, read the message back from its shard at its offset and
    /// fail unless it is there (one message, a durable stream; a deployment's smoke test).
    #[arg(long)]
    read_back: bool,
    #[command(flatten)]
    conn: ConnectArgs,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
#[value(rename_all = "snake_case")]
pub(crate) enum AckArg {
    /// Fire and forget.
    None,
    /// The broker answers once the batch is accepted.
    PerMessage,
    /// The broker answers once for the batch.
    PerBatch,
}

impl From<AckArg> for Ack {
    fn from(a: AckArg) -> Ack {
        match a {
            AckArg::None => Ack::None,
            AckArg::PerMessage => Ack::PerMessage,
            AckArg::PerBatch => Ack::PerBatch,
        }
    }
}

pub(crate) async fn publish(args: PubArgs) -> Result<(), Failure> {
    if args.read_back {
        return publish_and_read_back(&args).await;
    }
    let client = args.conn.connect().await?;
    let result = publish_all(&client, &args).await;
    if result.is_ok() && args.ack == AckArg::None {
        settle_unacked(&client, &args.conn.namespace).await;
    }
    client.close().await;
    result
}

async fn publish_all(client: &Client, args: &PubArgs) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    if !args.messages.is_empty() {
        let payloads = args
            .messages
            .iter()
            .map(|m| Bytes::from(m.clone()))
            .collect();
        return publish_batch(client, args, payloads, &mut out).await;
    }
    // Lines are read by a task of their own so that lines already waiting go out together
    // while a publish is in flight.
    let (tx, mut rx) = mpsc::channel::<Bytes>(args.batch as usize * 4);
    let reader = tokio::spawn(read_lines(tx));
    let mut batch = Vec::with_capacity(args.batch as usize);
    while rx.recv_many(&mut batch, args.batch as usize).await > 0 {
        let payloads = std::mem::take(&mut batch);
        publish_batch(client, args, payloads, &mut out).await?;
    }
    match reader.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Failure::io("reading stdin", e)),
        Err(e) => Err(Failure::Connection(format!("stdin reader: {e}"))),
    }
}

/// Sends each line of stdin (without its line ending) until end of input.
async fn read_lines(tx: mpsc::Sender<Bytes>) -> std::io::Result<()> {
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let mut line = Vec::new();
    loop {
        line.clear();
        if stdin.read_until(b'\n', &mut line).await? == 0 {
            return Ok(());
        }
        if line.last() == Some(&b'\n') {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
        }
        if tx.send(Bytes::copy_from_slice(&line)).await.is_err() {
            // The publisher failed; its error is what gets reported.
            return Ok(());
        }
    }
}

/// Publishes one batch and prints one offset per message when the broker gave one.
async fn publish_batch(
    client: &Client,
    args: &PubArgs,
    payloads: Vec<Bytes>,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let count = payloads.len() as u64;
    let key = args.key.as_ref().map(|k| Bytes::from(k.clone()));
    let first = client
        .publish(
            &args.conn.namespace,
            &args.stream,
            payloads,
            key,
            args.ack.into(),
        )
        .await
        .map_err(|e| Failure::client(&format!("publish to {}", args.stream), e))?;
    if let Some(first) = first {
        for offset in first..first + count {
            writeln!(out, "{offset}").map_err(|e| Failure::io("writing stdout", e))?;
        }
    }
    Ok(())
}

/// `felix pub --read-back`: one message, acknowledged with an offset, then read back from
/// the shard its key routes to (the cluster client learns the stream's width from
/// `shard_owners`, also through one address) and compared. Prints the offset.
async fn publish_and_read_back(args: &PubArgs) -> Result<(), Failure> {
    let [message] = &args.messages[..] else {
        return Err(Failure::usage("--read-back publishes exactly one MESSAGE"));
    };
    if args.ack == AckArg::None {
        return Err(Failure::usage(
            "--read-back needs an acknowledgement (not --ack none)",
        ));
    }
    let mut config = args.conn.client_config()?;
    if config.seeds.is_empty() {
        config.seeds = vec![config.addr];
        config.offer = felix_client::Offer::cluster();
    }
    let client = Client::connect(config)
        .await
        .map_err(|e| Failure::client("cannot connect", e))?;
    let result = read_back(&client, args, message).await;
    client.close().await;
    result
}

async fn read_back(client: &Client, args: &PubArgs, message: &str) -> Result<(), Failure> {
    let (namespace, stream) = (&args.conn.namespace, &args.stream);
    let payload = Bytes::from(message.to_owned());
    let key = args.key.as_ref().map(|k| Bytes::from(k.clone()));
    let offset = client
        .publish(namespace, stream, vec![payload.clone()], key.clone(), args.ack.into())
        .await
        .map_err(|e| Failure::client(&format!("publish to {stream}"), e))?
        .ok_or_else(|| {
            Failure::Refused(format!(
                "{stream} acknowledged without an offset (an in-memory stream): nothing to read back"
            ))
        })?;
    let width = client
        .shard_owners(namespace, stream)
        .await
        .map_err(|e| Failure::client(&format!("shard owners of {stream}"), e))?
        .len() as u32;
    let shard = felix_proto::routing::shard_for_key(
        key.as_deref(),
        width,
        felix_proto::routing::RoutingMapping::Modulo,
    );
    let mut sub = client
        .subscribe_shard(namespace, stream, Start::Offset(offset), Some(shard))
        .await
        .map_err(|e| Failure::client(&format!("subscribe to {stream} shard {shard}"), e))?;
    let item = sub
        .next()
        .await
        .map_err(|e| Failure::client("reading back", e))?;
    match item {
        SubscriptionItem::Event(e) if e.offset == Some(offset) && e.payload == payload => {
            println!("{offset}");
            Ok(())
        }
        SubscriptionItem::Event(e) => Err(Failure::Refused(format!(
            "read back {:?} at offset {:?} of shard {shard}, not the message published at {offset}",
            String::from_utf8_lossy(&e.payload),
            e.offset
        ))),
        SubscriptionItem::End(end) => Err(Failure::Ended(describe_end(&end))),
    }
}

/// Fire-and-forget publishes are only queued on the QUIC stream when `publish` returns, and
/// closing the connection discards whatever is unsent. The client has no flush, so wait for
/// one round trip on the connection (any answer, even a refusal, means earlier packets had
/// their chance) and a moment for the broker to read them.
async fn settle_unacked(client: &Client, namespace: &str) {
    let _ = tokio::time::timeout(
        Duration::from_secs(2),
        client.cache_get(namespace, "felix-cli-flush", "flush"),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[derive(Args, Debug)]
pub(crate) struct SubArgs {
    /// Stream to subscribe to.
    stream: String,
    /// Where to start: earliest, latest, or an offset.
    #[arg(long, default_value = "latest", value_parser = parse_start)]
    from: Start,
    /// Exit after this many events.
    #[arg(long)]
    count: Option<u64>,
    /// Shard to read (streams with several shards).
    #[arg(long)]
    shard: Option<u32>,
    /// Print payloads as hex instead of text.
    #[arg(long)]
    hex: bool,
    #[command(flatten)]
    conn: ConnectArgs,
}

fn parse_start(text: &str) -> Result<Start, String> {
    match text {
        "earliest" => Ok(Start::Earliest),
        "latest" => Ok(Start::Latest),
        offset => offset
            .parse()
            .map(Start::Offset)
            .map_err(|_| format!("{text:?} is not earliest, latest or an offset")),
    }
}

pub(crate) async fn subscribe(args: SubArgs) -> Result<(), Failure> {
    let client = args.conn.connect().await?;
    let result = print_events(&client, &args).await;
    client.close().await;
    result
}

async fn print_events(client: &Client, args: &SubArgs) -> Result<(), Failure> {
    if args.count == Some(0) {
        return Ok(());
    }
    let mut sub = client
        .subscribe_shard(&args.conn.namespace, &args.stream, args.from, args.shard)
        .await
        .map_err(|e| Failure::client(&format!("subscribe to {}", args.stream), e))?;
    // On stderr, so stdout stays events only; scripts and tests wait for this line.
    match sub.start_offset() {
        Some(start) => eprintln!(
            "subscribed to {}/{} (subscription {}, from offset {start})",
            args.conn.namespace,
            args.stream,
            sub.id()
        ),
        None => eprintln!(
            "subscribed to {}/{} (subscription {})",
            args.conn.namespace,
            args.stream,
            sub.id()
        ),
    }
    let mut stop = StopSignal::new()?;
    let mut out = std::io::stdout().lock();
    let mut received = 0u64;
    loop {
        let item = tokio::select! {
            item = sub.next() => item,
            () = stop.wait() => return Ok(()),
        };
        let item = item.map_err(|e| Failure::client("subscription", e))?;
        match item {
            SubscriptionItem::Event(event) => {
                if let Err(e) = write_event(&mut out, &event, args.hex) {
                    // `felix sub | head -3`: the reader has what it wanted.
                    if e.kind() == std::io::ErrorKind::BrokenPipe {
                        return Ok(());
                    }
                    return Err(Failure::io("writing stdout", e));
                }
                received += 1;
                if args.count.is_some_and(|n| received >= n) {
                    return Ok(());
                }
            }
            SubscriptionItem::End(end) => return Err(Failure::Ended(describe_end(&end))),
        }
    }
}

/// `<offset>\t<payload>` when the event has an offset, else the payload alone.
fn write_event(out: &mut impl Write, event: &Event, hex: bool) -> std::io::Result<()> {
    if let Some(offset) = event.offset {
        write!(out, "{offset}\t")?;
    }
    if hex {
        writeln!(out, "{}", hex::encode(&event.payload))
    } else {
        out.write_all(&event.payload)?;
        writeln!(out)
    }
}

fn describe_end(end: &SubscriptionEnd) -> String {
    match end {
        SubscriptionEnd::Lagged { resume_from } => format!(
            "subscription lagged: the broker dropped events; resume with --from {resume_from}"
        ),
        SubscriptionEnd::ShardMoved {
            resume_from,
            node_id,
            addr,
        } => {
            let mut text = String::from("subscription ended: the shard moved");
            if let Some(addr) = addr {
                text.push_str(&format!(" to {addr}"));
            }
            if let Some(node) = node_id {
                text.push_str(&format!(" (node {node})"));
            }
            if let Some(offset) = resume_from {
                text.push_str(&format!("; resume with --from {offset}"));
            }
            text
        }
        SubscriptionEnd::StreamDeleted => "subscription ended: the stream was deleted".into(),
        SubscriptionEnd::Closed => "subscription ended: the broker closed it".into(),
    }
}

/// Ctrl-C (and SIGTERM on unix): stop cleanly, exit 0.
struct StopSignal {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
}

impl StopSignal {
    fn new() -> Result<StopSignal, Failure> {
        Ok(StopSignal {
            #[cfg(unix)]
            term: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .map_err(|e| Failure::io("installing the SIGTERM handler", e))?,
        })
    }

    async fn wait(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = self.term.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_positions() {
        assert_eq!(parse_start("earliest"), Ok(Start::Earliest));
        assert_eq!(parse_start("latest"), Ok(Start::Latest));
        assert_eq!(parse_start("42"), Ok(Start::Offset(42)));
        assert!(parse_start("-1").is_err());
        assert!(parse_start("soon").is_err());
    }

    #[test]
    fn events_print_with_offsets_when_present() {
        let mut out = Vec::new();
        let event = Event {
            payload: Bytes::from_static(b"hi"),
            offset: Some(7),
        };
        write_event(&mut out, &event, false).unwrap();
        write_event(&mut out, &event, true).unwrap();
        let bare = Event {
            payload: Bytes::from_static(b"\x00\xff"),
            offset: None,
        };
        write_event(&mut out, &bare, true).unwrap();
        assert_eq!(out, b"7\thi\n7\t6869\n00ff\n");
    }

    #[test]
    fn ends_say_how_to_resume() {
        let text = describe_end(&SubscriptionEnd::Lagged { resume_from: 12 });
        assert!(text.contains("--from 12"), "{text}");
        let moved = describe_end(&SubscriptionEnd::ShardMoved {
            resume_from: Some(3),
            node_id: Some("n2".into()),
            addr: Some("10.0.0.2:5000".into()),
        });
        assert!(
            moved.contains("10.0.0.2:5000") && moved.contains("--from 3"),
            "{moved}"
        );
    }
}
