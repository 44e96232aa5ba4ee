//! The real `felix-broker` process under `kill -9`: started with `on_commit`, publishers push
//! acked records, the process is killed at a random moment, restarted on the same storage
//! directory, and every record ever acknowledged must be readable, in order, at contiguous
//! offsets. At least [`MIN_KILLS`] kills, within [`TIME_BUDGET`].
//!
//! The broker binary is [`felix_integration::broker_binary`], run on the suite's runtime
//! (`FELIX_RUNTIME`). The random schedule comes from `FELIX_CRASH_SEED` (printed
//! on every run, so a failure can be replayed).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use felix_client::{Ack, Client, ClientConfig, Start, SubscriptionItem};
use felix_integration::{
    broker_binary, broker_runtime, client_config, free_udp_port, unique, within,
};

const MIN_KILLS: usize = 20;
const MAX_KILLS: usize = 30;
/// Kills stop being scheduled past this; the test as a whole stays under a minute.
const TIME_BUDGET: Duration = Duration::from_secs(45);
/// Segment size for the broker under test: a few roll-overs per run.
const SEGMENT_MAX_BYTES: usize = 1 << 20;
const PUBLISHERS: usize = 4;
const RECORDS_PER_BATCH: usize = 4;
const BIG_RECORDS_PER_BATCH: usize = 8;
const BIG_RECORD_BYTES: usize = 32 * 1024;
/// Bounds what every restart re-reads from `earliest`.
const BIG_BATCHES_PER_ROUND: usize = 4;

/// splitmix64: the schedule's only source of randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// One run of the broker process.
struct Broker {
    child: Child,
    config: ClientConfig,
}

async fn start_broker(bin: &Path, storage: &Path, work: &Path, round: usize) -> Broker {
    let ca = work.join("ca.pem");
    let token = work.join("token");
    let _ = std::fs::remove_file(&ca);
    let _ = std::fs::remove_file(&token);
    let addr: SocketAddr = format!("127.0.0.1:{}", free_udp_port()).parse().unwrap();
    let log = std::fs::File::create(work.join(format!("broker-{round}.log"))).unwrap();
    let mut child = Command::new(bin)
        .env("FELIX_RUNTIME", broker_runtime())
        .env("FELIX_QUIC_BIND", addr.to_string())
        .env("FELIX_TLS_CERT_EXPORT", &ca)
        .env("FELIX_DEV_TOKEN_EXPORT", &token)
        .env("FELIX_DURABLE_STORAGE_DIR", storage)
        .env("FELIX_DURABLE_FSYNC_MODE", "on_commit")
        // Small segments, so that kills also find sealed segments still carrying the
        // direct appends' block padding (docs/storage-format.md, "Write padding").
        .env(
            "FELIX_DURABLE_SEGMENT_MAX_BYTES",
            SEGMENT_MAX_BYTES.to_string(),
        )
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    // The exports appear once recovery is done and the socket is served.
    for _ in 0..400 {
        if let (Ok(ca_pem), Ok(token)) = (std::fs::read(&ca), std::fs::read_to_string(&token)) {
            let config = client_config(addr, ca_pem, token.trim());
            return Broker { child, config };
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(work.join(format!("broker-{round}.log")));
            panic!("broker exited with {status} in round {round}: {log:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let _ = child.kill();
    panic!("broker did not start in round {round}");
}

/// Acknowledged records by offset: their length and FNV-1a hash (big ones are not kept).
type Acked = Arc<Mutex<BTreeMap<u64, (usize, u64)>>>;

fn fingerprint(payload: &[u8]) -> (usize, u64) {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in payload {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (payload.len(), h)
}

/// Every acknowledged record is readable from `earliest`, in order, at contiguous offsets.
async fn verify(client: &Client, stream: &str, acked: &Acked, round: usize) -> u64 {
    let expected: BTreeMap<u64, (usize, u64)> = acked.lock().unwrap().clone();
    let Some((&last, _)) = expected.last_key_value() else {
        return 0;
    };
    let mut sub = within(10, client.subscribe("default", stream, Start::Earliest))
        .await
        .unwrap_or_else(|e| panic!("round {round}: subscribe from earliest: {e}"));
    assert_eq!(
        sub.start_offset(),
        Some(0),
        "round {round}: nothing was trimmed"
    );
    let mut next = 0u64;
    while next <= last {
        let item = within(10, sub.next())
            .await
            .unwrap_or_else(|e| panic!("round {round}: reading offset {next}: {e}"));
        let SubscriptionItem::Event(event) = item else {
            panic!("round {round}: subscription ended at {next}: {item:?}");
        };
        assert_eq!(
            event.offset,
            Some(next),
            "round {round}: offsets are contiguous"
        );
        if let Some(want) = expected.get(&next) {
            assert_eq!(
                &fingerprint(&event.payload),
                want,
                "round {round}: acked record {next}"
            );
        }
        next += 1;
    }
    expected.len() as u64
}

async fn publisher(client: Client, stream: String, acked: Acked, round: usize, task: usize) {
    for n in 0.. {
        let payloads: Vec<Bytes> = (0..RECORDS_PER_BATCH)
            .map(|j| Bytes::from(format!("r{round}-t{task}-n{n}-{j}")))
            .collect();
        match client
            .publish("default", &stream, payloads.clone(), None, Ack::PerBatch)
            .await
        {
            Ok(Some(offset)) => {
                let mut acked = acked.lock().unwrap();
                for (j, p) in payloads.into_iter().enumerate() {
                    acked.insert(offset + j as u64, fingerprint(&p));
                }
            }
            Ok(None) => panic!("an on_commit ack carries its offset"),
            // The broker died under us: this batch is not acknowledged.
            Err(_) => return,
        }
    }
}

/// Large batches, so a kill has writes of some length to land in (a torn tail).
async fn big_publisher(client: Client, stream: String, acked: Acked, round: usize) {
    for n in 0..BIG_BATCHES_PER_ROUND {
        let payloads: Vec<Bytes> = (0..BIG_RECORDS_PER_BATCH)
            .map(|j| {
                let mut p = vec![(round + n + j) as u8; BIG_RECORD_BYTES];
                let tag = format!("{round:04}-{n:05}-{j:04}");
                p[..tag.len()].copy_from_slice(tag.as_bytes());
                Bytes::from(p)
            })
            .collect();
        match client
            .publish("default", &stream, payloads.clone(), None, Ack::PerBatch)
            .await
        {
            Ok(Some(offset)) => {
                let mut acked = acked.lock().unwrap();
                for (j, p) in payloads.iter().enumerate() {
                    acked.insert(offset + j as u64, fingerprint(p));
                }
            }
            Ok(None) => panic!("an on_commit ack carries its offset"),
            Err(_) => return,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_records_survive_kill_9_at_random_moments() {
    let bin = broker_binary();
    let seed = std::env::var("FELIX_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!(
        "crash_recovery: seed {seed} (replay: FELIX_CRASH_SEED={seed} cargo test -p felix-integration --test crash_recovery), broker {}",
        bin.display()
    );
    // A failure's first line names the seed, whatever panicked (this thread or a task).
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        eprintln!(
            "crash_recovery FAILED with seed {seed}: replay with FELIX_CRASH_SEED={seed} cargo test -p felix-integration --test crash_recovery"
        );
        default_hook(info);
    }));
    let mut rng = Rng(seed);
    let work = std::env::temp_dir().join(unique("felix-crash"));
    let storage = work.join("storage");
    std::fs::create_dir_all(&storage).unwrap();
    let stream = "crash-orders".to_owned();
    let acked: Acked = Arc::new(Mutex::new(BTreeMap::new()));

    let began = Instant::now();
    let mut kills = 0;
    while kills < MAX_KILLS && (kills < MIN_KILLS || began.elapsed() < TIME_BUDGET) {
        let mut broker = start_broker(&bin, &storage, &work, kills).await;
        let client = within(15, Client::connect(broker.config.clone()))
            .await
            .unwrap_or_else(|e| panic!("round {kills}: connect: {e}"));
        verify(&client, &stream, &acked, kills).await;

        let mut tasks: Vec<_> = (0..PUBLISHERS)
            .map(|t| {
                tokio::spawn(publisher(
                    client.clone(),
                    stream.clone(),
                    acked.clone(),
                    kills,
                    t,
                ))
            })
            .collect();
        tasks.push(tokio::spawn(big_publisher(
            client.clone(),
            stream.clone(),
            acked.clone(),
            kills,
        )));
        tokio::time::sleep(Duration::from_millis(rng.between(20, 300))).await;
        broker.child.kill().expect("kill -9");
        broker.child.wait().expect("reap");
        kills += 1;
        // Nothing answers any more; closing fails the publishes in flight at once rather
        // than after the idle timeout.
        client.close().await;
        for t in tasks {
            let _ = within(20, t).await;
        }
    }

    let mut broker = start_broker(&bin, &storage, &work, kills).await;
    let client = within(15, Client::connect(broker.config.clone()))
        .await
        .expect("final connect");
    let checked = verify(&client, &stream, &acked, kills).await;
    let torn = (0..=kills)
        .filter_map(|r| std::fs::read_to_string(work.join(format!("broker-{r}.log"))).ok())
        .filter(|log| log.contains("torn tail"))
        .count();
    eprintln!(
        "crash_recovery: {kills} kills in {:.1?}, {torn} restarts cut a torn tail, {checked} acknowledged records all readable",
        began.elapsed()
    );
    assert!(kills >= MIN_KILLS);
    assert!(checked > 0, "publishers got acknowledgements");
    assert!(
        most_files_in_one_dir(&storage) >= 2,
        "some shard rolled over to a second segment (SEGMENT_MAX_BYTES)"
    );
    client.close().await;
    let _ = broker.child.kill();
    let _ = broker.child.wait();
    let _ = std::fs::remove_dir_all(&work);
}

/// The most regular files any one directory under `dir` holds (a shard's segments).
fn most_files_in_one_dir(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let (mut files, mut most) = (0, 0);
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            most = most.max(most_files_in_one_dir(&path));
        } else {
            files += 1;
        }
    }
    most.max(files)
}
