//! A small data-driven format for the replication decisions' exact outputs (the idea of
//! raft-rs's `testdata/`): each case is input lines, `----`, then the expected output lines;
//! cases are separated by blank lines and `#` starts a comment. `FELIX_BLESS=1` rewrites the
//! expected parts from what the code answers; review that diff like code.

use std::collections::BTreeMap;
use std::path::PathBuf;

pub(crate) struct Block {
    pub(crate) lines: Vec<String>,
}

fn path(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/replication")
        .join(file)
}

/// Runs every case of `file` through `run` and compares (or, blessing, rewrites) the outputs.
pub(crate) fn check(file: &str, run: impl Fn(&Block) -> String) {
    let path = path(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let bless = std::env::var_os("FELIX_BLESS").is_some();
    let mut rewritten = String::new();
    let mut failures = Vec::new();
    let mut cases = 0;
    for chunk in text.split("\n\n") {
        let mut comments = Vec::new();
        let mut input = Vec::new();
        let mut expected = Vec::new();
        let mut after = false;
        for line in chunk.lines() {
            if line.starts_with('#') {
                comments.push(line);
            } else if line == "----" {
                after = true;
            } else if !line.trim().is_empty() {
                if after { &mut expected } else { &mut input }.push(line.to_string());
            }
        }
        if input.is_empty() {
            if !comments.is_empty() {
                rewritten.push_str(&format!("{}\n\n", comments.join("\n")));
            }
            continue;
        }
        cases += 1;
        let got = run(&Block {
            lines: input.clone(),
        });
        if got != expected.join("\n") {
            failures.push(format!(
                "case {}:\n  input:    {}\n  expected: {}\n  got:      {}",
                cases,
                input.join(" | "),
                expected.join(" | "),
                got.replace('\n', " | ")
            ));
        }
        for c in &comments {
            rewritten.push_str(c);
            rewritten.push('\n');
        }
        rewritten.push_str(&format!("{}\n----\n{}\n\n", input.join("\n"), got));
    }
    assert!(cases > 0, "{} holds no cases", path.display());
    if bless {
        std::fs::write(&path, rewritten.trim_end().to_string() + "\n").unwrap();
        return;
    }
    assert!(
        failures.is_empty(),
        "{} (FELIX_BLESS=1 rewrites):\n{}",
        path.display(),
        failures.join("\n")
    );
}

/// `key=value` fields of one line (a bare word `w` becomes `w=`).
pub(crate) fn fields(line: &str) -> BTreeMap<String, String> {
    line.split_whitespace()
        .map(|w| match w.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (w.to_string(), String::new()),
        })
        .collect()
}

pub(crate) fn num(f: &BTreeMap<String, String>, key: &str) -> u64 {
    f.get(key)
        .unwrap_or_else(|| panic!("missing {key} in {f:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("{key}: {e}"))
}
