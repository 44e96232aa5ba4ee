//! CounterLog against memfs: sums visible once durable, rebuilt after a power loss, kept by
//! compaction, and overflow refused.

use super::*;
use crate::memfs::{Crash, MemFs};
use crate::test_bench::{cfg, settle, Bench};

const DIR: &str = "counters/t/ns/c/0";

struct Rig {
    bench: Bench,
    counters: CounterLog,
    durable: u64,
    compacted: usize,
    failed: Option<StorageError>,
}

impl Rig {
    fn on(fs: MemFs, cfg: LogConfig) -> Rig {
        let (bench, counters) = Bench::open(fs, cfg, |cfg, t0| {
            CounterLog::open(LogId(3), DIR.into(), cfg, t0)
        });
        let mut rig = Rig {
            bench,
            counters,
            durable: 0,
            compacted: 0,
            failed: None,
        };
        rig.pump();
        rig
    }

    fn collect(&mut self) {
        self.bench.take_ops(&mut self.counters);
        while let Some(e) = self.counters.poll_event() {
            match e {
                CacheEvent::Durable { up_to } => self.durable = up_to,
                CacheEvent::Compacted { .. } => self.compacted += 1,
                CacheEvent::CompactionFailed(e) | CacheEvent::Failed(e) => self.failed = Some(e),
                _ => {}
            }
        }
    }

    fn pump(&mut self) {
        settle("the counters", || {
            self.collect();
            self.bench.run_one(&mut self.counters)
        });
    }

    fn add(&mut self, key: &str, delta: i64) -> i64 {
        let (_, sum) = self
            .counters
            .add(self.bench.t0, 1_000_000, key.as_bytes(), delta)
            .expect("add");
        sum
    }

    fn reopen(self, crash: Crash) -> Rig {
        let (fs, cfg) = self.bench.crashed(crash);
        Rig::on(fs, cfg)
    }
}

#[test]
fn records_round_trip_and_refuse_nonsense() {
    let r = CounterRecord {
        key: Bytes::from_static(b"hits"),
        delta: -3,
        sum: i64::MIN,
    };
    assert_eq!(CounterRecord::decode(&r.encode()), Ok(r.clone()));
    let mut bad = r.encode().to_vec();
    bad[0] = 9;
    assert!(CounterRecord::decode(&Bytes::from(bad)).is_err());
    let mut short_key = r.encode().to_vec();
    short_key.pop();
    assert!(CounterRecord::decode(&Bytes::from(short_key)).is_err());
}

#[test]
fn an_add_answers_the_sum_including_it_and_gets_see_it_once_durable() {
    let mut rig = Rig::on(MemFs::new(), cfg(1 << 20));
    assert_eq!(rig.counters.get(b"a"), None, "never written is not zero");
    assert_eq!(rig.add("a", 5), 5);
    // Accepted, not durable yet: a get sees the durable sum, a second add counts both.
    assert_eq!(rig.counters.get(b"a"), None);
    assert_eq!(rig.add("a", -7), -2);
    rig.pump();
    assert_eq!(rig.durable, 2);
    assert_eq!(rig.counters.get(b"a"), Some(-2));
    assert_eq!(rig.add("zero", 0), 0);
    rig.pump();
    assert_eq!(rig.counters.get(b"zero"), Some(0));
}

#[test]
fn overflow_is_refused_and_writes_nothing() {
    let mut rig = Rig::on(MemFs::new(), cfg(1 << 20));
    assert_eq!(rig.add("big", i64::MAX), i64::MAX);
    let next = rig.counters.log().next_offset();
    assert_eq!(
        rig.counters.add(rig.bench.t0, 0, b"big", 1),
        Err(AddError::Overflow { sum: i64::MAX })
    );
    assert_eq!(rig.counters.log().next_offset(), next);
    assert_eq!(rig.add("big", -1), i64::MAX - 1);
}

#[test]
fn a_key_at_the_limit_is_counted_and_one_byte_longer_refused() {
    let mut rig = Rig::on(MemFs::new(), cfg(1 << 20));
    let longest = vec![b'k'; MAX_CACHE_KEY_BYTES];
    let (_, sum) = rig
        .counters
        .add(rig.bench.t0, 0, &longest, 2)
        .expect("fits");
    assert_eq!(sum, 2);
    rig.pump();
    assert_eq!(rig.counters.get(&longest), Some(2));
    let next = rig.counters.log().next_offset();
    let too_long = vec![b'k'; MAX_CACHE_KEY_BYTES + 1];
    assert_eq!(
        rig.counters.add(rig.bench.t0, 0, &too_long, 1),
        Err(AddError::Append(AppendError::TooLarge(
            MAX_CACHE_KEY_BYTES + 1
        )))
    );
    assert_eq!(rig.counters.log().next_offset(), next, "nothing written");
}

#[test]
fn sums_survive_a_power_loss_and_compaction() {
    let mut rig = Rig::on(MemFs::new(), cfg(600));
    for i in 0..200 {
        rig.add(&format!("k{}", i % 5), i);
        rig.pump();
    }
    let expect: Vec<Option<i64>> = (0..5)
        .map(|k| Some((0..200).filter(|i| i % 5 == k).sum()))
        .collect();
    let sums = |rig: &Rig| -> Vec<Option<i64>> {
        (0..5)
            .map(|k| rig.counters.get(format!("k{k}").as_bytes()))
            .collect()
    };
    assert_eq!(sums(&rig), expect);
    let bytes_before = rig.counters.log().total_bytes();
    assert!(rig.counters.compact());
    rig.pump();
    assert!(rig.failed.is_none(), "{:?}", rig.failed);
    assert_eq!(rig.compacted, 1);
    assert!(rig.counters.log().total_bytes() < bytes_before / 3);
    assert_eq!(sums(&rig), expect);

    let mut rig = rig.reopen(Crash::Power);
    assert!(rig.failed.is_none(), "{:?}", rig.failed);
    assert_eq!(
        sums(&rig),
        expect,
        "the newest record of each key is its sum"
    );
    assert_eq!(rig.add("k0", 1), expect[0].unwrap() + 1);
}

#[test]
fn a_follower_fed_a_compacted_counter_log_holds_its_leaders_sums() {
    let keys: Vec<String> = (0..7).map(|k| format!("k{k}")).collect();
    let sums =
        |c: &CounterLog| -> Vec<Option<i64>> { keys.iter().map(|k| c.get(k.as_bytes())).collect() };
    let mut lead = Rig::on(MemFs::new(), cfg(600));
    for i in 0..150i64 {
        // k6 is written early only, so its one record sits in a compacted segment.
        let k = if i < 3 { 6 } else { i % 6 };
        lead.add(&format!("k{k}"), i - 40);
        lead.pump();
    }
    assert!(lead.counters.compact());
    lead.pump();
    assert_eq!(lead.compacted, 1);
    let want = sums(&lead.counters);
    assert!(want.iter().all(Option::is_some));
    let lead_next = lead.counters.log().next_offset();
    let lead_live = lead.counters.live_bytes();
    let (fs, lead_cfg) = lead.bench.crashed(Crash::Process);
    let mut shipper = crate::test_bench::Shipper::on(fs, lead_cfg, DIR);

    let mut follow = Rig::on(MemFs::new(), cfg(600));
    let in_gaps = crate::test_bench::ship(
        &mut shipper,
        &mut follow,
        1 << 10,
        |f| f.counters.log().next_offset(),
        |f, base, entries| {
            let end = f
                .counters
                .append_shipped(f.bench.t0, base, entries)
                .expect("append_shipped");
            f.pump();
            end
        },
    );
    assert!(in_gaps > 0, "some reads began in a gap");
    assert!(follow.failed.is_none(), "{:?}", follow.failed);
    assert_eq!(follow.counters.log().next_offset(), lead_next);
    assert_eq!(follow.durable, lead_next);
    assert_eq!(sums(&follow.counters), want);
    assert_eq!(follow.counters.len(), keys.len());
    assert_eq!(follow.counters.live_bytes(), lead_live);

    let mut follow = follow.reopen(Crash::Power);
    assert!(follow.failed.is_none(), "{:?}", follow.failed);
    assert_eq!(sums(&follow.counters), want);
    assert_eq!(follow.add("k6", 1), want[6].unwrap() + 1);
}
