#![no_main]
// The invariant lives in felix-peer-proto (feature `fuzzing`) so that `cargo test` replays the
// saved corpus through exactly the same code (felix-peer-proto/tests/fuzz_corpus.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| felix_peer_proto::fuzzing::family(
    felix_peer_proto::Family::Replication,
    data
));
