//! `--wipe-disks` kept within the fault model: a replicated shard may lose a minority of its
//! copies at a time. A copy on a replaced disk counts again only once the shard's leader has
//! rebuilt it and the control plane records it on the new disk (`Command::RecordCopy`); until
//! then fences and promotions treat it as lost. With three copies a minority is one, so the
//! rule is: a node's disk may be replaced only while every other copy of every shard that
//! node holds is recorded on the disk its own node has now. A second wipe earlier would leave
//! the shard two lost copies out of three, which no fence can get past, and the shard would
//! rightly stay dark (seeds 1601, 3705, 5539 before this rule, docs/replication.md).
//!
//! What the node has now is read from its disk, not from the metadata: a node back on a new
//! disk shows in the metadata with its old identity until its join is applied, and a node
//! still down has no view at all. A shard with one copy never blocks a wipe (no other copy),
//! which is what the single-copy runs and the cache expect.

use std::collections::BTreeMap;

use felix_cluster::meta::Metadata;

use crate::disk::MemFs;

/// Where the engine keeps its disk's identity: 32 hex digits and a newline, the `storage_id`
/// the node joins with (felix-engine `cluster/metalog.rs`, `IDENTITY`).
const IDENTITY: &str = "cluster/storage.id";

/// The storage identity written on `disk`, if any: none on a disk just replaced, until the
/// restarted engine writes its new one.
pub(super) fn identity(disk: &MemFs) -> Option<String> {
    let bytes = disk.file(IDENTITY)?;
    let text = std::str::from_utf8(bytes).ok()?.strip_suffix('\n')?;
    Some(text.to_owned())
}

/// Why `node`'s disk must not be replaced now, by the metadata `meta` and each node's disk
/// identity in `disks`: the first shard `node` holds whose copy on another node is not
/// recorded on that node's current disk. `None`: the wipe keeps every shard within a minority.
pub(super) fn wipe_blocker(
    meta: &Metadata,
    node: &str,
    disks: &BTreeMap<String, Option<String>>,
) -> Option<String> {
    let streams = meta.streams.iter().map(|(k, s)| ("stream", k, &s.shards));
    let caches = meta.caches.iter().map(|(k, c)| ("cache", k, &c.shards));
    for (kind, key, shards) in streams.chain(caches) {
        for (i, shard) in shards.iter().enumerate() {
            if !shard.replicas.iter().any(|r| r.as_str() == node) {
                continue;
            }
            for other in shard.replicas.iter().filter(|r| r.as_str() != node) {
                let disk = disks.get(other.as_str()).and_then(|d| d.as_deref());
                if disk.is_none() || shard.storage_of(other) != disk {
                    return Some(format!(
                        "{other}'s current disk is not yet recorded for {kind}:{key} shard {i}"
                    ));
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_cluster::meta::{Command, Consistency, ObjectKey, StreamSpec};
    use felix_cluster::NodeId;

    const NODES: [&str; 4] = ["n1", "n2", "n3", "n4"];
    const DISKS: [&str; 4] = ["d1", "d2", "d3", "d4"];

    /// Every node's disk as joined, except `gone`'s, replaced and not yet written.
    fn disks(gone: Option<&str>) -> BTreeMap<String, Option<String>> {
        NODES
            .iter()
            .zip(DISKS)
            .map(|(n, d)| (n.to_string(), (Some(*n) != gone).then(|| d.to_owned())))
            .collect()
    }

    #[test]
    fn a_second_copy_of_a_shard_is_not_wiped_before_the_first_is_recorded() {
        let mut meta = Metadata::new(NODES.iter().map(|n| NodeId::new(*n)).collect());
        let mut index = 0;
        let mut apply = |meta: &mut Metadata, cmd: Command| {
            index += 1;
            meta.apply_entry(index, &cmd.encode());
        };
        for (n, d) in NODES.iter().zip(DISKS) {
            let join = Command::Join {
                node: NodeId::new(*n),
                client_addr: None,
                storage_id: d.into(),
                durable: true,
            };
            apply(&mut meta, join);
        }
        let key = ObjectKey::new("t", "ns", "s");
        let spec = StreamSpec {
            shards: 1,
            replication_factor: 3,
            consistency: Consistency::Quorum,
            retention: Default::default(),
            durable: true,
        };
        apply(
            &mut meta,
            Command::CreateStream {
                key: key.clone(),
                spec,
            },
        );
        let holders: Vec<String> = meta.streams[&key].shards[0]
            .replicas
            .iter()
            .map(|r| r.0.clone())
            .collect();
        let outsider = *NODES
            .iter()
            .find(|n| !holders.contains(&n.to_string()))
            .unwrap();
        let (a, b) = (holders[0].as_str(), holders[1].as_str());
        // Every copy recorded: any disk may go.
        assert_eq!(wipe_blocker(&meta, a, &disks(None)), None);
        // `a`'s disk is gone: no other holder of the shard may lose its disk; the outsider may.
        assert!(wipe_blocker(&meta, b, &disks(Some(a))).is_some());
        assert_eq!(wipe_blocker(&meta, outsider, &disks(Some(a))), None);
        // `a` may lose its new disk too: the shard still misses one copy.
        assert_eq!(wipe_blocker(&meta, a, &disks(Some(a))), None);
        // `a` back on a new disk that joined: still not recorded for the shard until rebuilt.
        let mut back = disks(None);
        back.insert(a.to_owned(), Some("e1".into()));
        let rejoin = Command::Join {
            node: NodeId::new(a),
            client_addr: None,
            storage_id: "e1".into(),
            durable: true,
        };
        apply(&mut meta, rejoin);
        assert!(wipe_blocker(&meta, b, &back).is_some());
        let record = Command::RecordCopy {
            shard: meta.shards().next().unwrap().0,
            generation: 1,
            node: NodeId::new(a),
            storage_id: "e1".into(),
        };
        apply(&mut meta, record);
        assert_eq!(wipe_blocker(&meta, b, &back), None);
    }
}
