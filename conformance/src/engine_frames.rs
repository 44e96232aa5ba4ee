//! The `engine_frames` fuzz check: `arbitrary` sequences of client actions fed to sessions
//! and the broker beneath QUIC, through `felix_engine::fuzzing::FrameHarness` — auth,
//! publishes (binary and JSON), subscribes, cache operations, consumer groups, every other
//! request type (an arbitrary message with its names pinned to a few), garbage and mutated
//! frames, stream deletes, file completions in any order (some failing), closes and time
//! passing. It asserts that:
//!
//! - nothing panics (the engine's own `expect`s included);
//! - every answer the broker writes is exactly one frame that decodes, and none follows the
//!   end of its stream;
//! - every event stream starts with `event_stream_hello`, and every frame on it decodes;
//! - the sessions and the broker hold no more than their limits allow (the harness's
//!   `usage()` after every action).
//!
//! Without QUIC and TLS an input costs from about 0.3 ms (building the core) to a few
//! milliseconds, not a handshake: this target runs on the order of a thousand inputs per CPU
//! second where `engine` runs tens to hundreds (figures in docs/security.md). The `engine`
//! target stays for what lies above the sessions (QUIC streams, flow control, the
//! connection's read budget).
//!
//! Durable storage runs on an in-memory disk; each file op is performed when the input
//! completes it, in the order it picks.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use felix_engine::fuzzing::{FrameHarness, Written, UNREAD_PAGE_RESERVE};
use felix_engine::{
    AuthConfig, DurableConfig, EngineConfig, FileCompletion, FileError, FileErrorKind, FileOp,
    FsyncPolicy,
};
use felix_proto::message::Message;
use felix_proto::{Decoded, FrameDecoder};
use felix_testkit::{binary_frame, json_frame, shared_tls, MemFs};
use serde_json::Value;

/// Actions read from one input.
const MAX_ACTIONS: usize = 64;
/// Client connections one input may open.
const MAX_CLIENTS: usize = 3;
/// File ops completed at the end of an input before the disk counts as stuck.
const MAX_FINAL_OPS: usize = 20_000;

// The limits, small so that inputs reach their edges.
const PREAUTH_MAX_STREAMS: usize = 2;
const MAX_SUBSCRIPTIONS: usize = 3;
const PUBLISH_WINDOW: u32 = 4;
const MAX_UNWRITTEN: usize = 16 * 1024;
const READ_CHUNK: usize = 4 * 1024;
const MAX_FRAME: u32 = 32 * 1024;
const QUEUE_CAPACITY: usize = 4;
const QUEUE_CAPACITY_MAX: usize = 8;
const MAX_BROKER_STREAMS: usize = 5;
const MAX_BIDI: u32 = 8;
const MAX_EVENT_BYTES: usize = 24 * 1024;
const CACHE_MAX_VALUE: usize = 1024;
/// The harness's start, as Unix seconds (2026-01-01T00:00:00Z).
const UNIX_SECS: u64 = 1_767_225_600;

/// The real client's offer (peer-client-wire.md §3), and a bare one (no error codes, no
/// `unsupported`: the paths that close the stream instead).
const OFFER: &str = r#""client_flags":8191,"client_features":4218945535,"client_features_hi":15"#;

/// Runs one input. Panics on a broken invariant.
pub fn engine_frames(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(setup) = Setup::arbitrary(&mut u) else {
        return;
    };
    if debug() {
        eprintln!("{setup:?}");
    }
    let mut world = World::new(setup);
    for _ in 0..MAX_ACTIONS {
        let Ok(action) = Action::arbitrary(&mut u) else {
            break;
        };
        if debug() {
            eprintln!("{action:?}");
        }
        world.apply(action);
        world.after_action();
    }
    // Let the disk finish and timers run, so held answers go out and are checked too.
    world.complete_all();
    world.advance(Duration::from_secs(40));
    world.complete_all();
    world.check_written();
    world.check_usage();
}

/// `FELIX_FUZZ_DEBUG` set: print each action (to replay a finding).
fn debug() -> bool {
    static DEBUG: OnceLock<bool> = OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var_os("FELIX_FUZZ_DEBUG").is_some())
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Storage {
    Memory,
    /// Durable, no fsync.
    NoSync,
    /// Durable, fsync every 50 ms.
    Periodic,
    /// Durable, every ack after an fsync.
    OnCommit,
}

#[derive(Arbitrary, Debug)]
struct Setup {
    storage: Storage,
    /// Complete every file op after each action (else only when an action says so).
    auto_disk: bool,
    /// Small segments and a retention bound, so logs roll and trim.
    small_logs: bool,
    /// Offer error codes and every feature (else a bare auth).
    full_offer: bool,
}

/// A payload of `len % 1200` copies of `fill`.
#[derive(Arbitrary, Debug, Clone, Copy)]
struct Payload {
    len: u16,
    fill: u8,
}

impl Payload {
    fn bytes(self) -> Vec<u8> {
        vec![self.fill; usize::from(self.len % 1200)]
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Token {
    Good,
    /// A good signature for t1, presented as t2.
    OtherTenant,
    Garbage,
}

/// A request (it may still be refused: another tenant, a limit, a bad shard).
#[derive(Arbitrary, Debug, Clone)]
enum Req {
    PublishBinary {
        acked: bool,
        key: Option<u8>,
        stream: u8,
        payloads: Vec<Payload>,
    },
    PublishJson {
        acked: bool,
        batch: bool,
        stream: u8,
        shard: Option<u8>,
        payload: Payload,
    },
    Subscribe {
        stream: u8,
        shard: u8,
        start: u8,
        queue: Option<u8>,
    },
    CachePut {
        cache: u8,
        key: u8,
        value: Payload,
        ttl_ms: Option<u16>,
    },
    CacheGet {
        cache: u8,
        key: u8,
    },
    CacheDelete {
        cache: u8,
        key: u8,
    },
    GroupPoll {
        stream: u8,
        group: u8,
        max: u8,
        wait_ms: Option<u16>,
        visibility_ms: Option<u16>,
    },
    /// Settles record `offset` of a group: ack, nack, extend, dead-letter, discard.
    GroupSettle {
        how: u8,
        stream: u8,
        group: u8,
        offset: u8,
    },
    StreamRead {
        stream: u8,
        from: u8,
        max: u8,
    },
    /// Any message, its names (tenant, stream, cache, group, key...) and numbers pinned
    /// to a few values so that requests meet each other's state.
    Any {
        message: Box<Message>,
        seed: u8,
    },
    AuthAgain,
}

#[derive(Arbitrary, Debug, Clone)]
enum Action {
    Connect,
    /// Opens a stream, authenticating it at once when `auth` says how.
    Open {
        conn: u8,
        auth: Option<Token>,
    },
    Auth {
        conn: u8,
        stream: u8,
        token: Token,
    },
    Send {
        conn: u8,
        stream: u8,
        req: Req,
    },
    /// A request with some bytes flipped.
    SendMutated {
        conn: u8,
        stream: u8,
        req: Req,
        flips: Vec<(u16, u8)>,
    },
    /// A request in two pieces, split at `at`.
    SendSplit {
        conn: u8,
        stream: u8,
        req: Req,
        at: u16,
    },
    SendGarbage {
        conn: u8,
        stream: u8,
        bytes: Vec<u8>,
    },
    /// A well-framed frame with any flags and payload.
    SendFrame {
        conn: u8,
        stream: u8,
        flags: u16,
        payload: Vec<u8>,
    },
    Finish {
        conn: u8,
        stream: u8,
    },
    Reset {
        conn: u8,
        stream: u8,
    },
    Stop {
        conn: u8,
        stream: u8,
    },
    BlockAnswers {
        conn: u8,
        stream: u8,
        blocked: bool,
    },
    BlockEvents {
        conn: u8,
        which: u8,
        blocked: bool,
    },
    StopEvents {
        conn: u8,
        which: u8,
    },
    Close {
        conn: u8,
    },
    /// The operator deletes a stream.
    DeleteStream {
        stream: u8,
    },
    /// Completes one pending file op, picked from those out.
    CompleteOp {
        pick: u8,
    },
    /// Completes up to `n` pending file ops in the order they were issued.
    CompleteOps {
        n: u8,
    },
    /// Completes one pending file op with an error (the op is not performed).
    FailOp {
        pick: u8,
        no_space: bool,
    },
    /// Lets `ms` × 10 ms pass (up to about 11 minutes: past every timer).
    Advance {
        ms: u16,
    },
}

fn stream_name(n: u8) -> String {
    // More names than the broker holds streams, so creation reaches its limit.
    format!("s{}", n % 7)
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

impl Req {
    fn encode(&self, request_id: u64) -> Vec<u8> {
        let (tenant, ns) = ("t1", "default");
        match self {
            Req::PublishBinary {
                acked,
                key,
                stream,
                payloads,
            } => {
                let mut flags = 0x0001u16;
                let mut p = Vec::new();
                if *acked {
                    flags |= 0x0008;
                    p.extend_from_slice(&request_id.to_be_bytes());
                    p.push(1);
                }
                if let Some(k) = key {
                    flags |= 0x0040;
                    p.extend_from_slice(&1u16.to_be_bytes());
                    p.push(*k);
                }
                for s in [tenant, ns, &stream_name(*stream)] {
                    p.extend_from_slice(&(s.len() as u16).to_be_bytes());
                    p.extend_from_slice(s.as_bytes());
                }
                let payloads: Vec<_> = payloads.iter().take(8).map(|p| p.bytes()).collect();
                p.extend_from_slice(&(payloads.len() as u32).to_be_bytes());
                for payload in &payloads {
                    p.extend_from_slice(&(payload.len() as u32).to_be_bytes());
                    p.extend_from_slice(payload);
                }
                binary_frame(flags, &p)
            }
            Req::PublishJson {
                acked,
                batch,
                stream,
                shard,
                payload,
            } => {
                let body = b64(&payload.bytes());
                let mut v = serde_json::json!({"type": "publish", "tenant_id": tenant,
                    "namespace": ns, "stream": stream_name(*stream),
                    "request_id": request_id,
                    "ack": if *acked { "per_message" } else { "none" }});
                if *batch {
                    v["type"] = "publish_batch".into();
                    v["payloads"] = serde_json::json!([body, body]);
                } else {
                    v["payload"] = body.into();
                }
                if let Some(shard) = shard {
                    v["shard"] = (*shard % 3).into();
                }
                json_frame(&v.to_string())
            }
            Req::Subscribe {
                stream,
                shard,
                start,
                queue,
            } => {
                let mut v = serde_json::json!({"type": "subscribe", "tenant_id": tenant,
                    "namespace": ns, "stream": stream_name(*stream), "shard": shard % 3});
                match start % 4 {
                    0 => {}
                    1 => v["start"] = "earliest".into(),
                    2 => v["start"] = serde_json::json!({"offset": start / 4}),
                    _ => v["start"] = "latest".into(),
                }
                if let Some(q) = queue {
                    v["queue_capacity"] = (*q).into();
                }
                json_frame(&v.to_string())
            }
            Req::CachePut {
                cache,
                key,
                value,
                ttl_ms,
            } => {
                let mut v = serde_json::json!({"type": "cache_put", "tenant_id": tenant,
                    "namespace": ns, "cache": format!("c{}", cache % 3),
                    "key": format!("k{}", key % 6), "value": b64(&value.bytes()),
                    "request_id": request_id});
                if let Some(ttl) = ttl_ms {
                    v["ttl_ms"] = (*ttl).into();
                }
                json_frame(&v.to_string())
            }
            Req::CacheGet { cache, key } | Req::CacheDelete { cache, key } => {
                let ty = match self {
                    Req::CacheGet { .. } => "cache_get",
                    _ => "cache_delete",
                };
                let v = serde_json::json!({"type": ty, "tenant_id": tenant,
                    "namespace": ns, "cache": format!("c{}", cache % 3),
                    "key": format!("k{}", key % 6), "request_id": request_id});
                json_frame(&v.to_string())
            }
            Req::GroupPoll {
                stream,
                group,
                max,
                wait_ms,
                visibility_ms,
            } => {
                let mut v = serde_json::json!({"type": "group_poll", "tenant_id": tenant,
                    "namespace": ns, "stream": stream_name(*stream), "shard": 0,
                    "group": format!("g{}", group % 2), "max_records": max % 6,
                    "request_id": request_id, "consumer": format!("m{}", group % 3)});
                if let Some(w) = wait_ms {
                    v["wait_ms"] = (*w % 5000).into();
                }
                if let Some(vis) = visibility_ms {
                    v["visibility_ms"] = (*vis).into();
                }
                json_frame(&v.to_string())
            }
            Req::GroupSettle {
                how,
                stream,
                group,
                offset,
            } => {
                let ty = [
                    "group_ack",
                    "group_nack",
                    "group_extend",
                    "group_dead_letter",
                    "group_discard",
                    "group_redrive",
                ][usize::from(how % 6)];
                let mut v = serde_json::json!({"type": ty, "tenant_id": tenant,
                    "namespace": ns, "stream": stream_name(*stream), "shard": 0,
                    "group": format!("g{}", group % 2), "offset": offset % 16,
                    "request_id": request_id});
                if ty == "group_nack" {
                    v["delay_ms"] = (u64::from(*how) * 40).into();
                }
                if ty == "group_extend" {
                    v["visibility_ms"] = (u64::from(*how) * 100).into();
                }
                json_frame(&v.to_string())
            }
            Req::StreamRead { stream, from, max } => {
                let v = serde_json::json!({"type": "stream_read", "tenant_id": tenant,
                    "namespace": ns, "stream": stream_name(*stream), "shard": 0,
                    "from": from % 16, "max_records": max % 8, "request_id": request_id});
                json_frame(&v.to_string())
            }
            Req::Any { message, seed } => {
                let Ok(mut v) = serde_json::from_slice::<Value>(&message.encode()) else {
                    return json_frame(&String::from_utf8_lossy(&message.encode()));
                };
                pin(&mut v, *seed, request_id);
                json_frame(&v.to_string())
            }
            Req::AuthAgain => json_frame(&format!(
                r#"{{"type":"auth","tenant_id":"t1","token":"x",{OFFER}}}"#
            )),
        }
    }
}

/// Pins an arbitrary message's names and numbers to a few values, so that it names the
/// streams, caches and groups other requests use, and offsets near theirs.
fn pin(v: &mut Value, seed: u8, request_id: u64) {
    let Some(obj) = v.as_object_mut() else {
        return;
    };
    let n = u64::from(seed);
    for (field, value) in obj.iter_mut() {
        let pinned: Option<Value> = match field.as_str() {
            "tenant_id" => Some((if seed.is_multiple_of(11) { "t2" } else { "t1" }).into()),
            "namespace" => Some("default".into()),
            "stream" | "name" => Some(stream_name(seed).into()),
            "cache" => Some(format!("c{}", seed % 3).into()),
            "group" => Some(format!("g{}", seed % 2).into()),
            "consumer" => Some(format!("m{}", seed % 3).into()),
            "key" | "entity_key" if value.is_string() => Some(format!("k{}", seed % 6).into()),
            "prefix" if value.is_string() => Some("k".into()),
            "request_id" => Some(request_id.into()),
            "shard" if value.is_u64() => Some((n % 3).into()),
            "offset" | "from" | "end" | "expected_offset" | "from_offset" | "sequence"
                if value.is_u64() =>
            {
                Some((value.as_u64().unwrap_or(0) % 24).into())
            }
            "max_records" | "max_bytes" if value.is_u64() => {
                Some((value.as_u64().unwrap_or(0) % 4096).into())
            }
            "wait_ms" | "visibility_ms" | "delay_ms" | "ttl_ms" if value.is_u64() => {
                Some((value.as_u64().unwrap_or(0) % 20_000).into())
            }
            "producer_id" if value.is_u64() => Some((n % 4).into()),
            _ => None,
        };
        if let Some(p) = pinned {
            *value = p;
        }
    }
}

/// What the check knows about one stream the broker writes to.
#[derive(Default)]
struct Seen {
    frames: usize,
    ended: bool,
}

struct World {
    harness: FrameHarness,
    disk: MemFs,
    /// File ops out, in the order they were issued.
    ops: Vec<FileOp>,
    auto_disk: bool,
    full_offer: bool,
    token: String,
    conns: usize,
    next_request: u64,
    answers: BTreeMap<(usize, u64), Seen>,
    events: BTreeMap<(usize, u64), Seen>,
}

/// A JWKS document and a full-permission token for `t1`, made once per process: key
/// derivation and signing were most of a short input's cost in dev mode, which does both
/// for every engine it builds.
fn auth() -> &'static (Vec<u8>, String) {
    static AUTH: OnceLock<(Vec<u8>, String)> = OnceLock::new();
    AUTH.get_or_init(|| {
        let key = felix_auth::SigningKey::from_bytes(&[7; 32]);
        let doc = felix_auth::jwks_document(&[("fuzz", &key)]).into_bytes();
        let perms = felix_auth::full_permissions("t1");
        let claims = felix_auth::Claims::for_tenant("t1", perms, UNIX_SECS, 86_400);
        (doc, felix_auth::mint_token(&key, "fuzz", &claims))
    })
}

fn config(setup: &Setup) -> EngineConfig {
    let mut config = EngineConfig::new(
        shared_tls().identity.clone(),
        AuthConfig::Jwks(auth().0.clone()),
        [9; 32],
    );
    config.preauth_max_streams_per_connection = PREAUTH_MAX_STREAMS;
    config.max_subscriptions_per_connection = MAX_SUBSCRIPTIONS;
    config.publish_window = PUBLISH_WINDOW;
    config.max_connection_unwritten_bytes = MAX_UNWRITTEN;
    config.max_connection_event_bytes = MAX_EVENT_BYTES;
    config.read_chunk_bytes = READ_CHUNK;
    config.subscriber_queue_capacity = QUEUE_CAPACITY;
    config.subscriber_queue_capacity_max = QUEUE_CAPACITY_MAX;
    config.max_streams = MAX_BROKER_STREAMS;
    config.max_concurrent_bidi_streams = MAX_BIDI;
    config.preauth_max_frame_bytes = 2048;
    config.max_frame_bytes = MAX_FRAME;
    config.cache_max_key_bytes = 8;
    config.cache_max_value_bytes = CACHE_MAX_VALUE;
    config.cache_max_total_bytes = 4096;
    config.event_batch_max_records = 8;
    config.default_shards = 2;
    let durable = |fsync| {
        let mut d = DurableConfig::default();
        d.fsync = fsync;
        d.max_inflight_file_ops = 4;
        d.tail_cache_bytes = 4096;
        if setup.small_logs {
            d.segment_max_bytes = 2048;
            d.retention_bytes = Some(6144);
            d.retention_check_interval = Duration::from_secs(1);
        }
        d.groups.max_in_flight = 8;
        d.groups.max_waiting_polls = 4;
        d.groups.max_attempts = 3;
        d
    };
    config.durable = match setup.storage {
        Storage::Memory => None,
        Storage::NoSync => Some(durable(FsyncPolicy::None)),
        Storage::Periodic => Some(durable(FsyncPolicy::Periodic(Duration::from_millis(50)))),
        Storage::OnCommit => Some(durable(FsyncPolicy::OnCommit)),
    };
    config
}

impl World {
    fn new(setup: Setup) -> World {
        let harness = FrameHarness::new(config(&setup), Instant::now(), UNIX_SECS * 1_000_000)
            .expect("the harness builds");
        let token = auth().1.clone();
        let mut world = World {
            harness,
            disk: MemFs::new(),
            ops: Vec::new(),
            auto_disk: setup.auto_disk,
            full_offer: setup.full_offer,
            token,
            conns: 0,
            next_request: 0,
            answers: BTreeMap::new(),
            events: BTreeMap::new(),
        };
        world.complete_all();
        assert!(
            world.harness.is_ready(),
            "recovery of an empty disk finishes"
        );
        // One connection with one authenticated stream, so short inputs reach the broker.
        world.apply(Action::Connect);
        world.apply(Action::Open {
            conn: 0,
            auth: Some(Token::Good),
        });
        world.after_action();
        world
    }

    fn conn(&self, conn: u8) -> Option<usize> {
        (self.conns > 0).then(|| usize::from(conn) % self.conns)
    }

    fn stream(&self, conn: u8, stream: u8) -> Option<(usize, u64)> {
        let c = self.conn(conn)?;
        let streams = self.harness.streams(c);
        let s = *streams.get(usize::from(stream) % streams.len().max(1))?;
        Some((c, s))
    }

    fn events_stream(&self, conn: u8, which: u8) -> Option<(usize, u64)> {
        let c = self.conn(conn)?;
        let streams = self.harness.event_streams(c);
        let s = *streams.get(usize::from(which) % streams.len().max(1))?;
        Some((c, s))
    }

    fn request_id(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    fn auth_frame(&self, token: Token) -> Vec<u8> {
        let (tenant, token) = match token {
            Token::Good => ("t1", self.token.as_str()),
            Token::OtherTenant => ("t2", self.token.as_str()),
            Token::Garbage => ("t1", "garbage"),
        };
        let offer = if self.full_offer {
            format!(",{OFFER}")
        } else {
            String::new()
        };
        json_frame(&format!(
            r#"{{"type":"auth","tenant_id":"{tenant}","token":"{token}"{offer}}}"#
        ))
    }

    fn apply(&mut self, action: Action) {
        match action {
            Action::Connect => {
                if self.conns < MAX_CLIENTS {
                    self.conns = self.harness.connect() + 1;
                }
            }
            Action::Open { conn, auth } => {
                let Some(c) = self.conn(conn) else { return };
                let Some(s) = self.harness.open_stream(c) else {
                    return;
                };
                if let Some(token) = auth {
                    let frame = self.auth_frame(token);
                    self.harness.send(c, s, &frame);
                }
            }
            Action::Auth {
                conn,
                stream,
                token,
            } => {
                let Some((c, s)) = self.stream(conn, stream) else {
                    return;
                };
                let frame = self.auth_frame(token);
                self.harness.send(c, s, &frame);
            }
            Action::Send { conn, stream, req } => {
                let Some((c, s)) = self.stream(conn, stream) else {
                    return;
                };
                let id = self.request_id();
                self.harness.send(c, s, &req.encode(id));
            }
            Action::SendMutated {
                conn,
                stream,
                req,
                flips,
            } => {
                let Some((c, s)) = self.stream(conn, stream) else {
                    return;
                };
                let id = self.request_id();
                let mut bytes = req.encode(id);
                for (at, x) in flips.into_iter().take(8) {
                    let len = bytes.len();
                    if len > 0 {
                        bytes[usize::from(at) % len] ^= x;
                    }
                }
                self.harness.send(c, s, &bytes);
            }
            Action::SendSplit {
                conn,
                stream,
                req,
                at,
            } => {
                let Some((c, s)) = self.stream(conn, stream) else {
                    return;
                };
                let id = self.request_id();
                let bytes = req.encode(id);
                let at = usize::from(at) % (bytes.len() + 1);
                self.harness.send(c, s, &bytes[..at]);
                self.harness.send(c, s, &bytes[at..]);
            }
            Action::SendGarbage {
                conn,
                stream,
                bytes,
            } => {
                let Some((c, s)) = self.stream(conn, stream) else {
                    return;
                };
                self.harness.send(c, s, &bytes);
            }
            Action::SendFrame {
                conn,
                stream,
                flags,
                payload,
            } => {
                let Some((c, s)) = self.stream(conn, stream) else {
                    return;
                };
                self.harness.send(c, s, &binary_frame(flags, &payload));
            }
            Action::Finish { conn, stream } => {
                if let Some((c, s)) = self.stream(conn, stream) {
                    self.harness.finish(c, s);
                }
            }
            Action::Reset { conn, stream } => {
                if let Some((c, s)) = self.stream(conn, stream) {
                    self.harness.reset(c, s);
                }
            }
            Action::Stop { conn, stream } => {
                if let Some((c, s)) = self.stream(conn, stream) {
                    self.harness.stop(c, s);
                }
            }
            Action::BlockAnswers {
                conn,
                stream,
                blocked,
            } => {
                if let Some((c, s)) = self.stream(conn, stream) {
                    self.harness.block_answers(c, s, blocked);
                }
            }
            Action::BlockEvents {
                conn,
                which,
                blocked,
            } => {
                if let Some((c, s)) = self.events_stream(conn, which) {
                    self.harness.block_events(c, s, blocked);
                }
            }
            Action::StopEvents { conn, which } => {
                if let Some((c, s)) = self.events_stream(conn, which) {
                    self.harness.stop_events(c, s);
                }
            }
            Action::Close { conn } => {
                if let Some(c) = self.conn(conn) {
                    self.harness.close(c);
                }
            }
            Action::DeleteStream { stream } => {
                // Refusals (no such stream, a log still opening) are answers too.
                let _ = self
                    .harness
                    .delete_stream("t1", "default", &stream_name(stream));
            }
            Action::CompleteOp { pick } => {
                self.pull_ops();
                if !self.ops.is_empty() {
                    let op = self.ops.remove(usize::from(pick) % self.ops.len());
                    self.perform(op);
                }
            }
            Action::CompleteOps { n } => {
                for _ in 0..n % 16 {
                    self.pull_ops();
                    if self.ops.is_empty() {
                        break;
                    }
                    let op = self.ops.remove(0);
                    self.perform(op);
                }
            }
            Action::FailOp { pick, no_space } => {
                self.pull_ops();
                if !self.ops.is_empty() {
                    let op = self.ops.remove(usize::from(pick) % self.ops.len());
                    let kind = if no_space {
                        FileErrorKind::NoSpace
                    } else {
                        FileErrorKind::Other
                    };
                    self.harness.handle_file_completion(FileCompletion {
                        id: op.id,
                        result: Err(FileError::new(kind, "injected by the fuzzer")),
                    });
                }
            }
            Action::Advance { ms } => self.advance(Duration::from_millis(10 * u64::from(ms))),
        }
    }

    fn pull_ops(&mut self) {
        while let Some(op) = self.harness.poll_file_op() {
            self.ops.push(op);
        }
    }

    fn perform(&mut self, op: FileOp) {
        let completion = self.disk.execute(op).expect("the disk never crashes here");
        self.harness.handle_file_completion(completion);
    }

    /// Completes every file op, in issue order, until none is left.
    fn complete_all(&mut self) {
        for _ in 0..MAX_FINAL_OPS {
            self.pull_ops();
            if self.ops.is_empty() {
                return;
            }
            let op = self.ops.remove(0);
            self.perform(op);
        }
        panic!("file ops still coming after {MAX_FINAL_OPS}");
    }

    fn advance(&mut self, d: Duration) {
        self.harness.advance(d);
        if self.auto_disk {
            self.complete_all();
        }
    }

    fn after_action(&mut self) {
        if self.auto_disk {
            self.complete_all();
        }
        self.check_written();
        self.check_usage();
    }

    /// Every answer is one whole frame that decodes; event streams start with a hello;
    /// nothing follows the end of a stream.
    fn check_written(&mut self) {
        for w in self.harness.take_written() {
            match w {
                Written::Answer {
                    conn,
                    stream,
                    frame,
                } => {
                    let seen = self.answers.entry((conn, stream)).or_default();
                    assert!(!seen.ended, "an answer after the stream finished");
                    seen.frames += 1;
                    one_frame(&frame, "answer");
                }
                Written::Finished { conn, stream } => {
                    let seen = self.answers.entry((conn, stream)).or_default();
                    assert!(!seen.ended, "a stream finished twice");
                    seen.ended = true;
                }
                Written::Event {
                    conn,
                    events,
                    frame,
                } => {
                    let seen = self.events.entry((conn, events)).or_default();
                    assert!(!seen.ended, "an event after the event stream ended");
                    let decoded = one_frame(&frame, "event");
                    if seen.frames == 0 {
                        assert!(
                            matches!(decoded, Decoded::Json(Message::EventStreamHello(_))),
                            "an event stream starts with {decoded:?}"
                        );
                    }
                    seen.frames += 1;
                }
                Written::EventsEnded { conn, events } => {
                    let seen = self.events.entry((conn, events)).or_default();
                    assert!(!seen.ended, "an event stream ended twice");
                    seen.ended = true;
                }
                Written::Closed { .. } => {}
            }
        }
    }

    /// The sessions and the broker hold no more than their limits allow.
    fn check_usage(&self) {
        let u = self.harness.usage();
        assert!(
            u.sessions <= MAX_CLIENTS * MAX_BIDI as usize,
            "sessions: {u:?}"
        );
        assert!(
            u.max_unauthenticated_per_connection <= PREAUTH_MAX_STREAMS,
            "unauthenticated streams: {u:?}"
        );
        assert!(
            u.max_session_backlog <= PUBLISH_WINDOW as usize,
            "session backlog over the window: {u:?}"
        );
        // A decoder holds at most one frame and one chunk read past it.
        assert!(
            u.max_connection_buffered_bytes
                <= MAX_BIDI as usize * (MAX_FRAME as usize + 12 + READ_CHUNK),
            "buffered bytes: {u:?}"
        );
        // One answer may cross the budget: the largest is a `stream_read` page not read yet,
        // which counts as a full one.
        assert!(
            u.max_connection_unwritten_bytes
                <= MAX_UNWRITTEN + UNREAD_PAGE_RESERVE.max(2 * MAX_FRAME as usize),
            "unwritten answer bytes: {u:?}"
        );
        assert!(
            u.max_connection_subscriptions <= MAX_SUBSCRIPTIONS,
            "subscriptions: {u:?}"
        );
        assert!(
            u.max_subscriber_queue <= QUEUE_CAPACITY_MAX + 64,
            "subscriber queue: {u:?}"
        );
        assert!(u.streams <= MAX_BROKER_STREAMS, "streams: {u:?}");
        assert!(
            u.max_connection_event_bytes <= MAX_EVENT_BYTES,
            "queued event bytes: {u:?}"
        );
    }
}

/// `bytes` hold exactly one frame, and it decodes.
fn one_frame(bytes: &bytes::Bytes, what: &str) -> Decoded {
    let mut decoder = FrameDecoder::new(u32::MAX);
    decoder.feed_bytes(bytes.clone());
    let frame = decoder
        .next_frame()
        .unwrap_or_else(|e| panic!("{what} frame does not decode: {e}"))
        .unwrap_or_else(|| panic!("{what} of {} bytes is not a whole frame", bytes.len()));
    assert_eq!(
        decoder.buffered(),
        0,
        "{what} holds more than one frame ({} bytes)",
        bytes.len()
    );
    felix_proto::decode_frame(&frame).unwrap_or_else(|e| panic!("{what} does not decode: {e}"))
}
