//! The UDP datagrams the runtime hands in and the ones it is asked to send: shared by the
//! client endpoint (`engine/`) and the peer endpoint (`cluster/peers.rs`), so neither reaches
//! into the other for them.

use core::net::{IpAddr, SocketAddr};

use bytes::BytesMut;
pub use quinn_proto::EcnCodepoint;

/// A UDP datagram (or a GRO batch of same-source datagrams) received by the runtime.
#[derive(Debug)]
pub struct Datagram {
    /// Who sent it.
    pub remote: SocketAddr,
    /// The local address it arrived on, when the socket reports it.
    pub local_ip: Option<IpAddr>,
    /// ECN bits it carried.
    pub ecn: Option<EcnCodepoint>,
    /// The bytes: one datagram, or several of `segment_size` bytes each (the last may be
    /// shorter) when the socket coalesced them.
    pub data: BytesMut,
    /// Size of each coalesced datagram; `None` for a single one.
    pub segment_size: Option<usize>,
}

/// Datagrams to send: `size` bytes at the start of the buffer given to
/// [`crate::Engine::poll_output`]. With `segment_size`, the buffer holds several datagrams of that
/// size (the last may be shorter) for one destination, to be sent with GSO or one by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Where to send.
    pub destination: SocketAddr,
    /// ECN bits to set.
    pub ecn: Option<EcnCodepoint>,
    /// Bytes written to the buffer.
    pub size: usize,
    /// The datagram size when the buffer holds more than one.
    pub segment_size: Option<usize>,
    /// The local address to send from, when it matters.
    pub src_ip: Option<IpAddr>,
}

impl Transmit {
    /// quinn-proto's transmit, as the runtime is handed it.
    pub(crate) fn of(t: &quinn_proto::Transmit) -> Transmit {
        Transmit {
            destination: t.destination,
            ecn: t.ecn,
            size: t.size,
            segment_size: t.segment_size,
            src_ip: t.src_ip,
        }
    }
}
