//! raft-rs messages to and from the peer protocol's flat `RaftMessage`.
//!
//! No protobuf parser ever sees a peer's bytes (RUSTSEC-2024-0437): felix-peer-proto decodes
//! them with its bounded encoding, and this module copies fields across. Message types only a
//! node sends itself (`Hup`, `Beat`, `Unreachable`, `SnapStatus`, `CheckQuorum`) are refused
//! when they arrive from a peer: raft-rs would act on them as if they were local.

use felix_peer_proto::{
    RaftConfState, RaftEntry, RaftEntryType, RaftMessage, RaftMessageType, RaftSnapshot,
    RaftSnapshotMetadata,
};
use raft::eraftpb::{
    ConfState, Entry, EntryType, Message, MessageType, Snapshot, SnapshotMetadata,
};

fn msg_type_out(t: MessageType) -> RaftMessageType {
    use MessageType as M;
    use RaftMessageType as R;
    match t {
        M::MsgHup => R::Hup,
        M::MsgBeat => R::Beat,
        M::MsgPropose => R::Propose,
        M::MsgAppend => R::Append,
        M::MsgAppendResponse => R::AppendResponse,
        M::MsgRequestVote => R::RequestVote,
        M::MsgRequestVoteResponse => R::RequestVoteResponse,
        M::MsgSnapshot => R::Snapshot,
        M::MsgHeartbeat => R::Heartbeat,
        M::MsgHeartbeatResponse => R::HeartbeatResponse,
        M::MsgUnreachable => R::Unreachable,
        M::MsgSnapStatus => R::SnapStatus,
        M::MsgCheckQuorum => R::CheckQuorum,
        M::MsgTransferLeader => R::TransferLeader,
        M::MsgTimeoutNow => R::TimeoutNow,
        M::MsgReadIndex => R::ReadIndex,
        M::MsgReadIndexResp => R::ReadIndexResp,
        M::MsgRequestPreVote => R::RequestPreVote,
        M::MsgRequestPreVoteResponse => R::RequestPreVoteResponse,
    }
}

/// `None` for a type no peer may send.
fn msg_type_in(t: RaftMessageType) -> Option<MessageType> {
    use MessageType as M;
    use RaftMessageType as R;
    Some(match t {
        R::Hup | R::Beat | R::Unreachable | R::SnapStatus | R::CheckQuorum => return None,
        R::Propose => M::MsgPropose,
        R::Append => M::MsgAppend,
        R::AppendResponse => M::MsgAppendResponse,
        R::RequestVote => M::MsgRequestVote,
        R::RequestVoteResponse => M::MsgRequestVoteResponse,
        R::Snapshot => M::MsgSnapshot,
        R::Heartbeat => M::MsgHeartbeat,
        R::HeartbeatResponse => M::MsgHeartbeatResponse,
        R::TransferLeader => M::MsgTransferLeader,
        R::TimeoutNow => M::MsgTimeoutNow,
        R::ReadIndex => M::MsgReadIndex,
        R::ReadIndexResp => M::MsgReadIndexResp,
        R::RequestPreVote => M::MsgRequestPreVote,
        R::RequestPreVoteResponse => M::MsgRequestPreVoteResponse,
    })
}

fn entry_out(e: &Entry) -> RaftEntry {
    RaftEntry {
        entry_type: match e.entry_type {
            EntryType::EntryNormal => RaftEntryType::Normal,
            EntryType::EntryConfChange => RaftEntryType::ConfChange,
            EntryType::EntryConfChangeV2 => RaftEntryType::ConfChangeV2,
        },
        term: e.term,
        index: e.index,
        data: e.data.clone(),
        context: e.context.clone(),
        sync_log: e.sync_log,
    }
}

fn entry_in(e: RaftEntry) -> Entry {
    let mut out = Entry::default();
    out.entry_type = match e.entry_type {
        RaftEntryType::Normal => EntryType::EntryNormal,
        RaftEntryType::ConfChange => EntryType::EntryConfChange,
        RaftEntryType::ConfChangeV2 => EntryType::EntryConfChangeV2,
    };
    out.term = e.term;
    out.index = e.index;
    out.data = e.data;
    out.context = e.context;
    out.sync_log = e.sync_log;
    out
}

fn conf_out(c: &ConfState) -> RaftConfState {
    RaftConfState {
        voters: c.voters.clone(),
        learners: c.learners.clone(),
        voters_outgoing: c.voters_outgoing.clone(),
        learners_next: c.learners_next.clone(),
        auto_leave: c.auto_leave,
    }
}

fn conf_in(c: RaftConfState) -> ConfState {
    let mut out = ConfState::default();
    out.voters = c.voters;
    out.learners = c.learners;
    out.voters_outgoing = c.voters_outgoing;
    out.learners_next = c.learners_next;
    out.auto_leave = c.auto_leave;
    out
}

/// raft-rs's message as the peer protocol carries it.
pub fn to_peer(m: &Message) -> RaftMessage {
    let snapshot = m.snapshot.as_ref().map(|s| RaftSnapshot {
        data: s.data.clone(),
        metadata: s.metadata.as_ref().map(|md| RaftSnapshotMetadata {
            conf_state: md.conf_state.as_ref().map(conf_out),
            index: md.index,
            term: md.term,
        }),
    });
    RaftMessage {
        msg_type: msg_type_out(m.msg_type),
        to: m.to,
        from: m.from,
        term: m.term,
        log_term: m.log_term,
        index: m.index,
        entries: m.entries.iter().map(entry_out).collect(),
        commit: m.commit,
        commit_term: m.commit_term,
        snapshot,
        request_snapshot: m.request_snapshot,
        reject: m.reject,
        reject_hint: m.reject_hint,
        context: m.context.clone(),
        deprecated_priority: m.deprecated_priority,
        priority: m.priority,
    }
}

/// A peer's message as raft-rs takes it; `None` for a type only a node sends itself.
pub fn from_peer(m: RaftMessage) -> Option<Message> {
    let mut out = Message::default();
    out.msg_type = msg_type_in(m.msg_type)?;
    out.to = m.to;
    out.from = m.from;
    out.term = m.term;
    out.log_term = m.log_term;
    out.index = m.index;
    out.entries = m
        .entries
        .into_iter()
        .map(entry_in)
        .collect::<Vec<_>>()
        .into();
    out.commit = m.commit;
    out.commit_term = m.commit_term;
    if let Some(s) = m.snapshot {
        let mut snap = Snapshot::default();
        snap.data = s.data;
        if let Some(md) = s.metadata {
            let mut meta = SnapshotMetadata::default();
            meta.index = md.index;
            meta.term = md.term;
            if let Some(c) = md.conf_state {
                meta.set_conf_state(conf_in(c));
            }
            snap.set_metadata(meta);
        }
        out.set_snapshot(snap);
    }
    out.request_snapshot = m.request_snapshot;
    out.reject = m.reject;
    out.reject_hint = m.reject_hint;
    out.context = m.context;
    out.deprecated_priority = m.deprecated_priority;
    out.priority = m.priority;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_with_every_field_survives_the_trip() {
        let mut e = Entry::default();
        e.term = 3;
        e.index = 9;
        e.data = b"data".to_vec().into();
        e.context = b"ctx".to_vec().into();
        e.entry_type = EntryType::EntryConfChange;
        let mut m = Message::default();
        m.msg_type = MessageType::MsgSnapshot;
        m.to = 2;
        m.from = 1;
        m.term = 4;
        m.log_term = 3;
        m.index = 8;
        m.entries = vec![e].into();
        m.commit = 7;
        m.commit_term = 3;
        m.request_snapshot = 5;
        m.reject = true;
        m.reject_hint = 6;
        m.context = b"c".to_vec().into();
        m.priority = -2;
        let mut snap = Snapshot::default();
        snap.data = b"snap".to_vec().into();
        let mut meta = SnapshotMetadata::default();
        meta.index = 8;
        meta.term = 3;
        let mut cs = ConfState::default();
        cs.voters = vec![1, 2, 3];
        meta.set_conf_state(cs);
        snap.set_metadata(meta);
        m.set_snapshot(snap);
        let back = from_peer(to_peer(&m)).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn local_only_types_are_refused_from_peers() {
        for t in [
            RaftMessageType::Hup,
            RaftMessageType::Beat,
            RaftMessageType::Unreachable,
            RaftMessageType::SnapStatus,
            RaftMessageType::CheckQuorum,
        ] {
            let m = RaftMessage {
                msg_type: t,
                ..Default::default()
            };
            assert!(from_peer(m).is_none(), "{t:?}");
        }
        let m = RaftMessage {
            msg_type: RaftMessageType::Heartbeat,
            ..Default::default()
        };
        assert_eq!(from_peer(m).unwrap().msg_type, MessageType::MsgHeartbeat);
    }
}
