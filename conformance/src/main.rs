//! `felix-conformance vectors <dir>`: checks every wire vector in `<dir>`, prints one line per
//! vector, and exits non-zero if any fails.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [cmd, dir] if cmd == "vectors" => run_vectors(PathBuf::from(dir)),
        _ => {
            eprintln!("usage: felix-conformance vectors <dir>");
            ExitCode::from(2)
        }
    }
}

fn run_vectors(dir: PathBuf) -> ExitCode {
    let results = match felix_conformance::vectors::check_dir(&dir) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot read {}: {e}", dir.display());
            return ExitCode::from(2);
        }
    };
    let mut failed = 0;
    for r in &results {
        match &r.outcome {
            Ok(()) => println!("PASS {}", r.name),
            Err(why) => {
                failed += 1;
                println!("FAIL {}: {why}", r.name);
            }
        }
    }
    if results.is_empty() {
        println!("no vectors found in {}", dir.display());
        return ExitCode::FAILURE;
    }
    println!(
        "vectors: {} passed, {} failed",
        results.len() - failed,
        failed
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
