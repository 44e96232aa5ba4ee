#![no_main]
// The invariant lives in felix-conformance so that `cargo test` replays the saved corpus
// through exactly the same code (conformance/tests/fuzz_corpus.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| felix_conformance::checks::json_message(data));
