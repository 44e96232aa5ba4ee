//! The engine fuzz check: `arbitrary` sequences of client actions — connect, open streams,
//! send frames (valid, mutated, garbage), finish, reset, stop, let time pass, close, and the
//! operator's stream deletion, with file ops held in flight across actions — fed to a
//! real [`Engine`] through real QUIC and TLS, asserting that:
//!
//! - nothing panics (the engine's own `expect`s included);
//! - the engine never holds more than its limits allow ([`Engine::usage`] after every step);
//! - everything the broker sends decodes (answers and event streams);
//! - every request that reached a handler is answered: on a stream that authenticated with a
//!   good token and carried only whole, valid requests, the broker sends exactly one answer
//!   per request that asks for one, once the network settles.
//!
//! The client side is a quinn-proto client endpoint built from felix-testkit's pieces (the
//! ones under the engine tests' `Net`; this harness keeps its own loop, which gives every
//! client its own address and tracks each stream's requests), rather than a hook inside the
//! engine: the fuzzer then drives
//! the very path a hostile peer reaches — QUIC stream events, the connection's read loop and
//! buffer budget, the session — and the engine needs no test-only API beyond its public
//! `usage()` getter. The cost is a TLS handshake per input (a few hundred inputs a second).
//!
//! Durable storage runs on an in-memory disk that performs every file op at once, unless
//! [`Action::HoldFileOps`] holds them (all held ops are performed before the final check, so
//! an answer a deletion stranded behind a forgotten log still counts as owed).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use felix_engine::{AuthConfig, DurableConfig, Engine, EngineConfig, FsyncPolicy, Output};
use felix_proto::FrameDecoder;
use felix_testkit::{
    binary_frame, client_config, client_endpoint, client_tls, json_frame, poll_connection,
    quic_crypto, read_stream, shared_tls, to_client, to_engine, ClientTransport, MemFs, Trust,
};
use quinn_proto::{
    ClientConfig, Connection, ConnectionHandle, Dir, Endpoint, Event, StreamEvent, StreamId, VarInt,
};

/// Actions read from one input.
const MAX_ACTIONS: usize = 48;
/// Client connections one input may open (one more than the engine accepts).
const MAX_CLIENTS: usize = 4;
/// Streams one connection may open.
const MAX_STREAMS: usize = 24;
/// Datagram round trips before the network is declared stuck.
const MAX_STEPS: usize = 20_000;

// The engine's limits, small so that inputs reach their edges.
const MAX_CONNECTIONS: usize = 3;
const PREAUTH_MAX_STREAMS: usize = 3;
const MAX_SUBSCRIPTIONS: usize = 3;
const PUBLISH_WINDOW: u32 = 4;
const MAX_BUFFERED: usize = 48 * 1024;
const READ_CHUNK: usize = 8 * 1024;
const QUEUE_CAPACITY: usize = 4;
const QUEUE_CAPACITY_MAX: usize = 8;
const MAX_BROKER_STREAMS: usize = 6;
const MAX_BIDI: u32 = 16;
const MAX_UNWRITTEN: usize = 16 * 1024;
const MAX_EVENT_BYTES: usize = 24 * 1024;

/// The real client's offer (peer-client-wire.md §3): error codes, `unsupported`, coded acks.
const OFFER: &str = r#""client_flags":8191,"client_features":4218945535,"client_features_hi":15"#;

/// Runs one input. Panics on a broken invariant.
pub fn engine(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(setup) = Setup::arbitrary(&mut u) else {
        return;
    };
    let mut world = World::new(setup);
    for _ in 0..MAX_ACTIONS {
        let Ok(action) = Action::arbitrary(&mut u) else {
            break;
        };
        if debug() {
            eprintln!("{action:?}");
        }
        world.apply(action);
        world.settle();
        world.check_usage();
    }
    // Every write lands in the end, so every answer it holds is owed by then.
    world.release_file_ops();
    world.settle();
    world.check_answers();
    if debug() {
        eprintln!("{:?}\n{:?}", world.engine.stats(), world.engine.usage());
    }
}

/// `FELIX_FUZZ_DEBUG` set: print each action and the engine's counters (to replay a finding).
fn debug() -> bool {
    static DEBUG: OnceLock<bool> = OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var_os("FELIX_FUZZ_DEBUG").is_some())
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Storage {
    Memory,
    /// Durable, acks as soon as accepted.
    Durable,
    /// Durable, every ack after an fsync.
    OnCommit,
}

#[derive(Arbitrary, Debug)]
struct Setup {
    storage: Storage,
    /// Offer ALPN `felix/1` (or none) on every connection.
    alpn: bool,
    /// Connections made before the first action (1 or 2), so short inputs reach sessions.
    clients: u8,
}

/// A payload of `len % 1500` copies of `fill` (big enough to cross chunk sizes, small enough
/// to stay fast).
#[derive(Arbitrary, Debug, Clone, Copy)]
struct Payload {
    len: u16,
    fill: u8,
}

impl Payload {
    fn bytes(self) -> Vec<u8> {
        vec![self.fill; usize::from(self.len % 1500)]
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Token {
    Good,
    /// A token for another tenant than the one authenticated as.
    OtherTenant,
    Garbage,
}

/// A well-formed request (it may still be refused: another tenant, a limit, a bad shard).
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
    StreamShards {
        stream: u8,
    },
    CacheShards {
        cache: u8,
    },
    ShardOwners {
        name: u8,
        cache: bool,
    },
    Unknown,
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
        other_tenant: bool,
    },
    /// A valid request with some bytes flipped.
    SendMutated {
        conn: u8,
        stream: u8,
        req: Req,
        flips: Vec<(u16, u8)>,
    },
    /// A valid request whose first `at` bytes go out, the rest only after the network settles.
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
        code: u8,
    },
    Stop {
        conn: u8,
        stream: u8,
    },
    /// STOP_SENDING on a subscription's event stream (the client drops it).
    StopEvents {
        conn: u8,
        which: u8,
    },
    /// Lets `tenths` × 100 ms pass (up to 25.5 s: past the auth timeout, not the reap).
    Advance {
        tenths: u8,
    },
    Close {
        conn: u8,
    },
    /// The operator deletes a stream (`Engine::delete_stream`), maybe while its writes wait.
    DeleteStream {
        stream: u8,
    },
    /// From now on file ops wait unperformed (`true`), or every waiting one is performed in
    /// turn and ops run at once again (`false`): writes and fsyncs then stay in flight across
    /// other actions, such as a stream deletion.
    HoldFileOps {
        on: bool,
    },
}

fn stream_name(n: u8) -> String {
    // More names than the broker holds streams, so creation reaches its limit.
    format!("s{}", n % 8)
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

impl Req {
    /// The frame bytes, and whether the broker owes an answer.
    fn encode(&self, tenant: &str, request_id: u64) -> (Vec<u8>, bool) {
        let ns = "default";
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
                (binary_frame(flags, &p), *acked)
            }
            Req::PublishJson {
                acked,
                stream,
                shard,
                payload,
            } => {
                let mut v = serde_json::json!({"type": "publish", "tenant_id": tenant,
                    "namespace": ns, "stream": stream_name(*stream),
                    "payload": b64(&payload.bytes()), "request_id": request_id,
                    "ack": if *acked { "per_message" } else { "none" }});
                if let Some(shard) = shard {
                    v["shard"] = (*shard % 3).into();
                }
                (json_frame(&v.to_string()), *acked)
            }
            Req::Subscribe {
                stream,
                shard,
                start,
                queue,
            } => {
                let mut v = serde_json::json!({"type": "subscribe", "tenant_id": tenant,
                    "namespace": ns, "stream": stream_name(*stream), "shard": shard % 2});
                match start % 4 {
                    0 => {}
                    1 => v["start"] = "earliest".into(),
                    2 => v["start"] = serde_json::json!({"offset": start / 4}),
                    _ => v["start"] = "latest".into(),
                }
                if let Some(q) = queue {
                    v["queue_capacity"] = (*q).into();
                }
                (json_frame(&v.to_string()), true)
            }
            Req::CachePut {
                cache,
                key,
                value,
                ttl_ms,
            } => {
                let mut v = serde_json::json!({"type": "cache_put", "tenant_id": tenant,
                    "namespace": ns, "cache": format!("c{}", cache % 3),
                    "key": format!("k{key}"), "value": b64(&value.bytes()),
                    "request_id": request_id});
                if let Some(ttl) = ttl_ms {
                    v["ttl_ms"] = (*ttl).into();
                }
                (json_frame(&v.to_string()), true)
            }
            Req::CacheGet { cache, key } | Req::CacheDelete { cache, key } => {
                let ty = match self {
                    Req::CacheGet { .. } => "cache_get",
                    _ => "cache_delete",
                };
                let v = serde_json::json!({"type": ty, "tenant_id": tenant,
                    "namespace": ns, "cache": format!("c{}", cache % 3),
                    "key": format!("k{key}"), "request_id": request_id});
                (json_frame(&v.to_string()), true)
            }
            Req::StreamShards { stream } => {
                let v = serde_json::json!({"type": "stream_shards", "tenant_id": tenant,
                    "namespace": ns, "stream": stream_name(*stream), "request_id": request_id});
                (json_frame(&v.to_string()), true)
            }
            Req::CacheShards { cache } => {
                let v = serde_json::json!({"type": "cache_shards", "tenant_id": tenant,
                    "namespace": ns, "cache": format!("c{}", cache % 3),
                    "request_id": request_id});
                (json_frame(&v.to_string()), true)
            }
            Req::ShardOwners { name, cache } => {
                let v = serde_json::json!({"type": "shard_owners", "tenant_id": tenant,
                    "namespace": ns, "name": stream_name(*name),
                    "kind": if *cache { "cache" } else { "stream" }, "request_id": request_id});
                (json_frame(&v.to_string()), true)
            }
            Req::Unknown => {
                let v = serde_json::json!({"type": "brand_new", "request_id": request_id});
                (json_frame(&v.to_string()), true)
            }
            Req::AuthAgain => (
                json_frame(&format!(
                    r#"{{"type":"auth","tenant_id":"t1","token":"x",{OFFER}}}"#
                )),
                true,
            ),
        }
    }
}

/// What the client knows about one of its streams.
struct ClientStream {
    id: StreamId,
    /// Bytes written by the test but not yet taken by QUIC flow control.
    unsent: Vec<u8>,
    /// Only a good auth, then whole valid requests, were sent: every answer is owed.
    clean: bool,
    /// Auth was sent (anything before it makes the stream unclean).
    auth_sent: bool,
    /// Answers owed (auth included).
    owed: usize,
    /// Frames received.
    answers: usize,
    /// The client finished, reset or stopped its side, or the broker ended the stream.
    done_sending: bool,
    stopped: bool,
    /// The broker refused the stream (STOP_SENDING or a reset), as it does past the
    /// unauthenticated-streams limit: nothing on it reached a handler.
    refused: bool,
    decoder: FrameDecoder,
    ended: bool,
}

struct Client {
    ch: ConnectionHandle,
    conn: Connection,
    lost: bool,
    closed_by_us: bool,
    streams: Vec<ClientStream>,
    events: BTreeMap<StreamId, (FrameDecoder, bool)>,
}

struct World {
    now: Instant,
    engine: Engine,
    disk: MemFs,
    client: Endpoint,
    client_config: ClientConfig,
    clients: Vec<Client>,
    server: SocketAddr,
    token: String,
    next_request: u64,
    buf: Vec<u8>,
    /// Clients get a port each; the engine sees them as distinct peers.
    next_port: u16,
    addrs: HashMap<ConnectionHandle, SocketAddr>,
    /// `Some` while file ops are held ([`Action::HoldFileOps`]): the ops waiting.
    held_ops: Option<Vec<felix_engine::FileOp>>,
}

impl World {
    fn new(setup: Setup) -> World {
        // A CA and a `localhost` leaf, made once per process (key generation is slow).
        let tls = shared_tls();
        let mut config = EngineConfig::new(
            tls.identity.clone(),
            AuthConfig::Dev { seed: [7; 32] },
            [9; 32],
        );
        config.max_connections = MAX_CONNECTIONS;
        config.preauth_max_streams_per_connection = PREAUTH_MAX_STREAMS;
        config.max_subscriptions_per_connection = MAX_SUBSCRIPTIONS;
        config.publish_window = PUBLISH_WINDOW;
        config.max_connection_buffered_bytes = MAX_BUFFERED;
        config.max_connection_unwritten_bytes = MAX_UNWRITTEN;
        config.max_connection_event_bytes = MAX_EVENT_BYTES;
        config.read_chunk_bytes = READ_CHUNK;
        config.subscriber_queue_capacity = QUEUE_CAPACITY;
        config.subscriber_queue_capacity_max = QUEUE_CAPACITY_MAX;
        config.max_streams = MAX_BROKER_STREAMS;
        config.max_concurrent_bidi_streams = MAX_BIDI;
        config.preauth_max_frame_bytes = 2048;
        config.max_frame_bytes = 32 * 1024;
        config.cache_max_key_bytes = 8;
        config.cache_max_value_bytes = 1024;
        config.cache_max_total_bytes = 4096;
        config.event_batch_max_records = 8;
        config.stream_receive_window = 64 * 1024;
        config.connection_receive_window = 256 * 1024;
        config.durable = match setup.storage {
            Storage::Memory => None,
            Storage::Durable => Some({
                let mut durable_config = DurableConfig::default();
                durable_config.fsync = FsyncPolicy::None;
                durable_config
            }),
            Storage::OnCommit => Some({
                let mut durable_config = DurableConfig::default();
                durable_config.fsync = FsyncPolicy::OnCommit;
                durable_config
            }),
        };
        let now = Instant::now();
        let engine = Engine::new(config, now, 1_767_225_600_000_000).expect("engine builds");
        let token = engine.dev_token().expect("dev mode").to_owned();

        let alpn: &[&[u8]] = if setup.alpn { &[b"felix/1"] } else { &[] };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let crypto = quic_crypto(client_tls(provider, Trust::Ca(tls.ca.clone()), alpn));
        let transport = ClientTransport {
            stream_window: 256 * 1024,
            max_uni_streams: 64,
            keep_alive: None,
            idle_timeout: None,
        };
        let client_config = client_config(crypto, &transport);

        let mut world = World {
            now,
            engine,
            disk: MemFs::new(),
            client: client_endpoint(Some([3; 32])),
            client_config,
            clients: Vec::new(),
            server: "127.0.0.1:5000".parse().expect("literal"),
            token,
            held_ops: None,
            next_request: 0,
            buf: Vec::new(),
            next_port: 40_000,
            addrs: HashMap::new(),
        };
        world.settle();
        assert!(
            world.engine.is_ready(),
            "recovery of an empty disk finishes"
        );
        for _ in 0..=setup.clients % 2 {
            world.apply(Action::Connect);
        }
        world.settle();
        world
    }

    fn client_index(&self, conn: u8) -> Option<usize> {
        (!self.clients.is_empty()).then(|| usize::from(conn) % self.clients.len())
    }

    fn stream_index(&self, c: usize, stream: u8) -> Option<usize> {
        let n = self.clients[c].streams.len();
        (n > 0).then(|| usize::from(stream) % n)
    }

    fn apply(&mut self, action: Action) {
        match action {
            Action::Connect => {
                if self.clients.len() >= MAX_CLIENTS {
                    return;
                }
                let (ch, conn) = self
                    .client
                    .connect(
                        self.now,
                        self.client_config.clone(),
                        self.server,
                        "localhost",
                    )
                    .expect("connect");
                let addr = SocketAddr::from(([127, 0, 0, 1], self.next_port));
                self.next_port += 1;
                self.addrs.insert(ch, addr);
                self.clients.push(Client {
                    ch,
                    conn,
                    lost: false,
                    closed_by_us: false,
                    streams: Vec::new(),
                    events: BTreeMap::new(),
                });
            }
            Action::Open { conn, auth } => {
                let Some(c) = self.client_index(conn) else {
                    return;
                };
                let client = &mut self.clients[c];
                if client.streams.len() >= MAX_STREAMS {
                    return;
                }
                if let Some(id) = client.conn.streams().open(Dir::Bi) {
                    let s = client.streams.len();
                    client.streams.push(ClientStream {
                        id,
                        unsent: Vec::new(),
                        clean: true,
                        auth_sent: false,
                        owed: 0,
                        answers: 0,
                        done_sending: false,
                        stopped: false,
                        refused: false,
                        decoder: FrameDecoder::new(64 << 20),
                        ended: false,
                    });
                    if let Some(token) = auth {
                        self.auth(c, s, token);
                    }
                }
            }
            Action::Auth {
                conn,
                stream,
                token,
            } => {
                if let Some((c, s)) = self.pick(conn, stream) {
                    self.auth(c, s, token);
                }
            }
            Action::Send {
                conn,
                stream,
                req,
                other_tenant,
            } => {
                let Some((c, s)) = self.pick(conn, stream) else {
                    return;
                };
                let id = self.request_id();
                let tenant = if other_tenant { "t2" } else { "t1" };
                let (bytes, answered) = req.encode(tenant, id);
                let st = &mut self.clients[c].streams[s];
                if !st.auth_sent {
                    st.clean = false;
                }
                st.owed += usize::from(answered);
                self.write(c, s, &bytes);
            }
            Action::SendMutated {
                conn,
                stream,
                req,
                flips,
            } => {
                let Some((c, s)) = self.pick(conn, stream) else {
                    return;
                };
                let id = self.request_id();
                let (mut bytes, _) = req.encode("t1", id);
                for (at, xor) in flips.into_iter().take(8) {
                    let n = bytes.len();
                    bytes[usize::from(at) % n] ^= xor;
                }
                self.clients[c].streams[s].clean = false;
                self.write(c, s, &bytes);
            }
            Action::SendSplit {
                conn,
                stream,
                req,
                at,
            } => {
                let Some((c, s)) = self.pick(conn, stream) else {
                    return;
                };
                let id = self.request_id();
                let (bytes, answered) = req.encode("t1", id);
                let st = &mut self.clients[c].streams[s];
                if !st.auth_sent {
                    st.clean = false;
                }
                st.owed += usize::from(answered);
                let at = usize::from(at) % bytes.len();
                self.write(c, s, &bytes[..at]);
                self.settle();
                self.write(c, s, &bytes[at..]);
            }
            Action::SendGarbage {
                conn,
                stream,
                bytes,
            } => {
                let Some((c, s)) = self.pick(conn, stream) else {
                    return;
                };
                self.clients[c].streams[s].clean = false;
                let bytes: Vec<u8> = bytes.into_iter().take(4096).collect();
                self.write(c, s, &bytes);
            }
            Action::SendFrame {
                conn,
                stream,
                flags,
                payload,
            } => {
                let Some((c, s)) = self.pick(conn, stream) else {
                    return;
                };
                self.clients[c].streams[s].clean = false;
                let payload: Vec<u8> = payload.into_iter().take(4096).collect();
                self.write(c, s, &binary_frame(flags, &payload));
            }
            Action::Finish { conn, stream } => {
                let Some((c, s)) = self.pick(conn, stream) else {
                    return;
                };
                let client = &mut self.clients[c];
                let st = &mut client.streams[s];
                if st.unsent.is_empty() && client.conn.send_stream(st.id).finish().is_ok() {
                    st.done_sending = true;
                }
            }
            Action::Reset { conn, stream, code } => {
                let Some((c, s)) = self.pick(conn, stream) else {
                    return;
                };
                let client = &mut self.clients[c];
                let st = &mut client.streams[s];
                let _ = client
                    .conn
                    .send_stream(st.id)
                    .reset(VarInt::from_u32(code.into()));
                st.done_sending = true;
                st.unsent.clear();
                // Requests not yet read may be dropped with the reset.
                st.clean = false;
            }
            Action::Stop { conn, stream } => {
                let Some((c, s)) = self.pick(conn, stream) else {
                    return;
                };
                let client = &mut self.clients[c];
                let st = &mut client.streams[s];
                let _ = client.conn.recv_stream(st.id).stop(VarInt::from_u32(0));
                st.stopped = true;
            }
            Action::StopEvents { conn, which } => {
                let Some(c) = self.client_index(conn) else {
                    return;
                };
                let client = &mut self.clients[c];
                let ids: Vec<StreamId> = client.events.keys().copied().collect();
                if ids.is_empty() {
                    return;
                }
                let id = ids[usize::from(which) % ids.len()];
                let _ = client.conn.recv_stream(id).stop(VarInt::from_u32(0));
                client.events.remove(&id);
            }
            Action::Advance { tenths } => {
                self.advance(Duration::from_millis(100 * u64::from(tenths)))
            }
            Action::Close { conn } => {
                let Some(c) = self.client_index(conn) else {
                    return;
                };
                let client = &mut self.clients[c];
                client
                    .conn
                    .close(self.now, VarInt::from_u32(0), Bytes::from_static(b"bye"));
                client.closed_by_us = true;
            }
            Action::DeleteStream { stream } => {
                // Refusals (no such stream, a log still opening) are answers too.
                let name = stream_name(stream);
                let _ = self.engine.delete_stream(self.now, "t1", "default", &name);
            }
            Action::HoldFileOps { on: true } => {
                self.held_ops.get_or_insert_with(Vec::new);
            }
            Action::HoldFileOps { on: false } => self.release_file_ops(),
        }
    }

    fn auth(&mut self, c: usize, s: usize, token: Token) {
        let (tenant, token_text) = match token {
            Token::Good => ("t1", self.token.clone()),
            // A good signature for t1, presented as t2.
            Token::OtherTenant => ("t2", self.token.clone()),
            Token::Garbage => ("t1", "garbage".to_owned()),
        };
        let bytes = json_frame(&format!(
            r#"{{"type":"auth","tenant_id":"{tenant}","token":"{token_text}",{OFFER}}}"#
        ));
        let st = &mut self.clients[c].streams[s];
        if st.auth_sent || !matches!(token, Token::Good) {
            st.clean = false;
        }
        st.auth_sent = true;
        st.owed += 1;
        self.write(c, s, &bytes);
    }

    fn pick(&self, conn: u8, stream: u8) -> Option<(usize, usize)> {
        let c = self.client_index(conn)?;
        let s = self.stream_index(c, stream)?;
        let st = &self.clients[c].streams[s];
        (!st.done_sending).then_some((c, s))
    }

    fn request_id(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    /// Queues bytes on a stream and writes what flow control allows.
    fn write(&mut self, c: usize, s: usize, bytes: &[u8]) {
        self.clients[c].streams[s].unsent.extend_from_slice(bytes);
        self.flush(c, s);
    }

    fn flush(&mut self, c: usize, s: usize) {
        let client = &mut self.clients[c];
        let st = &mut client.streams[s];
        if st.unsent.is_empty() || st.done_sending {
            return;
        }
        match client.conn.send_stream(st.id).write(&st.unsent) {
            Ok(n) => {
                st.unsent.drain(..n);
            }
            Err(quinn_proto::WriteError::Blocked) => {}
            Err(_) => {
                // Stopped by the broker: nothing more can be sent.
                st.unsent.clear();
                st.done_sending = true;
            }
        }
    }

    /// Shuttles datagrams and file ops until nothing moves.
    fn settle(&mut self) {
        for _ in 0..MAX_STEPS {
            if !self.step() {
                return;
            }
        }
        panic!("the network did not settle in {MAX_STEPS} steps");
    }

    fn step(&mut self) -> bool {
        let mut moved = false;
        for c in 0..self.clients.len() {
            for s in 0..self.clients[c].streams.len() {
                self.flush(c, s);
            }
        }
        for client in &mut self.clients {
            let remote = self.addrs[&client.ch];
            let (engine, buf) = (&mut self.engine, &mut self.buf);
            moved |= to_engine(&mut client.conn, engine, self.now, remote, buf);
        }
        let mut out = Vec::new();
        let mut ops = Vec::new();
        while let Some(output) = self.engine.poll_output(self.now, &mut out) {
            moved = true;
            let t = match output {
                Output::Transmit(t) => t,
                Output::FileOp(op) => {
                    ops.push(op);
                    continue;
                }
                other => panic!("an engine output the fuzz harness does not handle: {other:?}"),
            };
            for (ch, ev) in to_client(&mut self.client, self.now, self.server, &t, &out) {
                if let Some(client) = self.clients.iter_mut().find(|c| c.ch == ch) {
                    client.conn.handle_event(ev);
                }
            }
        }
        match &mut self.held_ops {
            Some(held) => held.extend(ops),
            None => {
                for op in ops {
                    let completion = self.disk.execute(op).expect("the disk never crashes here");
                    self.engine.handle_file_completion(self.now, completion);
                }
            }
        }
        if self.process_client_events() {
            moved = true;
        }
        moved
    }

    /// Handles client events and reads every readable stream. True if anything happened.
    fn process_client_events(&mut self) -> bool {
        let mut moved = false;
        for client in &mut self.clients {
            loop {
                let Client {
                    ch,
                    conn,
                    lost,
                    streams,
                    events,
                    ..
                } = &mut *client;
                let mut any = poll_connection(&mut self.client, *ch, conn, |conn, ev| match ev {
                    Event::ConnectionLost { .. } => *lost = true,
                    Event::Stream(StreamEvent::Stopped { id, .. }) => {
                        if let Some(st) = streams.iter_mut().find(|s| s.id == id) {
                            st.refused = true;
                        }
                    }
                    Event::Stream(StreamEvent::Opened { dir: Dir::Uni }) => {
                        while let Some(id) = conn.streams().accept(Dir::Uni) {
                            events.insert(id, (FrameDecoder::new(64 << 20), false));
                        }
                    }
                    _ => {}
                });
                if read_all(client) {
                    any = true;
                }
                if !any {
                    break;
                }
                moved = true;
            }
        }
        moved
    }

    /// Performs every held file op in the order issued, and stops holding.
    fn release_file_ops(&mut self) {
        for op in self.held_ops.take().unwrap_or_default() {
            let completion = self.disk.execute(op).expect("the disk never crashes here");
            self.engine.handle_file_completion(self.now, completion);
        }
    }

    fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        for _ in 0..1000 {
            let mut next = self.engine.poll_timeout();
            for c in &mut self.clients {
                if let Some(t) = c.conn.poll_timeout() {
                    next = Some(next.map_or(t, |n: Instant| n.min(t)));
                }
            }
            let Some(at) = next.filter(|t| *t <= end) else {
                break;
            };
            self.now = self.now.max(at);
            self.fire_timers();
            self.settle();
        }
        self.now = end;
        self.fire_timers();
        self.settle();
    }

    fn fire_timers(&mut self) {
        if self.engine.poll_timeout().is_some_and(|t| t <= self.now) {
            self.engine.handle_timeout(self.now);
        }
        for c in &mut self.clients {
            if c.conn.poll_timeout().is_some_and(|t| t <= self.now) {
                c.conn.handle_timeout(self.now);
            }
        }
        self.process_client_events();
    }

    /// The engine holds no more than its limits allow.
    fn check_usage(&self) {
        let u = self.engine.usage();
        assert!(u.connections <= MAX_CONNECTIONS, "{u:?}");
        assert!(
            u.sessions <= MAX_CONNECTIONS * MAX_BIDI as usize,
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
        // Over the budget a stream mid-frame is not read; each stream between frames may
        // still take one chunk.
        assert!(
            u.max_connection_buffered_bytes <= MAX_BUFFERED + MAX_BIDI as usize * READ_CHUNK,
            "buffered bytes: {u:?}"
        );
        // One answer may cross the budget; the largest is a cache value (1 KiB here).
        assert!(
            u.max_connection_unwritten_bytes <= MAX_UNWRITTEN + 4096,
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

    /// Every clean stream on a live connection got one answer per request that asks for one.
    fn check_answers(&mut self) {
        for client in &self.clients {
            if client.lost || client.closed_by_us {
                continue;
            }
            for st in &client.streams {
                if !st.clean || !st.auth_sent || st.stopped || st.refused || !st.unsent.is_empty() {
                    continue;
                }
                assert_eq!(
                    st.answers, st.owed,
                    "stream {} got {} answers for {} requests that ask for one",
                    st.id, st.answers, st.owed
                );
            }
        }
    }
}

/// Reads every stream of a client; every frame must decode. True if anything was read.
fn read_all(client: &mut Client) -> bool {
    let mut any = false;
    for st in &mut client.streams {
        if st.ended {
            continue;
        }
        let r = read_stream(&mut client.conn, st.id, &mut st.decoder);
        any |= r.read;
        st.ended = r.ended();
        st.refused |= r.reset.is_some();
        while let Some(frame) = st.decoder.next_frame().expect("broker frames decode") {
            felix_proto::decode_frame(&frame).expect("broker answers decode");
            st.answers += 1;
        }
    }
    for (id, (decoder, ended)) in client.events.iter_mut() {
        if *ended {
            continue;
        }
        let r = read_stream(&mut client.conn, *id, decoder);
        any |= r.read;
        *ended = r.ended();
        while let Some(frame) = decoder.next_frame().expect("event frames decode") {
            felix_proto::decode_frame(&frame).expect("event frames decode");
        }
    }
    any
}
