//! Felix conformance: the wire-vector runner and the invariant checks shared by the fuzz
//! targets and the corpus replay test.
//!
//! - [`vectors`] loads a directory of reference vectors (`*.json` describing a message and its
//!   exact bytes) and checks each one: decode, compare the decoded fields, re-encode byte for
//!   byte, and compare the framed bytes.
//! - [`checks`] holds one function per fuzz target. Each takes raw bytes and panics on a
//!   violated invariant; `fuzz/` calls them from libFuzzer, `tests/fuzz_corpus.rs` replays the
//!   saved corpus through them under `cargo test`.
//! - [`engine_fuzz`] drives a whole broker engine with `arbitrary` client actions over real
//!   QUIC (the `engine` fuzz target).
//! - [`engine_frames`] drives sessions and the broker beneath QUIC with `arbitrary` client
//!   actions, thousands of inputs a second (the `engine_frames` fuzz target).

pub mod checks;
pub mod engine_frames;
pub mod engine_fuzz;
pub mod fixture;
pub mod sdk_suite;
pub mod vectors;
pub mod verify;
