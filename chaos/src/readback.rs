//! The end of a fault run, shared by `felix-chaos` and the deployment check: who leads each
//! shard, and every shard read in full from whoever leads it when the read is made.
//!
//! Both tolerate a cluster that is still settling. A node that was cut off or rebuilt may
//! answer `shard_owners` from metadata a generation behind, so every node is asked and the
//! newest generation per shard wins; and a leadership may move between that answer and the
//! read, so each read goes through the SDK's cluster client, seeded with the named leader
//! first, which follows `not_leader` to the shard's leader now.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_client::{Client, ClientConfig, ClientError, Offer};
use felix_proto::message::{self, Message, ShardKind};
use felix_testkit::history::{Read, ShardId};

/// Every shard's leader (node id, client address) and generation.
pub type Owners = BTreeMap<ShardId, ((String, String), u64)>;

/// `named` folded into `merged`, per shard the entry of the newest generation: a node a
/// generation behind cannot name a leader that has since been replaced.
fn keep_newest(merged: &mut Owners, named: Owners) {
    for (shard, (leader, generation)) in named {
        if merged.get(&shard).is_none_or(|(_, g)| *g < generation) {
            merged.insert(shard, (leader, generation));
        }
    }
}

/// Where and how to ask: the cluster's client addresses, credentials and bounds.
#[derive(Clone, Debug)]
pub struct Reader {
    pub addrs: Vec<SocketAddr>,
    pub ca: String,
    pub tenant: String,
    pub token: String,
    pub namespace: String,
    /// Bound on each request, and on each connection attempt.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// Pause between two rounds of asking while the cluster settles.
    pub pause: Duration,
    /// Records asked for per read.
    pub page: u32,
}

impl Reader {
    fn config(&self, seeds: Vec<SocketAddr>) -> ClientConfig {
        let mut config = ClientConfig::with_seeds(
            seeds,
            self.ca.as_bytes().to_vec(),
            &self.tenant,
            &self.token,
        );
        config.request_timeout = self.request_timeout;
        config.connect_timeout = self.connect_timeout;
        config
    }

    /// Every node asked at once, round after round, until their answers together name a
    /// leader for each of `shards` shards of every one of `streams`; per shard the newest
    /// generation any node named. At most `limit`.
    pub async fn owners_everywhere(
        &self,
        streams: &[&str],
        shards: u32,
        limit: Duration,
    ) -> Result<Owners, String> {
        let deadline = Instant::now() + limit;
        let wanted = streams.len() * shards as usize;
        loop {
            let asks: Vec<_> = self
                .addrs
                .iter()
                .map(|&addr| {
                    let (me, streams) = (self.clone(), streams.iter().map(|s| s.to_string()));
                    let streams: Vec<String> = streams.collect();
                    tokio::spawn(async move { (addr, me.owners(addr, &streams).await) })
                })
                .collect();
            let mut merged = Owners::new();
            let mut last = Vec::new();
            for ask in asks {
                match ask
                    .await
                    .map_err(|e| format!("an owners task failed: {e}"))?
                {
                    (_, Ok(named)) => keep_newest(&mut merged, named),
                    (addr, Err(e)) => last.push(format!("{addr}: {e}")),
                }
            }
            if merged.len() == wanted {
                return Ok(merged);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "no leader named for every shard within {limit:?} ({} of {wanted}; {})",
                    merged.len(),
                    last.join("; ")
                ));
            }
            tokio::time::sleep(self.pause).await;
        }
    }

    /// What one node says of `streams`' owners (shards it names no leader for are left out).
    async fn owners(&self, addr: SocketAddr, streams: &[String]) -> Result<Owners, String> {
        let mut config = self.config(vec![addr]);
        config.offer = Offer::reference_client();
        let client = Client::connect(config).await.map_err(|e| e.to_string())?;
        let mut out = Owners::new();
        for (n, stream) in streams.iter().enumerate() {
            let ask = Message::ShardOwners(message::ShardOwners {
                tenant_id: self.tenant.clone(),
                namespace: self.namespace.clone(),
                name: stream.clone(),
                kind: ShardKind::Stream,
                request_id: n as u64 + 1,
            });
            let mut raw = client
                .open_raw_stream(true)
                .await
                .map_err(|e| e.to_string())?;
            raw.send(ask.to_frame().to_bytes())
                .await
                .map_err(|e| e.to_string())?;
            let frame = tokio::time::timeout(self.request_timeout, raw.recv_frame())
                .await
                .map_err(|_| "no shard_owners answer".to_owned())?
                .map_err(|e| e.to_string())?
                .ok_or("the stream ended without an answer")?;
            match Message::decode(&frame.payload).map_err(|e| e.to_string())? {
                Message::ShardOwnersView(v) => {
                    for o in v.owners {
                        if let (Some(node), Some(a), Some(g)) = (o.node_id, o.addr, o.generation) {
                            out.insert(ShardId::new(stream, o.shard as u32), ((node, a), g));
                        }
                    }
                }
                other => return Err(format!("expected shard_owners_view, got {other:?}")),
            }
        }
        client.close().await;
        Ok(out)
    }

    /// Every shard in `owners` read in full from its leader at the time of the read, each
    /// retried until it answers, all within `limit`.
    pub async fn read_back(&self, owners: &Owners, limit: Duration) -> Result<Vec<Read>, String> {
        let deadline = Instant::now() + limit;
        let mut reads = Vec::new();
        for (shard, ((node, addr), _)) in owners {
            let named: SocketAddr = addr
                .parse()
                .map_err(|e| format!("{shard}: leader {node} address {addr:?}: {e}"))?;
            // The named leader first, every node after it: the client follows a redirect
            // from wherever it lands to the shard's leader now.
            let mut seeds = vec![named];
            seeds.extend(self.addrs.iter().filter(|&&a| a != named));
            loop {
                match self.read_shard(seeds.clone(), shard).await {
                    Ok(records) => {
                        reads.push(Read {
                            shard: shard.clone(),
                            records,
                        });
                        break;
                    }
                    Err(e) if Instant::now() >= deadline => {
                        return Err(format!(
                            "{shard}: no full read within {limit:?} (named leader {node}): {e}"
                        ))
                    }
                    Err(_) => tokio::time::sleep(self.pause).await,
                }
            }
        }
        Ok(reads)
    }

    async fn read_shard(
        &self,
        seeds: Vec<SocketAddr>,
        shard: &ShardId,
    ) -> Result<Vec<(u64, Bytes)>, ClientError> {
        let client = Client::connect(self.config(seeds)).await?;
        let mut records = Vec::new();
        let mut from = 0;
        // Bounded: each page moves on by at least one record, and no run writes this many.
        for _ in 0..100_000 {
            let page = client
                .stream_read(
                    &self.namespace,
                    &shard.stream,
                    shard.shard,
                    from,
                    None,
                    Some(self.page),
                )
                .await?;
            if page.records.is_empty() {
                break;
            }
            from = page.next_offset;
            records.extend(page.records.into_iter().map(|r| (r.offset, r.payload)));
        }
        client.close().await;
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(entries: &[(u32, &str, u64)]) -> Owners {
        entries
            .iter()
            .map(|&(shard, node, g)| {
                let leader = (node.to_owned(), format!("{node}:5000"));
                (ShardId::new("s", shard), (leader, g))
            })
            .collect()
    }

    #[test]
    fn the_newest_generation_named_wins_whoever_answers_first() {
        let mut merged = Owners::new();
        // A lagging node answers first: shard 0 at generation 3 under n3.
        keep_newest(&mut merged, owners(&[(0, "n3", 3), (1, "n2", 2)]));
        // An up-to-date one: shard 0 moved to n1 at generation 4; shard 1 is older here.
        keep_newest(
            &mut merged,
            owners(&[(0, "n1", 4), (1, "n3", 1), (2, "n2", 5)]),
        );
        assert_eq!(merged, owners(&[(0, "n1", 4), (1, "n2", 2), (2, "n2", 5)]));
        // The lagging answer again changes nothing.
        keep_newest(&mut merged, owners(&[(0, "n3", 3)]));
        assert_eq!(merged[&ShardId::new("s", 0)].1, 4);
    }
}
