//! The forwards this node sends to shard leaders (felix-cluster's `forward`), carried to the
//! peers and their ends handed back to the sessions waiting on them; and the forwards other
//! nodes sent here, queued for the engine.

use std::time::Instant;

use felix_cluster::forward::{ForwardEnd, ForwardOutput};
use felix_cluster::NodeId;
use felix_peer_proto::PeerMessage;

use super::{ClusterNode, Inbound};

impl ClusterNode {
    /// A channel number for one client session's forwards (the high half of their ids).
    pub(crate) fn new_channel(&mut self) -> u32 {
        self.forwards.new_channel()
    }

    /// Sends a forward to `to`; with `answer_to`, its answer is owed to that session. A
    /// forward owed an answer takes a place in `to`'s window; with the window full, or
    /// others already waiting, it waits in order (so a session's forwards keep their order).
    pub(crate) fn forward(
        &mut self,
        now: Instant,
        to: &NodeId,
        forward: felix_peer_proto::Forward,
        answer_to: Option<(quinn_proto::ConnectionHandle, quinn_proto::StreamId)>,
    ) {
        self.forwards.forward(now, to, forward, answer_to);
        self.drain_forwards();
        self.pump(now);
    }

    /// Carries out what the forwards decided: messages to peers, ended forwards to the
    /// sessions that wait for them.
    pub(super) fn drain_forwards(&mut self) {
        while let Some(out) = self.forwards.poll_output() {
            match out {
                ForwardOutput::Send { to, forward } => {
                    self.net.send(to.as_str(), &PeerMessage::Forward(forward));
                }
                ForwardOutput::Ended {
                    owner: (ch, stream),
                    forward_id,
                    end,
                } => {
                    let outcome = match end {
                        ForwardEnd::Answered(frame) => ForwardOutcome::Answered(frame),
                        ForwardEnd::Refused { by, refusal } => ForwardOutcome::Refused(
                            refusal.code,
                            format!("{by} refused the forwarded request"),
                        ),
                        ForwardEnd::Unanswered { to, after } => ForwardOutcome::Refused(
                            felix_proto::ErrorCode::Unacknowledged,
                            format!(
                                "no answer from {to} within {after:?}; the request may or may \
                                 not have been applied"
                            ),
                        ),
                        ForwardEnd::NotTaken { to, after } => ForwardOutcome::Refused(
                            felix_proto::ErrorCode::ShardUnavailable,
                            format!(
                                "{to} did not take the forwarded request within {after:?} (its \
                                 forward window stayed full); it was not applied"
                            ),
                        ),
                    };
                    self.done.push_back((ch, stream, forward_id, outcome));
                }
            }
        }
    }

    /// Forwards waiting for a place in a peer's window (all peers).
    pub(crate) fn waiting_forwards(&self) -> usize {
        self.forwards.waiting_forwards()
    }

    /// Registers that a session's channel is being opened on `to` with `open` (its
    /// `auth`), so that the channel can be reopened and closed from here.
    pub(crate) fn channel_opened(
        &mut self,
        channel: u32,
        owner: (quinn_proto::ConnectionHandle, quinn_proto::StreamId),
        to: &NodeId,
        open: &felix_peer_proto::Forward,
    ) {
        self.forwards.channel_opened(channel, owner, to, open);
    }

    /// A client session ended: close its channel on every node it was opened on (an
    /// opening forward with an empty frame), so no virtual session is left there.
    pub(crate) fn session_ended(
        &mut self,
        now: Instant,
        owner: (quinn_proto::ConnectionHandle, Option<quinn_proto::StreamId>),
    ) {
        let closes = self
            .forwards
            .sessions_ended(|o| o.0 == owner.0 && owner.1.is_none_or(|s| s == o.1));
        for (to, close) in closes {
            self.forward(now, &to, close, None);
        }
    }

    /// Answers a forward `from` sent.
    pub(crate) fn answer(&mut self, now: Instant, from: &str, message: PeerMessage) {
        self.net.reply(from, &message);
        self.pump(now);
    }

    /// Answers or forwards are waiting for the engine.
    pub(crate) fn has_work(&self) -> bool {
        !self.done.is_empty() || !self.inbound.is_empty()
    }

    /// Forwards this node sent that have ended.
    pub(crate) fn poll_done(
        &mut self,
    ) -> Option<(
        quinn_proto::ConnectionHandle,
        quinn_proto::StreamId,
        u64,
        ForwardOutcome,
    )> {
        self.done.pop_front()
    }

    /// Forwards other nodes sent here.
    pub(crate) fn poll_inbound(&mut self) -> Option<Inbound> {
        self.inbound.pop_front()
    }

    /// `limits.forward_window`.
    pub(crate) fn forward_window(&self) -> usize {
        self.forwards.window()
    }

    /// How long a forward, or a request waiting for its stream's placement, may take.
    pub(crate) fn forward_timeout(&self) -> std::time::Duration {
        self.forwards.timeout()
    }
}

#[cfg(test)]
mod channel_tests {
    use super::*;
    use std::sync::Arc;

    use crate::config::{AuthConfig, ClusterConfig, EngineConfig, PeerAddr};

    fn node(seed: u8) -> ClusterNode {
        let key = rcgen::KeyPair::generate().expect("key");
        let params = rcgen::CertificateParams::new(vec!["n1".to_owned()]).expect("params");
        let cert = params.self_signed(&key).expect("certificate");
        let tls = crate::tls::TlsIdentity {
            cert_chain: vec![cert.der().clone()],
            key: rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key"),
        };
        let engine = EngineConfig::new(tls, AuthConfig::Dev { seed: [7; 32] }, [seed; 32]);
        let peers = (1..=3)
            .map(|i| PeerAddr {
                node_id: format!("n{i}"),
                addr: ([127, 0, 0, 1], 7100 + i).into(),
            })
            .collect();
        let cfg = ClusterConfig::new("n1", peers);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        ClusterNode::new(&cfg, &engine, provider, &[seed; 32], None, Instant::now()).expect("node")
    }

    #[test]
    fn a_restarted_node_numbers_its_forward_channels_elsewhere() {
        // Two processes of one node (each start draws its own seed): a leader may still owe
        // the first one answers, whose forward ids must not be the second one's.
        let (mut first, mut second) = (node(1), node(2));
        let (a, b) = (first.new_channel(), second.new_channel());
        assert_ne!(a, b);
        assert_ne!(a, 0);
        assert_eq!(first.new_channel(), a.wrapping_add(1).max(1));
    }
}

/// How a forward this node sent to a shard's leader ended: made here, handed to the session
/// that asked through the router (which re-exports it).
#[derive(Debug)]
pub(crate) enum ForwardOutcome {
    /// The leader's answer frame.
    Answered(bytes::Bytes),
    /// The leader refused it, or it never answered.
    Refused(felix_proto::ErrorCode, String),
}
