//! The first exchange on a peer link: who is calling, and whether the answering node accepts.
//!
//! The dialer sends [`Hello`]; the answering node replies with its own [`Hello`] as
//! `HelloAck`, or with [`HelloRefused`] and closes the link. Nothing else is sent before the
//! ack. Under mTLS the engine also checks that `node_id` is the one the certificate names:
//! peers are known by their handshake, never by a datagram's source address.

use crate::error::{PeerDecodeError, PeerEncodeError};
use crate::wire::{put_string, Body, Reader};

/// The peer protocol version this crate speaks, sent in every hello.
pub const PEER_PROTOCOL_VERSION: u16 = 1;

/// A node's identity, sent by the dialer (`Hello`) and echoed by the answering node with its
/// own values (`HelloAck`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Hello {
    /// The cluster the node belongs to; a different one is refused.
    pub cluster_id: String,
    /// The node's id (`FELIX_NODE_ID`).
    pub node_id: String,
    /// The peer protocol version the node speaks ([`PEER_PROTOCOL_VERSION`]).
    pub protocol_version: u16,
    /// The identity of the node's disk, minted when its data directory is created: a node
    /// whose disk was emptied comes back with a new one, so its peers can tell it has lost
    /// its log and must not vote until it has caught up.
    pub storage_id: [u8; 16],
    /// Bumped by the node at every start, so a peer can tell a restart from a reconnect.
    pub incarnation: u64,
}

impl Body for Hello {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        put_string(out, &self.cluster_id, "hello.cluster_id")?;
        put_string(out, &self.node_id, "hello.node_id")?;
        out.extend_from_slice(&self.protocol_version.to_be_bytes());
        out.extend_from_slice(&self.storage_id);
        out.extend_from_slice(&self.incarnation.to_be_bytes());
        Ok(())
    }

    fn decode(r: &mut Reader<'_>) -> Result<Hello, PeerDecodeError> {
        Ok(Hello {
            cluster_id: r.string("hello.cluster_id")?,
            node_id: r.string("hello.node_id")?,
            protocol_version: r.u16("hello.protocol_version")?,
            storage_id: r.array("hello.storage_id")?,
            incarnation: r.u64("hello.incarnation")?,
        })
    }
}

/// Why a hello was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum HelloRefusal {
    /// The dialer names another cluster (wire 1).
    WrongCluster,
    /// The dialer's node id is not a member (wire 2).
    UnknownNode,
    /// The answering node does not speak the dialer's protocol version (wire 3).
    UnsupportedVersion,
    /// The node id is not the one the dialer's certificate names (wire 4).
    IdentityMismatch,
}

impl HelloRefusal {
    /// The reason's wire number.
    pub fn number(self) -> u8 {
        match self {
            HelloRefusal::WrongCluster => 1,
            HelloRefusal::UnknownNode => 2,
            HelloRefusal::UnsupportedVersion => 3,
            HelloRefusal::IdentityMismatch => 4,
        }
    }

    /// The reason for a wire number; `None` for a number this crate does not know.
    pub fn from_number(n: u8) -> Option<HelloRefusal> {
        match n {
            1 => Some(HelloRefusal::WrongCluster),
            2 => Some(HelloRefusal::UnknownNode),
            3 => Some(HelloRefusal::UnsupportedVersion),
            4 => Some(HelloRefusal::IdentityMismatch),
            _ => None,
        }
    }
}

/// The answering node's refusal, with its own identity so the dialer's log says who refused
/// and what it speaks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct HelloRefused {
    /// Why.
    pub reason: HelloRefusal,
    /// The answering node's cluster.
    pub cluster_id: String,
    /// The answering node's id.
    pub node_id: String,
    /// The highest protocol version the answering node speaks.
    pub protocol_version: u16,
}

impl Body for HelloRefused {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), PeerEncodeError> {
        out.push(self.reason.number());
        put_string(out, &self.cluster_id, "hello_refused.cluster_id")?;
        put_string(out, &self.node_id, "hello_refused.node_id")?;
        out.extend_from_slice(&self.protocol_version.to_be_bytes());
        Ok(())
    }

    fn decode(r: &mut Reader<'_>) -> Result<HelloRefused, PeerDecodeError> {
        let raw = r.u8("hello_refused.reason")?;
        let reason = HelloRefusal::from_number(raw).ok_or(PeerDecodeError::InvalidValue {
            field: "hello_refused.reason",
            value: raw.into(),
        })?;
        Ok(HelloRefused {
            reason,
            cluster_id: r.string("hello_refused.cluster_id")?,
            node_id: r.string("hello_refused.node_id")?,
            protocol_version: r.u16("hello_refused.protocol_version")?,
        })
    }
}
