//! What a node does with a client request, given who leads the request's shard.
//!
//! The two paths chose opposite answers on purpose, as the client expects
//! (`peer-client-cluster-wire.md`): writes that any node may accept are *forwarded* (a publish
//! never fails because it reached the wrong node), while readers and leader-only operations are
//! *redirected* (served locally they would look like a quiet stream; forwarded, an idempotent
//! or conditional write could reach the leader twice through two nodes).

use crate::ids::NodeId;

/// A request, by how it may be routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    /// `publish`, binary batches of every ack mode, keyed or not.
    Publish,
    /// `cache_get`, `cache_put`, `cache_delete`, `counter_add`, `counter_get` and the
    /// conditional cache writes.
    CacheOp,
    /// `subscribe`, on any shard.
    Subscribe,
    /// `cache_watch`.
    CacheWatch,
    /// Every consumer-group request: only the shard's leader holds its groups.
    Group,
    /// `commit`, `publish_if`, `publish_idempotent`, `state_get`, `stream_read`,
    /// `offset_for_time`: answered only by the leader, never forwarded.
    LeaderOnly,
}

/// Who serves a shard, as this node's metadata says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// This node leads it and serves it now.
    Local,
    /// Another node leads it at `generation`; `addr` is its client-facing address, when known.
    Remote {
        node: NodeId,
        addr: Option<String>,
        generation: u64,
    },
    /// Nobody leads it (no qualifying replica, or not placed yet).
    Unassigned,
    /// A `leader` shard whose leader is down and may hold acknowledged records no other
    /// replica has: nobody serves it until that node is back.
    Awaiting { node: NodeId },
}

/// `shard_unavailable`'s `detail.reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// No node leads the shard.
    NotAssigned,
    /// Its leader is down and no other replica is known to hold all it acknowledged.
    AwaitingLeader,
}

impl Unavailable {
    pub fn reason(self) -> &'static str {
        match self {
            Unavailable::NotAssigned => "not_assigned",
            Unavailable::AwaitingLeader => "awaiting_leader",
        }
    }
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Serve it here.
    Serve,
    /// Send it to `to` and relay the answer, in the client stream's order.
    Forward { to: NodeId },
    /// Answer the `not_leader` message naming the owner.
    Redirect {
        node: NodeId,
        addr: Option<String>,
        generation: u64,
    },
    /// Answer an `error` with code `not_leader` (class `redirect`) naming the owner in prose:
    /// the client did not offer `FEATURE_REDIRECT`.
    NotLeaderError { node: NodeId },
    /// Answer `shard_unavailable` (class `retry`).
    Unavailable(Unavailable),
}

/// Routes one request. `client_redirect` says the client offered `FEATURE_REDIRECT`.
pub fn route(class: RequestClass, owner: &Owner, client_redirect: bool) -> Route {
    match owner {
        Owner::Local => Route::Serve,
        Owner::Unassigned => Route::Unavailable(Unavailable::NotAssigned),
        Owner::Awaiting { .. } => Route::Unavailable(Unavailable::AwaitingLeader),
        Owner::Remote {
            node,
            addr,
            generation,
        } => match class {
            RequestClass::Publish | RequestClass::CacheOp => Route::Forward { to: node.clone() },
            RequestClass::Subscribe
            | RequestClass::CacheWatch
            | RequestClass::Group
            | RequestClass::LeaderOnly => {
                if client_redirect {
                    Route::Redirect {
                        node: node.clone(),
                        addr: addr.clone(),
                        generation: *generation,
                    }
                } else {
                    Route::NotLeaderError { node: node.clone() }
                }
            }
        },
    }
}

/// What the node a request was forwarded to does with it, by its own metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardVerdict {
    /// Serve it: this node leads the shard at the generation it was routed by (or a later
    /// one this node has not applied yet).
    Serve,
    /// Hold it until this node's metadata catches up: the shard is not placed here yet, or
    /// this node knows it only at an older generation than the forwarding node did.
    AwaitMetadata,
    /// Refuse it `not_leader` (not applied): another node leads the shard as far as both
    /// nodes know.
    NotLeader,
    /// Refuse it `not_leader` (not applied): this node leads the shard, but at a later
    /// generation than the one the request was routed by. A generation changes only with
    /// its leader, so another node led the shard in between, and the forwarding client
    /// session may have had its later requests served there; applied now, this one would
    /// land after them and reorder the session's writes.
    Outdated,
}

/// Judges a forward routed at generation `routed` against this node's view of the shard:
/// `owner` and the shard's `current` generation (`None` when not placed here).
pub fn judge_forward(owner: &Owner, current: Option<u64>, routed: u64) -> ForwardVerdict {
    match (owner, current) {
        (Owner::Local, Some(g)) if g > routed => ForwardVerdict::Outdated,
        (Owner::Local, _) => ForwardVerdict::Serve,
        (Owner::Remote { generation, .. }, _) if *generation < routed => {
            ForwardVerdict::AwaitMetadata
        }
        (Owner::Remote { .. }, _) => ForwardVerdict::NotLeader,
        (Owner::Unassigned | Owner::Awaiting { .. }, _) => ForwardVerdict::AwaitMetadata,
    }
}

/// The shard of a cache of `shards` shards that item `key` lives on: the protocol's key → shard
/// function (FNV-1a and the splitmix64 finalizer, modulo the count; routing.md), the very one
/// the real client applies to a cache key before it sends a `cache_get` or `cache_put` to the
/// owner `shard_owners` named. A cache has no per-cache mapping on the wire (`cache_shards`
/// carries none), so it is always the default, modulo, whatever a broker's streams use.
pub fn cache_shard(key: &[u8], shards: u32) -> u32 {
    felix_proto::routing::shard_for_key(
        Some(key),
        shards,
        felix_proto::routing::RoutingMapping::Modulo,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// routing.md's vector table, modulo column (key; its shard over 2, 3, 4, 8, 16), and
    /// one and zero shards: every key on shard 0.
    #[test]
    fn cache_keys_hash_as_the_protocol_vectors_say() {
        let vectors: [(&[u8], [u32; 5]); 5] = [
            (b"", [1, 0, 3, 3, 11]),
            (b"a", [0, 1, 0, 0, 8]),
            (b"user-42", [1, 1, 3, 3, 3]),
            (b"k1", [0, 1, 2, 6, 6]),
            (b"orders/123", [1, 0, 1, 5, 13]),
        ];
        let mut got = Vec::new();
        for (key, _) in &vectors {
            let row: Vec<u32> = [2, 3, 4, 8, 16]
                .iter()
                .map(|&n| cache_shard(key, n))
                .collect();
            got.push(row);
        }
        let want: Vec<Vec<u32>> = vectors.iter().map(|(_, w)| w.to_vec()).collect();
        assert_eq!(got, want);
        for (key, _) in &vectors {
            assert_eq!((cache_shard(key, 1), cache_shard(key, 0)), (0, 0));
        }
        // The keys the interop and chaos tests write, over 4 shards: all four shards used.
        let four: Vec<u32> = (0..8)
            .map(|i| cache_shard(format!("key-{i}").as_bytes(), 4))
            .collect();
        assert_eq!(four, [3, 2, 2, 2, 0, 1, 2, 0]);
    }

    const CLASSES: [RequestClass; 6] = [
        RequestClass::Publish,
        RequestClass::CacheOp,
        RequestClass::Subscribe,
        RequestClass::CacheWatch,
        RequestClass::Group,
        RequestClass::LeaderOnly,
    ];

    fn remote() -> Owner {
        Owner::Remote {
            node: NodeId::new("n2"),
            addr: Some("127.0.0.1:5002".into()),
            generation: 7,
        }
    }

    /// Every class against every owner view, with and without FEATURE_REDIRECT, as one table of
    /// exact outputs.
    #[test]
    fn every_class_every_owner() {
        let mut got = String::new();
        for owner in [Owner::Local, remote(), Owner::Unassigned] {
            for class in CLASSES {
                for redirect in [true, false] {
                    got.push_str(&format!(
                        "{:?} {class:?} redirect={redirect} -> {:?}\n",
                        match &owner {
                            Owner::Local => "local",
                            Owner::Remote { .. } => "remote",
                            Owner::Unassigned => "unassigned",
                            Owner::Awaiting { .. } => "awaiting",
                        },
                        route(class, &owner, redirect)
                    ));
                }
            }
        }
        let fwd = r#"Forward { to: n2 }"#;
        let redirect = r#"Redirect { node: n2, addr: Some("127.0.0.1:5002"), generation: 7 }"#;
        let err = r#"NotLeaderError { node: n2 }"#;
        let unavailable = "Unavailable(NotAssigned)";
        let mut want = String::new();
        for (owner, per_class) in [
            ("local", [["Serve", "Serve"]; 6]),
            (
                "remote",
                [
                    [fwd, fwd],
                    [fwd, fwd],
                    [redirect, err],
                    [redirect, err],
                    [redirect, err],
                    [redirect, err],
                ],
            ),
            ("unassigned", [[unavailable, unavailable]; 6]),
        ] {
            for (class, answers) in CLASSES.iter().zip(per_class) {
                for (redirect, answer) in [true, false].into_iter().zip(answers) {
                    want.push_str(&format!(
                        "{owner:?} {class:?} redirect={redirect} -> {answer}\n"
                    ));
                }
            }
        }
        assert_eq!(got, want);
    }

    #[test]
    fn a_redirect_keeps_a_missing_address_missing() {
        let owner = Owner::Remote {
            node: NodeId::new("n3"),
            addr: None,
            generation: 1,
        };
        assert_eq!(
            route(RequestClass::Subscribe, &owner, true),
            Route::Redirect {
                node: NodeId::new("n3"),
                addr: None,
                generation: 1
            }
        );
        assert_eq!(Unavailable::NotAssigned.reason(), "not_assigned");
    }

    /// A forward against every view the receiving node may hold of its shard, as one table of
    /// exact outputs: led here at an older, the same or a newer generation than it was routed
    /// by; led elsewhere at an older, the same or a newer one; not placed.
    #[test]
    fn a_forward_is_served_only_by_its_routed_leadership_or_a_newer_view_of_it() {
        let elsewhere = |generation| Owner::Remote {
            node: NodeId::new("n3"),
            addr: None,
            generation,
        };
        let routed = 5;
        let got: Vec<(&str, ForwardVerdict)> = vec![
            (
                "led here at 4",
                judge_forward(&Owner::Local, Some(4), routed),
            ),
            (
                "led here at 5",
                judge_forward(&Owner::Local, Some(5), routed),
            ),
            (
                "led here at 6",
                judge_forward(&Owner::Local, Some(6), routed),
            ),
            (
                "led elsewhere at 4",
                judge_forward(&elsewhere(4), Some(4), routed),
            ),
            (
                "led elsewhere at 5",
                judge_forward(&elsewhere(5), Some(5), routed),
            ),
            (
                "led elsewhere at 6",
                judge_forward(&elsewhere(6), Some(6), routed),
            ),
            (
                "not placed",
                judge_forward(&Owner::Unassigned, None, routed),
            ),
        ];
        use ForwardVerdict::*;
        let want = vec![
            ("led here at 4", Serve),
            ("led here at 5", Serve),
            ("led here at 6", Outdated),
            ("led elsewhere at 4", AwaitMetadata),
            ("led elsewhere at 5", NotLeader),
            ("led elsewhere at 6", NotLeader),
            ("not placed", AwaitMetadata),
        ];
        assert_eq!(got, want);
    }
}
