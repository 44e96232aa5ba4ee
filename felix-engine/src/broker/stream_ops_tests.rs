//! Guarded appends, commits and bounded reads through the broker over an in-memory
//! filesystem, including a restart over the same files.

use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_proto::message::{Message, PublishRefusalReason, StateChange};

use super::*;
use felix_storage::log::{FsyncMode, LogConfig};
use felix_storage::memfs::MemFs;

const T0_MICROS: u64 = 1_700_000_000_000_000;

struct Rig {
    b: Broker,
    fs: MemFs,
    t0: Instant,
    now: Instant,
}

impl Rig {
    fn new() -> Rig {
        Rig::on(MemFs::new())
    }

    fn on(fs: MemFs) -> Rig {
        Rig::with_config(fs, BrokerConfig::default())
    }

    /// The default log (no fsync) under a broker configured as `cfg`.
    fn with_config(fs: MemFs, cfg: BrokerConfig) -> Rig {
        let log = LogConfig {
            fsync: FsyncMode::None,
            ..LogConfig::default()
        };
        Rig::build(fs, cfg, log)
    }

    /// A default broker over logs configured as `log`.
    fn with_log(fs: MemFs, log: LogConfig) -> Rig {
        Rig::build(fs, BrokerConfig::default(), log)
    }

    fn build(fs: MemFs, cfg: BrokerConfig, log: LogConfig) -> Rig {
        let t0 = Instant::now();
        let settings = DurableSettings {
            log,
            ack_after_write: true,
            groups: Default::default(),
        };
        let b = Broker::with_storage(cfg, settings, crate::clock::UnixAnchor::new(t0, T0_MICROS));
        let mut rig = Rig { b, fs, t0, now: t0 };
        rig.pump();
        assert!(rig.b.is_ready(), "{:?}", rig.b.storage_fatal());
        rig
    }

    fn unix(&self) -> u64 {
        T0_MICROS + self.now.duration_since(self.t0).as_micros() as u64
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// Logs of 300-byte segments kept to 1000 bytes, with no tail cache: a few dozen
    /// records roll several segments that retention then removes.
    fn small_trimmed_log() -> LogConfig {
        LogConfig {
            fsync: FsyncMode::None,
            segment_max_bytes: 300,
            retention_bytes: Some(1000),
            tail_cache_bytes: 0,
            ..LogConfig::default()
        }
    }

    /// Publishes 60 small records, then lets a retention check run.
    fn fill_and_enforce_retention(&mut self) {
        for i in 0..60u64 {
            let payload = Bytes::from(format!("record {i:040}"));
            self.retry(|r| {
                let unix = r.unix();
                r.b.publish(r.now, unix, &key(), None, None, vec![payload.clone()], None)
            });
        }
        self.pump();
        self.advance(felix_storage::log::DEFAULT_RETENTION_CHECK_INTERVAL);
        let unix = self.unix();
        self.b.handle_timeout(self.now, unix);
        self.pump();
    }

    /// The oldest offset shard 0 of `key()` still holds.
    fn start_offset(&self) -> u64 {
        let i = self.b.stream_index[&key()];
        let log = self.b.streams[i].shards[0].store.as_ref().unwrap().log;
        let logs = self.b.logs.as_ref().unwrap();
        logs.slot(log).unwrap().log.shard().start_offset()
    }

    /// Runs file ops and log events until nothing is left.
    fn pump(&mut self) {
        for _ in 0..1000 {
            self.b.flush(self.now);
            let mut did = false;
            while let Some(op) = self.b.poll_file_op() {
                let c = self.fs.execute(op).expect("the disk is alive");
                self.b.handle_file_completion(self.now, c);
                did = true;
            }
            if !did && !self.b.has_storage_work() {
                return;
            }
        }
        panic!("storage never settled");
    }

    /// Runs a request that may meet a log still opening, pumping until it does not.
    fn retry<T>(&mut self, mut f: impl FnMut(&mut Rig) -> Result<T, BrokerError>) -> T {
        for _ in 0..10 {
            match f(self) {
                Err(e) if e.opening.is_some() => self.pump(),
                Err(e) => panic!("refused: {e}"),
                Ok(v) => {
                    self.pump();
                    return v;
                }
            }
        }
        panic!("the log never opened");
    }

    fn idem(
        &mut self,
        producer: u64,
        seq: u64,
        payloads: &[&'static str],
        reused: bool,
    ) -> Guarded {
        let payloads: Vec<Bytes> = payloads
            .iter()
            .map(|p| Bytes::from_static(p.as_bytes()))
            .collect();
        self.retry(|r| {
            let unix = r.unix();
            r.b.publish_guarded(
                r.now,
                unix,
                &key(),
                (None, None),
                payloads.clone(),
                Guard::Sequence {
                    producer,
                    sequence: seq,
                },
                reused,
            )
        })
    }

    /// Publishes `payloads` as one batch stamped `unix_micros`, whatever the rig's clock says.
    fn publish_at(&mut self, unix_micros: u64, payloads: Vec<Bytes>) -> u64 {
        let p = self.retry(|r| {
            r.b.publish(
                r.now,
                unix_micros,
                &key(),
                None,
                None,
                payloads.clone(),
                None,
            )
        });
        p.first_offset.expect("a non-empty batch has an offset")
    }

    fn offset_for_time(&mut self, at_micros: u64) -> Option<u64> {
        let answer = self.b.offset_for_time(self.now, &key(), 0, at_micros, 3);
        match self.read_answer(answer.unwrap()) {
            Message::OffsetValue(v) => v.offset,
            other => panic!("{other:?}"),
        }
    }

    fn publish_if(&mut self, expected: u64, payload: &'static str) -> Guarded {
        self.retry(|r| {
            let unix = r.unix();
            r.b.publish_guarded(
                r.now,
                unix,
                &key(),
                (None, None),
                vec![Bytes::from_static(payload.as_bytes())],
                Guard::Offset(expected),
                true,
            )
        })
    }

    fn tail(&self) -> u64 {
        let i = self.b.stream_index[&key()];
        let log = self.b.streams[i].shards[0].store.as_ref().unwrap().log;
        self.b
            .logs
            .as_ref()
            .unwrap()
            .slot(log)
            .unwrap()
            .log
            .shard()
            .next_offset()
    }

    /// The frame a held read was answered with.
    fn read_answer(&mut self, answer: ReadAnswer) -> Message {
        let frame = match answer {
            ReadAnswer::Now(frame) => frame,
            ReadAnswer::Later { log, ticket } => {
                self.pump();
                let mut found = None;
                while let Some(n) = self.b.poll_notice() {
                    if let Notice::Value {
                        log: l,
                        ticket: t,
                        value,
                    } = n
                    {
                        if (l, t) == (log, ticket) {
                            found = Some(value.unwrap().unwrap());
                        }
                    }
                }
                found.expect("the read was answered")
            }
        };
        Message::decode(&frame[12..]).unwrap()
    }
}

fn key() -> StreamKey {
    StreamKey::new("t1", "default", "orders")
}

fn written(g: Guarded) -> Option<u64> {
    match g {
        Guarded::Written(p) => p.first_offset,
        other => panic!("not written: {other:?}"),
    }
}

fn duplicate(g: Guarded) -> Option<u64> {
    match g {
        Guarded::Duplicate(p) => p.first_offset,
        other => panic!("not a duplicate: {other:?}"),
    }
}

fn refused(g: Guarded) -> PublishRefusalReason {
    match g {
        Guarded::Refused(r) => r,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn an_idempotent_batch_lands_once_and_a_gap_or_reuse_is_refused() {
    let mut r = Rig::new();
    assert_eq!(written(r.idem(9, 0, &["a", "b"], true)), Some(0));
    assert_eq!(duplicate(r.idem(9, 0, &["a", "b"], true)), Some(0));
    assert_eq!(r.tail(), 2, "the re-send appended nothing");
    assert_eq!(
        refused(r.idem(9, 2, &["c"], true)),
        PublishRefusalReason::SequenceGap { expected: 1 }
    );
    assert_eq!(
        refused(r.idem(9, 0, &["other"], true)),
        PublishRefusalReason::SequenceReused
    );
    // A client that cannot read `sequence_reused` is answered as for a re-send, unwritten.
    assert_eq!(duplicate(r.idem(9, 0, &["other"], false)), Some(0));
    assert_eq!(
        refused(r.idem(77, 5, &["x"], true)),
        PublishRefusalReason::UnknownProducer
    );
    assert_eq!(written(r.idem(9, 1, &["c"], true)), Some(2));
    assert_eq!(r.tail(), 3);
}

#[test]
fn producers_are_rebuilt_from_the_log_after_a_restart() {
    let mut r = Rig::new();
    assert_eq!(written(r.idem(5, 0, &["a"], true)), Some(0));
    r.b.publish(
        r.now,
        r.unix(),
        &key(),
        None,
        None,
        vec![Bytes::from("plain")],
        None,
    )
    .unwrap();
    assert_eq!(written(r.idem(5, 1, &["b", "c"], true)), Some(2));
    r.pump();
    let fs = r.fs;

    let mut r = Rig::on(fs);
    assert_eq!(duplicate(r.idem(5, 1, &["b", "c"], true)), Some(2));
    assert_eq!(duplicate(r.idem(5, 0, &["a"], true)), Some(0));
    assert_eq!(r.tail(), 4, "nothing appended twice across the restart");
    assert_eq!(
        refused(r.idem(5, 3, &["d"], true)),
        PublishRefusalReason::SequenceGap { expected: 2 }
    );
    assert_eq!(written(r.idem(5, 2, &["d"], true)), Some(4));
}

#[test]
fn recovery_hands_producer_marks_to_the_shard_as_it_reads_them() {
    let mut r = Rig::new();
    for seq in 0..20 {
        assert!(written(r.idem(9, seq, &["x"], true)).is_some());
    }
    r.pump();
    let fs = r.fs;

    // No request names the stream yet: the marks are folded, not queued whole in the log.
    let mut r = Rig::on(fs);
    assert!(r.b.streams.is_empty(), "nothing has claimed the log");
    let (&log, folded) = r.b.recovered.iter().next().expect("tables for the log");
    assert_eq!(folded.producers.len(), 1, "producer 9, folded");
    let logs = r.b.logs.as_ref().expect("durable");
    let shard_log = logs.slot(log).expect("open").log.shard();
    assert_eq!(
        shard_log.scanned_ext_len(),
        0,
        "nothing left queued in the log"
    );
    // The stream that claims the log takes the tables over.
    assert_eq!(duplicate(r.idem(9, 19, &["x"], true)), Some(19));
    assert!(r.b.recovered.is_empty());
}

#[test]
fn of_two_publish_if_at_one_offset_exactly_one_is_written() {
    let mut r = Rig::new();
    assert_eq!(written(r.publish_if(0, "first")), Some(0));
    assert_eq!(
        refused(r.publish_if(0, "second")),
        PublishRefusalReason::OffsetMismatch { tail: 1 }
    );
    assert_eq!(written(r.publish_if(1, "third")), Some(1));
    assert_eq!(r.tail(), 2);
}

#[test]
fn guarded_writes_on_an_in_memory_stream() {
    let mut b = Broker::new(BrokerConfig::default());
    let now = Instant::now();
    let pay = || vec![Bytes::from_static(b"p")];
    let seq = |sequence| Guard::Sequence {
        producer: 1,
        sequence,
    };
    let g = b
        .publish_guarded(now, 0, &key(), (None, None), pay(), seq(0), true)
        .unwrap();
    assert!(matches!(g, Guarded::Written(_)));
    let g = b
        .publish_guarded(now, 0, &key(), (None, None), pay(), seq(0), true)
        .unwrap();
    assert!(matches!(g, Guarded::Duplicate(_)));
    let e = b
        .publish_guarded(now, 0, &key(), (None, None), pay(), Guard::Offset(0), true)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRequest);
}

#[test]
fn a_commit_writes_its_event_and_state_as_one_record_and_survives_a_restart() {
    let mut r = Rig::new();
    let put = |k: &str, v: &'static str| StateChange::Put {
        key: k.into(),
        value: Bytes::from_static(v.as_bytes()),
    };
    let commit = |r: &mut Rig, changes: Vec<StateChange>, expected: Option<u64>| {
        r.retry(|r| {
            let unix = r.unix();
            r.b.commit(
                r.now,
                unix,
                &key(),
                (b"match-1", None),
                Bytes::from_static(b"event"),
                &changes,
                expected,
            )
        })
    };
    let Committed::Written(p) = commit(&mut r, vec![put("score", "1"), put("turn", "a")], None)
    else {
        panic!()
    };
    let first = p.first_offset.unwrap();
    let Committed::Written(p) = commit(
        &mut r,
        vec![
            put("score", "2"),
            StateChange::Delete { key: "turn".into() },
        ],
        Some(first + 1),
    ) else {
        panic!()
    };
    let second = p.first_offset.unwrap();
    assert_eq!(second, first + 1, "one record per commit");
    let Committed::Refused(reason) = commit(&mut r, vec![put("score", "3")], Some(0)) else {
        panic!("a stale expected offset is refused")
    };
    assert_eq!(
        reason,
        PublishRefusalReason::OffsetMismatch { tail: second + 1 }
    );

    let get = |r: &mut Rig, k: &'static str| {
        r.retry(|r| r.b.state_get(r.now, &key(), (b"match-1", None), k))
    };
    let score = get(&mut r, "score");
    assert_eq!(score.value.as_deref(), Some(&b"2"[..]));
    assert_eq!((score.version, score.as_of), (Some(second), Some(second)));
    assert_eq!(get(&mut r, "turn").value, None);
    r.pump();

    let mut r = Rig::on(r.fs);
    let score = get(&mut r, "score");
    assert_eq!(score.value.as_deref(), Some(&b"2"[..]));
    assert_eq!(score.version, Some(second));
    assert_eq!(get(&mut r, "turn").value, None);
}

#[test]
fn commits_that_would_grow_a_shards_state_past_its_limit_are_refused_whole() {
    let limited = |limit| BrokerConfig {
        state_max_bytes_per_shard: limit,
        ..BrokerConfig::default()
    };
    let put = |k: &str, v: &str| StateChange::Put {
        key: k.into(),
        value: Bytes::from(v.to_owned()),
    };
    let commit = |r: &mut Rig, changes: Vec<StateChange>| {
        r.retry(|r| {
            let unix = r.unix();
            let event = Bytes::from_static(b"e");
            let entity = (&b"m"[..], None);
            match r
                .b
                .commit(r.now, unix, &key(), entity, event, &changes, None)
            {
                Err(e) if e.code == ErrorCode::LimitExceeded => Ok(Err(e)),
                other => other.map(Ok),
            }
        })
        .map(|_| ())
    };
    let limit_exceeded = |result: Result<(), BrokerError>| {
        assert_eq!(result.expect_err("refused").code, ErrorCode::LimitExceeded);
    };
    let mut r = Rig::with_config(MemFs::new(), limited(20));
    // Keys plus values: 10, then 20, exactly the limit.
    commit(&mut r, vec![put("k1", "12345678")]).unwrap();
    commit(&mut r, vec![put("k2", "12345678")]).unwrap();
    let tail = r.tail();
    limit_exceeded(commit(&mut r, vec![put("k3", "1")]));
    assert_eq!(r.tail(), tail, "nothing written");
    // What counts is the state after the whole commit: +3 - 10.
    commit(
        &mut r,
        vec![put("k3", "1"), StateChange::Delete { key: "k2".into() }],
    )
    .unwrap();
    r.pump();

    // Restarted with a lower limit the stored state (13 bytes) is over it; a commit that
    // shrinks it still goes through, one that grows it does not.
    let mut r = Rig::with_config(r.fs, limited(5));
    limit_exceeded(commit(&mut r, vec![put("k9", "x")]));
    commit(&mut r, vec![StateChange::Delete { key: "k1".into() }]).unwrap();
    limit_exceeded(commit(&mut r, vec![put("k9", "x")]));
    // k3 (3 bytes) + k (2) is 5, exactly the limit; one byte more is not.
    commit(&mut r, vec![put("k", "x")]).unwrap();
    limit_exceeded(commit(&mut r, vec![put("k", "xy")]));
}

#[test]
fn stream_read_pages_stop_at_end_and_refuse_offsets_out_of_range() {
    let mut r = Rig::new();
    for i in 0..10u64 {
        let p = vec![Bytes::from(format!("r{i}"))];
        r.retry(|r| {
            let unix = r.unix();
            r.b.publish(r.now, unix, &key(), None, None, p.clone(), None)
        });
    }
    let req = |from, end, max_records| PageRequest {
        shard: 0,
        from,
        end,
        max_records,
        max_bytes: None,
        request_id: 7,
    };
    let answer =
        r.b.stream_read(r.now, &key(), req(2, Some(6), Some(3)))
            .unwrap();
    let Message::StreamRecords(page) = r.read_answer(answer) else {
        panic!()
    };
    let offsets: Vec<u64> = page.records.iter().map(|x| x.offset).collect();
    assert_eq!(offsets, [2, 3, 4]);
    assert_eq!(page.records[0].payload, Bytes::from("r2"));
    assert_eq!(page.records[0].timestamp_micros, Some(T0_MICROS));
    assert_eq!((page.next_offset, page.request_id), (5, 7));
    let answer =
        r.b.stream_read(r.now, &key(), req(5, Some(6), None))
            .unwrap();
    let Message::StreamRecords(page) = r.read_answer(answer) else {
        panic!()
    };
    assert_eq!(page.records.len(), 1);
    assert_eq!(page.next_offset, 6, "the page stops at end");
    let answer = r.b.stream_read(r.now, &key(), req(10, None, None)).unwrap();
    let Message::StreamRecords(page) = r.read_answer(answer) else {
        panic!()
    };
    assert!(page.records.is_empty() && page.next_offset == 10);
    let answer = r.b.stream_read(r.now, &key(), req(11, None, None)).unwrap();
    assert!(matches!(
        r.read_answer(answer),
        Message::SubscribeCursorError(_)
    ));
}

#[test]
fn offset_for_time_finds_the_first_record_at_or_after_a_time() {
    let mut r = Rig::new();
    // Batch i is appended at T0 + i seconds.
    for i in 0..20u64 {
        let p = vec![Bytes::from(format!("a{i}")), Bytes::from(format!("b{i}"))];
        r.retry(|r| {
            let unix = r.unix();
            r.b.publish(r.now, unix, &key(), None, None, p.clone(), None)
        });
        r.advance(Duration::from_secs(1));
    }
    assert_eq!(
        r.offset_for_time(0),
        Some(0),
        "older than everything: the oldest"
    );
    assert_eq!(r.offset_for_time(T0_MICROS + 7_000_000), Some(14));
    assert_eq!(r.offset_for_time(T0_MICROS + 7_000_001), Some(16));
    assert_eq!(r.offset_for_time(T0_MICROS + 60_000_000), None);
}

/// Append times that go back (a wall clock stepped back) and small entries the sparse index
/// skips: the answer is still the first offset whose stored time is at or after the asked
/// one, checked against a scan of every entry, from the tail cache and from the files.
#[test]
fn offset_for_time_after_the_clock_steps_back_still_answers_the_first_record_at_or_after() {
    // (seconds after T0, payload bytes). 5000 bytes puts an index point on the next entry;
    // a small entry after a small indexed one gets none.
    let entries: [(u64, usize); 13] = [
        (10, 10),
        (50, 10),
        (20, 5000),
        (30, 5000),
        (40, 5000),
        (15, 5000),
        (25, 10),
        (35, 5000),
        (60, 5000),
        (5, 5000),
        (45, 10),
        (70, 5000),
        (65, 5000),
    ];
    let from_tail = LogConfig {
        fsync: FsyncMode::None,
        ..LogConfig::default()
    };
    let from_files = LogConfig {
        fsync: FsyncMode::None,
        segment_max_bytes: 12_000,
        tail_cache_bytes: 0,
        ..LogConfig::default()
    };
    for cfg in [from_tail, from_files] {
        let mut r = Rig::with_log(MemFs::new(), cfg.clone());
        let mut stored = Vec::new();
        for &(secs, bytes) in &entries {
            let at = T0_MICROS + secs * 1_000_000;
            let first = r.publish_at(at, vec![Bytes::from(vec![b'x'; bytes]), Bytes::from("y")]);
            stored.push((first, at));
        }
        r.pump();
        let mut probes = vec![0, u64::MAX];
        for &(_, at) in &stored {
            probes.extend([at - 1, at, at + 1]);
        }
        for t in probes {
            let expected = stored
                .iter()
                .find(|&&(_, at)| at >= t)
                .map(|&(first, _)| first);
            assert_eq!(r.offset_for_time(t), expected, "asked for {t} ({cfg:?})");
        }
    }
}

/// The first page read from the index point holds no record that recent (one batch fills
/// it), so the broker reads on from where that page stopped, which is the answer itself.
#[test]
fn offset_for_time_reads_on_when_the_first_page_holds_no_answer() {
    use felix_storage::log::MAX_RECORDS_PER_READ;
    let mut r = Rig::new();
    let full_page: Vec<Bytes> = (0..MAX_RECORDS_PER_READ)
        .map(|i| Bytes::from(i.to_string()))
        .collect();
    assert_eq!(r.publish_at(T0_MICROS, full_page), 0);
    let late = T0_MICROS + 1_000_000;
    let next_page = MAX_RECORDS_PER_READ as u64;
    assert_eq!(r.publish_at(late, vec![Bytes::from("late")]), next_page);
    assert_eq!(
        r.publish_at(late + 1_000_000, vec![Bytes::from("later")]),
        next_page + 1
    );
    r.pump();
    assert_eq!(r.offset_for_time(T0_MICROS + 1), Some(next_page));
    assert_eq!(r.offset_for_time(late), Some(next_page));
    assert_eq!(r.offset_for_time(late + 1), Some(next_page + 1));
    assert_eq!(r.offset_for_time(late + 1_000_001), None);
}

#[test]
fn retention_keeps_what_commit_state_is_rebuilt_from() {
    let commit = |r: &mut Rig, value: &'static str| {
        let changes = [StateChange::Put {
            key: "early".into(),
            value: Bytes::from_static(value.as_bytes()),
        }];
        r.retry(|r| {
            let unix = r.unix();
            let event = Bytes::from_static(b"e");
            r.b.commit(r.now, unix, &key(), (b"m", None), event, &changes, None)
        });
    };
    let get = |r: &mut Rig| {
        r.retry(|r| r.b.state_get(r.now, &key(), (b"m", None), "early"))
            .value
    };

    let mut r = Rig::with_log(MemFs::new(), Rig::small_trimmed_log());
    commit(&mut r, "first");
    r.fill_and_enforce_retention();
    assert_eq!(
        r.start_offset(),
        0,
        "the segment holding the only state write is kept"
    );
    let mut r = Rig::with_log(r.fs, Rig::small_trimmed_log());
    assert_eq!(
        get(&mut r).as_deref(),
        Some(&b"first"[..]),
        "rebuilt after a restart"
    );

    // A newer write of the key frees the old segments; the restarted state is the new one.
    r.fill_and_enforce_retention();
    commit(&mut r, "second");
    r.fill_and_enforce_retention();
    assert!(
        r.start_offset() > 0,
        "retention went on past the superseded write"
    );
    let mut r = Rig::with_log(r.fs, Rig::small_trimmed_log());
    assert_eq!(get(&mut r).as_deref(), Some(&b"second"[..]));
    // The floor was rebuilt with the state: retention still keeps the live write.
    r.fill_and_enforce_retention();
    let mut r = Rig::with_log(r.fs, Rig::small_trimmed_log());
    assert_eq!(get(&mut r).as_deref(), Some(&b"second"[..]));
}

#[test]
fn stream_read_below_retention_is_answered_too_old() {
    use felix_proto::message::CursorErrorReason;
    let mut r = Rig::with_log(MemFs::new(), Rig::small_trimmed_log());
    r.fill_and_enforce_retention();
    let start = r.start_offset();
    assert!(start > 0, "retention removed the oldest segments");
    let req = |from| PageRequest {
        shard: 0,
        from,
        end: None,
        max_records: Some(1),
        max_bytes: None,
        request_id: 9,
    };
    let answer = r.b.stream_read(r.now, &key(), req(start - 1)).unwrap();
    match r.read_answer(answer) {
        Message::SubscribeCursorError(e) => {
            assert_eq!(e.reason, CursorErrorReason::TooOld);
            assert_eq!((e.requested, e.available), (start - 1, start));
        }
        other => panic!("expected too_old, got {other:?}"),
    }
    let answer = r.b.stream_read(r.now, &key(), req(start)).unwrap();
    let Message::StreamRecords(page) = r.read_answer(answer) else {
        panic!()
    };
    assert_eq!(
        page.records[0].offset, start,
        "the oldest kept record is still read"
    );
}

#[test]
fn a_page_asking_for_more_than_the_limit_gets_the_limit() {
    use felix_storage::log::MAX_RECORDS_PER_READ;
    let mut r = Rig::new();
    let per_batch = 500;
    let batches = MAX_RECORDS_PER_READ / per_batch + 1;
    for b in 0..batches {
        let p: Vec<Bytes> = (0..per_batch)
            .map(|i| Bytes::from(format!("{b}.{i}")))
            .collect();
        r.retry(|r| {
            let unix = r.unix();
            r.b.publish(r.now, unix, &key(), None, None, p.clone(), None)
        });
    }
    let req = PageRequest {
        shard: 0,
        from: 0,
        end: None,
        max_records: Some(MAX_RECORDS_PER_READ as u64 * 2),
        max_bytes: None,
        request_id: 1,
    };
    let answer = r.b.stream_read(r.now, &key(), req).unwrap();
    let Message::StreamRecords(page) = r.read_answer(answer) else {
        panic!()
    };
    assert_eq!(page.records.len(), MAX_RECORDS_PER_READ);
    assert_eq!(page.next_offset, MAX_RECORDS_PER_READ as u64);
}

/// Every frame handed to `id` so far, concatenated.
fn delivered(b: &mut Broker, id: SubscriberId) -> Vec<u8> {
    std::iter::from_fn(|| b.next_delivery(id))
        .take(10_000)
        .flat_map(|d| match d {
            Delivery::Frame(f) | Delivery::Final(f) => f.to_vec(),
        })
        .collect()
}

fn holds(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_leaderships_uncommitted_write_is_not_fanned_out_by_a_later_one_here() {
    // Sim replicated seed 503: a leader wrote past its commit mark and stepped down; its copy
    // was cut there and refilled; when it led again and committed that offset, the old write
    // still queued for fan-out went out in place of the log's record.
    let mut r = Rig::new();
    r.publish_at(T0_MICROS, vec![Bytes::from_static(b"first")]);
    let i = r.b.stream_index[&key()];
    let log = r.b.streams[i].shards[0].store.as_ref().unwrap().log;
    r.b.gate(log, 1);
    let at = r.publish_at(T0_MICROS, vec![Bytes::from_static(b"uncommitted")]);
    assert_eq!(at, 1);
    r.b.ungate(log);
    r.b.truncate_log(log, 1).expect("a cut above the commit");
    r.pump();
    r.b.truncated(log, 1);
    assert_eq!(r.tail(), 1);
    r.b.gate(log, 1);
    let at = r.publish_at(T0_MICROS, vec![Bytes::from_static(b"written-later")]);
    assert_eq!(at, 1);
    let o = SubscribeOpts::negotiated(1, Flags(0x1FFF), Default::default(), None);
    let id =
        r.b.subscribe(r.now, &key(), 0, Start::Latest, o)
            .unwrap()
            .id;
    r.b.committed(log, 2);
    r.pump();
    let frames = delivered(&mut r.b, id);
    assert!(!holds(&frames, b"uncommitted"), "the cut write went out");
    assert!(
        holds(&frames, b"written-later"),
        "the committed record did not"
    );
}

#[test]
fn a_reopened_log_gated_at_its_commit_serves_readers_only_the_committed_records() {
    // Sim replicated seed 3124: a node restarted with records past its commit mark, was made
    // leader at that mark, and served them to a catch-up reader; the next leader, which never
    // had them, gave those offsets to other records.
    let mut r = Rig::new();
    for p in ["committed", "past-commit-1", "past-commit-2"] {
        r.publish_at(T0_MICROS, vec![Bytes::from_static(p.as_bytes())]);
    }
    let fs = r.fs;
    let mut r = Rig::on(fs);
    assert_eq!(
        r.publish_at(T0_MICROS, vec![Bytes::from_static(b"opens")]),
        3
    );
    let i = r.b.stream_index[&key()];
    let log = r.b.streams[i].shards[0].store.as_ref().unwrap().log;
    r.b.gate(log, 1);
    let o = SubscribeOpts::negotiated(1, Flags(0x1FFF), Default::default(), None);
    let id = match r.b.subscribe(r.now, &key(), 0, Start::Earliest, o) {
        Ok(s) => s.id,
        Err(_) => panic!("the subscribe was refused"),
    };
    r.pump();
    let frames = delivered(&mut r.b, id);
    assert!(
        holds(&frames, b"committed"),
        "the committed record was not served"
    );
    assert!(
        !holds(&frames, b"past-commit-1") && !holds(&frames, b"past-commit-2"),
        "records past the commit mark were served"
    );
    r.b.committed(log, 3);
    r.pump();
    let frames = delivered(&mut r.b, id);
    assert!(holds(&frames, b"past-commit-1") && holds(&frames, b"past-commit-2"));
    assert!(
        !holds(&frames, b"opens"),
        "the write past the new mark went out"
    );
}

#[test]
fn a_tenant_at_its_producer_cap_takes_a_new_one_only_in_place_of_its_own_oldest_idle_one() {
    let cfg = BrokerConfig {
        max_producers_per_tenant: 3,
        ..BrokerConfig::default()
    };
    let mut b = Broker::new(cfg);
    let t0 = Instant::now();
    let a = StreamKey::new("t1", "default", "a");
    let other = StreamKey::new("t1", "default", "b");
    let theirs = StreamKey::new("t2", "default", "a");
    let write = |b: &mut Broker, at: Duration, key: &StreamKey, producer, sequence| {
        let guard = Guard::Sequence { producer, sequence };
        let pay = vec![Bytes::from_static(b"p")];
        b.publish_guarded(t0 + at, 0, key, (None, None), pay, guard, true)
    };
    let s = Duration::from_secs;
    // Three producers of t1 over two streams, first written at 0 s, 1 s and 2 s.
    for (at, key, p) in [(0, &a, 1), (1, &a, 2), (2, &other, 3)] {
        assert!(matches!(
            write(&mut b, s(at), key, p, 0),
            Ok(Guarded::Written(_))
        ));
    }
    // Another tenant's producers are its own: they neither count nor push t1's out.
    assert!(matches!(
        write(&mut b, s(3), &theirs, 9, 0),
        Ok(Guarded::Written(_))
    ));
    // At the cap, a fourth is refused while none of the tenant's is idle long enough.
    let idle = super::producers::PRODUCER_IDLE_BEFORE_EVICTION;
    let e = write(&mut b, idle - Duration::from_nanos(1), &other, 4, 0).unwrap_err();
    assert_eq!(e.code, ErrorCode::LimitExceeded, "{e:?}");
    // Once the oldest (producer 1) is idle that long, the newcomer takes its place.
    assert!(matches!(
        write(&mut b, idle, &other, 4, 0),
        Ok(Guarded::Written(_))
    ));
    assert_eq!(
        refused(write(&mut b, idle, &a, 1, 1).unwrap()),
        PublishRefusalReason::UnknownProducer,
        "producer 1 was forgotten"
    );
    for (key, p) in [(&a, 2), (&other, 3), (&theirs, 9)] {
        assert!(
            matches!(write(&mut b, idle, key, p, 1), Ok(Guarded::Written(_))),
            "{p}"
        );
    }
    // Full again, every producer just wrote: the next newcomer is refused.
    let e = write(&mut b, idle, &a, 5, 0).unwrap_err();
    assert_eq!(e.code, ErrorCode::LimitExceeded);
}

/// Where shard 0 of `k` starts.
fn start_of(r: &Rig, k: &StreamKey) -> u64 {
    let i = r.b.stream_index[k];
    let log = r.b.streams[i].shards[0].store.as_ref().unwrap().log;
    let l = r.b.logs.as_ref().unwrap().slot(log).unwrap().log.shard();
    l.start_offset()
}

#[test]
fn a_streams_own_retention_replaces_the_broker_wide_bound_under_a_virtual_clock() {
    // Broker-wide: keep 1000 bytes. `orders` keeps records for 30 s whatever its size;
    // `audit` sets nothing of its own and keeps the broker-wide bound.
    let orders = key();
    let audit = StreamKey::new("t1", "default", "audit");
    let cfg = BrokerConfig {
        declared_retention: vec![(
            orders.clone(),
            retention::StreamRetention {
                max_bytes: Some(u64::MAX),
                max_age: Some(Duration::from_secs(30)),
            },
        )],
        ..BrokerConfig::default()
    };
    let log = LogConfig {
        retention_check_interval: Duration::from_secs(1),
        ..Rig::small_trimmed_log()
    };
    let mut r = Rig::build(MemFs::new(), cfg, log);
    // One record a second into each stream, from t0 on: offset n is stamped n seconds.
    // Segments of 300 bytes hold 3 such records: [0,3) [3,6) ... [57,60).
    for i in 0..60u64 {
        for k in [&orders, &audit] {
            let payload = Bytes::from(format!("record {i:040}"));
            r.retry(|r| {
                let unix = r.unix();
                r.b.publish(r.now, unix, k, None, None, vec![payload.clone()], None)
            });
        }
        r.advance(Duration::from_secs(1));
    }
    r.pump();
    let check = |r: &mut Rig| {
        let unix = r.unix();
        r.b.handle_timeout(r.now, unix);
        r.pump();
        (start_of(r, &orders), start_of(r, &audit))
    };
    // t = 60 s: a segment of `orders` goes once its newest record is over 30 s old: [27,30)
    // (newest 29 s) goes, [30,33) (newest 32 s) stays. `audit` keeps its newest 3 segments.
    assert_eq!(check(&mut r), (30, 51));
    r.advance(Duration::from_secs(2));
    assert_eq!(check(&mut r), (30, 51), "t = 62 s: 32 + 30 is not below 62");
    r.advance(Duration::from_secs(1));
    assert_eq!(check(&mut r), (33, 51), "t = 63 s");
    // An alter at runtime: `audit` now keeps 5 s (its size bound stays the broker-wide
    // one), `orders` falls back to the broker-wide bound entirely.
    r.b.set_stream_retention(
        &audit,
        retention::StreamRetention {
            max_bytes: None,
            max_age: Some(Duration::from_secs(5)),
        },
    );
    r.b.set_stream_retention(&orders, retention::StreamRetention::default());
    r.advance(Duration::from_secs(1));
    // t = 64 s: audit's [54,57) (newest 56 s) is older than 5 s, and the active [57,60)
    // never goes.
    assert_eq!(check(&mut r), (51, 57));
}
