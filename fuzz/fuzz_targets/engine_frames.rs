#![no_main]
// Sessions and the broker beneath QUIC. The check lives in felix-conformance
// (engine_frames.rs) so that `cargo test` replays the saved corpus through exactly the same
// code (conformance/tests/fuzz_corpus.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| felix_conformance::engine_frames::engine_frames(data));
