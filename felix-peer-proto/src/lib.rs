//! # felix-peer-proto
//!
//! The messages Felix brokers send each other, as plain data: a hello that identifies each end
//! of a link, raft messages for the cluster's control plane, client requests forwarded to a
//! shard's leader with their answers, and the replication of a shard's log between its
//! replicas with the leases that let a node lead. Sans-IO: no sockets, no clock, no files;
//! bytes in, values out. Links are QUIC connections between brokers with ALPN [`ALPN`]
//! (`felix-peer/1`), one frame after another on their streams.
//!
//! - [`frame`]: the 10-byte header and [`PeerFrameDecoder`], which refuses an unknown kind or
//!   an oversized body on the header alone.
//! - [`KIND_TABLE`]: every message kind, declared once with its code, name, family and
//!   whether it is shard-scoped. [`PeerKind`], [`PeerMessage`] and the dispatch are generated
//!   from it; nothing else lists kinds.
//! - One module per family: [`hello`], [`raft`], [`forward`], [`replication`]; [`scope`] for the
//!   `(cluster, shard, generation)` every shard-scoped message carries.
//! - [`limits`]: every bound on a length or count, named.
//!
//! Encoding is big-endian, fixed-width, and canonical: each value has exactly one encoding
//! (bools and presence bytes are 0 or 1, nothing else), so a decoded frame re-encodes to the
//! same bytes. Nothing is recursive, every length is checked against its limit before the
//! bytes behind it are read, and a count is checked against the bytes left before a vector is
//! sized from it. Decoding never panics.
//!
//! **Why raft messages are not protobuf on the wire.** raft-rs 0.7.0 depends on rust-protobuf
//! 2, whose parser can be driven into unbounded recursion by crafted nested messages
//! (RUSTSEC-2024-0437). Peers are authenticated, but a compromised or buggy peer must still
//! not be able to crash a node. So raft messages cross the wire only as [`RaftMessage`]:
//! flat structs with this crate's bounded, non-recursive encoding, converted to and from
//! `eraftpb::Message` in felix-cluster. No protobuf parser ever sees peer bytes, and this
//! crate depends on neither raft nor protobuf.
//!
//! **Stale generations are refused at decode.** A shard-scoped kind decodes only against a
//! [`GenerationView`], the receiver's current generation per shard: an older generation is
//! [`PeerDecodeError::StaleGeneration`], an unknown shard [`PeerDecodeError::UnknownShard`].
//! The other kinds ignore the view.

pub mod error;
pub mod forward;
pub mod frame;
pub mod hello;
pub mod limits;
pub mod raft;
pub mod replication;
pub mod scope;
mod wire;

#[cfg(feature = "fuzzing")]
pub mod fuzzing;

use bytes::Bytes;

pub use error::{PeerDecodeError, PeerEncodeError};
pub use forward::{Forward, ForwardAnswer, ForwardRefused, LeaderHint};
pub use frame::{PeerFrame, PeerFrameDecoder, PeerHeader, HEADER_LEN};
pub use hello::{Hello, HelloRefusal, HelloRefused, PEER_PROTOCOL_VERSION};
pub use limits::Limit;
pub use raft::{
    RaftConfState, RaftEntry, RaftEntryType, RaftMessage, RaftMessageType, RaftSnapshot,
    RaftSnapshotMetadata,
};
pub use replication::{
    Epoch, Fence, FenceAnswer, Follow, FollowFrom, LeaseGrant, LeaseRenew, LogStart, RefusalReason,
    ReplicaReport, Replicate, ReplicationRefused, TailChunk, TailFetch,
};
pub use scope::{GenerationView, NoShards, ShardId, ShardKind, ShardScope};

use wire::{Body, Reader, Scoped};

/// The ALPN a peer link negotiates. A client connection never offers it, so a broker tells
/// peers from clients by the handshake alone.
pub const ALPN: &[u8] = b"felix-peer/1";

/// A family of kinds: the high byte of every code in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Family {
    /// Link setup ([`hello`]).
    Hello = 0x01,
    /// The control plane ([`raft`]).
    Raft = 0x02,
    /// Forwarded client requests ([`forward`]).
    Forward = 0x03,
    /// Shard log replication and shard leases ([`replication`]).
    Replication = 0x04,
}

/// One row of [`KIND_TABLE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindSpec {
    /// The kind.
    pub kind: PeerKind,
    /// Its code in the frame header.
    pub code: u16,
    /// Its name, for logs and docs.
    pub name: &'static str,
    /// Its family (the code's high byte).
    pub family: Family,
    /// Whether it carries a [`ShardScope`] checked at decode.
    pub shard_scoped: bool,
}

macro_rules! peer_kinds {
    (@scoped scoped) => { true };
    (@scoped unscoped) => { false };
    (@check scoped, $body:expr, $view:expr) => { Scoped::scope($body).check($view)? };
    (@check unscoped, $body:expr, $view:expr) => {};
    (@scope scoped, $body:expr) => { Some(Scoped::scope($body)) };
    (@scope unscoped, $body:expr) => {{ let _ = $body; None }};
    ($( $(#[$doc:meta])* $variant:ident = $code:literal, $name:literal, $family:ident, $body:ty, $scoped:ident; )*) => {
        /// A message kind, numbered by its header code.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum PeerKind {
            $( $(#[$doc])* $variant = $code, )*
        }

        /// Every kind: its code, name, family and whether it is shard-scoped.
        pub const KIND_TABLE: &[KindSpec] = &[
            $( KindSpec {
                kind: PeerKind::$variant,
                code: $code,
                name: $name,
                family: Family::$family,
                shard_scoped: peer_kinds!(@scoped $scoped),
            }, )*
        ];

        // A code's high byte is its family.
        $( const _: () = assert!(($code >> 8) == Family::$family as u16); )*

        impl PeerKind {
            /// The kind a header code names, or `None` for a code not in the table.
            pub fn from_code(code: u16) -> Option<PeerKind> {
                match code {
                    $( $code => Some(PeerKind::$variant), )*
                    _ => None,
                }
            }

            /// The kind's row of [`KIND_TABLE`].
            pub fn spec(self) -> &'static KindSpec {
                match self {
                    $( PeerKind::$variant => &KIND_TABLE[PeerKind::$variant.index()], )*
                }
            }

            fn index(self) -> usize {
                let mut i = 0;
                $( if self == PeerKind::$variant { return i; } i += 1; )*
                i
            }
        }

        /// Any peer message, by kind.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum PeerMessage {
            $( $(#[$doc])* $variant($body), )*
        }

        impl PeerMessage {
            /// The message's kind.
            pub fn kind(&self) -> PeerKind {
                match self {
                    $( PeerMessage::$variant(_) => PeerKind::$variant, )*
                }
            }

            /// The shard a shard-scoped message is about; `None` for the other kinds.
            pub fn scope(&self) -> Option<&ShardScope> {
                match self {
                    $( PeerMessage::$variant(b) => peer_kinds!(@scope $scoped, b), )*
                }
            }

            fn write_body(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
                match self {
                    $( PeerMessage::$variant(b) => Body::encode(b, out), )*
                }
            }

            /// A value of `kind` drawn from `u`, so property tests and fuzzers can cover
            /// every kind without listing them.
            #[cfg(feature = "arbitrary")]
            pub fn arbitrary_of_kind(
                kind: PeerKind,
                u: &mut arbitrary::Unstructured<'_>,
            ) -> arbitrary::Result<PeerMessage> {
                match kind {
                    $( PeerKind::$variant => Ok(PeerMessage::$variant(u.arbitrary()?)), )*
                }
            }
        }

        fn read_body<V: GenerationView + ?Sized>(
            kind: PeerKind,
            r: &mut Reader<'_>,
            view: &V,
        ) -> Result<PeerMessage, PeerDecodeError> {
            match kind {
                $( PeerKind::$variant => {
                    let body = <$body as Body>::decode(r)?;
                    peer_kinds!(@check $scoped, &body, view);
                    Ok(PeerMessage::$variant(body))
                } )*
            }
        }
    };
}

peer_kinds! {
    /// The dialer's identity, first on a link.
    Hello = 0x0101, "hello", Hello, Hello, unscoped;
    /// The answering node's identity: the link is accepted.
    HelloAck = 0x0102, "hello_ack", Hello, Hello, unscoped;
    /// The link is refused, with a reason.
    HelloRefused = 0x0103, "hello_refused", Hello, HelloRefused, unscoped;
    /// One raft message of the control plane.
    Raft = 0x0201, "raft", Raft, RaftMessage, unscoped;
    /// A client request for the shard's leader.
    Forward = 0x0301, "forward", Forward, Forward, scoped;
    /// The leader's answer to a forward.
    ForwardAnswer = 0x0302, "forward_answer", Forward, ForwardAnswer, unscoped;
    /// The leader's refusal of a forward.
    ForwardRefused = 0x0303, "forward_refused", Forward, ForwardRefused, unscoped;
    /// A follower asks to be fed.
    Follow = 0x0401, "follow", Replication, Follow, scoped;
    /// Where the follower cuts its copy and is fed from.
    FollowFrom = 0x0402, "follow_from", Replication, FollowFrom, scoped;
    /// Entries shipped from the leader's log.
    Replicate = 0x0403, "replicate", Replication, Replicate, scoped;
    /// What a follower holds, received and durable.
    ReplicaReport = 0x0404, "replica_report", Replication, ReplicaReport, scoped;
    /// A promoted leader fences a replica at its generation.
    Fence = 0x0405, "fence", Replication, Fence, scoped;
    /// A fenced replica's position.
    FenceAnswer = 0x0406, "fence_answer", Replication, FenceAnswer, scoped;
    /// A promoted leader fetches the most advanced tail.
    TailFetch = 0x0407, "tail_fetch", Replication, TailFetch, scoped;
    /// Entries answering a tail fetch.
    TailChunk = 0x0408, "tail_chunk", Replication, TailChunk, scoped;
    /// A replication message was refused.
    ReplicationRefused = 0x0409, "replication_refused", Replication, ReplicationRefused, scoped;
    /// Where the leader's log starts now: followers cut their copies there.
    LogStart = 0x040a, "log_start", Replication, LogStart, scoped;
    /// A node asks to renew its shard leases.
    LeaseRenew = 0x0481, "lease_renew", Replication, LeaseRenew, unscoped;
    /// The control plane's leader renewed them.
    LeaseGrant = 0x0482, "lease_grant", Replication, LeaseGrant, unscoped;
}

impl PeerKind {
    /// The header code.
    pub fn code(self) -> u16 {
        self as u16
    }

    /// The kind's name.
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// The kind's family.
    pub fn family(self) -> Family {
        self.spec().family
    }

    /// Whether decoding checks a [`ShardScope`] against the caller's view.
    pub fn shard_scoped(self) -> bool {
        self.spec().shard_scoped
    }
}

impl PeerMessage {
    /// Appends the message's body (no header) to `out`. On error nothing is appended.
    pub fn encode_body(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        let start = out.len();
        let result = self.write_body(out);
        if result.is_err() {
            out.truncate(start);
        }
        result
    }
}

/// Appends the message as one frame, header and body, to `out`. A field over its limit, or a
/// body over [`limits::MAX_FRAME_BODY_BYTES`], is refused and nothing is appended.
pub fn encode_frame(msg: &PeerMessage, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_LEN]);
    let body = msg
        .write_body(out)
        .and_then(|()| {
            let len = out.len() - start - HEADER_LEN;
            wire::check(Limit::FrameBody, "body", len).map(|()| len)
        })
        .inspect_err(|_| out.truncate(start))?;
    let header = PeerHeader {
        kind: msg.kind(),
        // At most MAX_FRAME_BODY_BYTES, a u32.
        length: body as u32,
    };
    out[start..start + HEADER_LEN].copy_from_slice(&header.to_bytes());
    Ok(())
}

/// Decodes one body of `kind`. Every byte must belong to the message; shard-scoped kinds are
/// checked against `view` once the whole body has decoded.
pub fn decode_body<V: GenerationView + ?Sized>(
    kind: PeerKind,
    body: &Bytes,
    view: &V,
) -> Result<PeerMessage, PeerDecodeError> {
    if body.len() > limits::MAX_FRAME_BODY_BYTES as usize {
        return Err(PeerDecodeError::FrameTooLarge {
            length: u32::try_from(body.len()).unwrap_or(u32::MAX),
            limit: limits::MAX_FRAME_BODY_BYTES,
        });
    }
    let mut r = Reader::new(body);
    let msg = read_body(kind, &mut r, view)?;
    r.finish()?;
    Ok(msg)
}

/// Decodes exactly one whole frame, header and body, with the protocol's body limit. For a
/// stream of frames use [`PeerFrameDecoder`].
pub fn decode_frame<V: GenerationView + ?Sized>(
    bytes: &Bytes,
    view: &V,
) -> Result<PeerMessage, PeerDecodeError> {
    let Some(raw) = bytes.get(..HEADER_LEN) else {
        return Err(PeerDecodeError::Truncated {
            field: "header",
            needed: HEADER_LEN,
            available: bytes.len(),
        });
    };
    let raw: [u8; HEADER_LEN] = raw.try_into().expect("HEADER_LEN bytes");
    let header = PeerHeader::decode(&raw, limits::MAX_FRAME_BODY_BYTES)?;
    let len = header.length as usize;
    let available = bytes.len() - HEADER_LEN;
    if available < len {
        return Err(PeerDecodeError::Truncated {
            field: "body",
            needed: len,
            available,
        });
    }
    if available > len {
        return Err(PeerDecodeError::TrailingBytes {
            extra: available - len,
        });
    }
    decode_body(header.kind, &bytes.slice(HEADER_LEN..), view)
}
