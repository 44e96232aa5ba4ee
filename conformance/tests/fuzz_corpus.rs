//! Replays every saved fuzz input (`fuzz/corpus/<target>/*`) through the same check the
//! fuzz target runs, so a regression found once stays caught by `cargo test`.

use std::fs;
use std::path::PathBuf;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut inputs: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{} has no corpus: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "{} is empty", dir.display());
    for path in &inputs {
        let data = fs::read(path).unwrap();
        if let Err(panic) = std::panic::catch_unwind(|| check(&data)) {
            std::panic::resume_unwind(Box::new(format!(
                "{}: {:?}",
                path.display(),
                panic.downcast_ref::<String>()
            )));
        }
    }
    println!("{target}: replayed {} inputs", inputs.len());
}

#[test]
fn frame_decoder_corpus() {
    replay("frame_decoder", felix_conformance::checks::frame_decoder);
}

#[test]
fn json_message_corpus() {
    replay("json_message", felix_conformance::checks::json_message);
}

#[test]
fn structured_message_corpus() {
    replay(
        "structured_message",
        felix_conformance::checks::structured_message,
    );
}

#[test]
fn binary_layout_corpus() {
    replay("binary_layout", felix_conformance::checks::binary_layout);
}

#[test]
fn structured_binary_corpus() {
    replay(
        "structured_binary",
        felix_conformance::checks::structured_binary,
    );
}

/// The engine corpus is the slow one (a TLS handshake per input), so it replays on every core.
#[test]
fn engine_corpus() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/engine");
    let mut inputs: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{} has no corpus: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "{} is empty", dir.display());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let chunk = inputs.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for part in inputs.chunks(chunk) {
            scope.spawn(move || {
                for path in part {
                    let data = fs::read(path).unwrap();
                    if let Err(panic) =
                        std::panic::catch_unwind(|| felix_conformance::engine_fuzz::engine(&data))
                    {
                        std::panic::resume_unwind(Box::new(format!(
                            "{}: {:?}",
                            path.display(),
                            panic.downcast_ref::<String>()
                        )));
                    }
                }
            });
        }
    });
    println!("engine: replayed {} inputs", inputs.len());
}

/// Inputs the fuzzer has not seen: bytes from a fixed LCG, so new engine paths get some
/// coverage under `cargo test` even before the corpus holds them.
#[test]
fn engine_pseudo_random_inputs() {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..48 {
        let len = 64 + (state % 3000) as usize;
        let input: Vec<u8> = (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (state >> 33) as u8
            })
            .collect();
        felix_conformance::engine_fuzz::engine(&input);
    }
}

/// Replays the inputs in `FELIX_FUZZ_REPLAY` (a directory), for a finding under a debugger.
#[test]
fn engine_replay_dir() {
    let Some(dir) = std::env::var_os("FELIX_FUZZ_REPLAY") else {
        return;
    };
    for entry in fs::read_dir(dir).unwrap() {
        let data = fs::read(entry.unwrap().path()).unwrap();
        felix_conformance::engine_fuzz::engine(&data);
    }
}

/// The frame-level engine corpus (sessions and the broker beneath QUIC).
#[test]
fn engine_frames_corpus() {
    replay(
        "engine_frames",
        felix_conformance::engine_frames::engine_frames,
    );
}

/// Inputs the fuzzer has not seen, for the frame-level check (as for the engine one above).
#[test]
fn engine_frames_pseudo_random_inputs() {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..256 {
        let len = 16 + (state % 4000) as usize;
        let input: Vec<u8> = (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (state >> 33) as u8
            })
            .collect();
        felix_conformance::engine_frames::engine_frames(&input);
    }
}

/// Replays the inputs in `FELIX_FUZZ_REPLAY` through the frame-level check.
#[test]
fn engine_frames_replay_dir() {
    let Some(dir) = std::env::var_os("FELIX_FUZZ_REPLAY") else {
        return;
    };
    for entry in fs::read_dir(dir).unwrap() {
        let data = fs::read(entry.unwrap().path()).unwrap();
        felix_conformance::engine_frames::engine_frames(&data);
    }
}
