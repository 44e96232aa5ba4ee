#![no_main]
// The check lives in felix-conformance (engine_fuzz.rs) so that `cargo test` replays the saved
// corpus through exactly the same code (conformance/tests/fuzz_corpus.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| felix_conformance::engine_fuzz::engine(data));
