//! A client request forwarded from the node that received it to the shard's leader, and the
//! leader's answer.
//!
//! The forwarding node has authenticated the client and checked its permission; it sends the
//! client's frame untouched, with the identity it authenticated, under the scope it believes
//! current. The leader answers with the frame it would have sent the client, or refuses with a
//! client error code and, when it knows one, a better leader.

use bytes::Bytes;
use felix_proto::ErrorCode;

use crate::error::{PeerDecodeError, PeerEncodeError};
use crate::limits::Limit;
use crate::scope::ShardScope;
use crate::wire::{put_blob, put_string, Body, Reader, Scoped};

#[cfg(feature = "arbitrary")]
use crate::raft::arbitrary_bytes;

/// A client request for a shard this node does not lead. Shard-scoped: a stale generation
/// is refused at decode.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Forward {
    /// Chosen by the forwarding node, unique on the link; the answer carries it back.
    pub forward_id: u64,
    /// The shard and the generation the forwarding node routed by.
    pub scope: ShardScope,
    /// The tenant the client authenticated to.
    pub tenant: String,
    /// The principal the client authenticated as.
    pub principal: String,
    /// One felix-proto client frame, header included, at most
    /// [`crate::limits::MAX_FORWARDED_FRAME_BYTES`]. Opaque here.
    #[cfg_attr(feature = "arbitrary", arbitrary(with = arbitrary_bytes))]
    pub frame: Bytes,
}

impl Scoped for Forward {
    fn scope(&self) -> &ShardScope {
        &self.scope
    }
}

impl Body for Forward {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        out.extend_from_slice(&self.forward_id.to_be_bytes());
        self.scope.encode(out)?;
        put_string(out, &self.tenant, "forward.tenant")?;
        put_string(out, &self.principal, "forward.principal")?;
        put_blob(out, &self.frame, Limit::ForwardedFrame, "forward.frame")
    }

    fn decode(r: &mut Reader<'_>) -> Result<Forward, PeerDecodeError> {
        Ok(Forward {
            forward_id: r.u64("forward.forward_id")?,
            scope: ShardScope::decode(r)?,
            tenant: r.string("forward.tenant")?,
            principal: r.string("forward.principal")?,
            frame: r.blob(Limit::ForwardedFrame, "forward.frame")?,
        })
    }
}

/// The leader's answer to a [`Forward`]: the frame to hand the client.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ForwardAnswer {
    /// The forward this answers.
    pub forward_id: u64,
    /// One felix-proto client frame, header included, at most
    /// [`crate::limits::MAX_FORWARDED_FRAME_BYTES`].
    #[cfg_attr(feature = "arbitrary", arbitrary(with = arbitrary_bytes))]
    pub frame: Bytes,
}

impl Body for ForwardAnswer {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        out.extend_from_slice(&self.forward_id.to_be_bytes());
        put_blob(
            out,
            &self.frame,
            Limit::ForwardedFrame,
            "forward_answer.frame",
        )
    }

    fn decode(r: &mut Reader<'_>) -> Result<ForwardAnswer, PeerDecodeError> {
        Ok(ForwardAnswer {
            forward_id: r.u64("forward_answer.forward_id")?,
            frame: r.blob(Limit::ForwardedFrame, "forward_answer.frame")?,
        })
    }
}

/// Where the refusing node believes the shard is led.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct LeaderHint {
    /// The leader's node id.
    pub node_id: String,
    /// The generation under which it leads.
    pub generation: u64,
}

/// The leader would not serve a [`Forward`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ForwardRefused {
    /// The forward this answers.
    pub forward_id: u64,
    /// The client error code, sent as its binary number: a code only known as a string goes
    /// as `internal` (13), and a number this crate does not know is carried as it came.
    #[cfg_attr(feature = "arbitrary", arbitrary(with = arbitrary_code))]
    pub code: ErrorCode,
    /// A better leader, when the refusing node knows one.
    pub leader: Option<LeaderHint>,
}

#[cfg(feature = "arbitrary")]
fn arbitrary_code(u: &mut arbitrary::Unstructured<'_>) -> arbitrary::Result<ErrorCode> {
    Ok(ErrorCode::from_number(u.arbitrary()?))
}

impl Body for ForwardRefused {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        out.extend_from_slice(&self.forward_id.to_be_bytes());
        out.extend_from_slice(&self.code.number().to_be_bytes());
        match &self.leader {
            None => out.push(0),
            Some(h) => {
                out.push(1);
                put_string(out, &h.node_id, "forward_refused.leader.node_id")?;
                out.extend_from_slice(&h.generation.to_be_bytes());
            }
        }
        Ok(())
    }

    fn decode(r: &mut Reader<'_>) -> Result<ForwardRefused, PeerDecodeError> {
        let forward_id = r.u64("forward_refused.forward_id")?;
        let code = ErrorCode::from_number(r.u16("forward_refused.code")?);
        let leader = if r.bool("forward_refused.leader present")? {
            Some(LeaderHint {
                node_id: r.string("forward_refused.leader.node_id")?,
                generation: r.u64("forward_refused.leader.generation")?,
            })
        } else {
            None
        };
        Ok(ForwardRefused {
            forward_id,
            code,
            leader,
        })
    }
}
